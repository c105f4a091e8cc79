//! How the bench client reaches a target: straight over loopback TCP, or through a
//! Bridgehead frontend exactly as kube-apiserver dials it (the harness's async client: a
//! fresh connection per tunnel, a fresh TLS handshake without session resumption,
//! `CONNECT host:port HTTP/1.1`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bridgehead_e2e::client::tls;
use bridgehead_e2e::client::tunnel::{AsyncConn, Frontend};
use bridgehead_e2e::Pki;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Opening one tunnel (connect, handshake, CONNECT, 200) must finish within this.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// An open tunnel (or direct connection).
pub type Conn = AsyncConn;

/// Where the client's connections go.
#[derive(Debug, Clone)]
pub enum Route {
    /// Loopback TCP straight to the target: the physical limit.
    Direct,
    /// Through a Bridgehead frontend.
    Bridgehead(Frontend),
    /// Through another proxy's HTTP CONNECT frontend (konnectivity), named by `label`.
    Peer {
        label: &'static str,
        frontend: Frontend,
    },
}

impl Route {
    /// The mTLS frontend at `frontend` with `client.crt` of `pki` and kube-apiserver's TLS
    /// settings.
    pub fn mtls(pki: &Pki, frontend: SocketAddr) -> anyhow::Result<Route> {
        let config = tls::config(
            &pki.path("frontend-ca.crt"),
            Some((&pki.path("client.crt"), &pki.path("client.key"))),
        )?;
        Ok(Route::Bridgehead(Frontend::mtls(frontend, config)))
    }

    /// The plain Unix-socket frontend at `path`.
    pub fn uds(path: PathBuf) -> Route {
        Route::Bridgehead(Frontend::Uds { path })
    }

    /// Another proxy's mTLS frontend, with the same client settings as [`Route::mtls`].
    pub fn peer_mtls(
        label: &'static str,
        pki: &Pki,
        frontend: SocketAddr,
    ) -> anyhow::Result<Route> {
        let Route::Bridgehead(frontend) = Route::mtls(pki, frontend)? else {
            anyhow::bail!("Route::mtls made no frontend");
        };
        Ok(Route::Peer { label, frontend })
    }

    /// Another proxy's Unix-socket frontend.
    pub fn peer_uds(label: &'static str, path: PathBuf) -> Route {
        Route::Peer {
            label,
            frontend: Frontend::Uds { path },
        }
    }

    /// The TLS version and cipher suite the mTLS frontend negotiates with this client (one
    /// handshake, no tunnel); `None` for the other routes.
    pub async fn negotiated(&self) -> anyhow::Result<Option<String>> {
        let Route::Bridgehead(Frontend::Mtls { addr, connector }) = self else {
            return Ok(None);
        };
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
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
            Route::Bridgehead(Frontend::Mtls { .. }) => "bridgehead-mtls",
            Route::Bridgehead(Frontend::Uds { .. }) => "bridgehead-uds",
            Route::Bridgehead(Frontend::Tcp { .. }) => "bridgehead-tcp",
            Route::Peer { label, .. } => label,
        }
    }

    /// Opens a connection to `target`, within [`OPEN_TIMEOUT`].
    pub async fn open(&self, target: SocketAddr) -> anyhow::Result<Conn> {
        self.open_with(target, None).await
    }

    /// [`Route::open`], the client's TCP socket made with `receive_buffer` as its `SO_RCVBUF`
    /// (the kernel's default if `None`).
    pub async fn open_with(
        &self,
        target: SocketAddr,
        receive_buffer: Option<u32>,
    ) -> anyhow::Result<Conn> {
        tokio::time::timeout(OPEN_TIMEOUT, self.open_unbounded(target, receive_buffer))
            .await
            .with_context(|| format!("{} did not open within {OPEN_TIMEOUT:?}", self.label()))?
    }

    async fn open_unbounded(
        &self,
        target: SocketAddr,
        receive_buffer: Option<u32>,
    ) -> anyhow::Result<Conn> {
        match self {
            Route::Direct => {
                let tcp = TcpStream::connect(target)
                    .await
                    .context("connecting to the target")?;
                tcp.set_nodelay(true)?;
                Ok(Box::new(tcp))
            }
            Route::Bridgehead(frontend) | Route::Peer { frontend, .. } => {
                frontend
                    .open_with(&target.to_string(), receive_buffer)
                    .await
            }
        }
    }
}
