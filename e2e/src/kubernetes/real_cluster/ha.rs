//! A real cluster with several control-plane nodes behind one endpoint, as a kubeadm HA
//! cluster ("stacked" control plane, haproxy in front) is laid out:
//!
//! - each control-plane node is a test host of its own (a network namespace) running
//!   kube-apiserver as a process (as the single control-plane node does: the static pod
//!   manifest kubeadm would write names an image no node has, and a process keeps the
//!   restarts the drills need in the test's hands) and a node host whose kubelet runs
//!   deploy/server-static-pod's server on that node's Unix socket, the manifest given
//!   `--peer-port` and the flags for Lease-based peering, as docs/ha.md recommends for
//!   static pods (every server writes its peer address on its Lease, dials the others');
//! - one etcd member, on the first control-plane node, shared by every kube-apiserver
//!   (stacked etcd, a member per node, is not done yet); every kube-apiserver with its own
//!   `--advertise-address` and `--endpoint-reconciler-type=lease`;
//! - haproxy on the first control-plane node (kubeadm's HA guide runs it as a static pod on
//!   the control-plane nodes, on a port of its own beside kube-apiserver's 6443): on
//!   [`ENDPOINT_PORT`] in front of every kube-apiserver's 6443 (round robin), the endpoint
//!   every kubeconfig names (admin, kubelets, controllers, the servers'); and on
//!   [`AGENT_ENDPOINT_PORT`] in front of every server's agent port (least connections), where
//!   the agents' DaemonSet points, so each agent holds a session with every server (it counts
//!   them by their Leases) and the servers forward to each other for the moments it does not:
//!   docs/ha.md's "every agent on every server, with forwarding";
//! - the control-plane nodes labelled and tainted as `kubeadm init` and `kubeadm join
//!   --control-plane` mark them; the workers linked to the first control-plane node's
//!   namespace (the one router between node hosts), the other control-plane nodes reaching
//!   the first through the test net and nothing else: no control-plane host reaches a
//!   worker's kubelet or pods (the other nodes' pods, their agents, reach the workers' pods
//!   through the first, as a pod network carries pod to pod; the nodes' own processes are
//!   refused there); and each control-plane node's kubelet refuses what comes over
//!   the test net (the other control-plane nodes), so every kube-apiserver reaches every
//!   kubelet through Bridgehead only. The first node's own pods (its agent, as on the single
//!   control-plane node) sit on a bridge in kube-apiserver's namespace: the taint keeps every
//!   other pod off it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{
    deploy, install_server_files, publish, pulled_from, static_pod_manifest, RealCluster, SOCKET,
};
use crate::haproxy::{Balance, Frontend, Haproxy};
use crate::kubernetes::addons::{self, AddonImages, CLUSTER_DNS};
use crate::kubernetes::control_plane::{Apiserver, APISERVER_PORT};
use crate::kubernetes::controllers::Controllers;
use crate::kubernetes::images::Images;
use crate::kubernetes::node_host::{Network, NodeHost, NodeOptions};
use crate::kubernetes::{Binaries, ControlPlane, Egress};
use crate::netns::{ip, TestNet};

mod drills;
mod peering;
mod upgrade;
pub use peering::PEER_PORT;
use peering::{install_peer_files, with_peering};
pub use upgrade::{next_version, ReleaseImage};

/// Where the load balancer serves kube-apiserver, on the first control-plane node's address.
pub const ENDPOINT_PORT: u16 = 8443;
/// Where the load balancer serves the servers' agent ports, on the same address.
pub const AGENT_ENDPOINT_PORT: u16 = 18132;
/// The servers' agent port (deploy/server-static-pod's `--agent-port`).
const AGENT_PORT: u16 = 8132;
/// The most control-plane nodes (the node hosts' pod networks have room for six).
const MAX_CONTROL_PLANES: usize = 6;

/// A control-plane node past the first: its kube-apiserver and its node host.
#[derive(Debug)]
pub struct ControlPlaneNode {
    /// The kubelet, with the server's static pod. Dropped before the kube-apiserver.
    pub node: NodeHost,
    /// Its kube-apiserver; [`Apiserver::kubeconfig`] reaches it directly, not through the
    /// load balancer.
    pub apiserver: Apiserver,
    /// Its test host in [`RealCluster::net`].
    pub host: usize,
    /// The node's `/etc/kubernetes`.
    etc_kubernetes: tempfile::TempDir,
}

impl ControlPlaneNode {
    /// The node's `/etc/kubernetes`, seen from the test.
    pub fn etc_kubernetes(&self) -> &Path {
        self.etc_kubernetes.path()
    }
}

/// The load balancer of an HA cluster and what it fronts.
#[derive(Debug)]
pub struct Endpoint {
    pub haproxy: Haproxy,
    /// `https://<first node>:ENDPOINT_PORT`: what every kubeconfig names.
    pub url: String,
    /// A kubeconfig of the first control-plane node's own kube-apiserver (no balancer).
    pub first_apiserver: PathBuf,
}

/// The name of control-plane node `index` (from 0) of an HA cluster.
pub fn control_plane_name(index: usize) -> String {
    format!("control-plane-{}", index + 1)
}

impl RealCluster {
    /// Starts `control_planes` control-plane nodes behind a load balancer (see the module's
    /// doc), `workers` workers and the agents' DaemonSet, and waits until an agent is Ready on
    /// every node. [`RealCluster::control_plane`] is the first node's kube-apiserver and etcd,
    /// its [`ControlPlane::kubeconfig`] pointing at the load balancer;
    /// [`RealCluster::control_plane_node`] the first node; [`RealCluster::others`] the rest.
    pub fn start_ha(
        binaries: &Binaries,
        control_planes: usize,
        workers: u8,
    ) -> anyhow::Result<RealCluster> {
        if !(2..=MAX_CONTROL_PLANES).contains(&control_planes) {
            bail!("an HA cluster has 2 to {MAX_CONTROL_PLANES} control-plane nodes, not {control_planes}");
        }
        let images = Images::get()?;
        let addon_images = AddonImages::get()?;
        let mut net = TestNet::new(control_planes)?;
        // The control-plane nodes reach each other (etcd, peers, the balancer's backends).
        net.route_between_hosts()?;
        let addresses: Vec<Ipv4Addr> = (0..control_planes).map(|i| net.host(i).v4()).collect();
        let mut etcs = Vec::new();
        for _ in 0..control_planes {
            etcs.push(tempfile::Builder::new().prefix("bh-etc-k8s-").tempdir()?);
        }
        let egress = |etc: &tempfile::TempDir| {
            Egress::Uds(
                etc.path()
                    .join(SOCKET.trim_start_matches("/etc/kubernetes/")),
            )
        };
        let mut control_plane = ControlPlane::start_first_of(
            binaries,
            &mut net,
            0,
            egress(&etcs[0]),
            // As kubeadm runs kube-apiserver: kube-proxy's DaemonSet is privileged.
            &["--allow-privileged=true"],
            &addresses[1..],
        )?;
        let mut apiservers = Vec::new();
        for (i, address) in addresses.iter().enumerate().skip(1) {
            net.set_hosts(i, &[])?;
            let ns = net.host(i).ns_name().to_owned();
            apiservers.push(control_plane.add_apiserver_on(&ns, *address, &egress(&etcs[i]))?);
        }
        let first = addresses[0];
        let backends = |port: u16| -> Vec<SocketAddr> {
            addresses
                .iter()
                .map(|address| SocketAddr::from((*address, port)))
                .collect()
        };
        let haproxy = Haproxy::start_in(
            net.host(0).ns_name(),
            &[
                Frontend {
                    name: "apiservers",
                    bind: (first, ENDPOINT_PORT).into(),
                    backends: backends(APISERVER_PORT),
                    balance: Balance::default(),
                    // A kube-apiserver starting again listens before it is ready.
                    ready_check: Some("/readyz"),
                },
                Frontend {
                    name: "agents",
                    bind: (first, AGENT_ENDPOINT_PORT).into(),
                    backends: backends(AGENT_PORT),
                    balance: Balance {
                        least_connections: true,
                        ..Balance::default()
                    },
                    ready_check: None,
                },
            ],
        )?;
        let url = format!("https://{first}:{ENDPOINT_PORT}");
        let first_apiserver = control_plane
            .use_endpoint(&url)
            .context("kube-apiserver through the load balancer")?;

        let (registry, version, trust) = publish(&images, first.into(), net.host(0).ns_name())?;
        let controllers = Controllers::start(&control_plane, &net, 0)?;
        control_plane.kubectl_ok(&["apply", "-k", &deploy().join("rbac").to_string_lossy()])?;
        let manifest = pulled_from(
            &static_pod_manifest(&binaries.kubectl)?,
            &registry,
            &version,
        )?;
        let names: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        let peers = bridgehead_certs::Pki::generate(&names)?;
        let mut nodes = Vec::new();
        for (i, etc) in etcs.iter().enumerate() {
            install_server_files(
                &control_plane,
                etc.path(),
                &with_peering(&manifest, i, addresses[i])?,
            )?;
            install_peer_files(etc.path(), &peers)?;
            // Its kubelet answers its own pods (its agent) and itself, not the other
            // control-plane nodes, where the other kube-apiservers run: they reach it through
            // Bridgehead only, as they reach the workers' kubelets.
            let out = net.run_in(
                i,
                &[
                    "iptables",
                    "-A",
                    "INPUT",
                    "-i",
                    "eth0",
                    "-p",
                    "tcp",
                    "--dport",
                    "10250",
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "tcp-reset",
                ],
            )?;
            if !out.status.success() {
                bail!(
                    "closing {}'s kubelet port: {:?}",
                    control_plane_name(i),
                    out
                );
            }
            if i > 0 {
                // Its pods (an agent) reach the balancer through the node, as the first
                // node's do (whose worker links turn forwarding on there).
                let out = net.run_in(i, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
                if !out.status.success() {
                    bail!("ip_forward on {}: {:?}", control_plane_name(i), out);
                }
            }
            let name = control_plane_name(i);
            nodes.push(NodeHost::start(
                &control_plane,
                &images,
                NodeOptions {
                    name: name.clone(),
                    network: Network::ControlPlane {
                        ns: net.host(i).ns_name().to_owned(),
                        address: addresses[i],
                        index: u8::try_from(i)?,
                    },
                    etc_kubernetes: Some(etc.path().to_owned()),
                    registry: Some(trust.clone()),
                    cluster_dns: Some(CLUSTER_DNS),
                },
            )?);
            addon_images.import(nodes.last().context("no node")?)?;
            // As `kubeadm init`/`join --control-plane` mark the node.
            control_plane.kubectl_ok(&[
                "label",
                "node",
                &name,
                "node-role.kubernetes.io/control-plane=",
            ])?;
            control_plane.kubectl_ok(&[
                "taint",
                "node",
                &name,
                "node-role.kubernetes.io/control-plane:NoSchedule",
            ])?;
        }
        let ns = net.host(0).ns_name().to_owned();
        reach_every_control_plane_node_from_workers(&net)?;
        let test_net = test_net(first);
        let mut worker_hosts = Vec::new();
        for index in 1..=workers {
            let worker = NodeHost::start(
                &control_plane,
                &images,
                NodeOptions {
                    name: format!("worker-{index}"),
                    network: Network::Worker {
                        ns: ns.clone(),
                        index,
                    },
                    etc_kubernetes: None,
                    registry: Some(trust.clone()),
                    cluster_dns: Some(CLUSTER_DNS),
                },
            )?;
            addon_images.import(&worker)?;
            // The other control-plane nodes, through the first (see
            // reach_every_control_plane_node_from_workers).
            let out = worker.run(&[
                "ip",
                "route",
                "add",
                &test_net,
                "via",
                &format!("10.201.{index}.1"),
            ])?;
            if !out.status.success() {
                bail!(
                    "a route to the control-plane nodes on {}: {}",
                    worker.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            worker_hosts.push(worker);
        }
        reach_workers_pods_from_control_plane_pods(&net, control_planes)?;
        let mut nodes = nodes.into_iter();
        let control_plane_node = nodes.next().context("no control-plane node")?;
        let mut etcs = etcs.into_iter();
        let etc_kubernetes = etcs.next().context("no /etc/kubernetes")?;
        let others = nodes
            .zip(apiservers)
            .zip(etcs)
            .enumerate()
            .map(
                |(i, ((node, apiserver), etc_kubernetes))| ControlPlaneNode {
                    node,
                    apiserver,
                    host: i + 1,
                    etc_kubernetes,
                },
            )
            .collect();
        let cluster = RealCluster {
            workers: worker_hosts,
            others,
            control_plane_node,
            controllers,
            endpoint: Some(Endpoint {
                haproxy,
                url,
                first_apiserver,
            }),
            control_plane,
            registry,
            version,
            net,
            etc_kubernetes,
        };
        // As kubeadm: kube-proxy and CoreDNS are there before the network add-ons (here, the
        // agents) an operator installs.
        cluster
            .control_plane
            .apply(&addon_images.kube_proxy_manifests(&cluster.control_plane.url, POD_NETWORK))?;
        cluster.rollout_of("daemonset/kube-proxy", addons::ROLLOUT)?;
        cluster
            .control_plane
            .apply(&addon_images.coredns_manifests())?;
        cluster.rollout_of("deployment/coredns", addons::ROLLOUT)?;
        cluster.install_agents(&[&format!("--proxy-server-port={AGENT_ENDPOINT_PORT}")])?;
        Ok(cluster)
    }

    /// Every control-plane node's test host and a kubeconfig of its own kube-apiserver (not
    /// through the load balancer), in order; the one control-plane node of a cluster
    /// without one.
    pub fn apiservers(&self) -> Vec<(usize, PathBuf)> {
        let first = match &self.endpoint {
            Some(endpoint) => endpoint.first_apiserver.clone(),
            None => self.control_plane.kubeconfig.clone(),
        };
        std::iter::once((super::CONTROL_PLANE_HOST, first))
            .chain(
                self.others
                    .iter()
                    .map(|other| (other.host, other.apiserver.kubeconfig.clone())),
            )
            .collect()
    }

    /// Every control-plane node's node host, the first's first.
    pub fn control_plane_nodes(&self) -> Vec<&NodeHost> {
        std::iter::once(&self.control_plane_node)
            .chain(self.others.iter().map(|other| &other.node))
            .collect()
    }

    /// GETs `path` from `127.0.0.1:port` inside control-plane host `host`'s namespace (its
    /// server's health port is 8134).
    pub fn host_get(&self, host: usize, port: u16, path: &str) -> anyhow::Result<String> {
        let out = self.net.run_in(
            host,
            &[
                "curl",
                "-sS",
                "--max-time",
                "10",
                &format!("http://127.0.0.1:{port}{path}"),
            ],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Every node's pod network (kube-proxy's `clusterCIDR`).
const POD_NETWORK: &str = "10.244.0.0/16";

/// The test net's `/24`, where every control-plane node has its address.
fn test_net(first: Ipv4Addr) -> String {
    let [a, b, c, _] = first.octets();
    format!("{a}.{b}.{c}.0/24")
}

/// Lets the pods on the control-plane nodes past the first (their agents) reach every worker's
/// pods, as a pod network lets any pod reach any other: the `default` strategy may choose any
/// node's agent for a pod's address. Each such node `i` gets a link of its own to the first,
/// the workers' router (`10.201.<250 + i>.0/30`, among the workers' links, which the workers
/// route back through the first), and routes the pod network over it; what its pods send is
/// masqueraded as the node's end of the link (the CNI bridge's `ipMasq`). What the node's own
/// processes (its kube-apiserver) send over the link is refused in its OUTPUT chain, as on the
/// first: they reach pods through Bridgehead only.
fn reach_workers_pods_from_control_plane_pods(
    net: &TestNet,
    control_planes: usize,
) -> anyhow::Result<()> {
    let router = net.host(0).ns_name();
    for host in 1..control_planes {
        let ns = net.host(host).ns_name();
        let subnet = 250 + u8::try_from(host)?;
        let (near, far) = (format!("10.201.{subnet}.1"), format!("10.201.{subnet}.2"));
        // Made inside the two namespaces: the names never meet another test's.
        let name = format!("cp{host}");
        ip(&[
            "-n", router, "link", "add", &name, "type", "veth", "peer", "name", "pods", "netns", ns,
        ])?;
        ip(&[
            "-n",
            router,
            "addr",
            "add",
            &format!("{near}/30"),
            "dev",
            &name,
        ])?;
        ip(&["-n", router, "link", "set", &name, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{far}/30"), "dev", "pods"])?;
        ip(&["-n", ns, "link", "set", "pods", "up"])?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            POD_NETWORK,
            "via",
            &near,
            "dev",
            "pods",
        ])?;
        for command in [
            vec![
                "iptables",
                "-A",
                "OUTPUT",
                "-o",
                "pods",
                "-p",
                "tcp",
                "-j",
                "REJECT",
                "--reject-with",
                "tcp-reset",
            ],
            vec!["iptables", "-A", "OUTPUT", "-o", "pods", "-j", "DROP"],
        ] {
            net.run_in(host, &command)?;
        }
    }
    Ok(())
}

/// Lets the workers reach every control-plane node, as nodes reach the control plane in a
/// kubeadm cluster: kube-proxy sends the `kubernetes` Service's connections to any
/// kube-apiserver (its endpoints are their addresses). Their link leads to the first
/// control-plane node, which masquerades what they send on into the test net (its own
/// address answered to; the other nodes have no route back to a worker's link, and are given
/// none: they must not reach a worker). Each worker routes the test net over its link (added
/// once it is up).
fn reach_every_control_plane_node_from_workers(net: &TestNet) -> anyhow::Result<()> {
    let out = net.run_in(
        0,
        &[
            "iptables",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            "10.201.0.0/16",
            "-o",
            "eth0",
            "-j",
            "MASQUERADE",
        ],
    )?;
    if !out.status.success() {
        bail!("masquerading the workers: {out:?}");
    }
    Ok(())
}
