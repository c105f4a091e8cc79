//! `--fleet-auth token` without `--fleet-tokens`: the bench makes the tokens itself, against
//! the project's control-plane fixture (bridgehead-e2e's etcd and kube-apiserver, in a network
//! namespace of their own; root and `scripts/k8s-build.sh` needed). deploy/rbac's manifests
//! as an operator applies them, a Node with an InternalIP and an agent Pod on it for every
//! simulated agent (named as [`Identity`] names them), a pod-bound token each from
//! TokenRequest; the server then runs as `system:konnectivity-server` with token
//! authentication (local verification, the default) and `--bind-agent-identifiers`.
//!
//! kube-apiserver's own request counters (`apiserver_request_total`) are read around each
//! restart, as a cross-check of what the server says it asked.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use bridgehead_e2e::kubernetes::fleet::{self, FleetNode, FleetSpec};
use bridgehead_e2e::kubernetes::{Binaries, ControlPlane, Egress};
use bridgehead_e2e::netns::{self, TestNet};

use super::identity::Identity;

const NAMESPACE: &str = "kube-system";
const ACCOUNT: &str = "bridgehead-agent";
const AUDIENCE: &str = "bridgehead";
/// The user kubeadm's konnectivity setup gives the server, bound by deploy/rbac.
const SERVER_USER: &str = "system:konnectivity-server";
/// The tokens outlive any run.
const TOKEN_SECONDS: i64 = 24 * 3600;
/// deploy/rbac, built in: the bench applies what an operator applies.
const RBAC: [&str; 2] = [
    include_str!("../../../deploy/rbac/server.yaml"),
    include_str!("../../../deploy/rbac/agent.yaml"),
];

/// The resources and verbs a server would ask kube-apiserver about per agent, if it did:
/// a TokenReview, a Node GET. The cross-check counts them in kube-apiserver.
pub const PER_AGENT: [(&str, &str); 2] = [("tokenreviews", "POST"), ("nodes", "GET")];

/// The running control plane with the fleet's objects.
#[derive(Debug)]
pub struct TokenCluster {
    /// The tokens, one a line (agent `i` on line `i`).
    pub tokens: PathBuf,
    /// The server's token flags.
    pub server_args: Vec<String>,
    cp: ControlPlane,
    _net: TestNet,
    _dir: tempfile::TempDir,
}

impl TokenCluster {
    /// Starts the control plane and makes `agents` Nodes, Pods and tokens.
    pub fn start(agents: usize, runtime: &tokio::runtime::Runtime) -> anyhow::Result<TokenCluster> {
        if !netns::is_root() {
            bail!("--fleet-auth token without --fleet-tokens starts a control plane in a network namespace: run as root");
        }
        let binaries = Binaries::find().context(
            "kube-apiserver, etcd and kubectl are not built: run scripts/k8s-build.sh (needs Go)",
        )?;
        let mut net = TestNet::new(1)?;
        let started = Instant::now();
        let cp = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .context("starting the control plane")?;
        for manifest in RBAC {
            cp.apply(manifest)?;
        }
        let kubeconfig = cp.kubeconfig_for(SERVER_USER, &[])?;
        eprintln!(
            "  control plane at {} ready after {:.1} s",
            cp.url,
            started.elapsed().as_secs_f64()
        );
        let spec = FleetSpec {
            namespace: NAMESPACE.to_owned(),
            account: ACCOUNT.to_owned(),
            audience: AUDIENCE.to_owned(),
            seconds: TOKEN_SECONDS,
        };
        let nodes: Vec<FleetNode> = (0..agents)
            .map(|i| {
                let identity = Identity::of(i);
                FleetNode {
                    name: identity.host,
                    ipv4: identity.ipv4,
                }
            })
            .collect();
        let making = Instant::now();
        let tokens = runtime.block_on(fleet::create(&cp, &spec, &nodes))?;
        eprintln!(
            "  {agents} Nodes, Pods and pod-bound tokens made in {:.1} s",
            making.elapsed().as_secs_f64()
        );
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tokens");
        std::fs::write(&path, tokens.join("\n") + "\n")?;
        Ok(TokenCluster {
            tokens: path,
            server_args: vec![
                format!("--agent-namespace={NAMESPACE}"),
                format!("--agent-service-account={ACCOUNT}"),
                format!("--authentication-audience={AUDIENCE}"),
                format!("--kubeconfig={}", kubeconfig.display()),
                "--bind-agent-identifiers".to_owned(),
            ],
            cp,
            _net: net,
            _dir: dir,
        })
    }

    /// kube-apiserver's count of requests for `resource` with `verb` so far.
    pub fn requests(&self, resource: &str, verb: &str) -> anyhow::Result<f64> {
        self.cp.requests(resource, verb)
    }

    /// kube-apiserver's counts of the per-agent requests ([`PER_AGENT`]), in that order.
    pub fn per_agent_requests(&self) -> anyhow::Result<Vec<f64>> {
        PER_AGENT
            .iter()
            .map(|(resource, verb)| self.requests(resource, verb))
            .collect()
    }
}
