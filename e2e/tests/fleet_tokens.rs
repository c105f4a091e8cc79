//! A fleet with pod-bound tokens against the real kube-apiserver: the bench's fleet in token
//! mode (`bench --only fleet --fleet-auth token`, built with the workspace) starts the
//! control-plane fixture, makes a Node, an agent Pod on it and a pod-bound token from
//! TokenRequest for each of N simulated agents, and runs a server with token authentication
//! (local verification, the default), `--bind-agent-identifiers` and deploy/rbac's
//! permissions; through a SIGKILL and a SIGTERM restart every agent comes back, and neither
//! the server's own request counter nor kube-apiserver's counts a TokenReview or a Node GET.
//! N is 200 here (`BRIDGEHEAD_FLEET_AGENTS` for more); the same rows at 10,000 are the
//! bench's. Needs root, `scripts/k8s-build.sh` and the bench binary.

use std::process::Command;
use std::time::Duration;

use bridgehead_e2e::kubernetes;

const TEST_TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn a_fleet_with_pod_bound_tokens_comes_back_without_asking_kube_apiserver() {
    let test = "a_fleet_with_pod_bound_tokens_comes_back_without_asking_kube_apiserver";
    if kubernetes::require(test).is_none() {
        return;
    }
    let bench = bridgehead_e2e::process::bin_dir().join("bench");
    if !bench.exists() {
        return bridgehead_e2e::skip::skip(test, "the bench is not built (cargo build --bins)");
    }
    let agents: usize = std::env::var("BRIDGEHEAD_FLEET_AGENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let out = tempfile::tempdir().unwrap();
    let mut command = Command::new(&bench);
    command
        .args(["--quick", "--only", "fleet", "--fleet-auth", "token"])
        .arg(format!("--agents={agents}"))
        .arg(format!("--out-dir={}", out.path().display()));
    let run = bridgehead_e2e::process::output_within(command, TEST_TIMEOUT)
        .unwrap_or_else(|e| panic!("the bench: {e:#}"));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{printed}");
    let results = std::fs::read_to_string(out.path().join("results.jsonl")).unwrap();
    let rows = |measurement: &str| -> Vec<serde_json::Value> {
        results
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|row| row["measurement"] == measurement)
            .collect()
    };
    let restarts = rows("fleet_restart");
    assert_eq!(restarts.len(), 2, "{printed}");
    for restart in &restarts {
        assert_eq!(restart["connected"], agents, "{restart}\n{printed}");
        assert!(restart["error"].is_null(), "{restart}");
    }
    let requests = rows("fleet_kube_requests");
    assert_eq!(requests.len(), 2, "{printed}");
    for storm in &requests {
        // By the server's own count: no TokenReview, no Node GET...
        assert_eq!(storm["per_agent_kinds"], 0, "{storm}\n{printed}");
        // ...and by kube-apiserver's.
        let apiserver = storm["apiserver_per_agent_kinds"].as_array().unwrap();
        assert!(
            apiserver.iter().all(|n| n.as_f64() == Some(0.0)),
            "kube-apiserver counted per-agent requests: {storm}\n{printed}"
        );
        // Discovery, lists and watches: a handful, not one per agent.
        let total = storm["total"].as_u64().unwrap();
        assert!(
            total > 0 && total < agents as u64,
            "{total} requests to kube-apiserver for {agents} agents: {storm}\n{printed}"
        );
    }
}
