//! Agents on their nodes' network (deploy/agent-host-network, docs/install.md "Agents on the
//! host network"), installed over the running DaemonSet as an operator would: one per worker,
//! each pod's address its node's, its health port on the node (8093: the server's static pod
//! holds 8134 on control-plane nodes); every server holds them; `kubectl logs` and `exec` into
//! a pod on each worker and kube-apiserver's proxy to each pod's IP go through them, counted by
//! the servers. Then the point of the shape: a worker loses its pod network, as a node whose
//! CNI is not installed yet, and an agent started there on the host network carries
//! kube-apiserver's traffic to its kubelet all the same.

use std::time::Instant;

use bridgehead_e2e::kubernetes::agent_shapes::{self, AgentPod, PodNetworkOff};
use bridgehead_e2e::kubernetes::real_cluster::{
    metric_sum, RealCluster, AGENT_ENDPOINT_PORT, POD_READY,
};
use bridgehead_e2e::kubernetes::workload;

use super::{carried, logs_and_exec, servers_peer_and_hold, CONTROL_PLANES, SETTLE};

/// The agents' health port on the host network (deploy/agent-host-network).
const AGENT_HEALTH_PORT: u16 = 8093;

/// What the test adds to deploy/agent-host-network. The agents on the workers only, as on
/// k0s, whose controllers run no kubelet by default. Here because of the fixture: its
/// control-plane hosts are kube-apiserver's own network namespaces, which reach no worker's
/// kubelet or pod by design, so an agent on their host network could not either, and
/// `default` would hand it pod-IP tunnels at random. (A real control-plane node routes to
/// pods, and deploy/agent-host-network tolerates its taint.) And every agent replaced at once:
/// the test's time, not a procedure to follow (an operator keeps deploy/agent's 10%).
const TEST_PATCH: &str = "    - op: add\n      path: /spec/template/spec/affinity\n      value:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            nodeSelectorTerms:\n            - matchExpressions:\n              - key: node-role.kubernetes.io/control-plane\n                operator: DoesNotExist\n    - op: replace\n      path: /spec/updateStrategy/rollingUpdate/maxUnavailable\n      value: 100%\n";

/// The whole step; `pods` are the test's pods, one per worker, serving `ok` on 8080.
pub(super) fn agents_on_the_host_network(cluster: &RealCluster, pods: &[(String, String)]) {
    let started = Instant::now();
    let cp = &cluster.control_plane;
    cluster
        .install_agents_from(
            "agent-host-network",
            &[&format!("--proxy-server-port={AGENT_ENDPOINT_PORT}")],
            TEST_PATCH,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let workers = cluster.workers.len();
    let agents =
        agent_shapes::wait_for_agents(cluster, SETTLE, "one Ready agent per worker", |agents| {
            agents.len() == workers && agents.iter().all(|a| a.ready && !a.deleting)
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    for worker in &cluster.workers {
        let agent = on(&agents, &worker.name);
        assert!(agent.host_network, "{agent:?}");
        assert_eq!(agent.pod_ip, worker.node_ip.to_string(), "{agent:?}");
        assert_eq!(agent.host_ip, agent.pod_ip, "{agent:?}");
        let ready = worker
            .run(&[
                "curl",
                "-sS",
                "--max-time",
                "10",
                &format!("http://{}:{AGENT_HEALTH_PORT}/readyz", worker.node_ip),
            ])
            .unwrap();
        assert!(
            ready.status.success(),
            "the agent's /readyz on {}'s {AGENT_HEALTH_PORT}: {}",
            worker.name,
            String::from_utf8_lossy(&ready.stderr)
        );
    }
    servers_peer_and_hold(cluster, workers);
    let installed = started.elapsed();

    // Through the balancer: the kubelets (destHost: each node's own agent), and each pod's IP
    // (kube-apiserver's pod proxy; `default`: either worker's agent, both route to every pod).
    let before = carried_by_all(cluster);
    for (pod, _) in pods {
        logs_and_exec(cluster, &cp.kubeconfig, pod);
        let body = cp
            .kubectl_ok(&[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/pods/{pod}:8080/proxy/"),
            ])
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(body, "ok\n", "{pod}'s IP through kube-apiserver's proxy");
    }
    let after = carried_by_all(cluster);
    assert!(
        after >= before + 3.0 * pods.len() as f64,
        "the servers carried {} tunnels for {} logs, execs and pod-IP proxies",
        after - before,
        3 * pods.len()
    );
    eprintln!(
        "agents on the host network: installed and held by every server after {installed:?}, checked after {:?}",
        started.elapsed()
    );
    without_a_pod_network(cluster, pods, &agents);
}

/// The last worker loses its pod network ([`PodNetworkOff`]): its Node goes NotReady, and a
/// pod on the pod network cannot start there (kubelet's `NetworkNotReady`). Its agent pod is
/// deleted; the DaemonSet's replacement starts there now, on the host network, Ready, and
/// every server holds it. `kubectl exec` and `logs` into the worker's pod (still running, it
/// keeps the network it had) go through that new agent: its own dial counter, read on the
/// node's port, counts them.
fn without_a_pod_network(cluster: &RealCluster, pods: &[(String, String)], agents: &[AgentPod]) {
    let started = Instant::now();
    let cp = &cluster.control_plane;
    let worker = cluster.workers.last().expect("a worker");
    let (pod, _) = pods
        .iter()
        .find(|(_, node)| *node == worker.name)
        .expect("a pod on the last worker");
    let off = PodNetworkOff::take(worker).unwrap_or_else(|e| panic!("{e:#}"));
    // Bounded polls below: kubelet reports the runtime's network state in its next node
    // status (10 s), and nothing says when.
    let not_ready = loop {
        let (status, message) = agent_shapes::node_ready(cluster, &worker.name).unwrap();
        if status == "False" && message.contains("network") {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < SETTLE,
            "{} still {status} ({message}) without its CNI configuration",
            worker.name
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    cp.apply(&workload::busybox_pods(
        &[("no-pod-network", &worker.name, "exec sleep 3600")],
        false,
    ))
    .unwrap();
    let refused = Instant::now();
    loop {
        let events = cp
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                "involvedObject.name=no-pod-network,reason=NetworkNotReady",
                "-o",
                "name",
            ])
            .unwrap();
        if !events.trim().is_empty() {
            break;
        }
        assert!(
            refused.elapsed() < SETTLE,
            "no NetworkNotReady for a pod on {}\n{}",
            worker.name,
            cluster.describe_pods("default")
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    let refused = refused.elapsed();
    let old = on(agents, &worker.name).name.clone();
    let deleted = Instant::now();
    cp.kubectl_ok(&["delete", "pod", "-n", "kube-system", &old, "--wait=false"])
        .unwrap();
    let replaced = agent_shapes::wait_for_agents(
        cluster,
        POD_READY,
        "the agent started again on the worker without a pod network",
        |agents| {
            agents.iter().all(|a| a.name != old)
                && agents
                    .iter()
                    .any(|a| a.node == worker.name && a.ready && a.host_network)
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let new = on(&replaced, &worker.name).name.clone();
    let ready = deleted.elapsed();
    let (status, _) = agent_shapes::node_ready(cluster, &worker.name).unwrap();
    assert_eq!(status, "False", "{} got its pod network back", worker.name);
    servers_peer_and_hold(cluster, cluster.workers.len());
    let held = deleted.elapsed();

    let dials = || {
        let metrics = worker
            .run(&[
                "curl",
                "-sS",
                "--max-time",
                "10",
                &format!("http://{}:{AGENT_HEALTH_PORT}/metrics", worker.node_ip),
            ])
            .unwrap();
        metric_sum(
            &String::from_utf8_lossy(&metrics.stdout),
            "bridgehead_agent_dials_total",
            &["result=\"ok\""],
        )
    };
    let before = dials();
    logs_and_exec(cluster, &cp.kubeconfig, pod);
    let after = dials();
    assert!(
        after >= before + 2.0,
        "{new} on {} dialed {} tunnels for a logs and an exec",
        worker.name,
        after - before
    );
    drop(off);
    cp.kubectl_ok(&["delete", "pod", "no-pod-network", "--wait=false"])
        .unwrap();
    eprintln!(
        "{} without a pod network: NotReady after {not_ready:?}, a pod refused {refused:?} later; its agent deleted, the new one {new} Ready after {ready:?}, held by every server after {held:?}, carrying exec and logs; {:?} in all",
        worker.name,
        started.elapsed()
    );
}

/// The agent on `node` among `agents`.
fn on<'a>(agents: &'a [AgentPod], node: &str) -> &'a AgentPod {
    agents
        .iter()
        .find(|agent| agent.node == node)
        .unwrap_or_else(|| panic!("no agent on {node}: {agents:#?}"))
}

/// Tunnels every server opened or forwarded.
fn carried_by_all(cluster: &RealCluster) -> f64 {
    (0..CONTROL_PLANES).map(|host| carried(cluster, host)).sum()
}
