//! `--fallback-proxy` and its flags, validated: how the fallback is reached
//! ([`FallbackConfig`]) and which targets may be relayed to it ([`FallbackDestinations`]).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use bridgehead_runtime::destinations::{Policy, Rule, RuleFlags};

/// How the fallback proxy is reached, as validated from the flags.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FallbackConfig {
    /// `unix:///path`: plain HTTP CONNECT on a Unix socket.
    Unix(PathBuf),
    /// `https://host:port`: HTTP CONNECT over TLS, the proxy's certificate checked against
    /// `ca`, `client` (certificate, key) presented when given.
    Https {
        host: String,
        port: u16,
        ca: PathBuf,
        client: Option<(PathBuf, PathBuf)>,
    },
}

impl FallbackConfig {
    /// Parses `--fallback-proxy` with its TLS flags; an error says what is wrong in one line.
    pub fn parse(
        url: &str,
        ca: Option<PathBuf>,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
    ) -> anyhow::Result<FallbackConfig> {
        if let Some(path) = url.strip_prefix("unix://") {
            if !path.starts_with('/') {
                bail!("--fallback-proxy {url}: a Unix socket is unix:///absolute/path");
            }
            if ca.is_some() || client_cert.is_some() || client_key.is_some() {
                bail!("--fallback-proxy-ca-cert/-client-cert/-client-key apply to an https:// fallback, not to {url}");
            }
            return Ok(FallbackConfig::Unix(PathBuf::from(path)));
        }
        let Some(authority) = url.strip_prefix("https://") else {
            bail!("--fallback-proxy {url}: expected unix:///path or https://host:port");
        };
        let authority = authority.trim_end_matches('/');
        let (host, port) = authority
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .filter(|(host, port)| !host.is_empty() && *port != 0)
            .with_context(|| format!("--fallback-proxy {url}: expected https://host:port"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let ca = ca.with_context(|| {
            format!(
                "--fallback-proxy {url} needs --fallback-proxy-ca-cert (the CA of its certificate)"
            )
        })?;
        let client = match (client_cert, client_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => bail!("--fallback-proxy-client-cert and --fallback-proxy-client-key go together"),
        };
        Ok(FallbackConfig::Https {
            host,
            port,
            ca,
            client,
        })
    }

    /// The URL, for logs and answers.
    pub fn url(&self) -> String {
        match self {
            FallbackConfig::Unix(path) => format!("unix://{}", path.display()),
            FallbackConfig::Https { host, port, .. } if host.contains(':') => {
                format!("https://[{host}]:{port}")
            }
            FallbackConfig::Https { host, port, .. } => format!("https://{host}:{port}"),
        }
    }
}

/// `--fallback-allowed-destinations`, `--fallback-denied-destinations` and
/// `--fallback-exempt-destinations`: the destination policy of what is relayed to the fallback
/// proxy. The defaults deny what an agent denies by default (link-local and cloud metadata
/// addresses, `0.0.0.0/8`, `::`): konnectivity's agents check nothing, so without this a target
/// no Bridgehead agent claims would reach them unchecked for as long as a migration lasts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FallbackDestinations {
    pub allowed: Vec<Rule>,
    pub denied: Vec<Rule>,
    /// Lifts the default denials for what it matches: what the cluster reached through
    /// konnectivity on purpose, for the migration window.
    pub exempt: Vec<Rule>,
}

impl FallbackDestinations {
    /// The policy these rules make. The server listens on nothing the fallback's agents could
    /// reach as "their own port": no ports of its own are denied.
    pub fn policy(&self) -> Policy {
        Policy::new(
            RuleFlags::FALLBACK,
            self.allowed.clone(),
            self.denied.clone(),
            vec![],
            vec![],
        )
        .exempting(self.exempt.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_into_a_fallback_or_one_clear_error() {
        assert_eq!(
            FallbackConfig::parse("unix:///run/konnectivity.sock", None, None, None).unwrap(),
            FallbackConfig::Unix("/run/konnectivity.sock".into())
        );
        let https = FallbackConfig::parse(
            "https://10.0.0.1:8131",
            Some("ca.crt".into()),
            Some("c.crt".into()),
            Some("c.key".into()),
        )
        .unwrap();
        assert_eq!(https.url(), "https://10.0.0.1:8131");
        let v6 = FallbackConfig::parse("https://[fd00::1]:8131/", Some("ca".into()), None, None)
            .unwrap();
        assert_eq!(v6.url(), "https://[fd00::1]:8131");
        let none: Option<&str> = None;
        for (url, ca, cert, key, says) in [
            (
                "http://x:1",
                none,
                none,
                none,
                "expected unix:///path or https://host:port",
            ),
            ("unix://relative", None, None, None, "unix:///absolute/path"),
            (
                "unix:///s",
                Some("ca"),
                None,
                None,
                "apply to an https:// fallback",
            ),
            (
                "https://x",
                Some("ca"),
                None,
                None,
                "expected https://host:port",
            ),
            (
                "https://x:0",
                Some("ca"),
                None,
                None,
                "expected https://host:port",
            ),
            (
                "https://x:1",
                None,
                None,
                None,
                "needs --fallback-proxy-ca-cert",
            ),
            ("https://x:1", Some("ca"), Some("c"), None, "go together"),
        ] {
            let error = FallbackConfig::parse(
                url,
                ca.map(Into::into),
                cert.map(Into::into),
                key.map(Into::into),
            )
            .unwrap_err()
            .to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}
