//! The CONNECT frontend: mTLS over TCP or plain on a Unix socket.
//!
//! Each connection is served in its own task: the TLS handshake under a timeout, then the
//! CONNECT head (bounded size, parsed by httparse, under the same timeout). The response is
//! `200` only once an agent's dial succeeded, with no body and no length headers; the same
//! task then splices the connection to the agent's stream, starting with any bytes the client
//! sent right behind its CONNECT head. A connection carries one request: anything else gets
//! its status and a one-line reason, and the connection closes.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::pump::{self, Moved};
use bridgehead_mux::MuxStream;
use bridgehead_proto::ErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::metrics::{DialResult, Direction};
use crate::tunnel::{self, Target, TunnelError};
use crate::Context;

mod head;
mod tls;

use head::Head;
pub use tls::{TlsAcceptor, TlsStream};

/// A client connection a tunnel can run over.
pub trait ClientSocket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Makes the next close a TCP RST, so a client sees a failed tunnel as a failure and not as
    /// a clean end of data.
    fn abort_on_close(&self);
}

impl ClientSocket for TlsStream {
    fn abort_on_close(&self) {
        let _ = self.tcp().set_zero_linger();
    }
}

impl ClientSocket for UnixStream {
    fn abort_on_close(&self) {}
}

/// Accepts mTLS CONNECT clients until `shutdown`.
pub async fn serve_tcp(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    connections: TaskTracker,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => { accept_failed(error).await; continue; }
            },
            () = shutdown.cancelled() => return,
        };
        let span = tracing::debug_span!("client", peer = %peer, target = tracing::field::Empty, agent = tracing::field::Empty);
        let acceptor = acceptor.clone();
        let ctx = ctx.clone();
        connections.spawn(
            async move {
                let _ = tcp.set_nodelay(true);
                let tls =
                    match tokio::time::timeout(ctx.handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(error)) => return debug!(%error, "TLS handshake failed"),
                        Err(_) => return debug!("TLS handshake timed out"),
                    };
                serve_connection(Box::new(tls), ctx).await;
            }
            .instrument(span),
        );
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
                Err(error) => { accept_failed(error).await; continue; }
            },
            () = shutdown.cancelled() => return,
        };
        let span = tracing::debug_span!(
            "client",
            peer = "uds",
            target = tracing::field::Empty,
            agent = tracing::field::Empty
        );
        connections.spawn(serve_connection(Box::new(socket), ctx.clone()).instrument(span));
    }
}

/// Binds the Unix socket: a stale socket file is removed first, the socket gets mode 0660.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context as _;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting mode 0660 on {}", path.display()))?;
    Ok(listener)
}

async fn accept_failed(error: io::Error) {
    // Out of file descriptors and the like: log and give the system a moment instead of
    // spinning on the same error.
    warn!(%error, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// One client connection: read and check the head, open the tunnel, answer, splice. Errors
/// are answered with their status and a one-line reason, and the connection closes.
///
/// The socket comes boxed: an async fn keeps a by-value parameter twice in its state (as
/// argument and as local), and this task lives as long as the tunnel — a TLS stream is
/// 1.2 KiB.
async fn serve_connection<S: ClientSocket>(mut socket: Box<S>, ctx: Arc<Context>) {
    let (target, early) =
        match tokio::time::timeout(ctx.handshake_timeout, head::read(&mut socket)).await {
            Ok(Head::Connect(target, early)) => (target, early),
            Ok(Head::Closed) => return debug!("client left before sending a request"),
            Ok(Head::Refuse(status, reason)) => {
                ctx.metrics.dial(DialResult::BadRequest);
                debug!(status, %reason, "CONNECT refused");
                return refuse(&mut *socket, status, &reason).await;
            }
            Err(_) => return debug!("client did not send a request head in time"),
        };
    let span = tracing::Span::current();
    span.record("target", tracing::field::display(&target));
    let stream = match open(&ctx, &target).await {
        Ok((stream, agent)) => {
            span.record("agent", tracing::field::display(&agent));
            stream
        }
        Err(error) => {
            ctx.metrics.dial(error.result());
            let status = error.status();
            if status.is_server_error() {
                info!(%status, %error, "CONNECT failed");
            } else {
                debug!(%status, %error, "CONNECT refused");
            }
            return refuse(&mut *socket, status.as_u16(), &error.to_string()).await;
        }
    };
    debug!(stream = stream.id(), "tunnel open");
    if let Err(error) = socket.write_all(head::ESTABLISHED).await {
        stream.reset(ErrorCode::ConnectionReset, "client left before the 200");
        return debug!(%error, "client left before the 200");
    }
    let _tunnel = ctx.tunnels.token();
    ctx.metrics.tunnels_open.inc();
    let mut moved = Moved::default();
    // kube-apiserver fails when any byte follows the 200 in the same read: a target that
    // speaks first waits for the client's first byte, or the hold time.
    let hold = Some(ctx.target_bytes_hold).filter(|hold| !hold.is_zero());
    let result = pump::splice_holding(&mut *socket, &stream, early, hold, &mut moved).await;
    ctx.metrics.tunnels_open.dec();
    ctx.metrics.bytes(Direction::ToTarget, moved.up);
    ctx.metrics.bytes(Direction::FromTarget, moved.down);
    match result {
        Ok(()) => debug!(up = moved.up, down = moved.down, "tunnel closed"),
        Err(error) => {
            socket.abort_on_close();
            debug!(%error, up = moved.up, down = moved.down, "tunnel failed");
        }
    }
}

/// Routes `target` and has an agent dial it, within the bound on dials in flight.
async fn open(ctx: &Context, target: &Target) -> Result<(MuxStream, String), TunnelError> {
    let Ok(_permit) = ctx.pending_dials.try_acquire() else {
        return Err(TunnelError::Overloaded(ctx.max_pending_dials));
    };
    ctx.metrics.dials_pending.inc();
    let started = std::time::Instant::now();
    let opened = tunnel::open(&ctx.registry, target, ctx.dial_timeout).await;
    ctx.metrics.dials_pending.dec();
    if opened.is_ok() {
        ctx.metrics.dial(DialResult::Ok);
        ctx.metrics
            .dial_duration
            .observe(started.elapsed().as_secs_f64());
    }
    opened
}

/// Answers with `status` and `reason`, then closes the connection.
async fn refuse<S: ClientSocket>(socket: &mut S, status: u16, reason: &str) {
    let _ = socket.write_all(&head::refusal(status, reason)).await;
    let _ = socket.shutdown().await;
}
