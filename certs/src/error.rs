//! What can go wrong making, writing or loading a PKI.

use std::io;
use std::path::PathBuf;

/// An error from generating a PKI, issuing a certificate, writing the files or loading a CA.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file system operation on `path` failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done, e.g. "write" or "create directory".
        action: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A file to be written already exists and overwriting was not asked for.
    #[error("{} already exists; refusing to overwrite it", .0.display())]
    Exists(PathBuf),
    /// rcgen could not build or sign a certificate.
    #[error("cannot generate a certificate")]
    Rcgen(#[from] rcgen::Error),
    /// An extra subject alternative name is neither an IP address nor a valid DNS name.
    #[error("invalid SAN {san:?}: {reason}")]
    InvalidSan {
        /// The name as given.
        san: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A node name for an agent certificate is not a DNS name (an IP address, a wildcard, or
    /// malformed).
    #[error("invalid node name {name:?}: {reason}")]
    InvalidNodeName {
        /// The name as given.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A CA certificate or key read from `path` cannot sign: not PEM, not a CA, expired.
    #[error("{}: {reason}", path.display())]
    InvalidCa {
        /// The certificate or key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The CA key file does not hold the private key of the CA certificate beside it.
    #[error("{} is not the private key of {}", key.display(), cert.display())]
    CaKeyMismatch {
        /// The CA certificate.
        cert: PathBuf,
        /// The key file that does not match it.
        key: PathBuf,
    },
    /// `dir` holds the PKI of an older `bridgehead-certs`: one `ca.crt`/`ca.key` that signed
    /// every certificate. The message explains the migration to two CAs.
    #[error(
        "{} holds an old one-CA PKI (ca.crt, ca.key): that CA signed every certificate, so the \
         agent certificate on every node is also accepted by the CONNECT frontend. Make a new \
         PKI with two CAs (`bridgehead-certs init` into a new directory, or into this one with \
         --force, which leaves ca.crt and ca.key for you to delete) and roll it out: \
         bridgehead-server --server-cert/--server-key/--server-ca-cert (frontend-ca.crt) and \
         --cluster-cert/--cluster-key/--cluster-ca-cert (cluster-ca.crt); every agent's \
         --ca-cert (cluster-ca.crt) and --agent-cert/--agent-key; kube-apiserver's caBundle \
         (frontend-ca.crt) and clientCert/clientKey. Until then, keep running the old PKI with \
         bridgehead-server --allow-shared-ca",
        dir.display()
    )]
    OldLayout {
        /// The directory holding `ca.crt` or `ca.key`.
        dir: PathBuf,
    },
}
