//! The PKI directory's file names (a contract with the scripts that deploy it), and the
//! recognition of the layout older versions wrote.

use std::fs;
use std::path::Path;

use crate::CertError;

/// The frontend CA: signs `server` and `client`.
pub(crate) const FRONTEND_CA: &str = "frontend-ca";
/// The CONNECT frontend's certificate.
pub(crate) const SERVER: &str = "server";
/// kube-apiserver's (and curl's) certificate towards the frontend.
pub(crate) const CLIENT: &str = "client";
/// The cluster CA: signs `cluster` and the agents'.
pub(crate) const CLUSTER_CA: &str = "cluster-ca";
/// The agent endpoint's certificate.
pub(crate) const CLUSTER: &str = "cluster";
/// The agents' shared certificate.
pub(crate) const AGENT: &str = "agent";
/// The servers' certificate towards each other (forwarding), from the frontend CA.
pub(crate) const PEER: &str = "peer";

/// The one CA of the layout before there were two, which signed every certificate.
const OLD_CA_FILES: [&str; 2] = ["ca.crt", "ca.key"];

/// `stem.crt`.
pub(crate) fn cert(stem: &str) -> String {
    format!("{stem}.crt")
}

/// `stem.key`.
pub(crate) fn key(stem: &str) -> String {
    format!("{stem}.key")
}

/// The stem of node `node`'s own agent certificate: `agent-node`.
pub(crate) fn node_agent(node: &str) -> String {
    format!("{AGENT}-{node}")
}

/// Fails with [`CertError::OldLayout`] if `dir` holds the old `ca.crt` or `ca.key` and neither
/// CA of the new layout: a directory someone already migrated with `--force` is not old.
pub(crate) fn refuse_old(dir: &Path) -> Result<(), CertError> {
    let new_cas = [cert(FRONTEND_CA), cert(CLUSTER_CA)];
    if exists_any(dir, &OLD_CA_FILES) && !exists_any(dir, &new_cas) {
        return Err(CertError::OldLayout {
            dir: dir.to_owned(),
        });
    }
    Ok(())
}

/// Whether one of `names` is in `dir` (as anything, even a dangling link). An error looking
/// counts as absent: whoever reads or writes the file next reports it.
fn exists_any(dir: &Path, names: &[impl AsRef<Path>]) -> bool {
    names
        .iter()
        .any(|name| fs::symlink_metadata(dir.join(name)).is_ok())
}
