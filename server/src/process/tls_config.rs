//! The server configuration of both TLS endpoints, the CONNECT frontend and the agent
//! endpoint: each requires a client certificate from its own CA and speaks only `http/1.1`
//! over ALPN. ANP's `--cipher-suites` and `--tls-min-version` (Go's names) choose the TLS 1.2
//! suites and the versions of both ([`TlsPolicy`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use bridgehead_runtime::tls::{load_certs, load_key, load_roots, provider};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, ServerConfig, SupportedProtocolVersion};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The TLS versions and TLS 1.2 cipher suites both endpoints accept.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TlsPolicy {
    /// TLS 1.3 only (`--tls-min-version=VersionTLS13`).
    pub tls13_only: bool,
    /// The TLS 1.2 suites allowed; `None`: rustls' defaults (all of them are ECDHE AEAD).
    #[serde(serialize_with = "suite_names")]
    pub tls12_suites: Option<Vec<CipherSuite>>,
}

fn suite_names<S: serde::Serializer>(
    suites: &Option<Vec<CipherSuite>>,
    to: S,
) -> Result<S::Ok, S::Error> {
    let names = suites.as_ref().map(|suites| {
        suites
            .iter()
            .map(|suite| format!("{suite:?}"))
            .collect::<Vec<_>>()
    });
    serde::Serialize::serialize(&names, to)
}

/// Go's names of the TLS 1.2 suites rustls implements (with Go's older aliases).
const TLS12_SUITES: [(&str, CipherSuite); 8] = [
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Go's names of the TLS 1.3 suites: Go ignores them in `--cipher-suites` (TLS 1.3's are
/// not configurable), and so does Bridgehead.
const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Suites Go (and Kubernetes' flag) knows that rustls does not implement: CBC, static RSA key
/// exchange, 3DES, RC4. Accepted in the list, never offered.
const UNIMPLEMENTED_SUITES: [&str; 16] = [
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
];

/// `--tls-min-version=VersionTLS13`.
static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];

impl TlsPolicy {
    /// From `--cipher-suites` (Go's names) and `--tls-min-version` (`VersionTLS10` ... `13`);
    /// lines for what is accepted but not applied go to `notes`.
    pub fn from_flags(
        suites: &[String],
        min_version: Option<&str>,
        notes: &mut Vec<String>,
    ) -> Result<TlsPolicy, String> {
        let tls13_only = match min_version.map(str::trim).unwrap_or("") {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            old @ ("VersionTLS10" | "VersionTLS11") => {
                notes.push(format!(
                    "--tls-min-version={old}: Bridgehead speaks TLS 1.2 and 1.3 only, so the minimum is VersionTLS12"
                ));
                false
            }
            other => {
                return Err(format!(
                    "--tls-min-version {other:?}: valid are VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
                ))
            }
        };
        let names: Vec<&str> = suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        if names.is_empty() {
            return Ok(TlsPolicy {
                tls13_only,
                tls12_suites: None,
            });
        }
        let mut chosen = Vec::new();
        let mut unimplemented = Vec::new();
        for name in names {
            if let Some((_, suite)) = TLS12_SUITES.iter().find(|(n, _)| *n == name) {
                if !chosen.contains(suite) {
                    chosen.push(*suite);
                }
            } else if TLS13_SUITES.contains(&name) {
                // As Go: TLS 1.3's suites are always on.
            } else if UNIMPLEMENTED_SUITES.contains(&name) {
                unimplemented.push(name);
            } else {
                let valid: Vec<&str> = TLS12_SUITES
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(TLS13_SUITES)
                    .chain(UNIMPLEMENTED_SUITES)
                    .collect();
                return Err(format!(
                    "--cipher-suites: unknown cipher suite {name:?}; valid names (Go's): {}",
                    valid.join(", ")
                ));
            }
        }
        if !unimplemented.is_empty() {
            notes.push(format!(
                "--cipher-suites: {} are not implemented by rustls (CBC, RSA key exchange, 3DES, RC4) and never offered",
                unimplemented.join(", ")
            ));
        }
        if chosen.is_empty() && !tls13_only {
            notes.push(
                "--cipher-suites names no TLS 1.2 suite Bridgehead implements: TLS 1.3 only"
                    .to_owned(),
            );
        }
        Ok(TlsPolicy {
            tls13_only: tls13_only || chosen.is_empty(),
            tls12_suites: Some(chosen),
        })
    }

    /// The crypto provider with only the allowed suites, and the versions.
    fn apply(
        &self,
    ) -> (
        Arc<CryptoProvider>,
        &'static [&'static SupportedProtocolVersion],
    ) {
        let mut provider = (*provider()).clone();
        if let Some(allowed) = &self.tls12_suites {
            provider.cipher_suites.retain(|suite| {
                suite.version() == &rustls::version::TLS13 || allowed.contains(&suite.suite())
            });
        }
        let versions: &'static [&'static SupportedProtocolVersion] = if self.tls13_only {
            TLS13_ONLY
        } else {
            rustls::DEFAULT_VERSIONS
        };
        (Arc::new(provider), versions)
    }
}

/// Presents `cert`/`key` and, with `client_ca`, requires a client certificate that chains to
/// it. The CA's name is advertised in the CertificateRequest, which Go clients (kube-apiserver)
/// need before they send their certificate.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    policy: &TlsPolicy,
) -> anyhow::Result<Arc<ServerConfig>> {
    let (provider, versions) = policy.apply();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
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

/// How often the certificate files are looked at for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A TLS endpoint's configuration, rebuilt when its files change on disk: cert-manager or
/// kubelet rotating them, or the atomic symlink swap of a Secret or projected volume (the
/// files are compared by what their paths resolve to: device, inode, size, mtime). New
/// connections take the new configuration; connections open keep theirs. A change that does
/// not load (a half-written or mismatched pair, a broken CA) is logged, and the last good
/// configuration stays until the files load again.
#[derive(Debug)]
pub struct ReloadingConfig {
    what: &'static str,
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    policy: TlsPolicy,
    current: RwLock<Arc<ServerConfig>>,
    seen: Mutex<Vec<Option<FileStamp>>>,
    reloads: AtomicU64,
}

/// What a path resolves to, to tell a changed file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    })
}

impl ReloadingConfig {
    /// Loads the configuration now (an error if it does not load: a server must not start
    /// without its certificates).
    pub fn load(
        what: &'static str,
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        policy: &TlsPolicy,
    ) -> anyhow::Result<Arc<ReloadingConfig>> {
        let reloading = ReloadingConfig {
            what,
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: client_ca.map(Path::to_owned),
            policy: policy.clone(),
            current: RwLock::new(server_config(cert, key, client_ca, policy)?),
            seen: Mutex::new(Vec::new()),
            reloads: AtomicU64::new(0),
        };
        *reloading.seen.lock().unwrap_or_else(|p| p.into_inner()) = reloading.stamps();
        Ok(Arc::new(reloading))
    }

    /// The configuration for a new connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many times the files were reloaded.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    fn stamps(&self) -> Vec<Option<FileStamp>> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|path| stamp(path))
            .collect()
    }

    /// Looks at the files once; reloads when they changed. Returns whether it reloaded.
    pub fn check(&self) -> bool {
        let stamps = self.stamps();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == stamps {
                return false;
            }
            *seen = stamps;
        }
        match server_config(
            &self.cert,
            &self.key,
            self.client_ca.as_deref(),
            &self.policy,
        ) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = config;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                info!(endpoint = self.what, cert = %self.cert.display(), "certificates reloaded: new connections use them");
                true
            }
            Err(error) => {
                // Seen, so the same broken files are not retried every second; the next
                // change (the rest of a rotation) is.
                warn!(endpoint = self.what, error = %format!("{error:#}"), "changed certificate files do not load; keeping the previous ones");
                false
            }
        }
    }

    /// Checks every [`RELOAD_INTERVAL`] until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            // Three stat calls a second, and a parse when something changed: inline (a
            // blocking-pool thread for it would outlive the check and count as a worker).
            self.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(suites: &[&str], min: Option<&str>) -> (Result<TlsPolicy, String>, Vec<String>) {
        let mut notes = Vec::new();
        let suites: Vec<String> = suites.iter().map(|s| (*s).to_owned()).collect();
        (TlsPolicy::from_flags(&suites, min, &mut notes), notes)
    }

    #[test]
    fn changed_files_reload_broken_ones_keep_the_last_good() {
        let dir = tempfile::tempdir().unwrap();
        let mut pki = bridgehead_certs::Pki::generate(&[]).unwrap();
        pki.write_dir(dir.path(), true).unwrap();
        let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
        let ca = dir.path().join("frontend-ca.crt");
        let reloading =
            ReloadingConfig::load("frontend", &cert, &key, Some(&ca), &TlsPolicy::default())
                .unwrap();
        let first = reloading.current();
        // Nothing changed: nothing reloaded.
        assert!(!reloading.check());
        assert!(Arc::ptr_eq(&first, &reloading.current()));
        // New files, written in place of the old (a rename, as a volume swaps them).
        pki.renew_leaves(&[]).unwrap();
        let staged = tempfile::tempdir().unwrap();
        pki.write_dir(staged.path(), true).unwrap();
        std::fs::rename(staged.path().join("server.crt"), &cert).unwrap();
        std::fs::rename(staged.path().join("server.key"), &key).unwrap();
        assert!(reloading.check());
        assert_eq!(reloading.reloads(), 1);
        let second = reloading.current();
        assert!(!Arc::ptr_eq(&first, &second));
        // A broken certificate: not taken, and not retried until the files change again.
        std::fs::write(&cert, "not a certificate").unwrap();
        assert!(!reloading.check());
        assert!(!reloading.check());
        assert_eq!(reloading.reloads(), 1);
        assert!(Arc::ptr_eq(&second, &reloading.current()));
        // Fixed: taken.
        std::fs::write(&cert, &pki.server.cert_pem).unwrap();
        assert!(reloading.check());
        assert_eq!(reloading.reloads(), 2);
        // A file that cannot load at start is an error.
        std::fs::write(&key, "not a key").unwrap();
        assert!(
            ReloadingConfig::load("frontend", &cert, &key, Some(&ca), &TlsPolicy::default())
                .is_err()
        );
    }

    #[test]
    fn go_names_choose_the_tls12_suites() {
        assert_eq!(policy(&[], None).0.unwrap(), TlsPolicy::default());
        let (chosen, notes) = policy(
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
                "TLS_RSA_WITH_AES_128_CBC_SHA",
            ],
            Some("VersionTLS12"),
        );
        let chosen = chosen.unwrap();
        assert!(!chosen.tls13_only);
        assert_eq!(
            chosen.tls12_suites.as_deref(),
            Some(
                &[
                    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                    CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                ][..]
            )
        );
        assert!(
            notes[0].contains("TLS_RSA_WITH_AES_128_CBC_SHA"),
            "{notes:?}"
        );
        // The provider keeps TLS 1.3's suites and the chosen ones only.
        let (provider, versions) = chosen.apply();
        assert_eq!(versions.len(), 2);
        let kept: Vec<CipherSuite> = provider.cipher_suites.iter().map(|s| s.suite()).collect();
        assert!(kept.contains(&CipherSuite::TLS13_AES_128_GCM_SHA256));
        assert!(kept.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert!(!kept.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384));
    }

    #[test]
    fn unknown_names_are_refused_with_the_valid_list() {
        let error = policy(&["TLS_FANCY"], None).0.unwrap_err();
        assert!(error.contains("\"TLS_FANCY\""), "{error}");
        assert!(
            error.contains("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
            "{error}"
        );
        let error = policy(&[], Some("TLS1.2")).0.unwrap_err();
        assert!(error.contains("VersionTLS13"), "{error}");
    }

    #[test]
    fn versions() {
        assert!(policy(&[], Some("VersionTLS13")).0.unwrap().tls13_only);
        let (old, notes) = policy(&[], Some("VersionTLS10"));
        assert!(!old.unwrap().tls13_only);
        assert!(notes[0].contains("TLS 1.2 and 1.3 only"), "{notes:?}");
        // Only suites rustls lacks: TLS 1.3 alone.
        let (only_cbc, notes) = policy(&["TLS_RSA_WITH_AES_128_CBC_SHA"], None);
        assert!(only_cbc.unwrap().tls13_only);
        assert!(
            notes.iter().any(|n| n.contains("TLS 1.3 only")),
            "{notes:?}"
        );
        let (_, versions) = policy(&[], Some("VersionTLS13")).0.unwrap().apply();
        assert_eq!(versions, [&rustls::version::TLS13]);
        // TLS 1.3 asked for with TLS 1.2 suites named: no line about falling back to 1.3.
        let (chosen, notes) = policy(
            &["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
            Some("VersionTLS13"),
        );
        assert!(chosen.unwrap().tls13_only);
        assert!(notes.is_empty(), "{notes:?}");
    }
}
