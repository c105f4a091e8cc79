//! The CONNECT frontend: mTLS over TCP or plain on a Unix socket, HTTP/1 via hyper.
//!
//! Each connection is served in its own task: the TLS handshake under a timeout, then hyper
//! reads the CONNECT head (bounded size, under the same timeout). The response is `200` only
//! once an agent's dial succeeded, with no body and no length headers; the upgraded
//! connection is then spliced to the agent's stream, starting with any bytes the client sent
//! right behind its CONNECT head.

use std::convert::Infallible;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::pump::{self, Moved};
use bridgehead_mux::MuxStream;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::metrics::{DialResult, Direction};
use crate::tunnel::{self, TunnelError};
use crate::Context;

mod head;
mod rewind;
mod tls;

use head::{Head, MAX_HEAD_BYTES};
use rewind::Rewind;
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
                serve_connection(tls, ctx).await;
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
        connections.spawn(serve_connection(socket, ctx.clone()).instrument(span));
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

async fn serve_connection<S: ClientSocket>(mut socket: S, ctx: Arc<Context>) {
    // The head is read here first, so a malformed request gets its reason in words; hyper
    // then parses the same bytes again from the front.
    let head = match tokio::time::timeout(ctx.handshake_timeout, head::read(&mut socket)).await {
        Ok(Head::Complete(buf)) => buf.freeze(),
        Ok(Head::Closed) => return debug!("client left before sending a request"),
        Ok(Head::Refuse(status, reason)) => {
            ctx.metrics.dial(DialResult::BadRequest);
            debug!(status, %reason, "CONNECT refused");
            let _ =
                tokio::io::AsyncWriteExt::write_all(&mut socket, &head::refusal(status, &reason))
                    .await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut socket).await;
            return;
        }
        Err(_) => return debug!("client did not send a request head in time"),
    };
    let socket = Rewind::new(head, socket);
    let service_ctx = ctx.clone();
    let service = hyper::service::service_fn(move |request| {
        let ctx = service_ctx.clone();
        async move { Ok::<_, Infallible>(handle::<Rewind<S>>(request, ctx).await) }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(ctx.handshake_timeout)
        // Room for a whole head (already bounded by `head::read`) and the bytes behind it.
        .max_buf_size(2 * MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(socket), service)
        .with_upgrades()
        .await;
    if let Err(error) = result {
        debug!(%error, "client connection ended with an error");
    }
}

async fn handle<S: ClientSocket>(
    mut request: Request<Incoming>,
    ctx: Arc<Context>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::CONNECT {
        ctx.metrics.dial(DialResult::BadRequest);
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "only CONNECT is served here",
        );
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("CONNECT"));
        return response;
    }
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    let target = match authority.as_deref().map(tunnel::parse_target) {
        Some(Ok(target)) => target,
        Some(Err(error)) => return fail(&ctx, &error),
        None => return fail(&ctx, &TunnelError::BadTarget(request.uri().to_string())),
    };
    let span = tracing::Span::current();
    span.record("target", tracing::field::display(&target));
    let Ok(permit) = ctx.pending_dials.clone().try_acquire_owned() else {
        return fail(&ctx, &TunnelError::Overloaded(ctx.max_pending_dials));
    };
    ctx.metrics.dials_pending.inc();
    let started = std::time::Instant::now();
    let opened = tunnel::open(&ctx.registry, &target, ctx.dial_timeout).await;
    ctx.metrics.dials_pending.dec();
    drop(permit);
    let (stream, agent) = match opened {
        Ok(opened) => opened,
        Err(error) => return fail(&ctx, &error),
    };
    span.record("agent", tracing::field::display(&agent));
    ctx.metrics.dial(DialResult::Ok);
    ctx.metrics
        .dial_duration
        .observe(started.elapsed().as_secs_f64());
    debug!(stream = stream.id(), "tunnel open");
    let on_upgrade = hyper::upgrade::on(&mut request);
    ctx.tunnels
        .spawn(run_tunnel::<S>(on_upgrade, stream, ctx.clone()).instrument(span));
    Response::new(Full::new(Bytes::new()))
}

/// The tunnel's task: splices the upgraded client connection to the agent's stream.
async fn run_tunnel<S: ClientSocket>(
    on_upgrade: hyper::upgrade::OnUpgrade,
    stream: MuxStream,
    ctx: Arc<Context>,
) {
    // Unwrapped outside the task's state, so the socket is held once while the tunnel lives.
    let Some((mut socket, early)) = client_socket::<S>(on_upgrade.await) else {
        return;
    };
    ctx.metrics.tunnels_open.inc();
    let mut moved = Moved::default();
    // kube-apiserver fails when any byte follows the 200 in the same read: a target that
    // speaks first waits for the client's first byte, or the hold time.
    let hold = Some(ctx.target_bytes_hold).filter(|hold| !hold.is_zero());
    let result = pump::splice_holding(&mut socket, &stream, early, hold, &mut moved).await;
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

/// The client's socket out of hyper's upgrade, with the bytes hyper had read past the head.
fn client_socket<S: ClientSocket>(
    upgraded: hyper::Result<hyper::upgrade::Upgraded>,
) -> Option<(S, Bytes)> {
    let upgraded = match upgraded {
        Ok(upgraded) => upgraded,
        Err(error) => {
            debug!(%error, "client left before the tunnel started");
            return None;
        }
    };
    match upgraded.downcast::<TokioIo<S>>() {
        Ok(parts) => Some((parts.io.into_inner(), parts.read_buf)),
        Err(_) => {
            warn!("upgraded connection of an unexpected type");
            None
        }
    }
}

fn fail(ctx: &Context, error: &TunnelError) -> Response<Full<Bytes>> {
    ctx.metrics.dial(error.result());
    let status = error.status();
    if status.is_server_error() {
        info!(%status, %error, "CONNECT failed");
    } else {
        debug!(%status, %error, "CONNECT refused");
    }
    reply(status, &error.to_string())
}

fn reply(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}
