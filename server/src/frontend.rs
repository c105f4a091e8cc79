//! The CONNECT frontend: mTLS over TCP or plain on a Unix socket.
//!
//! The accept loops here only accept: each connection is served in its own task, which runs
//! the TLS handshake under a timeout ([`TlsStream`]) and then [`connection`]'s pipeline — the
//! CONNECT head (bounded size, parsed by httparse, under the same timeout; [`head`]), the
//! tunnel opened (admission, route, dial: [`crate::routing::open`]), and the answer: `200` only once
//! an agent's dial succeeded, with no body and no length headers. The same task then splices
//! the connection to the agent's stream, starting with any bytes the client sent right behind
//! its CONNECT head, its writes held until the client speaks ([`hold`]). A connection carries
//! one request: anything else gets its status and a one-line reason, and the connection
//! closes.

use std::path::Path;
use std::sync::Arc;

use bridgehead_mux::splice::TunnelSocket;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn, Instrument};

use crate::context::Context;
use crate::process::certificate::certificate_names;
use crate::routing::admission::ClientKey;
use crate::routing::refusal::Refusal;

mod connection;
pub mod handshakes;
mod head;
mod hold;
mod tls_stream;

pub use tls_stream::TlsStream;

/// A client connection a tunnel can run over: TLS over TCP, or a Unix socket. Once dialed,
/// it leaves the runtime it was accepted on for its agent session's thread
/// ([`bridgehead_runtime::threads::Shards`]), detached from one reactor and attached to the
/// other.
pub trait ClientSocket: AsyncRead + AsyncWrite + TunnelSocket + Unpin + Send + 'static {
    /// The connection while it belongs to no runtime.
    type Detached: Send + 'static;
    /// Takes the socket off the current runtime's reactor.
    fn detach(self) -> std::io::Result<Self::Detached>;
    /// Registers a detached connection with the current runtime's reactor.
    fn attach(detached: Self::Detached) -> std::io::Result<Self>
    where
        Self: Sized;
}

impl ClientSocket for TlsStream {
    type Detached = tls_stream::DetachedTls;

    fn detach(self) -> std::io::Result<Self::Detached> {
        TlsStream::detach(self)
    }

    fn attach(detached: Self::Detached) -> std::io::Result<Self> {
        TlsStream::attach(detached)
    }
}

impl ClientSocket for tokio::net::UnixStream {
    type Detached = std::os::unix::net::UnixStream;

    fn detach(self) -> std::io::Result<Self::Detached> {
        self.into_std()
    }

    fn attach(detached: Self::Detached) -> std::io::Result<Self> {
        tokio::net::UnixStream::from_std(detached)
    }
}

/// What [`read_head`] made of a client's first bytes.
#[doc(hidden)]
#[derive(Debug)]
pub enum ReadHead {
    /// `CONNECT target`; the tunnel's own bytes start at `start`.
    Connect {
        target: crate::routing::router::Target,
        start: usize,
    },
    /// The bytes end before a whole head.
    Incomplete,
    /// The refusal and the bytes of its answer.
    Refused {
        refusal: Box<Refusal>,
        answer: Vec<u8>,
    },
}

/// How the frontend reads `bytes` as the first bytes of a client connection, all in memory
/// (the same end of the head and checks as a connection's). The CONNECT head fuzz target
/// (`server/fuzz`) drives this.
#[doc(hidden)]
pub fn read_head(bytes: &[u8]) -> ReadHead {
    match head::parse(bytes) {
        Ok(Some((target, start))) => ReadHead::Connect { target, start },
        Ok(None) => ReadHead::Incomplete,
        Err(refusal) => ReadHead::Refused {
            answer: head::refusal(&refusal),
            refusal: Box::new(refusal),
        },
    }
}

/// Accepts mTLS CONNECT clients until `shutdown`.
pub async fn serve_tcp(
    listener: TcpListener,
    tls: Arc<crate::process::tls_config::ReloadingConfig>,
    allowed_clients: Arc<[String]>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    connections: TaskTracker,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    bridgehead_runtime::accept::failed("frontend", &error, &ctx.refusal_log).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        // Before TLS, nothing is known of the client: only so many may be in their handshake,
        // the oldest cut to make room.
        let (handshaking, evicted) = ctx.frontend_handshakes.begin();
        if evicted {
            ctx.metrics.process.handshake_refused("frontend");
            if let Some(suppressed) = ctx.refusal_log.admit() {
                warn!(
                    suppressed,
                    "too many CONNECT clients in their handshake: the oldest was closed"
                );
            }
        }
        let span = tracing::debug_span!("client", peer = %peer, target = tracing::field::Empty, agent = tracing::field::Empty);
        let tls = tls.current();
        let ctx = ctx.clone();
        let allowed_clients = allowed_clients.clone();
        connections.spawn(
            async move {
                let _ = tcp.set_nodelay(true);
                if let Err(error) = ctx.memory.sockets.apply_accepted(&tcp) {
                    debug!(%error, "setting the socket's buffer options");
                }
                if let Some(idle) = ctx.config.frontend.keepalive {
                    if let Err(error) = bridgehead_runtime::limits::tcp_keepalive(&tcp, idle) {
                        debug!(%error, "setting TCP keepalive");
                    }
                }
                let handshake = TlsStream::accept(tls, tcp);
                let tls = tokio::select! {
                    done = tokio::time::timeout(ctx.config.frontend.handshake_timeout, handshake) => match done {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => return debug!(%error, "TLS handshake failed"),
                        Err(_) => return debug!("TLS handshake timed out"),
                    },
                    () = handshaking.cut() => return debug!("TLS handshake cut for a newer client"),
                };
                drop(handshaking);
                let mut tls = Box::new(tls);
                if let Err(refusal) = check_client(&tls, &allowed_clients) {
                    return connection::refuse(&mut *tls, &ctx, refusal).await;
                }
                let client = tls
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map_or_else(
                        || ClientKey::from(&[][..]),
                        |cert| ClientKey::from(cert.as_ref()),
                    );
                tls.count_against(ctx.memory.budget.clone());
                connection::serve(tls, client, ctx).await;
            }
            .instrument(span),
        );
    }
}

/// With `--allowed-clients`, the client certificate must name one of them (its common name or
/// a DNS SAN).
fn check_client(tls: &TlsStream, allowed: &[String]) -> Result<(), Refusal> {
    if allowed.is_empty() {
        return Ok(());
    }
    let names = tls
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(certificate_names);
    match names {
        Some(names) if allowed.iter().any(|name| names.names(name)) => Ok(()),
        Some(names) => Err(Refusal::ClientNotAllowed(names.subject)),
        None => Err(Refusal::ClientNotAllowed("(no certificate)".to_owned())),
    }
}

/// Accepts plain CONNECT clients on a Unix socket until `shutdown`.
pub async fn serve_unix(
    listener: UnixListener,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    connections: TaskTracker,
) {
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(error) => {
                    bridgehead_runtime::accept::failed("frontend", &error, &ctx.refusal_log).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let span = tracing::debug_span!(
            "client",
            peer = "uds",
            target = tracing::field::Empty,
            agent = tracing::field::Empty
        );
        if let Err(error) = ctx.memory.sockets.apply_unix(&socket) {
            debug!(%error, "setting the socket's send buffer");
        }
        // Every client of the socket is one client: its file mode is the access control.
        let client = ClientKey::from(&b"unix socket"[..]);
        connections
            .spawn(connection::serve(Box::new(socket), client, ctx.clone()).instrument(span));
    }
}

/// Binds the Unix socket. A socket file nobody listens on (a crashed server's) is removed
/// first; one another process answers on is left alone and the start refused; anything else at
/// the path is refused too. The socket is made in a private directory beside the path (mode
/// 0700), given mode 0660 there and renamed into place, so it is never reachable with the
/// umask's mode.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context as _;
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another process is listening on {}; refusing to replace its socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let private = parent.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let staged = private.join(name);
    let bound = (|| {
        let listener =
            UnixListener::bind(&staged).with_context(|| format!("binding {}", staged.display()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("setting mode 0660 on {}", staged.display()))?;
        std::fs::rename(&staged, path)
            .with_context(|| format!("moving the socket to {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    bound
}

#[cfg(test)]
mod tests;
