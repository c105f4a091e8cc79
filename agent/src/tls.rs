//! The agent's TLS client configuration towards the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use bridgehead_runtime::tls;
use rustls::ClientConfig;

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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

/// The files of a client configuration: the CA, and the client pair if any.
type TlsFiles = (
    std::path::PathBuf,
    Option<(std::path::PathBuf, std::path::PathBuf)>,
);

/// The last client configuration that loaded, by its files, kept for when rotated files do
/// not load.
static LAST_GOOD: std::sync::Mutex<Vec<(TlsFiles, Arc<ClientConfig>)>> =
    std::sync::Mutex::new(Vec::new());

/// The client configuration for a new connection, its files read again (so rotated
/// certificates take effect on the next connection). When they do not load (a rotation
/// half done, a broken file), the error is logged and the last configuration that loaded is
/// used; with none, the error is returned.
pub(crate) fn current_client_config(config: &crate::Config) -> anyhow::Result<Arc<ClientConfig>> {
    let tls = &config.tls;
    client_config_or_last(&tls.ca_cert, tls.client_cert.as_ref(), &tls.alpn)
}

fn client_config_or_last(
    ca: &Path,
    client_cert: Option<&ClientCert>,
    alpn: &[String],
) -> anyhow::Result<Arc<ClientConfig>> {
    let files: TlsFiles = (
        ca.to_owned(),
        client_cert.map(|pair| (pair.cert.clone(), pair.key.clone())),
    );
    let mut last = LAST_GOOD.lock().unwrap_or_else(|p| p.into_inner());
    let known = last.iter().position(|(f, _)| *f == files);
    match client_config(ca, client_cert, alpn) {
        Ok(fresh) => {
            match known {
                Some(i) => last[i].1 = fresh.clone(),
                None => last.push((files, fresh.clone())),
            }
            Ok(fresh)
        }
        Err(error) => match known.map(|i| &last[i].1) {
            Some(previous) => {
                tracing::warn!(error = %format!("{error:#}"), "the TLS files do not load; connecting with the previous ones");
                Ok(previous.clone())
            }
            None => Err(error),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_files_fall_back_to_the_last_that_loaded() {
        let dir = tempfile::tempdir().unwrap();
        bridgehead_certs::Pki::generate(&[])
            .unwrap()
            .write_dir(dir.path(), true)
            .unwrap();
        let ca = dir.path().join("cluster-ca.crt");
        let pair = ClientCert {
            cert: dir.path().join("agent.crt"),
            key: dir.path().join("agent.key"),
        };
        // Never loaded: the error.
        std::fs::write(dir.path().join("other-ca.crt"), "garbage").unwrap();
        assert!(client_config_or_last(&dir.path().join("other-ca.crt"), None, &[]).is_err());
        let first = client_config_or_last(&ca, Some(&pair), &[]).unwrap();
        // A rotation half done (a key that does not match): the previous configuration.
        let other = bridgehead_certs::Pki::generate(&[]).unwrap();
        std::fs::write(&pair.key, &other.agent.key_pem).unwrap();
        let kept = client_config_or_last(&ca, Some(&pair), &[]).unwrap();
        assert!(Arc::ptr_eq(&first, &kept));
        // Fixed: a fresh one.
        std::fs::write(&pair.cert, &other.agent.cert_pem).unwrap();
        let fresh = client_config_or_last(&ca, Some(&pair), &[]).unwrap();
        assert!(!Arc::ptr_eq(&first, &fresh));
        // ALPN: http/1.1 first, then the extra protocols.
        let with_alpn = client_config(&ca, None, &["konnectivity".to_owned()]).unwrap();
        assert_eq!(
            with_alpn.alpn_protocols,
            [b"http/1.1".to_vec(), b"konnectivity".to_vec()]
        );
    }
}
