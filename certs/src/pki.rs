//! The PKI: two CAs, one per trust boundary, and the certificates each signed.

use std::fmt;
use std::path::{Path, PathBuf};

use rcgen::{Issuer, KeyPair};

use crate::layout::{self, AGENT, CLIENT, CLUSTER, CLUSTER_CA, FRONTEND_CA, PEER, SERVER};
use crate::pki_dir::{self, PkiFile};
use crate::profile::{self, Role};
use crate::{san, CertError, CertKey};

/// The frontend CA's common name.
const FRONTEND_CA_COMMON_NAME: &str = "bridgehead-frontend-ca";
/// The cluster CA's common name.
const CLUSTER_CA_COMMON_NAME: &str = "bridgehead-cluster-ca";
/// Common name of the CONNECT frontend's certificate.
const SERVER_COMMON_NAME: &str = "bridgehead-server";
/// Common name of the agent endpoint's certificate.
const CLUSTER_COMMON_NAME: &str = "bridgehead-cluster";
/// Common name of the certificate kube-apiserver and curl present to the frontend.
const CLIENT_COMMON_NAME: &str = "bridgehead-client";
/// Common name of the certificate agents present to the agent endpoint.
const AGENT_COMMON_NAME: &str = "bridgehead-agent";
/// Common name of the certificate servers present to each other.
const PEER_COMMON_NAME: &str = "bridgehead-peer";

/// Two CAs and the certificates they signed for each Bridgehead component. Every key is ECDSA
/// P-256.
///
/// The frontend CA signs the CONNECT frontend's certificate and its clients' (kube-apiserver,
/// curl); the cluster CA signs the agent endpoint's and the agents'. So the agent certificate
/// every node holds is no use on the CONNECT frontend, and a frontend client's none on the agent
/// endpoint, as long as each side trusts only its own CA (`--server-ca-cert` the frontend CA,
/// `--cluster-ca-cert` the cluster CA).
///
/// The CAs are valid for ten years, the leaves for one; all from an hour ago. The `Pki` keeps
/// both CAs' signing keys so that [`Pki::issue_client`] and [`Pki::issue_agent`] can sign more
/// certificates. `Debug` prints certificates but never keys.
pub struct Pki {
    /// `bridgehead-frontend-ca`: signs `server` and `client`, leaf certificates only.
    pub frontend_ca: CertKey,
    /// `bridgehead-cluster-ca`: signs `cluster` and `agent`, leaf certificates only.
    pub cluster_ca: CertKey,
    /// `bridgehead-server`: the CONNECT frontend kube-apiserver and curl talk to (`serverAuth`,
    /// from the frontend CA).
    pub server: CertKey,
    /// `bridgehead-client`: kube-apiserver and curl, towards the frontend (`clientAuth`, from
    /// the frontend CA).
    pub client: CertKey,
    /// `bridgehead-cluster`: the agent-facing WebSocket endpoint (`serverAuth`, from the cluster
    /// CA).
    pub cluster: CertKey,
    /// `bridgehead-agent`: agents, towards the agent endpoint (`clientAuth`, from the cluster
    /// CA).
    pub agent: CertKey,
    /// `bridgehead-peer`: servers towards each other, when they forward tunnels
    /// (`serverAuth` and `clientAuth`, from the frontend CA: a peer opens tunnels as a CONNECT
    /// client does, so it is trusted as one; the cluster CA, which every agent's certificate
    /// chains to, must not be).
    pub peer: CertKey,
    /// Signs further frontend clients; holds the frontend CA's private key.
    frontend_issuer: Issuer<'static, KeyPair>,
    /// Signs further agents; holds the cluster CA's private key.
    cluster_issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// Makes the frontend and cluster CAs and the server, client, cluster and agent
    /// certificates.
    ///
    /// `extra_sans`: extra DNS names or IP literals added to the server and cluster certificates
    /// (besides `localhost`, `127.0.0.1`, `::1`). An empty or malformed name is
    /// [`CertError::InvalidSan`].
    pub fn generate(extra_sans: &[String]) -> Result<Pki, CertError> {
        let sans = san::server_sans(extra_sans)?;
        let frontend = profile::ca(FRONTEND_CA_COMMON_NAME)?;
        let cluster = profile::ca(CLUSTER_CA_COMMON_NAME)?;
        let (front, back) = (&frontend.issuer, &cluster.issuer);
        Ok(Pki {
            server: profile::leaf(front, SERVER_COMMON_NAME, &[], Role::Server, &sans)?,
            client: profile::leaf(front, CLIENT_COMMON_NAME, &[], Role::Client, &[])?,
            cluster: profile::leaf(back, CLUSTER_COMMON_NAME, &[], Role::Server, &sans)?,
            agent: profile::leaf(back, AGENT_COMMON_NAME, &[], Role::Client, &[])?,
            peer: profile::leaf(front, PEER_COMMON_NAME, &[], Role::Peer, &sans)?,
            frontend_ca: frontend.cert_key,
            frontend_issuer: frontend.issuer,
            cluster_ca: cluster.cert_key,
            cluster_issuer: cluster.issuer,
        })
    }

    /// Writes `frontend-ca.crt frontend-ca.key server.crt server.key client.crt client.key
    /// cluster-ca.crt cluster-ca.key cluster.crt cluster.key agent.crt agent.key peer.crt peer.key`
    /// into `dir`,
    /// and returns their paths in that order.
    ///
    /// `dir` is created (mode 0700) if missing. Keys get mode 0600, certificates 0644. Unless
    /// `force`, nothing is written if any of the files already exists ([`CertError::Exists`]
    /// names it), or if `dir` holds the one-CA PKI older versions wrote (`ca.crt`, `ca.key`:
    /// [`CertError::OldLayout`] explains the migration). With `force`, existing files are
    /// replaced; an old `ca.crt` and `ca.key` are left alone.
    pub fn write_dir(&self, dir: &Path, force: bool) -> Result<Vec<PathBuf>, CertError> {
        if !force {
            layout::refuse_old(dir)?;
        }
        let files = [
            (FRONTEND_CA, &self.frontend_ca),
            (SERVER, &self.server),
            (CLIENT, &self.client),
            (CLUSTER_CA, &self.cluster_ca),
            (CLUSTER, &self.cluster),
            (AGENT, &self.agent),
            (PEER, &self.peer),
        ]
        .into_iter()
        .flat_map(|(stem, cert_key)| {
            [
                PkiFile::certificate(layout::cert(stem), &cert_key.cert_pem),
                PkiFile::private_key(layout::key(stem), &cert_key.key_pem),
            ]
        })
        .collect::<Vec<_>>();
        pki_dir::write(dir, &files, force)
    }

    /// Issues an agent certificate for node `node` from the cluster CA (`clientAuth`,
    /// `CN=node`, the SANs `node` and each of `addresses`): the names and addresses the server's
    /// `--bind-agent-identifiers` lets that agent announce. `node` must be a DNS name
    /// ([`CertError::InvalidNodeName`]); IP literals among `addresses` become IP SANs.
    /// New server, client, cluster and agent certificates (new keys) from the same CAs: a
    /// rotation of the leaves, as cert-manager renews them.
    pub fn renew_leaves(&mut self, extra_sans: &[String]) -> Result<(), CertError> {
        let sans = san::server_sans(extra_sans)?;
        let (front, back) = (&self.frontend_issuer, &self.cluster_issuer);
        self.server = profile::leaf(front, SERVER_COMMON_NAME, &[], Role::Server, &sans)?;
        self.client = profile::leaf(front, CLIENT_COMMON_NAME, &[], Role::Client, &[])?;
        self.cluster = profile::leaf(back, CLUSTER_COMMON_NAME, &[], Role::Server, &sans)?;
        self.agent = profile::leaf(back, AGENT_COMMON_NAME, &[], Role::Client, &[])?;
        self.peer = profile::leaf(front, PEER_COMMON_NAME, &[], Role::Peer, &sans)?;
        Ok(())
    }

    pub fn issue_agent(&self, node: &str, addresses: &[String]) -> Result<CertKey, CertError> {
        profile::agent(&self.cluster_issuer, node, addresses)
    }

    /// Issues one more frontend client certificate (`clientAuth`, no SANs) from the frontend CA,
    /// with a fresh key, valid for one year: for another kube-apiserver or curl, or for tests.
    pub fn issue_client(&self, common_name: &str) -> Result<CertKey, CertError> {
        profile::leaf(&self.frontend_issuer, common_name, &[], Role::Client, &[])
    }
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("frontend_ca", &self.frontend_ca)
            .field("cluster_ca", &self.cluster_ca)
            .field("server", &self.server)
            .field("client", &self.client)
            .field("cluster", &self.cluster)
            .field("agent", &self.agent)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}
