//! The PKI: a CA and the certificates it signed for each Bridgehead component.

use std::fmt;
use std::path::{Path, PathBuf};

use rcgen::{Issuer, KeyPair};

use crate::pki_dir::{self, PkiFile};
use crate::profile::{self, Role};
use crate::{san, CertError, CertKey};

/// The CA's common name.
pub(crate) const CA_COMMON_NAME: &str = "bridgehead-ca";
/// Common name of the CONNECT frontend's certificate.
const SERVER_COMMON_NAME: &str = "bridgehead-server";
/// Common name of the agent endpoint's certificate.
const CLUSTER_COMMON_NAME: &str = "bridgehead-cluster";
/// Common name of the certificate kube-apiserver and curl present to the frontend.
const CLIENT_COMMON_NAME: &str = "bridgehead-client";
/// Common name of the certificate agents present to the agent endpoint.
const AGENT_COMMON_NAME: &str = "bridgehead-agent";

/// A CA and the certificates it signed for each Bridgehead component. Every key is ECDSA P-256.
///
/// The CA is valid for ten years, the leaves for one; both from an hour ago. The `Pki` keeps the
/// CA's signing key so that [`Pki::issue_client`] can sign more client certificates.
/// `Debug` prints certificates but never keys.
pub struct Pki {
    /// The CA (`bridgehead-ca`), allowed to sign leaf certificates only.
    pub ca: CertKey,
    /// `bridgehead-server`: the CONNECT frontend kube-apiserver and curl talk to (`serverAuth`).
    pub server: CertKey,
    /// `bridgehead-cluster`: the agent-facing WebSocket endpoint (`serverAuth`).
    pub cluster: CertKey,
    /// `bridgehead-client`: kube-apiserver and curl, towards the frontend (`clientAuth`).
    pub client: CertKey,
    /// `bridgehead-agent`: agents, towards the agent endpoint (`clientAuth`).
    pub agent: CertKey,
    /// Signs further certificates; holds the CA's private key.
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// Makes a new CA and the server, cluster, client and agent certificates.
    ///
    /// `extra_sans`: extra DNS names or IP literals added to the server and cluster certificates
    /// (besides `localhost`, `127.0.0.1`, `::1`). An empty or malformed name is
    /// [`CertError::InvalidSan`].
    pub fn generate(extra_sans: &[String]) -> Result<Pki, CertError> {
        let sans = san::server_sans(extra_sans)?;
        let profile::Ca { cert_key, issuer } = profile::ca(CA_COMMON_NAME)?;
        Ok(Pki {
            server: profile::leaf(&issuer, SERVER_COMMON_NAME, &[], Role::Server, &sans)?,
            cluster: profile::leaf(&issuer, CLUSTER_COMMON_NAME, &[], Role::Server, &sans)?,
            client: profile::leaf(&issuer, CLIENT_COMMON_NAME, &[], Role::Client, &[])?,
            agent: profile::leaf(&issuer, AGENT_COMMON_NAME, &[], Role::Client, &[])?,
            ca: cert_key,
            issuer,
        })
    }

    /// Writes `ca.crt ca.key server.crt server.key cluster.crt cluster.key client.crt client.key
    /// agent.crt agent.key` into `dir`, and returns their paths in that order.
    ///
    /// `dir` is created (mode 0700) if missing. Keys get mode 0600, certificates 0644. Unless
    /// `force`, nothing is written if any of the files already exists ([`CertError::Exists`]
    /// names it); with `force`, existing files are replaced.
    pub fn write_dir(&self, dir: &Path, force: bool) -> Result<Vec<PathBuf>, CertError> {
        let files = [
            ("ca", &self.ca),
            ("server", &self.server),
            ("cluster", &self.cluster),
            ("client", &self.client),
            ("agent", &self.agent),
        ]
        .into_iter()
        .flat_map(|(stem, cert_key)| {
            [
                PkiFile::certificate(format!("{stem}.crt"), &cert_key.cert_pem),
                PkiFile::private_key(format!("{stem}.key"), &cert_key.key_pem),
            ]
        })
        .collect::<Vec<_>>();
        pki_dir::write(dir, &files, force)
    }

    /// Issues an agent certificate for node `node` (`clientAuth`, `CN=node`, the SANs `node` and
    /// each of `addresses`): the names and addresses the server's `--bind-agent-identifiers`
    /// lets that agent announce.
    pub fn issue_agent(&self, node: &str, addresses: &[String]) -> Result<CertKey, CertError> {
        let mut names = vec![node.to_owned()];
        names.extend_from_slice(addresses);
        let sans = san::sans(&names)?;
        profile::leaf(&self.issuer, node, &[], Role::Client, &sans)
    }

    /// Issues one more client certificate (`clientAuth`, no SANs) from this CA, with a fresh key,
    /// valid for one year: for extra agents, or for tests.
    pub fn issue_client(&self, common_name: &str) -> Result<CertKey, CertError> {
        profile::leaf(&self.issuer, common_name, &[], Role::Client, &[])
    }
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("ca", &self.ca)
            .field("server", &self.server)
            .field("cluster", &self.cluster)
            .field("client", &self.client)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}
