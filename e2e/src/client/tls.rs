//! Client TLS configurations that behave as kube-apiserver's Go client does: a fresh full
//! handshake per connection (no resumption), TLS 1.3 suites in Go's order, no ALPN.

use std::path::Path;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::{CipherSuite, ClientConfig};

use bridgehead_runtime::tls::{
    install_crypto_provider, load_certs, load_key, load_roots, provider,
};

/// Trusts the CA in `ca` and, unless `cert` is `None`, presents `cert` (certificate and key
/// files).
pub fn config(ca: &Path, cert: Option<(&Path, &Path)>) -> anyhow::Result<Arc<ClientConfig>> {
    install_crypto_provider();
    let mut suites = (*provider()).clone();
    suites
        .cipher_suites
        .sort_by_key(|suite| go_rank(suite.suite()));
    let builder = ClientConfig::builder_with_provider(Arc::new(suites))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(load_roots(ca)?);
    let mut config = match cert {
        Some((crt, key)) => builder.with_client_auth_cert(load_certs(crt)?, load_key(key)?)?,
        None => builder.with_no_client_auth(),
    };
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// Position of a suite in Go's TLS 1.3 preference with AES hardware (crypto/tls
/// `defaultCipherSuitesTLS13`: AES-128-GCM first, where rustls starts with AES-256-GCM);
/// TLS 1.2 suites keep their order after those.
fn go_rank(suite: CipherSuite) -> u8 {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        _ => 3,
    }
}
