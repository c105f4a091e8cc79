//! The cluster CA of a PKI directory, loaded back from disk to sign one agent certificate per
//! node.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rcgen::{Issuer, KeyPair};
use x509_parser::pem::parse_x509_pem;

use crate::layout::{self, CLUSTER_CA};
use crate::pki_dir::{self, PkiFile};
use crate::{profile, san, CertError, CertKey};

/// The cluster CA (`cluster-ca.crt`, `cluster-ca.key`) of a directory [`crate::Pki::write_dir`]
/// wrote, loaded to sign an agent certificate per node after the fact: each node then holds
/// a certificate naming only itself, which the server's `--bind-agent-identifiers` holds it to.
///
/// `Debug` prints the CA certificate, never its key.
pub struct ClusterCa {
    /// The CA's certificate and key, as read.
    pub ca: CertKey,
    issuer: Issuer<'static, KeyPair>,
}

impl ClusterCa {
    /// Reads `dir/cluster-ca.crt` and `dir/cluster-ca.key`.
    ///
    /// Fails with [`CertError::OldLayout`] if they are missing but the old `ca.crt`/`ca.key`
    /// are there, [`CertError::Io`] if a file cannot be read, [`CertError::InvalidCa`] if the
    /// certificate is not an unexpired CA certificate allowed to sign certificates or the key
    /// is not a PEM PKCS#8 private key, and [`CertError::CaKeyMismatch`] if the key is not the
    /// certificate's.
    pub fn load(dir: &Path) -> Result<ClusterCa, CertError> {
        let cert_path = dir.join(layout::cert(CLUSTER_CA));
        let key_path = dir.join(layout::key(CLUSTER_CA));
        let cert_pem = read(dir, &cert_path)?;
        let key_pem = read(dir, &key_path)?;
        let issuer = issuer(&cert_path, &cert_pem, &key_path, &key_pem)?;
        Ok(ClusterCa {
            ca: CertKey { cert_pem, key_pem },
            issuer,
        })
    }

    /// Checks `node` and `addresses` as [`ClusterCa::issue_agent`] would, without a CA: so a
    /// command line is refused ([`CertError::InvalidNodeName`], [`CertError::InvalidSan`])
    /// before any file is read.
    pub fn check_agent(node: &str, addresses: &[String]) -> Result<(), CertError> {
        san::agent_sans(node, addresses).map(drop)
    }

    /// Issues node `node`'s agent certificate, as [`crate::Pki::issue_agent`] does: `clientAuth`,
    /// `CN=node`, the SANs `node` (a DNS name, [`CertError::InvalidNodeName`] otherwise) and each
    /// of `addresses` (IP literals become IP SANs).
    pub fn issue_agent(&self, node: &str, addresses: &[String]) -> Result<CertKey, CertError> {
        profile::agent(&self.issuer, node, addresses)
    }

    /// Issues node `node`'s agent certificate ([`ClusterCa::issue_agent`]) and writes it into
    /// `dir` as `agent-node.crt` (mode 0644) and `agent-node.key` (0600), returning their paths
    /// in that order. `dir` is created (mode 0700) if missing; unless `force`, nothing is written
    /// if either file exists ([`CertError::Exists`]).
    pub fn write_agent(
        &self,
        dir: &Path,
        node: &str,
        addresses: &[String],
        force: bool,
    ) -> Result<Vec<PathBuf>, CertError> {
        let agent = self.issue_agent(node, addresses)?;
        let stem = layout::node_agent(node);
        let files = [
            PkiFile::certificate(layout::cert(&stem), &agent.cert_pem),
            PkiFile::private_key(layout::key(&stem), &agent.key_pem),
        ];
        pki_dir::write(dir, &files, force)
    }
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

/// Reads `path` in the PKI directory `dir`; a missing file in an old one-CA directory is
/// [`CertError::OldLayout`].
fn read(dir: &Path, path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).or_else(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            layout::refuse_old(dir)?;
        }
        Err(CertError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        })
    })
}

/// Checks that `cert_pem` is a CA that may sign certificates now and `key_pem` its key, and
/// makes the issuer that signs with them.
fn issuer(
    cert_path: &Path,
    cert_pem: &str,
    key_path: &Path,
    key_pem: &str,
) -> Result<Issuer<'static, KeyPair>, CertError> {
    let invalid = |path: &Path, reason| CertError::InvalidCa {
        path: path.to_owned(),
        reason,
    };
    let (_, pem) = parse_x509_pem(cert_pem.as_bytes())
        .ok()
        .filter(|(_, pem)| pem.label == "CERTIFICATE")
        .ok_or_else(|| invalid(cert_path, "not a PEM certificate"))?;
    let cert = pem
        .parse_x509()
        .map_err(|_| invalid(cert_path, "not an X.509 certificate"))?;
    if !cert.is_ca() {
        return Err(invalid(cert_path, "not a CA certificate"));
    }
    let may_sign = cert
        .key_usage()
        .map_err(|_| invalid(cert_path, "its key usage cannot be read"))?
        .is_none_or(|usage| usage.value.key_cert_sign());
    if !may_sign {
        return Err(invalid(
            cert_path,
            "a CA whose key usage does not allow signing certificates",
        ));
    }
    if !cert.validity().is_valid() {
        return Err(invalid(cert_path, "the CA is expired or not valid yet"));
    }

    let key = KeyPair::from_pem(key_pem)
        .map_err(|_| invalid(key_path, "not a PEM PKCS#8 private key"))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(CertError::CaKeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
        });
    }
    Issuer::from_ca_cert_pem(cert_pem, key).map_err(|_| invalid(cert_path, "cannot sign with it"))
}
