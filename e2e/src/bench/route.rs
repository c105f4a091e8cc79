//! How the bench client reaches a target: straight over loopback TCP, or through a
//! Bridgehead frontend exactly as kube-apiserver dials it (a fresh connection per tunnel, a
//! fresh TLS handshake without session resumption, `CONNECT host:port HTTP/1.1`).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::{CipherSuite, ClientConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;

use crate::Pki;

/// Opening one tunnel (connect, handshake, CONNECT, 200) must finish within this.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// Largest CONNECT response head the client reads.
const MAX_HEAD: usize = 4096;

/// A byte stream to a target, however it is reached.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// An open tunnel (or direct connection).
pub type Conn = Box<dyn Io>;

/// Where the client's connections go.
#[derive(Clone)]
pub enum Route {
    /// Loopback TCP straight to the target: the physical limit.
    Direct,
    /// The mTLS frontend at `frontend`.
    Mtls {
        frontend: SocketAddr,
        connector: TlsConnector,
    },
    /// The plain Unix-socket frontend at `path`.
    Uds { path: PathBuf },
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Direct => f.write_str("Direct"),
            Route::Mtls { frontend, .. } => write!(f, "Mtls({frontend})"),
            Route::Uds { path } => write!(f, "Uds({})", path.display()),
        }
    }
}

impl Route {
    /// The mTLS frontend at `frontend` with `client.crt` of `pki`, resumption disabled, and
    /// TLS 1.3 suites offered in Go's order (kube-apiserver's: AES-128-GCM first on CPUs with
    /// AES instructions; rustls' own order starts with AES-256-GCM-SHA384).
    pub fn mtls(pki: &Pki, frontend: SocketAddr) -> anyhow::Result<Route> {
        let mut provider = (*bridgehead_runtime::tls::provider()).clone();
        provider
            .cipher_suites
            .sort_by_key(|suite| go_rank(suite.suite()));
        let config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(bridgehead_runtime::tls::load_roots(&pki.path("ca.crt"))?)
            .with_client_auth_cert(
                bridgehead_runtime::tls::load_certs(&pki.path("client.crt"))?,
                bridgehead_runtime::tls::load_key(&pki.path("client.key"))?,
            )?;
        let mut config = config;
        config.resumption = Resumption::disabled();
        Ok(Route::Mtls {
            frontend,
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The TLS version and cipher suite the mTLS frontend negotiates with this client (one
    /// handshake, no tunnel); `None` for the other routes.
    pub async fn negotiated(&self) -> anyhow::Result<Option<String>> {
        let Route::Mtls {
            frontend,
            connector,
        } = self
        else {
            return Ok(None);
        };
        let tcp = TcpStream::connect(frontend).await?;
        let name = ServerName::IpAddress(frontend.ip().into());
        let mut tls = tokio::time::timeout(OPEN_TIMEOUT, connector.connect(name, tcp))
            .await
            .context("TLS handshake timed out")??;
        let (_, session) = tls.get_ref();
        let negotiated = format!(
            "{:?} {:?}",
            session.protocol_version(),
            session.negotiated_cipher_suite().map(|s| s.suite())
        );
        let _ = tls.shutdown().await;
        Ok(Some(negotiated))
    }

    /// The name used in tables, JSON and plots.
    pub fn label(&self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Mtls { .. } => "bridgehead-mtls",
            Route::Uds { .. } => "bridgehead-uds",
        }
    }

    /// Opens a connection to `target`, within [`OPEN_TIMEOUT`].
    pub async fn open(&self, target: SocketAddr) -> anyhow::Result<Conn> {
        tokio::time::timeout(OPEN_TIMEOUT, self.open_unbounded(target))
            .await
            .with_context(|| format!("{} did not open within {OPEN_TIMEOUT:?}", self.label()))?
    }

    async fn open_unbounded(&self, target: SocketAddr) -> anyhow::Result<Conn> {
        match self {
            Route::Direct => {
                let tcp = TcpStream::connect(target)
                    .await
                    .context("connecting to the target")?;
                tcp.set_nodelay(true)?;
                Ok(Box::new(tcp))
            }
            Route::Mtls {
                frontend,
                connector,
            } => {
                let tcp = TcpStream::connect(frontend)
                    .await
                    .context("connecting to the frontend")?;
                tcp.set_nodelay(true)?;
                let name = ServerName::IpAddress(frontend.ip().into());
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .context("TLS handshake with the frontend")?;
                connect(Box::new(tls), target).await
            }
            Route::Uds { path } => {
                let socket = UnixStream::connect(path)
                    .await
                    .with_context(|| format!("connecting to {}", path.display()))?;
                connect(Box::new(socket), target).await
            }
        }
    }
}

/// Position of a suite in Go's TLS 1.3 preference with AES hardware (crypto/tls
/// `defaultCipherSuitesTLS13`); TLS 1.2 suites keep their order after those.
fn go_rank(suite: CipherSuite) -> u8 {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        _ => 3,
    }
}

/// Asks for a tunnel to `target` as kube-apiserver does and checks the answer as it does:
/// status 200 and no byte after the head.
async fn connect(mut conn: Conn, target: SocketAddr) -> anyhow::Result<Conn> {
    let head = format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    conn.write_all(head.as_bytes()).await?;
    conn.flush().await?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buf.len() > MAX_HEAD {
            bail!("CONNECT response head longer than {MAX_HEAD} bytes");
        }
        let n = conn
            .read(&mut chunk)
            .await
            .context("reading the CONNECT response")?;
        if n == 0 {
            bail!(
                "frontend closed before the response head ended: {:?}",
                String::from_utf8_lossy(&buf)
            );
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    if !head.starts_with("HTTP/1.1 200") {
        let reply = String::from_utf8_lossy(&buf);
        bail!("CONNECT refused: {}", reply.trim_end());
    }
    if end != buf.len() {
        bail!("{} bytes after the 200 head", buf.len() - end);
    }
    Ok(conn)
}
