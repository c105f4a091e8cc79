//! Local verification of agents' ServiceAccount tokens (`bridgehead_kubeapi::serviceaccount`)
//! against a real kube-apiserver: real pod-bound tokens from TokenRequest, verified with the
//! issuer's keys from discovery and the watched pods and nodes, with no TokenReview and no Node
//! GET; a deleted pod's token refused about as soon as the watch says so; and a server with
//! only konnectivity's RBAC falling back rather than failing. The server's identity is given
//! exactly what deploy/rbac grants. Needs root and `scripts/k8s-build.sh`; skipped loudly
//! otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::{self, ControlPlane, Egress};
use bridgehead_e2e::netns::{self, TestNet};
use bridgehead_kubeapi::serviceaccount::{
    Fallback, Malformed, Outcome, Refusal, TokenVerifier, VerifierSettings,
};
use bridgehead_kubeapi::{KubeApi, RequestCounts};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "kube-system";
const ACCOUNT: &str = "bridgehead-agent";
const AUDIENCE: &str = "bridgehead";
/// The user deploy/rbac binds for a server run as a static pod (kubeadm's konnectivity user).
const SERVER_USER: &str = "system:konnectivity-server";
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the verifier may take to fetch the keys and list.
const READY: Duration = Duration::from_secs(60);
/// How soon a deleted pod's token must be refused: the watch delivers in milliseconds; the
/// rest is room for a loaded machine.
const REVOKED_WITHIN: Duration = Duration::from_secs(2);
/// A node address that is only data here: nothing is ever sent to it (TEST-NET-1).
const NODE_ADDRESS: &str = "192.0.2.7";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// A Node with an address and the agent's pod `pod` on it.
fn agent_pod(cp: &ControlPlane, node: &str, pod: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {NAMESPACE}\nspec:\n  nodeName: {node}\n  serviceAccountName: {ACCOUNT}\n  automountServiceAccountToken: false\n  containers:\n  - name: agent\n    image: bridgehead.invalid/agent\n"
    ))
    .unwrap();
    let status = format!(
        "{{\"status\":{{\"addresses\":[{{\"type\":\"InternalIP\",\"address\":\"{NODE_ADDRESS}\"}}]}}}}"
    );
    cp.kubectl_ok(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status,
    ])
    .unwrap();
}

/// A verifier as [`start`] makes one, waited for, and its client's request counts.
fn start_counted(
    runtime: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    stop: &CancellationToken,
) -> (TokenVerifier, RequestCounts) {
    runtime.block_on(async {
        let api = KubeApi::connect(Some(kubeconfig), 0.0, 0).await.unwrap();
        let requests = api.requests();
        let mut settings = VerifierSettings::new(NAMESPACE, ACCOUNT, AUDIENCE);
        settings.watch_nodes = true;
        let verifier = TokenVerifier::start(Arc::new(api), settings, stop.clone());
        tokio::time::timeout(READY, verifier.ready())
            .await
            .expect("the verifier never got its keys and lists");
        (verifier, requests)
    })
}

/// A verifier as the server would start one, with `kubeconfig`; ready when `ready`.
fn start(
    runtime: &tokio::runtime::Runtime,
    kubeconfig: &Path,
    stop: &CancellationToken,
    ready: bool,
) -> TokenVerifier {
    runtime.block_on(async {
        let api = KubeApi::connect(Some(kubeconfig), 0.0, 0).await.unwrap();
        let mut settings = VerifierSettings::new(NAMESPACE, ACCOUNT, AUDIENCE);
        settings.watch_nodes = true;
        let verifier = TokenVerifier::start(Arc::new(api), settings, stop.clone());
        if ready {
            tokio::time::timeout(READY, verifier.ready())
                .await
                .expect("the verifier never got its keys and lists");
        }
        verifier
    })
}

#[test]
fn pod_bound_tokens_are_verified_locally_against_kube_apiserver() {
    let test = "pod_bound_tokens_are_verified_locally_against_kube_apiserver";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, TEST_TIMEOUT, move |net| {
        verify_locally(&binaries, net)
    });
}

#[test]
fn without_streaming_lists_the_verifier_lists_in_pages_and_still_verifies() {
    let test = "without_streaming_lists_the_verifier_lists_in_pages_and_still_verifies";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, TEST_TIMEOUT, move |mut net| {
        // A kube-apiserver that refuses sendInitialEvents, as before 1.34 by default.
        let (_cp, server, token) =
            with_agent_pod_on(&binaries, &mut net, &["--feature-gates=WatchList=false"]);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let stop = CancellationToken::new();
        let (verifier, requests) = start_counted(&runtime, &server, &stop);
        let outcome = runtime.block_on(verifier.verify(&token));
        assert!(matches!(outcome, Outcome::Verified(_)), "{outcome:?}");
        let counted = requests.snapshot();
        for resource in ["pods", "serviceaccounts", "nodes"] {
            assert!(
                counted
                    .iter()
                    .any(|(verb, r, n)| *verb == "LIST" && r == resource && *n >= 1),
                "no paged list of {resource}: {counted:?}"
            );
        }
        stop.cancel();
    });
}

/// A control plane with deploy/rbac applied and agent pod `agent-1` on `node-1`: the server
/// identity's kubeconfig and the pod's token.
fn with_agent_pod(
    binaries: &kubernetes::Binaries,
    net: &mut TestNet,
) -> (ControlPlane, PathBuf, String) {
    with_agent_pod_on(binaries, net, &[])
}

/// [`with_agent_pod`] with `flags` for kube-apiserver.
fn with_agent_pod_on(
    binaries: &kubernetes::Binaries,
    net: &mut TestNet,
    flags: &[&str],
) -> (ControlPlane, PathBuf, String) {
    let cp = ControlPlane::start(binaries, net, 0, Egress::Direct, flags)
        .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
    for manifest in ["deploy/rbac/server.yaml", "deploy/rbac/agent.yaml"] {
        let path = repo().join(manifest);
        cp.kubectl_ok(&["apply", "-f", &path.display().to_string()])
            .unwrap();
    }
    let server = cp.kubeconfig_for(SERVER_USER, &[]).unwrap();
    agent_pod(&cp, "node-1", "agent-1");
    let token = cp
        .token(NAMESPACE, ACCOUNT, AUDIENCE, 3600, Some("agent-1"))
        .unwrap();
    (cp, server, token)
}

fn verify_locally(binaries: &kubernetes::Binaries, mut net: TestNet) {
    let (cp, server, token) = with_agent_pod(binaries, &mut net);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    let (verifier, requests) = start_counted(&runtime, &server, &stop);
    // Streaming lists: each watch's first state came from one WATCH, no LIST.
    let lists: Vec<_> = requests
        .snapshot()
        .into_iter()
        .filter(|(verb, _, _)| *verb == "LIST")
        .collect();
    assert!(lists.is_empty(), "{lists:?}");
    let freshness = verifier.freshness();
    assert_eq!(freshness.watches(), Some(Duration::ZERO));
    assert_eq!(freshness.nodes, Some(Duration::ZERO));

    let reviews = cp.requests("tokenreviews", "POST").unwrap();
    let node_gets = cp.requests("nodes", "GET").unwrap();
    let verify = |token: &str| runtime.block_on(verifier.verify(token));
    let Outcome::Verified(verified) = verify(&token) else {
        panic!(
            "a real pod-bound token was not verified: {:?}",
            verify(&token)
        );
    };
    assert_eq!(
        verified.username,
        format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}")
    );
    assert_eq!(verified.pod.name, "agent-1");
    assert_eq!(
        verified.node.as_ref().map(|n| n.name.as_str()),
        Some("node-1")
    );
    assert_eq!(
        verified.node_addresses,
        Some(vec!["node-1".to_owned(), NODE_ADDRESS.to_owned()])
    );
    // Many connections, still nothing asked of kube-apiserver.
    for _ in 0..100 {
        assert!(matches!(verify(&token), Outcome::Verified(_)));
    }

    // What kube-apiserver would refuse is refused here, without asking it.
    cp.kubectl_ok(&["create", "serviceaccount", "someone-else", "-n", NAMESPACE])
        .unwrap();
    let refused = [
        (
            "another audience",
            cp.token(NAMESPACE, ACCOUNT, "kubernetes", 3600, Some("agent-1"))
                .unwrap(),
            Refusal::WrongAudience,
        ),
        (
            "another account",
            cp.token(NAMESPACE, "someone-else", AUDIENCE, 3600, None)
                .unwrap(),
            Refusal::WrongAccount {
                got: format!("system:serviceaccount:{NAMESPACE}:someone-else"),
            },
        ),
        (
            "garbage",
            "not-a-token".to_owned(),
            Refusal::Malformed(Malformed::NotThreeParts),
        ),
        ("a forged signature", forge(&token), Refusal::BadSignature),
    ];
    for (what, token, refusal) in refused {
        assert_eq!(verify(&token), Outcome::Refused(refusal), "{what}");
    }
    // A token bound to no pod is TokenReview's.
    let unbound = cp.token(NAMESPACE, ACCOUNT, AUDIENCE, 3600, None).unwrap();
    assert_eq!(verify(&unbound), Outcome::Fallback(Fallback::NotPodBound));
    assert_eq!(cp.requests("tokenreviews", "POST").unwrap(), reviews);
    assert_eq!(cp.requests("nodes", "GET").unwrap(), node_gets);
    // The counters do count: one TokenReview made here shows.
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n  audiences: [{AUDIENCE}]\n"
    );
    let answer = cp
        .kubectl_as(
            &cp.kubeconfig,
            &["create", "-f", "-", "-o", "json"],
            Some(&review),
        )
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer.stdout).contains("\"authenticated\": true"),
        "{}",
        String::from_utf8_lossy(&answer.stderr)
    );
    assert_eq!(cp.requests("tokenreviews", "POST").unwrap(), reviews + 1.0);

    // The pod goes: its token is refused as soon as the watch says so.
    cp.kubectl_ok(&[
        "delete",
        "pod",
        "agent-1",
        "-n",
        NAMESPACE,
        "--grace-period=0",
        "--force",
    ])
    .unwrap();
    let deleted = Instant::now();
    let outcome = runtime.block_on(async {
        tokio::time::timeout(REVOKED_WITHIN, async {
            loop {
                let changed = verifier.changed();
                let outcome = verifier.verify(&token).await;
                if !matches!(outcome, Outcome::Verified(_)) {
                    return outcome;
                }
                changed.await;
            }
        })
        .await
    });
    assert_eq!(
        outcome,
        Ok(Outcome::Refused(Refusal::PodGone)),
        "after {:?}",
        deleted.elapsed()
    );
    assert_eq!(verifier.recheck(&verified), Some(Refusal::PodGone));
    stop.cancel();

    // A server with only konnectivity's RBAC (TokenReview): every token falls back, none is
    // refused for it.
    cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: konnectivity-only:auth-delegator\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: system:auth-delegator\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: konnectivity-only\n",
    )
    .unwrap();
    agent_pod(&cp, "node-2", "agent-2");
    let fresh = cp
        .token(NAMESPACE, ACCOUNT, AUDIENCE, 3600, Some("agent-2"))
        .unwrap();
    let konnectivity = cp.kubeconfig_for("konnectivity-only", &[]).unwrap();
    let stop = CancellationToken::new();
    let lacking = start(&runtime, &konnectivity, &stop, false);
    assert_eq!(
        runtime.block_on(lacking.verify(&fresh)),
        Outcome::Fallback(Fallback::KeysUnavailable)
    );
    assert!(!lacking.is_ready());
    stop.cancel();
    runtime.shutdown_timeout(Duration::from_secs(5));
}

/// `token` with its signature's first byte changed.
fn forge(token: &str) -> String {
    let (signed, signature) = token.rsplit_once('.').unwrap();
    let mut signature = signature.to_owned().into_bytes();
    signature[0] = if signature[0] == b'A' { b'B' } else { b'A' };
    format!("{signed}.{}", String::from_utf8(signature).unwrap())
}

/// The server itself with local verification (its default) and deploy/rbac's permissions: an
/// agent with a real pod-bound token, announcing its own node, gets its session with no
/// TokenReview and no Node GET; another node's identifiers are refused; garbage is refused
/// without asking; the deleted pod's token is refused within a few seconds and the session it
/// opened is closed; and the verifier's state age is exported.
#[test]
fn the_server_admits_pod_bound_agents_without_asking_kube_apiserver() {
    let test = "the_server_admits_pod_bound_agents_without_asking_kube_apiserver";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, TEST_TIMEOUT, move |mut net| {
        let (cp, kubeconfig, token) = with_agent_pod(&binaries, &mut net);
        let pki = bridgehead_e2e::Pki::new().unwrap();
        let server = bridgehead_e2e::Server::start(
            &pki,
            bridgehead_e2e::ServerOptions {
                args: vec![
                    format!("--agent-namespace={NAMESPACE}"),
                    format!("--agent-service-account={ACCOUNT}"),
                    format!("--authentication-audience={AUDIENCE}"),
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--bind-agent-identifiers".into(),
                ],
                without_cluster_ca: true,
                ..Default::default()
            },
        )
        .unwrap();
        // Ready once the pods' watch has listed.
        bridgehead_e2e::process::wait_until(READY, || {
            server
                .metric("bridgehead_server_token_verifier_state_age_seconds{state=\"pods\"}")
                .is_ok_and(|age| age < 60.0)
                && server
                    .get("/metrics")
                    .is_ok_and(|(_, body)| body.contains("state=\"nodes\""))
        })
        .unwrap_or_else(|_| panic!("the verifier never synced:\n{}", server.process.stderr()));
        let config =
            bridgehead_e2e::client::tls::config(&pki.path("cluster-ca.crt"), None).unwrap();
        let upgrade = |token: &str, query: &str| {
            bridgehead_e2e::client::agent_upgrade(
                config.clone(),
                server.agent_addr,
                Some(token),
                query,
            )
            .unwrap()
        };
        let reviews = cp.requests("tokenreviews", "POST").unwrap();
        let node_gets = cp.requests("nodes", "GET").unwrap();
        let own = format!("id=agent-1&host=node-1&ipv4={NODE_ADDRESS}");
        let reply = upgrade(&token, &own);
        assert_eq!(reply.status, 101, "{}{}", reply.head, reply.body);
        let reply = upgrade(&token, "id=agent-1b&host=node-2");
        assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
        assert!(reply.body.contains("host=node-2"), "{}", reply.body);
        let reply = upgrade("not-a-token", "id=x");
        assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
        assert!(reply.body.contains("malformed"), "{}", reply.body);
        assert_eq!(cp.requests("tokenreviews", "POST").unwrap(), reviews);
        assert_eq!(cp.requests("nodes", "GET").unwrap(), node_gets);
        let verified = server
            .metric("bridgehead_server_token_verifications_total{result=\"verified\",reason=\"\"}")
            .unwrap();
        assert_eq!(verified, 2.0);

        // A real agent holds a session with the pod's token (re-read for each connection).
        let token_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token_file.path(), &token).unwrap();
        let agent = bridgehead_e2e::Agent::start(
            &pki,
            &server,
            bridgehead_e2e::AgentOptions {
                id: Some("agent-1".into()),
                identifiers: Some(format!("host=node-1&ipv4={NODE_ADDRESS}")),
                token: Some(token_file.path().to_owned()),
                certificate: Some(None),
                args: vec!["--server-name".into(), "127.0.0.1".into()],
                ..Default::default()
            },
        )
        .unwrap();
        server.wait_agents(1).unwrap();

        cp.kubectl_ok(&[
            "delete",
            "pod",
            "agent-1",
            "-n",
            NAMESPACE,
            "--grace-period=0",
            "--force",
        ])
        .unwrap();
        let deleted = Instant::now();
        bridgehead_e2e::process::wait_until(Duration::from_secs(10), || {
            upgrade(&token, &own).status == 403
        })
        .expect("a deleted pod's token still opens sessions");
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "{:?}",
            deleted.elapsed()
        );
        // And the session it opened before is closed, not left to run.
        bridgehead_e2e::process::wait_until(Duration::from_secs(10), || {
            server.agents().is_ok_and(|agents| agents.is_empty())
        })
        .unwrap_or_else(|_| {
            panic!(
                "the deleted pod's session is still open:\n{}",
                server.process.stderr()
            )
        });
        assert!(
            server
                .process
                .stderr()
                .contains("its token is no longer valid"),
            "{}",
            server.process.stderr()
        );
        drop(agent);
        assert_eq!(cp.requests("tokenreviews", "POST").unwrap(), reviews);
    });
}
