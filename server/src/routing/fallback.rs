//! `--fallback-proxy`: where a CONNECT goes when the strategies find no agent for it. Another
//! HTTP CONNECT proxy — konnectivity's server in `http-connect` mode while its agents are
//! replaced by Bridgehead's, node by node (docs/migrating.md) — reached on a Unix socket or
//! over mutual TLS. The CONNECT is relayed as one: only the fallback's `200` opens a tunnel,
//! spliced with the same guarantees as an agent's (half-close each way, bounded buffers, a
//! failure on either side a reset on the other); any other answer is a `502` to the client with
//! the fallback's status and reason in its text, because kube-apiserver must see exactly `200`
//! or a failure (RFC 9110 lets a client take any 2xx to CONNECT as an open tunnel). The whole
//! exchange is bounded by `--dial-timeout`. Before anything is sent, an IP-literal target is
//! checked against the destination policy ([`FallbackDestinations`]): a target no agent claims
//! (a metadata address) gets a 403 here, as an agent would answer it, not a path around it.
//!
//! What this leaves out: routing (the frontend asks here only once the route table said no
//! agent), names (the fallback's agents resolve them, after any check here could run), and
//! reloading the fallback's TLS files (read at startup: the fallback is temporary).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bridgehead_mux::splice::TunnelSocket;
use bridgehead_runtime::destinations::{Denied, Policy};
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::process::http_head::{self, RawHead, MAX_HEADERS};
use crate::routing::dial::Deadline;
use crate::routing::router::Target;

mod config;

pub use config::{FallbackConfig, FallbackDestinations};

/// Largest buffer of each direction of a fallback tunnel.
const BUFFER: usize = 64 * 1024;

/// The fallback proxy, ready to relay to.
#[derive(Clone)]
pub struct Fallback {
    config: FallbackConfig,
    url: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    policy: Arc<Policy>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("url", &self.url)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Why a relayed CONNECT got no tunnel.
#[derive(Debug, thiserror::Error)]
pub enum FallbackError {
    /// The destination policy refused the target: the fallback was not asked.
    #[error("not relayed to fallback proxy {url}: {denied}")]
    Denied { url: String, denied: Denied },
    #[error("fallback proxy {url} unreachable: {error}")]
    Unreachable { url: String, error: std::io::Error },
    #[error("fallback proxy {url} did not answer within {timeout:?}")]
    TimedOut { url: String, timeout: Duration },
    #[error("fallback proxy {url} sent no usable answer: {what}")]
    BadAnswer { url: String, what: &'static str },
    /// The fallback answered with this status, not `200`: a 502 naming it and its reason.
    #[error("fallback proxy {url} answered {reason}")]
    Answered {
        url: String,
        status: StatusCode,
        reason: String,
    },
}

impl FallbackError {
    /// The status the client gets: 403 for a target the policy denies (as an agent's policy
    /// answers), 502, or 504 when the fallback did not answer in time. Never the fallback's
    /// own: a 2xx other than 200 would read as an open tunnel.
    pub fn status(&self) -> StatusCode {
        match self {
            FallbackError::Denied { .. } => StatusCode::FORBIDDEN,
            FallbackError::Unreachable { .. }
            | FallbackError::BadAnswer { .. }
            | FallbackError::Answered { .. } => StatusCode::BAD_GATEWAY,
            FallbackError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `fallback_dials_total` label.
    pub fn label(&self) -> &'static str {
        match self {
            FallbackError::Denied { .. } => "denied",
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
    /// The fallback of `config`, its TLS files loaded now (an error names the file), relayed
    /// only the targets `destinations` allow.
    pub fn new(
        config: FallbackConfig,
        destinations: &FallbackDestinations,
    ) -> anyhow::Result<Fallback> {
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
        Ok(Fallback {
            config,
            url,
            tls,
            policy: Arc::new(destinations.policy()),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Asks the fallback for a tunnel to `target`, all of it before `deadline`, if the
    /// destination policy allows the target.
    pub async fn relay(
        &self,
        target: &Target,
        deadline: Deadline,
    ) -> Result<Relayed, FallbackError> {
        self.check(target)?;
        match tokio::time::timeout_at(deadline.at(), self.connect_and_ask(target)).await {
            Ok(relayed) => relayed,
            Err(_) => Err(FallbackError::TimedOut {
                url: self.url.clone(),
                timeout: deadline.timeout(),
            }),
        }
    }

    /// The destination policy on an IP-literal target; a name passes (see the module doc).
    fn check(&self, target: &Target) -> Result<(), FallbackError> {
        let Some(ip) = target.host.ip() else {
            return Ok(());
        };
        self.policy
            .check(SocketAddr::new(ip, target.port))
            .map_err(|denied| FallbackError::Denied {
                url: self.url.clone(),
                denied,
            })
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
