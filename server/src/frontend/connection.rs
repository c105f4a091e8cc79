//! One client connection, top to bottom: read the CONNECT head, open the tunnel (admission,
//! route, dial: [`crate::routing::open`], which forwarded tunnels share), answer, splice. Every refusal
//! on the way is a [`Refusal`], counted and logged by [`open::report`] and answered with its
//! status and reason here.

use std::sync::Arc;

use bridgehead_mux::splice::{self, Meter, Moved, SendWait, TunnelSocket};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::{debug, info, Instrument};

use super::head::{self, Head};
use super::hold::Held;
use super::ClientSocket;
use crate::context::Context;
use crate::process::metrics::{Direction, Frontend, GaugeGuard};
use crate::routing::admission::ClientKey;
use crate::routing::fallback;
use crate::routing::open::{self, Opened, Origin, Request, Unopened, Via};
use crate::routing::refusal::Refusal;

/// Most bytes a client may send behind its head before it has a tunnel (kept for it while
/// the dial is pending).
const MAX_EARLY: usize = 64 * 1024;

/// A dialed tunnel, not answered yet.
#[derive(Debug)]
struct Unanswered {
    opened: Opened,
    /// Bytes the client sent behind its head: the tunnel's first.
    early: Bytes,
    /// `host:port`, for the tunnel's log line.
    target: String,
}

/// Counts a tunnel's bytes in the server's metrics as they flow.
struct BytesMeter<'a>(&'a Frontend);

impl Meter for BytesMeter<'_> {
    fn moved(&self, up: u64, down: u64) {
        if up > 0 {
            self.0.bytes(Direction::ToTarget, up);
        }
        if down > 0 {
            self.0.bytes(Direction::FromTarget, down);
        }
    }

    fn waited(&self, why: SendWait) {
        self.0.send_waits.waited(why);
    }
}

/// Serves one client connection.
///
/// The socket comes boxed: an async fn keeps a by-value parameter twice in its state (as
/// argument and as local), and this task lives as long as the tunnel — a TLS stream is
/// 1.2 KiB.
pub(super) async fn serve<S: ClientSocket>(
    mut socket: Box<S>,
    client: ClientKey,
    ctx: Arc<Context>,
) {
    let connection = ctx.metrics.frontend.http_connection();
    let unanswered = match open(&mut *socket, client, &ctx).await {
        Ok(unanswered) => unanswered,
        Err(Unopened::Gone) => return,
        Err(Unopened::Refused(refusal)) => return answer(&mut *socket, &refusal).await,
    };
    if let Err(error) = socket.write_all(head::ESTABLISHED).await {
        unanswered.opened.via.reset("client left before the 200");
        return debug!(%error, "client left before the 200");
    }
    // Counted from here, so that shutdown waits for it wherever it runs.
    let token = ctx.tunnels.token();
    let home = match &unanswered.opened.via {
        Via::Agent(stream) => {
            debug!(stream = stream.id(), "tunnel open");
            stream.home().cloned()
        }
        Via::Fallback(_) => None,
    };
    let Some(home) = home else {
        return tunnel(Placed::Here(socket), unanswered, ctx, token, connection).await;
    };
    // The splice runs beside its session, on the session's thread.
    let detached = match socket.detach() {
        Ok(detached) => Box::new(detached),
        Err(error) => {
            unanswered
                .opened
                .via
                .reset("the server could not move the tunnel");
            return debug!(%error, "taking a tunnel to its session's thread");
        }
    };
    let moved = tunnel(
        Placed::<S>::Detached(detached),
        unanswered,
        ctx,
        token,
        connection,
    );
    home.spawn(moved.instrument(tracing::Span::current()));
}

/// A tunnel's client socket: on the runtime that runs the tunnel, or taken off the one it was
/// accepted on, to be registered with the tunnel's (its session's thread).
enum Placed<S: ClientSocket> {
    Here(Box<S>),
    Detached(Box<S::Detached>),
}

/// The head, then the tunnel opened: a stream to the target, or why not (already counted and
/// logged).
async fn open<S: ClientSocket>(
    socket: &mut S,
    client: ClientKey,
    ctx: &Context,
) -> Result<Unanswered, Unopened> {
    let (target, early) =
        match tokio::time::timeout(ctx.config.frontend.handshake_timeout, head::read(socket)).await
        {
            Ok(Head::Connect(target, early)) => (target, early),
            Ok(Head::Refused(refusal)) => {
                open::report(ctx, Origin::Client, &refusal);
                return Err(Unopened::Refused(refusal));
            }
            Ok(Head::Closed) => {
                debug!("client left before sending a request");
                return Err(Unopened::Gone);
            }
            Err(_) => {
                debug!("client did not send a request head in time");
                return Err(Unopened::Gone);
            }
        };
    let mut early = BytesMut::from(early);
    let request = Request {
        origin: Origin::Client,
        target: &target,
        client,
    };
    let opened = open::open(
        ctx,
        &request,
        std::pin::pin!(client_gone(socket, &mut early)),
    )
    .await?;
    Ok(Unanswered {
        opened,
        early: early.freeze(),
        target: target.to_string(),
    })
}

/// Resolves when the client closes or fails while its dial is pending. What it sends
/// meanwhile belongs to the tunnel and is kept in `early`, up to [`MAX_EARLY`]; past that it
/// is left in the socket for the splice. An EOF counts as gone: a client that half-closes
/// before it has a tunnel has nothing to tunnel.
async fn client_gone<S: ClientSocket>(socket: &mut S, early: &mut BytesMut) {
    while early.len() < MAX_EARLY {
        let room = MAX_EARLY - early.len();
        match socket.read_buf(&mut (&mut *early).limit(room)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}

/// Counts and logs `refusal`, a refusal before the tunnel's opener ran, then answers it.
pub(super) async fn refuse<S: ClientSocket>(socket: &mut S, ctx: &Context, refusal: Refusal) {
    open::report(ctx, Origin::Client, &refusal);
    answer(socket, &refusal).await;
}

/// Answers `refusal` with its status and reason, and closes the connection.
async fn answer<S: ClientSocket>(socket: &mut S, refusal: &Refusal) {
    let _ = socket.write_all(&head::refusal(refusal)).await;
    let _ = socket.shutdown().await;
}

/// Splices the answered tunnel until both directions end; a failed tunnel ends the client's
/// connection with a reset. Bytes are counted as they flow; the end is one line (target, agent,
/// bytes each way, duration, how it ended) at info, unless `--log-tunnels=false`.
///
/// On a session's thread this future is the whole task, and it holds its arguments for the
/// tunnel's life: the socket comes in as it is ([`Placed`]) and is registered here, so no
/// wrapping future holds a second copy of them.
async fn tunnel<S: ClientSocket>(
    socket: Placed<S>,
    unanswered: Unanswered,
    ctx: Arc<Context>,
    _tunnel: TaskTrackerToken,
    _connection: GaugeGuard,
) {
    let Unanswered {
        opened: Opened {
            via,
            agent,
            forwarded,
        },
        early,
        target,
    } = unanswered;
    // The server that carried the tunnel to its agent: this one, or the peer it was forwarded to.
    let server: &str = forwarded
        .as_deref()
        .unwrap_or(&ctx.config.routing.server_id);
    let mut socket = match socket {
        Placed::Here(socket) => socket,
        // The box goes at the end of this arm, not at the tunnel's end as one captured by
        // a wrapping future did (a TLS client's 1.2 KiB beside the socket's new box).
        Placed::Detached(detached) => match S::attach(*detached) {
            Ok(socket) => Box::new(socket),
            Err(error) => {
                via.reset("the server could not move the tunnel");
                return debug!(%error, "registering a tunnel on its session's thread");
            }
        },
    };
    ctx.metrics.frontend.tunnels_open.inc();
    let started = Instant::now();
    let mut moved = Moved::default();
    // A target that speaks first waits for the client's first byte, or the hold time (unless
    // the client already sent bytes behind its head).
    let hold = Some(ctx.config.frontend.target_bytes_hold).filter(|_| early.is_empty());
    let meter = BytesMeter(&ctx.metrics.frontend);
    let result = match via {
        Via::Agent(stream) => {
            let held = Held::new(&mut *socket, hold);
            splice::splice_metered(held, &stream, early, &mut moved, &meter)
                .earning_within(
                    ctx.memory.sockets.accepted_receive(),
                    ctx.memory.sockets.unix_send_buffer,
                    Some(&ctx.memory.earned),
                )
                .reading_when_ready()
                .await
                .map_err(|error| error.to_string())
        }
        Via::Fallback(relayed) => {
            let _open = GaugeGuard::inc(&ctx.metrics.frontend.fallback_tunnels_open);
            let mut held = Held::new(&mut *socket, hold);
            let (up, down, result) = fallback::splice(&mut held, relayed, early).await;
            (moved.up, moved.down) = (up, down);
            meter.moved(up, down);
            result.map_err(|error| error.to_string())
        }
    };
    ctx.metrics.frontend.tunnels_open.dec();
    let duration = started.elapsed();
    ctx.metrics.frontend.tunnel_ended(duration.as_secs_f64());
    let ended = match &result {
        Ok(()) => "closed".to_owned(),
        Err(error) => {
            socket.abort_on_close();
            format!("reset: {error}")
        }
    };
    if ctx.config.logging.tunnels {
        info!(
            target: "bridgehead::tunnel",
            %target,
            %agent,
            %server,
            to_target = moved.up,
            from_target = moved.down,
            duration_ms = duration.as_millis() as u64,
            %ended,
            "tunnel ended"
        );
    } else {
        debug!(%target, %agent, %server, up = moved.up, down = moved.down, %ended, "tunnel ended");
    }
}
