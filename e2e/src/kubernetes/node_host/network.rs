//! A node host's network: a worker's link to the control plane's namespace, and TCP refused
//! at once to wherever a host has no route.

use std::net::Ipv4Addr;

use anyhow::bail;

use super::host::enter;
use crate::netns::ip;

/// The worker's veth: `eth0` (`10.201.<index>.2/30`) in the host, its peer
/// (`10.201.<index>.1/30`) in the control plane's namespace `ns`; the node's address on the
/// host's loopback; a route from the host to kube-apiserver's address over the link.
///
/// The pod network, host-gw style (what flannel's host-gw backend or Calico without overlay
/// set up in a real cluster): every node routes every other node's pod CIDR
/// (`10.244.<index>.0/24`) to that node. The control plane's namespace is the one link
/// between the node hosts, so it is their router: it forwards `10.244.<index>.0/24` to worker
/// `index`, and each worker sends the whole pod network (and the other links, where its
/// masqueraded pods' answers go) to it. So an agent on any node reaches any pod, as the
/// `default` strategy assumes. Node addresses (kubelets) are routed the same way, as nodes
/// reach each other in a real cluster. What the control plane's own processes send to a
/// worker's pods or node address is refused (a reset) in its OUTPUT chain: kube-apiserver
/// reaches them only through Bridgehead, while what the pods on the control-plane node (its
/// agent) send is forwarded.
pub(super) fn link(
    holder_pid: u32,
    ns: &str,
    index: u8,
    k: usize,
    apiserver: Ipv4Addr,
    node_ip: Ipv4Addr,
) -> anyhow::Result<()> {
    if index == 0 || index > 250 {
        bail!("a worker's index is 1 to 250, not {index}");
    }
    let peer = format!("bh{}k{k}", std::process::id());
    if peer.len() > 15 {
        bail!("interface name {peer} is longer than 15 characters");
    }
    let holder = holder_pid.to_string();
    let (near, far) = (Ipv4Addr::new(10, 201, index, 1), link_far_end(index));
    ip(&[
        "link", "add", &peer, "type", "veth", "peer", "name", "eth0", "netns", &holder,
    ])?;
    ip(&["link", "set", &peer, "netns", ns])?;
    ip(&["-n", ns, "addr", "add", &format!("{near}/30"), "dev", &peer])?;
    ip(&["-n", ns, "link", "set", &peer, "up"])?;
    for command in [
        vec!["ip", "addr", "add", &format!("{far}/30"), "dev", "eth0"],
        vec!["ip", "link", "set", "eth0", "up"],
        vec!["ip", "addr", "add", &format!("{node_ip}/32"), "dev", "lo"],
        vec![
            "ip",
            "route",
            "add",
            &format!("{apiserver}/32"),
            "via",
            &near.to_string(),
        ],
        vec!["ip", "route", "add", POD_NETWORK, "via", &near.to_string()],
        vec!["ip", "route", "add", NODES, "via", &near.to_string()],
        vec!["ip", "route", "add", LINKS, "via", &near.to_string()],
    ] {
        let command: Vec<&str> = command.iter().map(|s| s.as_ref()).collect();
        let out = enter(holder_pid, &command)?;
        if !out.status.success() {
            bail!(
                "{command:?} in the node host: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let pods = format!("10.244.{index}.0/24");
    let node = format!("{node_ip}/32");
    let mut commands = vec![vec!["sysctl", "-qw", "net.ipv4.ip_forward=1"]];
    for destination in [&pods, &node] {
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            destination,
            "via",
            &far.to_string(),
        ])?;
        commands.push(vec![
            "iptables",
            "-A",
            "OUTPUT",
            "-d",
            destination,
            "-p",
            "tcp",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ]);
        commands.push(vec![
            "iptables",
            "-A",
            "OUTPUT",
            "-d",
            destination,
            "-j",
            "DROP",
        ]);
    }
    for command in commands {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns])
            .args(&command)
            .stdin(std::process::Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "{command:?} in {ns}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// The worker's end of its link (`10.201.<index>.2`): where what the worker's own processes
/// send into the control plane's namespace comes from.
pub(super) fn link_far_end(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, index, 2)
}

/// Every node's pod CIDR (`10.244.<index>.0/24`; the control-plane node's is index 0).
const POD_NETWORK: &str = "10.244.0.0/16";
/// Every worker's node address (`10.202.<index>.1`, where its kubelet serves).
const NODES: &str = "10.202.0.0/16";
/// Every worker's link to the control plane's namespace.
const LINKS: &str = "10.201.0.0/16";

/// Makes a connection to an address this host has no route to fail at once, as a firewall's
/// reset would, rather than vanish: a default route into an interface that leads nowhere (one
/// end of a veth pair whose other end is in the same host; the kernels here have no dummy
/// interfaces), where TCP is answered with a reset. Without it, an agent asked to dial a node
/// it cannot reach (a tunnel the `default` strategy gave it while the node's own agent is
/// being replaced) waits for the dial timeout whenever the kernel's rate limit holds back the
/// ICMP unreachable.
pub(super) fn refuse_elsewhere(holder_pid: u32) -> anyhow::Result<()> {
    for command in [
        "ip link add nowhere type veth peer name nowhere-peer",
        "ip link set nowhere-peer up",
        "ip link set nowhere up",
        "ip route add default dev nowhere",
        "iptables -A FORWARD -o nowhere -p tcp -j REJECT --reject-with tcp-reset",
        "iptables -A FORWARD -o nowhere -j DROP",
        "iptables -A OUTPUT -o nowhere -p tcp -j REJECT --reject-with tcp-reset",
        "iptables -A OUTPUT -o nowhere -j DROP",
    ] {
        let command: Vec<&str> = command.split(' ').collect();
        let out = enter(holder_pid, &command)?;
        if !out.status.success() {
            bail!(
                "{command:?} in the node host: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// What kube-proxy would program on the node for the one Service the node's own pods need,
/// `kubernetes` (in-cluster configuration: the agents' Lease counting, the server's DaemonSet
/// on the host's network): connections to its ClusterIP, port 443, from the node's pods
/// (PREROUTING) and its own processes (OUTPUT) go to kube-apiserver. Unless the cluster runs
/// kube-proxy (the HA cluster: its rules come first, and this one is never reached), other
/// Services' ClusterIPs stay unrouted (kube-apiserver reaches Services' pods by their
/// endpoints). The OUTPUT filter matches the interface routed to before the DNAT
/// (on the control-plane node, which has no route to the ClusterIP, the one
/// [`refuse_elsewhere`] rejects): what was translated is let through first.
pub(super) fn kubernetes_service(
    holder_pid: u32,
    apiserver: Ipv4Addr,
    port: u16,
) -> anyhow::Result<()> {
    let to = format!("{apiserver}:{port}");
    let service = format!("{}/32", super::super::control_plane::KUBERNETES_SERVICE_IP);
    // Only the `kubernetes` Service's: where kube-proxy runs, its rules translate every
    // ClusterIP, and a broader rule would let kube-apiserver's namespace (the first
    // control-plane node's) reach a worker's pods through any Service.
    let accept = [
        "iptables",
        "-I",
        "OUTPUT",
        "1",
        "-m",
        "conntrack",
        "--ctstate",
        "DNAT",
        "--ctorigdst",
        &service,
        "-j",
        "ACCEPT",
    ];
    let out = enter(holder_pid, &accept)?;
    if !out.status.success() {
        bail!(
            "{accept:?} in the node host: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for chain in ["PREROUTING", "OUTPUT"] {
        let command = [
            "iptables",
            "-t",
            "nat",
            "-A",
            chain,
            "-d",
            &service,
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ];
        let out = enter(holder_pid, &command)?;
        if !out.status.success() {
            bail!(
                "{command:?} in the node host: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}
