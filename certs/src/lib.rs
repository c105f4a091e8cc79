//! `bridgehead-certs` makes the PKI a Bridgehead deployment runs on, and lets tests make one at
//! test time.
//!
//! [`Pki::generate`] creates two CAs, one per trust boundary, and five leaf certificates. The
//! frontend CA (`bridgehead-frontend-ca`) signs `server` (the CONNECT frontend kube-apiserver and
//! curl talk to, `serverAuth`), `client` (kube-apiserver, curl; `clientAuth`) and `peer`
//! (servers that forward to each other, both). The cluster CA
//! (`bridgehead-cluster-ca`) signs `cluster` (the agent-facing WebSocket endpoint, `serverAuth`)
//! and `agent` (`clientAuth`). The server certificates carry the SANs `localhost`, `127.0.0.1`,
//! `::1` plus any extra ones. With the frontend trusting only the frontend CA, the agent
//! certificate every node holds opens no CONNECT tunnel.
//!
//! [`Pki::issue_client`] signs more frontend clients, [`Pki::issue_agent`] per-node agent
//! certificates (`CN` and SANs the node's name and addresses), and [`Pki::write_dir`] writes the
//! whole set as PEM files with private-key permissions. [`ClusterCa::load`] reads the cluster CA
//! back from such a directory to sign per-node agent certificates later; it recognises the
//! one-CA directory older versions wrote ([`CertError::OldLayout`] explains the migration). Every
//! key made is ECDSA P-256. Each certificate and its key travel together as a [`CertKey`];
//! failures are a [`CertError`]. An [`Authority`] is a CA of its own, for other PKIs (a test's
//! Kubernetes control plane).
//!
//! ```
//! # fn main() -> Result<(), bridgehead_certs::CertError> {
//! use bridgehead_certs::{ClusterCa, Pki};
//!
//! let pki = Pki::generate(&["bridgehead.kube-system.svc".to_owned(), "10.0.0.5".to_owned()])?;
//! let curl = pki.issue_client("curl")?; // from the frontend CA
//! # let dir = std::env::temp_dir().join(format!("bridgehead-certs-doc-{}", std::process::id()));
//! let written = pki.write_dir(&dir, false)?; // dir/frontend-ca.crt, dir/frontend-ca.key, ...
//! # assert_eq!(written.len(), 14);
//!
//! // Later, one certificate per node, naming only that node:
//! let cluster_ca = ClusterCa::load(&dir)?;
//! let node_7 = cluster_ca.issue_agent("node-7", &["10.0.0.7".to_owned()])?;
//! let files = cluster_ca.write_agent(&dir, "node-8", &[], false)?; // dir/agent-node-8.crt, .key
//! # assert_eq!(files, [dir.join("agent-node-8.crt"), dir.join("agent-node-8.key")]);
//! # assert!(curl.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
//! # assert!(node_7.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```
//!
//! Deliberately left out: revocation (CRLs, OCSP), renewal and rotation, intermediate CAs, and
//! RSA keys. A PKI is cheap to make: make a new one. The only thing loaded from disk is the
//! cluster CA, to sign agents.

mod authority;
mod cert_key;
mod cluster_ca;
mod error;
mod layout;
mod pki;
mod pki_dir;
mod profile;
mod san;

pub use authority::Authority;
pub use cert_key::CertKey;
pub use cluster_ca::ClusterCa;
pub use error::CertError;
pub use pki::Pki;
