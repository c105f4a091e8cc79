//! What can go wrong making or writing a PKI.

use std::io;
use std::path::PathBuf;

/// An error from generating a PKI, issuing a certificate or writing the files.
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
}
