//! Loading PEM files for rustls, with the one crypto provider the whole process uses.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Installs ring as the process-wide rustls provider. Idempotent, so tests may call it too.
///
/// AES-128-GCM comes first among the cipher suites (Go, and so kube-apiserver, orders them
/// the same way): every tunnelled byte is encrypted and decrypted twice, and AES-128 does
/// that about a fifth cheaper than AES-256.
pub fn install_crypto_provider() {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let _ = provider.install_default();
}

/// The process's crypto provider, for builders that take one explicitly.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    install_crypto_provider();
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// Every certificate in a PEM file.
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificates in {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("no certificate found in {}", path.display());
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, SEC1 or PKCS#1).
pub fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading private key from {}", path.display()))
}

/// A root store holding every certificate of a CA bundle file.
pub fn load_roots(path: &Path) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .with_context(|| format!("adding CA certificate from {}", path.display()))?;
    }
    Ok(Arc::new(roots))
}
