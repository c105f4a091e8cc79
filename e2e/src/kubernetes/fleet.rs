//! A simulated fleet's objects in the test control plane: for each agent a Node with its
//! InternalIP, a Pod of the agent ServiceAccount bound to that Node (no kubelet runs it: it
//! only has to exist, with its UID, for the tokens bound to it), and a token from TokenRequest
//! bound to that Pod.
//!
//! Made with concurrent requests through kube-rs, the client the server itself uses, with the
//! admin kubeconfig: kubectl sends one request at a time and forks once per token, minutes at
//! 10,000 agents. Its requests are admin requests (kube-apiserver exempts `system:masters`
//! from its priority and fairness queues), so the fixture's speed is kube-apiserver's and
//! etcd's, on the same cores as everything else.

use std::net::Ipv4Addr;

use anyhow::{bail, Context};
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeAddress, NodeStatus, Pod, PodSpec, ServiceAccount,
};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use super::ControlPlane;

/// Requests in flight at once: enough to keep kube-apiserver and etcd busy on 2 cores.
const IN_FLIGHT: usize = 64;

/// Who the fleet's agents are and what their tokens say.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// The agents' namespace and ServiceAccount (which must exist).
    pub namespace: String,
    pub account: String,
    /// The tokens' audience and lifetime.
    pub audience: String,
    pub seconds: i64,
}

/// One agent's node: its name and its InternalIP.
#[derive(Debug, Clone)]
pub struct FleetNode {
    pub name: String,
    pub ipv4: Ipv4Addr,
}

/// The Pod of agent `i` (`agent-00042`).
pub fn pod_name(i: usize) -> String {
    format!("agent-{i:05}")
}

/// An admin client of `cp`.
pub async fn admin_client(cp: &ControlPlane) -> anyhow::Result<Client> {
    let file = Kubeconfig::read_from(&cp.kubeconfig).context("the admin kubeconfig")?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .context("the admin kubeconfig")?;
    Client::try_from(config).context("a client of the test control plane")
}

/// Creates every node of `nodes` and a pod on each, then one token per pod, in `nodes`' order.
pub async fn create(
    cp: &ControlPlane,
    spec: &FleetSpec,
    nodes: &[FleetNode],
) -> anyhow::Result<Vec<String>> {
    let client = admin_client(cp).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    let accounts: Api<ServiceAccount> = Api::namespaced(client, &spec.namespace);
    let post = PostParams::default();
    concurrently(nodes.iter(), |node| {
        let (api, post) = (&node_api, &post);
        async move {
            let created = api.create(post, &node_object(node)).await;
            created.with_context(|| format!("creating Node {}", node.name))
        }
    })
    .await?;
    // kube-apiserver keeps a Node's status on create (as kubelet registers), but check one:
    // without addresses, identity binding would refuse every agent.
    if let Some(first) = nodes.first() {
        let read = node_api.get(&first.name).await?;
        if read
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .is_empty()
        {
            concurrently(nodes.iter(), |node| {
                let api = &node_api;
                async move {
                    let patch = serde_json::json!({ "status": node_object(node).status });
                    api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .with_context(|| format!("Node {}'s addresses", node.name))
                }
            })
            .await?;
        }
    }
    concurrently(nodes.iter().enumerate(), |(i, node)| {
        let (api, post, spec) = (&pod_api, &post, spec);
        async move {
            let created = api.create(post, &pod_object(spec, i, node)).await;
            created.with_context(|| format!("creating Pod {}", pod_name(i)))
        }
    })
    .await?;
    let tokens = concurrently(0..nodes.len(), |i| {
        let (api, spec) = (&accounts, spec);
        async move { token(api, spec, &pod_name(i)).await }
    })
    .await?;
    Ok(tokens)
}

/// Runs `make` for every item, [`IN_FLIGHT`] at a time; the results in the items' order.
async fn concurrently<I, F, T>(
    items: impl IntoIterator<Item = I>,
    make: impl Fn(I) -> F,
) -> anyhow::Result<Vec<T>>
where
    F: std::future::Future<Output = anyhow::Result<T>>,
{
    futures_util::stream::iter(items.into_iter().map(make))
        .buffered(IN_FLIGHT)
        .try_collect()
        .await
}

/// A token for `spec`'s ServiceAccount bound to `pod`.
async fn token(api: &Api<ServiceAccount>, spec: &FleetSpec, pod: &str) -> anyhow::Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![spec.audience.clone()]),
            expiration_seconds: Some(spec.seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(pod.to_owned()),
                uid: None,
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer: TokenRequest = api
        .create_subresource("token", &spec.account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest bound to {pod}"))?;
    match answer.status.and_then(|status| status.token) {
        Some(token) if !token.is_empty() => Ok(token),
        _ => bail!("TokenRequest bound to {pod}: no token in the answer"),
    }
}

fn node_object(node: &FleetNode) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_owned(),
                address: node.ipv4.to_string(),
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

fn pod_object(spec: &FleetSpec, i: usize, node: &FleetNode) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(i)),
            namespace: Some(spec.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.name.clone()),
            service_account_name: Some(spec.account.clone()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "agent".to_owned(),
                image: Some("bridgehead.invalid/agent".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}
