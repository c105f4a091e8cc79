//! The server configuration of both TLS endpoints, the CONNECT frontend and the agent
//! endpoint: each requires a client certificate from its own CA and speaks only `http/1.1`
//! over ALPN.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use bridgehead_runtime::tls::{load_certs, load_key, load_roots, provider};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;

/// Presents `cert`/`key` and, with `client_ca`, requires a client certificate that chains to
/// it. The CA's name is advertised in the CertificateRequest, which Go clients (kube-apiserver)
/// need before they send their certificate.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?;
    let builder = match client_ca {
        Some(client_ca) => {
            let roots = load_roots(client_ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .with_context(|| {
                    format!("building the client verifier from {}", client_ca.display())
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        // Agents with token authentication alone present no certificate.
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .with_context(|| format!("using {} with {}", cert.display(), key.display()))?;
    // HTTP/1.1 only: Go offers h2 to proxies and must not get it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
