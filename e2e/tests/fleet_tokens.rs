//! A fleet with pod-bound tokens against the real kube-apiserver: the bench's fleet simulator
//! (`bench --only fleet`, built with the workspace) holds N agent sessions, each presenting a
//! real token from TokenRequest bound to its own Pod on its own Node, to a server with token
//! authentication (local verification, the default), `--bind-agent-identifiers` and
//! deploy/rbac's permissions; through a SIGKILL and a SIGTERM restart every agent comes back,
//! and kube-apiserver is asked for no TokenReview and no Node (its own request counters).
//! N is 200 here (`BRIDGEHEAD_FLEET_AGENTS` for more); the same rows at 10,000 are the
//! bench's. Needs root, `scripts/k8s-build.sh` and the bench binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bridgehead_e2e::kubernetes::{self, ControlPlane, Egress};
use bridgehead_e2e::netns;

const NAMESPACE: &str = "kube-system";
const ACCOUNT: &str = "bridgehead-agent";
const AUDIENCE: &str = "bridgehead";
const SERVER_USER: &str = "system:konnectivity-server";
const TEST_TIMEOUT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Simulated agent `i`'s node and address, as the bench names them (`fleet::identity`).
fn node(i: usize) -> (String, String) {
    let n = u32::try_from(i + 1).unwrap();
    let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + n);
    (format!("node-{i:05}"), ip.to_string())
}

/// Nodes `node-00000`.. with their addresses, and an agent pod on each.
fn nodes_and_pods(cp: &ControlPlane, dir: &Path, agents: usize) {
    let mut nodes = String::from("apiVersion: v1\nkind: List\nitems:\n");
    let mut pods = nodes.clone();
    for i in 0..agents {
        let (name, ip) = node(i);
        nodes.push_str(&format!(
            "- apiVersion: v1\n  kind: Node\n  metadata: {{name: {name}}}\n  status:\n    addresses: [{{type: InternalIP, address: \"{ip}\"}}]\n"
        ));
        pods.push_str(&format!(
            "- apiVersion: v1\n  kind: Pod\n  metadata: {{name: agent-{i:05}, namespace: {NAMESPACE}}}\n  spec:\n    nodeName: {name}\n    serviceAccountName: {ACCOUNT}\n    automountServiceAccountToken: false\n    containers: [{{name: agent, image: bridgehead.invalid/agent}}]\n"
        ));
    }
    let (nodes_file, pods_file) = (dir.join("nodes.yaml"), dir.join("pods.yaml"));
    std::fs::write(&nodes_file, nodes).unwrap();
    std::fs::write(&pods_file, pods).unwrap();
    let nodes_file = nodes_file.display().to_string();
    cp.kubectl_ok(&["apply", "-f", &nodes_file]).unwrap();
    // A Node's status is its own subresource: the addresses go in with a second write.
    cp.kubectl_ok(&["replace", "--subresource=status", "-f", &nodes_file])
        .unwrap();
    cp.kubectl_ok(&["apply", "-f", &pods_file.display().to_string()])
        .unwrap();
}

#[test]
fn a_fleet_with_pod_bound_tokens_comes_back_without_asking_kube_apiserver() {
    let test = "a_fleet_with_pod_bound_tokens_comes_back_without_asking_kube_apiserver";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    let bench = bridgehead_e2e::process::bin_dir().join("bench");
    if !bench.exists() {
        return bridgehead_e2e::skip::skip(test, "the bench is not built (cargo build --bins)");
    }
    let agents: usize = std::env::var("BRIDGEHEAD_FLEET_AGENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    netns::with_net(test, 1, TEST_TIMEOUT, move |mut net| {
        let cp = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
        for manifest in ["deploy/rbac/server.yaml", "deploy/rbac/agent.yaml"] {
            let path = repo().join(manifest);
            cp.kubectl_ok(&["apply", "-f", &path.display().to_string()])
                .unwrap();
        }
        let kubeconfig = cp.kubeconfig_for(SERVER_USER, &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        nodes_and_pods(&cp, dir.path(), agents);
        let tokens: Vec<String> = (0..agents)
            .map(|i| {
                cp.token(
                    NAMESPACE,
                    ACCOUNT,
                    AUDIENCE,
                    3600,
                    Some(&format!("agent-{i:05}")),
                )
                .unwrap()
            })
            .collect();
        let token_file = dir.path().join("tokens");
        std::fs::write(&token_file, tokens.join("\n") + "\n").unwrap();

        let reviews = cp.requests("tokenreviews", "POST").unwrap();
        let node_gets = cp.requests("nodes", "GET").unwrap();
        let out = dir.path().join("bench");
        let run = Command::new(&bench)
            .args(["--quick", "--only", "fleet", "--fleet-auth", "token"])
            .arg(format!("--agents={agents}"))
            .arg(format!("--fleet-tokens={}", token_file.display()))
            .arg(format!("--out-dir={}", out.display()))
            .args([
                format!("--server-arg=--agent-namespace={NAMESPACE}"),
                format!("--server-arg=--agent-service-account={ACCOUNT}"),
                format!("--server-arg=--authentication-audience={AUDIENCE}"),
                format!("--server-arg=--kubeconfig={}", kubeconfig.display()),
                "--server-arg=--bind-agent-identifiers".to_owned(),
            ])
            .output()
            .unwrap();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(run.status.success(), "{printed}");
        let results = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
        let restarts: Vec<serde_json::Value> = results
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|row| row["measurement"] == "fleet_restart")
            .collect();
        assert_eq!(restarts.len(), 2, "{printed}");
        for restart in &restarts {
            assert_eq!(restart["connected"], agents, "{restart}\n{printed}");
            assert!(restart["error"].is_null(), "{restart}");
        }
        assert_eq!(
            cp.requests("tokenreviews", "POST").unwrap(),
            reviews,
            "agents cost TokenReviews:\n{printed}"
        );
        assert_eq!(
            cp.requests("nodes", "GET").unwrap(),
            node_gets,
            "agents cost Node GETs:\n{printed}"
        );
    });
}
