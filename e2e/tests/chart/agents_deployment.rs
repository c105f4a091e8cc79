//! The chart's other agent shapes, run on the release the test installed as a DaemonSet,
//! upgraded as an operator would (`helm upgrade --reuse-values`). First `agent.hostNetwork`
//! (docs/install.md, "Agents on the host network"): an agent per node on its node's network,
//! `kubectl logs` and `exec` into a pod on each worker counted by the server. Then agents as a
//! Deployment (docs/ha.md, "Agents as a Deployment"): with one agent for three nodes, `kubectl logs` and `exec` into a pod on
//! each worker that has no agent go through the agent on another node (the chart's
//! `--proxy-strategies=destHost,default`: no agent claims that node, `default` takes any),
//! counted by the server. Then two agents and their PodDisruptionBudget (`maxUnavailable:
//! 1`): every node cordoned, both agents evicted as `kubectl drain` evicts them: one is let
//! go, the other refused by the budget (the first one's replacement has nowhere to go), and
//! `kubectl exec` into both workers' pods never fails while the evicted agent drains.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::agent_shapes;
use bridgehead_e2e::kubernetes::carried;
use bridgehead_e2e::kubernetes::real_cluster::{metric_sum, RealCluster, POD_READY};
use bridgehead_e2e::kubernetes::workload;

/// How long the agents may take to be what a step asks (a rollout, the server's sessions).
const SETTLE: Duration = Duration::from_secs(90);
/// How long `kubectl exec` goes on after the eviction, while the evicted agent drains.
const DURING: Duration = Duration::from_secs(10);
/// What each test pod logs before it sleeps.
const LOG_LINES: &str = "log line 1\nlog line 2\n";

/// The whole step.
pub(super) fn agents_as_a_deployment(cluster: &RealCluster, helm: &Path) {
    let started = Instant::now();
    let cp = &cluster.control_plane;
    let pods: Vec<(String, String)> = cluster
        .workers
        .iter()
        .enumerate()
        .map(|(i, worker)| (format!("shape-{}", i + 1), worker.name.clone()))
        .collect();
    let script = "echo log line 1; echo log line 2; exec sleep 3600";
    cp.apply(&workload::busybox_pods(
        &pods
            .iter()
            .map(|(pod, node)| (pod.as_str(), node.as_str(), script))
            .collect::<Vec<_>>(),
        false,
    ))
    .unwrap();
    let mut wait = vec![
        "wait".to_owned(),
        "--for=condition=Ready".to_owned(),
        format!("--timeout={}s", POD_READY.as_secs()),
    ];
    wait.extend(pods.iter().map(|(pod, _)| format!("pod/{pod}")));
    cp.kubectl_ok(&wait.iter().map(String::as_str).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("default")));

    // The chart's agent.hostNetwork first (deploy/agent-host-network's shape, which
    // e2e/tests/ha_cluster.rs runs further): an agent per node on the node's network, the
    // control-plane node's beside the server's DaemonSet (which holds 8133 and 8134 there),
    // carrying `kubectl logs` and `exec` into both workers.
    // Every agent replaced at once: the test's time (an operator keeps the chart's 10%).
    upgrade(
        cluster,
        helm,
        &["agent.hostNetwork=true", "agent.rollingMaxUnavailable=100%"],
    );
    let agents = agents_settle(cluster, 1 + cluster.workers.len());
    for agent in &agents {
        assert!(
            agent.host_network && agent.pod_ip == agent.host_ip,
            "{agent:?}"
        );
    }
    for (pod, node) in &pods {
        let before = carried::tunnels(cluster).unwrap();
        logs_and_exec(cluster, pod).unwrap_or_else(|e| panic!("{e:#}"));
        let after = carried::tunnels(cluster).unwrap();
        assert!(
            after >= before + 2.0,
            "{pod} on {node}, agents on the host network: {} tunnels for a logs and an exec",
            after - before
        );
    }
    let host_network = started.elapsed();

    upgrade(
        cluster,
        helm,
        &[
            "agent.kind=Deployment",
            "agent.replicas=1",
            "agent.hostNetwork=false",
        ],
    );
    let agents = agents_settle(cluster, 1);
    let with_agent = &agents[0].node;
    let without: Vec<&(String, String)> =
        pods.iter().filter(|(_, node)| node != with_agent).collect();
    assert!(!without.is_empty(), "an agent on every worker: {agents:#?}");
    for (pod, node) in without {
        let before = carried::tunnels(cluster).unwrap();
        logs_and_exec(cluster, pod).unwrap_or_else(|e| panic!("{e:#}"));
        let after = carried::tunnels(cluster).unwrap();
        assert!(
            after >= before + 2.0,
            "{pod} on {node} (the agent on {with_agent}): {} tunnels for a logs and an exec",
            after - before
        );
    }
    let one = started.elapsed();

    upgrade(cluster, helm, &["agent.replicas=2"]);
    let agents = agents_settle(cluster, 2);
    // The disruption controller's count, which the evictions are checked against: one of two
    // (bounded poll: it recounts when the pods change, and nothing says when).
    let started_budget = Instant::now();
    loop {
        let allowed = cp
            .kubectl_ok(&[
                "get",
                "poddisruptionbudget",
                "-n",
                "kube-system",
                "bridgehead-agent",
                "-o",
                "jsonpath={.status.disruptionsAllowed}",
            ])
            .unwrap();
        if allowed == "1" {
            break;
        }
        assert!(
            started_budget.elapsed() < SETTLE,
            "the agents' PodDisruptionBudget allows {allowed:?} disruptions, not 1"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let nodes = cp
        .kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"])
        .unwrap();
    for node in nodes.split_whitespace() {
        cp.kubectl_ok(&["cordon", node]).unwrap();
    }
    // Both agents evicted as `kubectl drain` evicts (the Eviction API, which is where the
    // budget is enforced): the first is let go, the second refused while the first one's
    // replacement has no node to go to. (Not `kubectl drain` itself: it then waits for the
    // evicted pod to be gone, and an evicted agent took more than 60 s to go here.)
    let evicted = Instant::now();
    let evict = |pod: &str| {
        cp.kubectl_as(
            &cp.kubeconfig,
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/kube-system/pods/{pod}/eviction"),
                "-f",
                "-",
            ],
            Some(&format!(
                "{{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{{\"name\":\"{pod}\",\"namespace\":\"kube-system\"}}}}"
            )),
        )
        .unwrap()
    };
    let first = evict(&agents[0].name);
    assert!(
        first.status.success(),
        "evicting {}: {}",
        agents[0].name,
        String::from_utf8_lossy(&first.stderr)
    );
    let second = evict(&agents[1].name);
    let refused = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && refused.contains("disruption budget"),
        "evicting {} after {}: {refused}",
        agents[1].name,
        agents[0].name
    );
    // `kubectl exec` into both workers' pods while the evicted agent drains.
    let (mut ok, mut failures) = (0, Vec::new());
    while evicted.elapsed() < DURING {
        for (pod, _) in &pods {
            match exec(cluster, pod) {
                Ok(()) => ok += 1,
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
    }
    assert!(
        failures.is_empty() && ok > 0,
        "{} of {} execs failed while an agent drained: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );
    // One agent evicted, its replacement Pending (every node cordoned); the other kept.
    let left = agent_shapes::agent_pods(cluster).unwrap();
    assert_eq!(
        left.iter()
            .filter(|agent| agent.ready && !agent.deleting)
            .count(),
        1,
        "{left:#?}"
    );
    assert!(
        left.iter().any(|agent| agent.node.is_empty()),
        "no replacement waiting for a node: {left:#?}"
    );
    for node in nodes.split_whitespace() {
        cp.kubectl_ok(&["uncordon", node]).unwrap();
    }
    eprintln!(
        "agents on the host network (the chart's) after {host_network:?}; as a Deployment: one agent carried the nodes without one after {one:?}; of two agents, the budget let one be evicted and kept the other, {ok} execs meanwhile failed none; {:?} in all",
        started.elapsed()
    );
}

/// `helm upgrade --reuse-values --wait` of the release with `values` (`--set` each).
fn upgrade(cluster: &RealCluster, helm: &Path, values: &[&str]) {
    let chart = super::chart().display().to_string();
    let mut args = vec![
        "upgrade",
        "bridgehead",
        chart.as_str(),
        "--namespace",
        "kube-system",
        "--reuse-values",
        "--wait",
        "--timeout=3m",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    let out = Command::new(helm)
        .args(&args)
        .env("KUBECONFIG", &cluster.control_plane.kubeconfig)
        .env("HOME", cluster.control_plane.dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm upgrade {values:?}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cluster.describe_pods("kube-system")
    );
}

/// Waits until `replicas` agents are Ready on as many nodes, none other left (the
/// DaemonSet's or a scaled-down Deployment's terminating), and the server holds exactly them.
fn agents_settle(cluster: &RealCluster, replicas: usize) -> Vec<agent_shapes::AgentPod> {
    let agents =
        agent_shapes::wait_for_agents(cluster, SETTLE, "the Deployment's agents", |agents| {
            let mut nodes: Vec<&str> = agents.iter().map(|agent| agent.node.as_str()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            agents.len() == replicas
                && nodes.len() == replicas
                && agents.iter().all(|agent| agent.ready && !agent.deleting)
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    // Bounded poll: an agent is Ready once it holds a session, the old ones' sessions end as
    // they exit.
    let started = Instant::now();
    loop {
        let metrics = cluster.server_health("/metrics").unwrap();
        let held = metric_sum(&metrics, "bridgehead_server_agents_connected", &[]);
        if held == replicas as f64 {
            return agents;
        }
        assert!(
            started.elapsed() < SETTLE,
            "the server holds {held} agents, not {replicas}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `kubectl logs` and `exec` into `pod`.
fn logs_and_exec(cluster: &RealCluster, pod: &str) -> anyhow::Result<()> {
    let logs = cluster.control_plane.kubectl_ok(&["logs", pod])?;
    anyhow::ensure!(logs == LOG_LINES, "kubectl logs {pod}: {logs:?}");
    exec(cluster, pod)
}

/// `kubectl exec` into `pod`: it answers with its name.
fn exec(cluster: &RealCluster, pod: &str) -> anyhow::Result<()> {
    let out = cluster.control_plane.kubectl_ok(&[
        "exec",
        pod,
        "--",
        "sh",
        "-c",
        "echo on $(hostname)",
    ])?;
    anyhow::ensure!(out == format!("on {pod}\n"), "kubectl exec {pod}: {out:?}");
    Ok(())
}
