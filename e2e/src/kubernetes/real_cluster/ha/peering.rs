//! What deploy/'s server static pod needs on each control-plane node of the HA cluster to
//! forward to the other servers, found by their Leases (docs/ha.md, "Forwarding between
//! servers"): the flags added to its manifest, and a peer certificate beside kube-apiserver's.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::bail;

use super::control_plane_name;

/// The servers' peer port (8132 to 8134 are the static pod's agent, admin and health ports).
pub const PEER_PORT: u16 = 8135;
/// The static pod's last argument before the ones added for peering.
const PEERING_AFTER: &str = "    - --proxy-strategies=destHost,default\n";

/// deploy/'s static pod manifest (rendered, its image in the registry) for control-plane node
/// `index` at `address`: a server id naming the node, and forwarding to the other servers,
/// found by their Leases (the manifest already runs the Lease controller), with the peer
/// certificate [`install_peer_files`] puts beside kube-apiserver's.
pub(super) fn with_peering(
    manifest: &str,
    index: usize,
    address: Ipv4Addr,
) -> anyhow::Result<String> {
    if !manifest.contains(PEERING_AFTER) || !manifest.contains("- --enable-lease-controller\n") {
        bail!("deploy/server-static-pod no longer gives {PEERING_AFTER:?} and --enable-lease-controller");
    }
    let flags = [
        format!("--server-id={}", control_plane_name(index)),
        format!("--peer-port={PEER_PORT}"),
        format!("--peer-advertise-address={address}"),
        "--peer-cert=/etc/kubernetes/pki/bridgehead-peer.crt".into(),
        "--peer-key=/etc/kubernetes/pki/bridgehead-peer.key".into(),
        "--peer-ca-cert=/etc/kubernetes/pki/bridgehead-peer-ca.crt".into(),
    ];
    let mut added = String::from(PEERING_AFTER);
    for flag in flags {
        added.push_str(&format!("    - {flag}\n"));
    }
    Ok(manifest.replacen(PEERING_AFTER, &added, 1))
}

/// The servers' peer certificate (`bridgehead-peer`, naming every control-plane node's
/// address) and the CA that signed it, in the node's `pki/` (the static pod mounts it), the
/// key 0600. Its CA is not kube-apiserver's: the server refuses a peer CA that also signs
/// agents, and kube-apiserver's CA signs every kubelet's.
pub(super) fn install_peer_files(etc: &Path, pki: &bridgehead_certs::Pki) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = etc.join("pki");
    std::fs::write(dir.join("bridgehead-peer.crt"), &pki.peer.cert_pem)?;
    std::fs::write(dir.join("bridgehead-peer.key"), &pki.peer.key_pem)?;
    std::fs::set_permissions(
        dir.join("bridgehead-peer.key"),
        std::fs::Permissions::from_mode(0o600),
    )?;
    std::fs::write(
        dir.join("bridgehead-peer-ca.crt"),
        &pki.frontend_ca.cert_pem,
    )?;
    Ok(())
}
