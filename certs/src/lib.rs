//! `bridgehead-certs` makes the PKI a Bridgehead deployment runs on, and lets tests make one at
//! test time.
//!
//! [`Pki::generate`] creates a fresh CA (`bridgehead-ca`) and four leaf certificates signed by it:
//! `server` (the CONNECT frontend kube-apiserver and curl talk to) and `cluster` (the
//! agent-facing WebSocket endpoint), both `serverAuth` with the SANs `localhost`, `127.0.0.1`,
//! `::1` plus any extra ones; and `client` (kube-apiserver, curl) and `agent`, both `clientAuth`.
//! [`Pki::issue_client`] signs more client certificates from the same CA, and
//! [`Pki::write_dir`] writes the whole set as PEM files with private-key permissions. Every key
//! is ECDSA P-256. Each certificate and its key travel together as a [`CertKey`]; failures are a
//! [`CertError`]. An [`Authority`] is a CA of its own, for other PKIs (a test's Kubernetes
//! control plane).
//!
//! ```
//! # fn main() -> Result<(), bridgehead_certs::CertError> {
//! use bridgehead_certs::Pki;
//!
//! let pki = Pki::generate(&["bridgehead.kube-system.svc".to_owned(), "10.0.0.5".to_owned()])?;
//! let extra_agent = pki.issue_client("agent-node-7")?;
//! # let dir = std::env::temp_dir().join(format!("bridgehead-certs-doc-{}", std::process::id()));
//! let written = pki.write_dir(&dir, false)?; // dir/ca.crt, dir/ca.key, dir/server.crt, ...
//! # assert_eq!(written.len(), 10);
//! # assert!(extra_agent.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```
//!
//! Deliberately left out: loading an existing CA from disk, revocation (CRLs, OCSP),
//! renewal and rotation, and RSA keys. A PKI is cheap to make: make a new one.

mod authority;
mod cert_key;
mod error;
mod pki;
mod pki_dir;
mod profile;
mod san;

pub use authority::Authority;
pub use cert_key::CertKey;
pub use error::CertError;
pub use pki::Pki;
