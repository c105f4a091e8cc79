//! A node host's network: a worker's link to the control plane's namespace, and TCP refused
//! at once to wherever a host has no route.

use std::net::Ipv4Addr;

use anyhow::bail;

use super::host::enter;
use crate::netns::ip;

/// The worker's veth: `eth0` (`10.201.<index>.2/30`) in the host, its peer
/// (`10.201.<index>.1/30`) in the control plane's namespace `ns`; the node's address on the
/// host's loopback; a route from the host to kube-apiserver's address over the link. The
/// control plane gets no route to the node's address or its pods.
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
    let (near, far) = (
        Ipv4Addr::new(10, 201, index, 1),
        Ipv4Addr::new(10, 201, index, 2),
    );
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
    Ok(())
}

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
