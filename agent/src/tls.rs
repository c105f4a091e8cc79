//! The agent's TLS client configuration towards the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use bridgehead_runtime::tls;
use rustls::ClientConfig;

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The rustls client configuration: roots from `ca` (`--ca-cert`), the client pair if given,
/// ALPN `http/1.1` and then `extra_alpn` (`--alpn-proto`: a load balancer that routes by ALPN
/// sees them; the server picks `http/1.1`).
pub(crate) fn client_config(
    ca: &Path,
    client_cert: Option<&ClientCert>,
    extra_alpn: &[String],
) -> anyhow::Result<Arc<ClientConfig>> {
    let roots = tls::load_roots(ca).context("loading --ca-cert")?;
    let builder = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .context("configuring TLS")?
        .with_root_certificates(roots);
    let mut client = match client_cert {
        Some(pair) => {
            let certs = tls::load_certs(&pair.cert).context("loading --agent-cert")?;
            let key = tls::load_key(&pair.key).context("loading --agent-key")?;
            builder
                .with_client_auth_cert(certs, key)
                .context("--agent-cert and --agent-key do not make a usable pair")?
        }
        None => builder.with_no_client_auth(),
    };
    client.alpn_protocols = std::iter::once(b"http/1.1".to_vec())
        .chain(extra_alpn.iter().map(|p| p.as_bytes().to_vec()))
        .collect();
    Ok(Arc::new(client))
}
