//! A certificate and its private key, both PEM.

use std::fmt;

/// A certificate and its private key, PEM-encoded (`CERTIFICATE` and PKCS#8 `PRIVATE KEY`).
///
/// `Debug` prints the certificate but never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKey {
    /// The certificate, one PEM `CERTIFICATE` block.
    pub cert_pem: String,
    /// The private key, one PEM PKCS#8 `PRIVATE KEY` block.
    pub key_pem: String,
}

impl fmt::Debug for CertKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertKey")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}
