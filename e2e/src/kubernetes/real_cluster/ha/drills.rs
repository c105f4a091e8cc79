//! What the drills of an HA cluster do to it (issue 50): take a control-plane node's
//! kube-apiserver out of the load balancer and back (haproxy's runtime API, as an operator
//! drains a backend before a planned restart), stop and start it as kubelet would its static
//! pod, and lose a whole control-plane node at once (its kube-apiserver, its kubelet and the
//! server its kubelet runs, SIGKILLed together) and bring it back.

use std::time::Duration;

use anyhow::{bail, Context};

use super::RealCluster;
use crate::haproxy::{Haproxy, ServerState};
use crate::kubernetes::node_host::NodeHost;

/// The balancer's frontend in front of the kube-apiservers (its backends in host order).
const APISERVERS: &str = "apiservers";
/// The balancer's frontend in front of the servers' agent ports (its backends in host order).
const AGENTS: &str = "agents";
/// deploy/server-static-pod's container.
const SERVER_CONTAINER: &str = "konnectivity-server-container";

impl RealCluster {
    fn balancer(&self) -> anyhow::Result<&Haproxy> {
        Ok(&self
            .endpoint
            .as_ref()
            .context("not an HA cluster: no load balancer")?
            .haproxy)
    }

    /// Sets control-plane host `host`'s kube-apiserver to `state` in the load balancer.
    pub fn balance_apiserver(&self, host: usize, state: ServerState) -> anyhow::Result<()> {
        self.balancer()?.set_state(APISERVERS, host, state)
    }

    /// Sets control-plane host `host`'s server (its agent port) to `state` in the load
    /// balancer: drained, agents' new sessions go to the other servers.
    pub fn balance_agent_port(&self, host: usize, state: ServerState) -> anyhow::Result<()> {
        self.balancer()?.set_state(AGENTS, host, state)
    }

    /// Stops host `host`'s kube-apiserver (SIGTERM, SIGKILL after `grace`, as kubelet stops a
    /// static pod); how long it took to exit.
    pub fn stop_apiserver_of(&mut self, host: usize, grace: Duration) -> anyhow::Result<Duration> {
        Ok(match host {
            0 => self.control_plane.stop_own_apiserver(grace),
            _ => self.other(host)?.apiserver.stop(grace),
        })
    }

    /// SIGKILLs host `host`'s kube-apiserver.
    pub fn kill_apiserver_of(&mut self, host: usize) -> anyhow::Result<()> {
        match host {
            0 => self.control_plane.kill_apiserver(),
            _ => self.other(host)?.apiserver.process.kill(),
        }
        Ok(())
    }

    /// Starts host `host`'s kube-apiserver again with its flags and waits until it is ready at
    /// its own address.
    pub fn start_apiserver_of(&mut self, host: usize) -> anyhow::Result<()> {
        if host == 0 {
            let own = self
                .endpoint
                .as_ref()
                .context("not an HA cluster")?
                .first_apiserver
                .clone();
            return self.control_plane.start_own_apiserver_again(&own);
        }
        let index = host.checked_sub(1).context("no such host")?;
        let other = self.others.get_mut(index).context("no such host")?;
        self.control_plane.start_again(&mut other.apiserver)
    }

    /// Loses control-plane node `host` at once: its kube-apiserver, its kubelet and the
    /// server its kubelet runs, each SIGKILLed (the kubelet first, so that it restarts no
    /// container). The node's network and containerd stay, as a machine's would across a
    /// crash of its processes... what goes is every process that serves.
    pub fn lose_control_plane_node(&mut self, host: usize) -> anyhow::Result<()> {
        self.kill_apiserver_of(host)?;
        let node = self.control_plane_node_mut(host)?;
        node.kill_kubelet();
        kill_container(node, SERVER_CONTAINER)
    }

    /// Brings node `host` back after [`RealCluster::lose_control_plane_node`]: its kubelet
    /// (which starts the server's static pod again) and its kube-apiserver, ready.
    pub fn bring_back_control_plane_node(&mut self, host: usize) -> anyhow::Result<()> {
        self.control_plane_node_mut(host)?.start_kubelet()?;
        self.start_apiserver_of(host)
    }

    fn other(&mut self, host: usize) -> anyhow::Result<&mut super::ControlPlaneNode> {
        let index = host.checked_sub(1).context("no such host")?;
        self.others.get_mut(index).context("no such host")
    }

    fn control_plane_node_mut(&mut self, host: usize) -> anyhow::Result<&mut NodeHost> {
        Ok(match host {
            0 => &mut self.control_plane_node,
            _ => &mut self.other(host)?.node,
        })
    }
}

/// SIGKILLs the task of every container named `name` on `node` (`ctr tasks kill`).
fn kill_container(node: &NodeHost, name: &str) -> anyhow::Result<()> {
    let filter = format!("labels.\"io.kubernetes.container.name\"=={name}");
    let out = node.ctr(&["containers", "ls", "-q", &filter])?;
    let ids = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || ids.trim().is_empty() {
        bail!(
            "no {name} container on {}: {}",
            node.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut killed = 0;
    for id in ids.split_whitespace() {
        // A container whose task already exited has nothing to kill.
        let out = node.ctr(&["tasks", "kill", "--signal", "SIGKILL", id])?;
        if out.status.success() {
            killed += 1;
        }
    }
    if killed == 0 {
        bail!("no running {name} task on {}", node.name);
    }
    Ok(())
}

/// The server's health port on each control-plane node (deploy/server-static-pod).
pub(super) const SERVER_HEALTH_PORT: u16 = 8134;

impl RealCluster {
    /// Waits (bounded poll: the servers' metrics are what tells) until every control-plane
    /// node's server sees every other as a peer and holds a session with every node's agent;
    /// how long that took. At most `within`.
    pub fn wait_servers_settled(&self, within: Duration) -> anyhow::Result<Duration> {
        let servers = 1 + self.others.len();
        let agents = (servers + self.workers.len()) as f64;
        let peers = (servers - 1) as f64;
        let started = std::time::Instant::now();
        loop {
            let seen: Vec<(f64, f64)> = (0..servers)
                .map(|host| {
                    let metrics = self
                        .host_get(host, SERVER_HEALTH_PORT, "/metrics")
                        .unwrap_or_default();
                    (
                        crate::kubernetes::real_cluster::metric_sum(
                            &metrics,
                            "bridgehead_server_peers_connected",
                            &[],
                        ),
                        crate::kubernetes::real_cluster::metric_sum(
                            &metrics,
                            "bridgehead_server_agents_connected",
                            &[],
                        ),
                    )
                })
                .collect();
            if seen.iter().all(|&(p, a)| p == peers && a == agents) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > within {
                bail!(
                    "servers (peers, agents): {seen:?}, want ({peers}, {agents}) each\n{}",
                    self.describe_pods("kube-system")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The rules that cut a worker from everything past its link (`eth0`, towards the first
/// control-plane node): its own traffic and its pods' (forwarded), both ways. Dropped, not
/// refused: a partition, which only keepalives notice.
const CUT: [&[&str]; 4] = [
    &["INPUT", "-i", "eth0", "-j", "DROP"],
    &["OUTPUT", "-o", "eth0", "-j", "DROP"],
    &["FORWARD", "-i", "eth0", "-j", "DROP"],
    &["FORWARD", "-o", "eth0", "-j", "DROP"],
];

impl RealCluster {
    /// Cuts worker `index` (from 0) from the control plane (`cut`), or heals it.
    pub fn cut_worker(&self, index: usize, cut: bool) -> anyhow::Result<()> {
        let worker = self.workers.get(index).context("no such worker")?;
        for rule in CUT {
            let mut command = vec!["iptables", if cut { "-I" } else { "-D" }];
            command.extend_from_slice(rule);
            let out = worker.run(&command)?;
            if !out.status.success() {
                bail!(
                    "{command:?} on {}: {}",
                    worker.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(())
    }
}
