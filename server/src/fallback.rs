//! `--fallback-proxy`: where a CONNECT goes when the strategies find no agent for it. Another
//! HTTP CONNECT proxy — konnectivity's server in `http-connect` mode while its agents are
//! replaced by Bridgehead's, node by node (docs/migrating.md) — reached on a Unix socket or
//! over mutual TLS. The CONNECT is relayed as one: the fallback's answer (status and reason) is
//! the client's, its `200` opens a tunnel that is spliced with the same guarantees as an
//! agent's (half-close each way, bounded buffers, a failure on either side a reset on the
//! other), and the whole exchange is bounded by `--dial-timeout`.
//!
//! What this leaves out: routing (the frontend asks here only once the route table said no
//! agent), and reloading the fallback's TLS files (read at startup: the fallback is temporary).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bridgehead_mux::splice::TunnelSocket;
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::http_head::{self, RawHead, MAX_HEADERS};
use crate::router::Target;

/// Largest buffer of each direction of a fallback tunnel.
const BUFFER: usize = 64 * 1024;

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

/// The fallback proxy, ready to relay to.
#[derive(Clone)]
pub struct Fallback {
    config: FallbackConfig,
    url: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Why a relayed CONNECT got no tunnel.
#[derive(Debug, thiserror::Error)]
pub enum FallbackError {
    #[error("fallback proxy {url} unreachable: {error}")]
    Unreachable { url: String, error: std::io::Error },
    #[error("fallback proxy {url} did not answer within {timeout:?}")]
    TimedOut { url: String, timeout: Duration },
    #[error("fallback proxy {url} sent no usable answer: {what}")]
    BadAnswer { url: String, what: &'static str },
    /// The fallback answered with this status: passed through with its reason.
    #[error("fallback proxy {url}: {reason}")]
    Answered {
        url: String,
        status: StatusCode,
        reason: String,
    },
}

impl FallbackError {
    /// The status the client gets: the fallback's own, 502 or 504.
    pub fn status(&self) -> StatusCode {
        match self {
            FallbackError::Unreachable { .. } | FallbackError::BadAnswer { .. } => {
                StatusCode::BAD_GATEWAY
            }
            FallbackError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            FallbackError::Answered { status, .. } => *status,
        }
    }

    /// The `fallback_dials_total` label.
    pub fn label(&self) -> &'static str {
        match self {
            FallbackError::Unreachable { .. } => "unreachable",
            FallbackError::TimedOut { .. } => "timed_out",
            FallbackError::BadAnswer { .. } => "bad_answer",
            FallbackError::Answered { .. } => "refused",
        }
    }
}

/// A tunnel the fallback proxy answered `200` for.
#[derive(Debug)]
pub struct Relayed {
    pub upstream: Upstream,
    /// What the fallback sent behind its `200`: the target's first bytes.
    pub early: Bytes,
}

/// The connection to the fallback proxy.
#[derive(Debug)]
pub enum Upstream {
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Fallback {
    /// The fallback of `config`, its TLS files loaded now (an error names the file).
    pub fn new(config: FallbackConfig) -> anyhow::Result<Fallback> {
        let tls = match &config {
            FallbackConfig::Unix(_) => None,
            FallbackConfig::Https {
                host, ca, client, ..
            } => {
                use bridgehead_runtime::tls;
                let roots = tls::load_roots(ca).context("loading --fallback-proxy-ca-cert")?;
                let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
                    .with_safe_default_protocol_versions()
                    .context("configuring TLS for --fallback-proxy")?
                    .with_root_certificates(roots);
                let mut client_config = match client {
                    Some((cert, key)) => {
                        let certs = tls::load_certs(cert)
                            .context("loading --fallback-proxy-client-cert")?;
                        let key =
                            tls::load_key(key).context("loading --fallback-proxy-client-key")?;
                        builder.with_client_auth_cert(certs, key).context(
                            "--fallback-proxy-client-cert and -client-key are not a usable pair",
                        )?
                    }
                    None => builder.with_no_client_auth(),
                };
                client_config.alpn_protocols = vec![b"http/1.1".to_vec()];
                let name = ServerName::try_from(host.clone())
                    .with_context(|| format!("--fallback-proxy host {host}"))?;
                Some((TlsConnector::from(Arc::new(client_config)), name))
            }
        };
        let url = config.url();
        Ok(Fallback { config, url, tls })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Asks the fallback for a tunnel to `target`, all of it within `timeout`.
    pub async fn relay(
        &self,
        target: &Target,
        timeout: Duration,
    ) -> Result<Relayed, FallbackError> {
        match tokio::time::timeout(timeout, self.connect_and_ask(target)).await {
            Ok(relayed) => relayed,
            Err(_) => Err(FallbackError::TimedOut {
                url: self.url.clone(),
                timeout,
            }),
        }
    }

    async fn connect_and_ask(&self, target: &Target) -> Result<Relayed, FallbackError> {
        let unreachable = |error| FallbackError::Unreachable {
            url: self.url.clone(),
            error,
        };
        let mut upstream = match (&self.config, &self.tls) {
            (FallbackConfig::Unix(path), _) => {
                Upstream::Unix(UnixStream::connect(path).await.map_err(unreachable)?)
            }
            (FallbackConfig::Https { host, port, .. }, Some((connector, name))) => {
                let tcp = TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(unreachable)?;
                let _ = tcp.set_nodelay(true);
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(unreachable)?;
                Upstream::Tls(Box::new(tls))
            }
            (FallbackConfig::Https { .. }, None) => {
                return Err(unreachable(std::io::Error::other("no TLS configuration")))
            }
        };
        let authority = target.to_string();
        let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
        upstream
            .write_all(request.as_bytes())
            .await
            .map_err(unreachable)?;
        let bad = |what| FallbackError::BadAnswer {
            url: self.url.clone(),
            what,
        };
        let (buf, end) = match http_head::read(&mut upstream).await {
            RawHead::Complete { buf, end } => (buf, end),
            RawHead::Closed => return Err(bad("it closed the connection")),
            RawHead::TooLarge => return Err(bad("its answer's head is too large")),
        };
        let status = answer_status(&buf[..end]).ok_or_else(|| bad("a malformed status line"))?;
        if status.0 != StatusCode::OK {
            return Err(FallbackError::Answered {
                url: self.url.clone(),
                status: status.0,
                reason: format!("{} {}", status.0.as_u16(), status.1),
            });
        }
        Ok(Relayed {
            upstream,
            early: BytesMut::from(&buf[end..]).freeze(),
        })
    }
}

/// The status and reason phrase of an answer's head.
fn answer_status(head: &[u8]) -> Option<(StatusCode, String)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return None,
    }
    let status = StatusCode::from_u16(response.code?).ok()?;
    let reason =
        bridgehead_proto::text::Printable::cut(response.reason.unwrap_or(""), 200).to_string();
    Some((status, reason))
}

/// Splices `client` with the fallback's tunnel until both directions end, `early` (the
/// client's bytes behind its head) first to the fallback and the fallback's early bytes first
/// to the client. Returns the bytes moved each way (to the target, from it), or the error that
/// ended it, after which both connections are closed with a reset.
pub async fn splice<C>(
    client: &mut C,
    relayed: Relayed,
    early: Bytes,
) -> (u64, u64, std::io::Result<()>)
where
    C: AsyncRead + AsyncWrite + TunnelSocket + Unpin,
{
    let Relayed {
        mut upstream,
        early: upstream_early,
    } = relayed;
    let result = async {
        upstream.write_all(&early).await?;
        client.write_all(&upstream_early).await?;
        tokio::io::copy_bidirectional_with_sizes(client, &mut upstream, BUFFER, BUFFER).await
    }
    .await;
    match result {
        Ok((up, down)) => (
            up + early.len() as u64,
            down + upstream_early.len() as u64,
            Ok(()),
        ),
        Err(error) => {
            client.abort_on_close();
            upstream.abort_on_close();
            (0, 0, Err(error))
        }
    }
}

impl Upstream {
    /// Makes the close a reset where the connection has one (TCP).
    fn abort_on_close(&self) {
        if let Upstream::Tls(tls) = self {
            let _ = tls.get_ref().0.set_zero_linger();
        }
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Unix(unix) => std::pin::Pin::new(unix).poll_read(cx, buf),
            Upstream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Upstream::Unix(unix) => std::pin::Pin::new(unix).poll_write(cx, buf),
            Upstream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Unix(unix) => std::pin::Pin::new(unix).poll_flush(cx),
            Upstream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Upstream::Unix(unix) => std::pin::Pin::new(unix).poll_shutdown(cx),
            Upstream::Tls(tls) => std::pin::Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
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

    #[test]
    fn an_answers_status_and_reason_are_read() {
        assert_eq!(
            answer_status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some((StatusCode::OK, "Connection established".into()))
        );
        assert_eq!(
            answer_status(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"),
            Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable".into()
            ))
        );
        assert_eq!(answer_status(b"garbage\r\n\r\n"), None);
    }
}
