//! The async client: tunnels opened through a frontend exactly as kube-apiserver opens them (a
//! fresh connection and full TLS handshake per tunnel, [`super::kube::connect_head`], status
//! 200 and no byte after the head), for load that many tunnels at once make.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, UnixStream};
use tokio_rustls::TlsConnector;

use super::kube;

/// Largest CONNECT response head read.
const MAX_HEAD: usize = 4096;

/// An async byte stream, however it is reached.
pub trait AsyncIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncIo for T {}

/// An open tunnel (or a direct connection) for async code.
pub type AsyncConn = Box<dyn AsyncIo>;

/// A frontend to open tunnels through.
#[derive(Clone)]
pub enum Frontend {
    /// The mTLS frontend at `addr`.
    Mtls {
        addr: SocketAddr,
        connector: TlsConnector,
    },
    /// The plain Unix-socket frontend at `path`.
    Uds { path: PathBuf },
    /// Plain HTTP CONNECT over TCP at `addr` (another proxy's, in the bench).
    Tcp { addr: SocketAddr },
}

impl fmt::Debug for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Frontend::Mtls { addr, .. } => write!(f, "Mtls({addr})"),
            Frontend::Uds { path } => write!(f, "Uds({})", path.display()),
            Frontend::Tcp { addr } => write!(f, "Tcp({addr})"),
        }
    }
}

impl Frontend {
    /// The mTLS frontend at `addr`, with a client configuration such as
    /// [`super::tls::config`] makes.
    pub fn mtls(addr: SocketAddr, config: Arc<ClientConfig>) -> Frontend {
        Frontend::Mtls {
            addr,
            connector: TlsConnector::from(config),
        }
    }

    /// A connection to the frontend, TLS handshake done, nothing sent yet.
    pub async fn connect(&self) -> anyhow::Result<AsyncConn> {
        self.connect_with(None).await
    }

    /// [`Frontend::connect`], a TCP connection made with `receive_buffer` as its `SO_RCVBUF`
    /// (the kernel's default if `None`; a Unix socket has none).
    pub async fn connect_with(&self, receive_buffer: Option<u32>) -> anyhow::Result<AsyncConn> {
        let tcp = |addr: SocketAddr| async move {
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            if let Some(size) = receive_buffer {
                socket.set_recv_buffer_size(size)?;
            }
            socket.connect(addr).await
        };
        match self {
            Frontend::Mtls { addr, connector } => {
                let tcp = tcp(*addr).await.context("connecting to the frontend")?;
                tcp.set_nodelay(true)?;
                let name = ServerName::IpAddress(addr.ip().into());
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .context("TLS handshake with the frontend")?;
                Ok(Box::new(tls))
            }
            Frontend::Uds { path } => {
                let socket = UnixStream::connect(path)
                    .await
                    .with_context(|| format!("connecting to {}", path.display()))?;
                Ok(Box::new(socket))
            }
            Frontend::Tcp { addr } => {
                let tcp = tcp(*addr)
                    .await
                    .with_context(|| format!("connecting to {addr}"))?;
                tcp.set_nodelay(true)?;
                Ok(Box::new(tcp))
            }
        }
    }

    /// A tunnel to `target`: [`Frontend::connect`], then [`connect`].
    pub async fn open(&self, target: &str) -> anyhow::Result<AsyncConn> {
        self.open_with(target, None).await
    }

    /// [`Frontend::open`] over [`Frontend::connect_with`] `receive_buffer`.
    pub async fn open_with(
        &self,
        target: &str,
        receive_buffer: Option<u32>,
    ) -> anyhow::Result<AsyncConn> {
        let conn = self.connect_with(receive_buffer).await?;
        connect(conn, target).await
    }
}

/// Asks for a tunnel to `target` on `conn` as kube-apiserver does and checks the answer as it
/// does: status 200 and no byte after the head.
pub async fn connect(mut conn: AsyncConn, target: &str) -> anyhow::Result<AsyncConn> {
    conn.write_all(kube::connect_head(target).as_bytes())
        .await?;
    conn.flush().await?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    let end = loop {
        if let Some(end) = kube::head_len(&buf) {
            break end;
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
    if kube::status(&head)? != 200 {
        bail!(
            "CONNECT refused: {}",
            String::from_utf8_lossy(&buf).trim_end()
        );
    }
    if end != buf.len() {
        bail!("{} bytes after the 200 head", buf.len() - end);
    }
    Ok(conn)
}
