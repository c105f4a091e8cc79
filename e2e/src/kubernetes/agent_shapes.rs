//! The agents' shapes other than deploy/agent's DaemonSet on the pod network, on a real
//! cluster: which agent pod runs where and on which network ([`agent_pods`]), a Node's `Ready`
//! condition, and a worker whose pod network is taken away ([`PodNetworkOff`]: its CNI
//! configuration moved out of containerd's sight, as on a node whose CNI is not installed
//! yet). What each shape must carry is checked by the tests that install it:
//! e2e/tests/ha_cluster.rs (deploy/agent-host-network) and e2e/tests/chart.rs (the chart's
//! Deployment).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::node_host::NodeHost;
use super::real_cluster::RealCluster;

/// The label every agent pod carries (deploy/agent, the chart).
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=bridgehead-agent";

/// An agent pod, as kube-apiserver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    pub name: String,
    /// Empty while it is not scheduled.
    pub node: String,
    pub host_network: bool,
    pub pod_ip: String,
    pub host_ip: String,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// It has a deletion timestamp (terminating).
    pub deleting: bool,
}

/// Every agent pod in kube-system.
pub fn agent_pods(cluster: &RealCluster) -> anyhow::Result<Vec<AgentPod>> {
    // `|` between fields: an unset one (hostNetwork, podIP) is empty.
    let out = cluster.control_plane.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        AGENT_LABEL,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}|{.spec.nodeName}|{.spec.hostNetwork}|{.status.podIP}|{.status.hostIP}|{.status.conditions[?(@.type==\"Ready\")].status}|{.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ])?;
    out.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            let [name, node, host_network, pod_ip, host_ip, ready, deleting] = fields[..] else {
                bail!("an agent pod as {line:?}");
            };
            Ok(AgentPod {
                name: name.to_owned(),
                node: node.to_owned(),
                host_network: host_network == "true",
                pod_ip: pod_ip.to_owned(),
                host_ip: host_ip.to_owned(),
                ready: ready == "True",
                deleting: !deleting.is_empty(),
            })
        })
        .collect()
}

/// The agent pods once `holds` holds for them, at most `within` (a bounded poll: nothing tells
/// the test when a controller, the scheduler and kubelet are done).
pub fn wait_for_agents(
    cluster: &RealCluster,
    within: Duration,
    what: &str,
    holds: impl Fn(&[AgentPod]) -> bool,
) -> anyhow::Result<Vec<AgentPod>> {
    let started = Instant::now();
    loop {
        let agents = agent_pods(cluster)?;
        if holds(&agents) {
            return Ok(agents);
        }
        if started.elapsed() > within {
            bail!(
                "{what}: not within {within:?}: {agents:#?}\n{}",
                cluster.describe_pods("kube-system")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Node `node`'s `Ready` condition: its status (`True`, `False`, `Unknown`) and message.
pub fn node_ready(cluster: &RealCluster, node: &str) -> anyhow::Result<(String, String)> {
    let out = cluster.control_plane.kubectl_ok(&[
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}|{.status.conditions[?(@.type==\"Ready\")].message}",
    ])?;
    let (status, message) = out
        .split_once('|')
        .with_context(|| format!("node {node}'s Ready condition as {out:?}"))?;
    Ok((status.to_owned(), message.to_owned()))
}

/// A worker without its pod network: its CNI configuration moved out of the folder
/// containerd's CRI plugin watches, so the runtime reports `NetworkReady=false` (kubelet then
/// marks the Node NotReady and starts only host-network pods), as on a node whose CNI is not
/// installed yet. Pods already running keep their network. Put back on drop.
#[derive(Debug)]
pub struct PodNetworkOff {
    moved: Vec<(PathBuf, PathBuf)>,
}

impl PodNetworkOff {
    /// Moves every CNI configuration of `worker` aside.
    pub fn take(worker: &NodeHost) -> anyhow::Result<PodNetworkOff> {
        // The node host's containerd reads its CNI configuration from `cni/` in its folder.
        let (folder, aside) = (worker.dir().join("cni"), worker.dir().join("cni-off"));
        std::fs::create_dir_all(&aside)?;
        let mut off = PodNetworkOff { moved: Vec::new() };
        for entry in
            std::fs::read_dir(&folder).with_context(|| format!("reading {}", folder.display()))?
        {
            let from = entry?.path();
            let to = aside.join(from.file_name().context("a file without a name")?);
            std::fs::rename(&from, &to)?;
            off.moved.push((from, to));
        }
        if off.moved.is_empty() {
            bail!("{} holds no CNI configuration", folder.display());
        }
        Ok(off)
    }
}

impl Drop for PodNetworkOff {
    fn drop(&mut self) {
        for (back, aside) in &self.moved {
            let _ = std::fs::rename(aside, back);
        }
    }
}
