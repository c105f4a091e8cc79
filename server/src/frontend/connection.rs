//! One client connection, top to bottom: read the CONNECT head, admit the dial, route it,
//! dial, answer, splice. Every refusal on the way is a [`Refusal`], answered with its status
//! and reason and counted under its label here, in one place.

use std::sync::Arc;

use bridgehead_mux::splice::{self, Meter, Moved, SendWait, TunnelSocket};
use bridgehead_mux::MuxStream;
use bridgehead_proto::ErrorCode;
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::{debug, info, Instrument};

use super::head::{self, Head};
use super::hold::Held;
use super::ClientSocket;
use crate::admission::ClientKey;
use crate::context::Context;
use crate::dial;
use crate::fallback::{self, Relayed};
use crate::metrics::{DialResult, Direction, GaugeGuard, Metrics};
use crate::refusal::Refusal;
use crate::registry::RouteError;

/// Most bytes a client may send behind its head before it has a tunnel (kept for it while
/// the dial is pending).
const MAX_EARLY: usize = 64 * 1024;

/// How far a connection got before it ended without a tunnel.
#[derive(Debug)]
enum Failure {
    /// Turned down: answered with a status and a reason.
    Refused(Refusal),
    /// The client left, or never finished its head: nobody to answer.
    Gone(&'static str),
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Failure {
        Failure::Refused(refusal)
    }
}

/// A dialed tunnel, not answered yet.
#[derive(Debug)]
struct Opened {
    via: Via,
    /// Bytes the client sent behind its head: the tunnel's first.
    early: Bytes,
    /// `host:port`, for the tunnel's log line.
    target: String,
    /// The agent that dialed it (or the fallback proxy).
    agent: String,
    /// The peer server that carried it to the agent, when the agent is not this server's.
    forwarded: Option<Arc<str>>,
}

/// What carries a tunnel.
#[derive(Debug)]
enum Via {
    /// A stream on an agent's session.
    Agent(MuxStream),
    /// `--fallback-proxy`, when no agent matched.
    Fallback(Relayed),
}

impl Via {
    /// Fails the tunnel: the agent's stream is reset; the fallback's connection is closed.
    fn reset(self, why: &'static str) {
        if let Via::Agent(stream) = self {
            stream.reset(ErrorCode::ConnectionReset, why);
        }
    }
}

/// Counts a tunnel's bytes in the server's metrics as they flow.
struct BytesMeter<'a>(&'a Metrics);

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
    let connection = ctx.metrics.http_connection();
    let opened = match open(&mut *socket, client, &ctx).await {
        Ok(opened) => opened,
        Err(Failure::Gone(why)) => return debug!("{why}"),
        Err(Failure::Refused(refusal)) => return refuse(&mut *socket, &ctx, refusal).await,
    };
    ctx.metrics.dial(DialResult::Ok);
    if let Err(error) = socket.write_all(head::ESTABLISHED).await {
        opened.via.reset("client left before the 200");
        return debug!(%error, "client left before the 200");
    }
    // Counted from here, so that shutdown waits for it wherever it runs.
    let token = ctx.tunnels.token();
    let home = match &opened.via {
        Via::Agent(stream) => {
            debug!(stream = stream.id(), "tunnel open");
            stream.home().cloned()
        }
        Via::Fallback(_) => None,
    };
    let Some(home) = home else {
        return tunnel(Placed::Here(socket), opened, ctx, token, connection).await;
    };
    // The splice runs beside its session, on the session's thread.
    let detached = match socket.detach() {
        Ok(detached) => Box::new(detached),
        Err(error) => {
            opened.via.reset("the server could not move the tunnel");
            return debug!(%error, "taking a tunnel to its session's thread");
        }
    };
    let moved = tunnel(
        Placed::<S>::Detached(detached),
        opened,
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

/// Head, admission, route, dial: a stream to the target, or why not.
async fn open<S: ClientSocket>(
    socket: &mut S,
    client: ClientKey,
    ctx: &Context,
) -> Result<Opened, Failure> {
    let (target, early) =
        match tokio::time::timeout(ctx.config.frontend.handshake_timeout, head::read(socket)).await
        {
            Ok(Head::Connect(target, early)) => (target, early),
            Ok(Head::Refused(refusal)) => return Err(refusal.into()),
            Ok(Head::Closed) => return Err(Failure::Gone("client left before sending a request")),
            Err(_) => return Err(Failure::Gone("client did not send a request head in time")),
        };
    let span = tracing::Span::current();
    span.record("target", tracing::field::display(&target));
    if !ctx.memory.budget.admit() {
        return Err(Refusal::MemoryBudget {
            buffered: ctx.memory.budget.buffered(),
            limit: ctx.memory.budget.limit(),
        }
        .into());
    }
    let _slot = ctx.admission.admit(&client)?;
    drop(client);
    let started = Instant::now();
    // A client that leaves while its dial is pending gets nothing more: dropping the dial
    // resets its stream (the agent stops dialing) and frees its admission slot at once.
    let mut early = BytesMut::from(early);
    let mut routed = ctx.registry.route(&target.host);
    if matches!(routed, Err(RouteError::NoRoute(_))) && !ctx.peers_settled.is_settled() {
        // Just started: the peers' agents are known a moment later.
        tokio::select! {
            _ = ctx.peers_settled.wait(ctx.config.routing.dial_timeout) => {}
            () = client_gone(socket, &mut early) => {
                return Err(Failure::Gone("client left while the server learned its peers' agents"));
            }
        }
        routed = ctx.registry.route(&target.host);
    }
    let (via, agent, forwarded) = match routed {
        Ok(candidates) => tokio::select! {
            dialed = dial::dial(candidates, &target, ctx.config.routing.dial_timeout) => {
                let dialed = dialed?;
                if let Some(peer) = &dialed.via {
                    ctx.metrics.forwarded(peer);
                }
                (Via::Agent(dialed.stream), dialed.agent, dialed.via)
            }
            () = client_gone(socket, &mut early) => {
                ctx.metrics.anp_dial_failure("frontend_close");
                return Err(Failure::Gone("client left while its dial was pending"));
            }
        },
        Err(no_agent) => {
            let Some(fallback) = &ctx.fallback else {
                return Err(Refusal::from(no_agent).into());
            };
            let relayed = tokio::select! {
                relayed = fallback.relay(&target, ctx.config.routing.dial_timeout) => relayed,
                () = client_gone(socket, &mut early) => {
                    return Err(Failure::Gone("client left while the fallback proxy dialed"));
                }
            };
            let relayed = relayed
                .inspect_err(|error| ctx.metrics.fallback_dial(error.label()))
                .map_err(Refusal::from)?;
            ctx.metrics.fallback_dial("ok");
            (
                Via::Fallback(relayed),
                format!("fallback {}", fallback.url()),
                None,
            )
        }
    };
    ctx.metrics.dialed(started.elapsed().as_secs_f64());
    span.record("agent", tracing::field::display(&agent));
    Ok(Opened {
        via,
        early: early.freeze(),
        target: target.to_string(),
        agent,
        forwarded,
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

/// Answers `refusal` with its status and reason, counts it, and closes the connection.
pub(super) async fn refuse<S: ClientSocket>(socket: &mut S, ctx: &Context, refusal: Refusal) {
    ctx.metrics.dial(refusal.result());
    let status = refusal.status();
    if status.is_server_error() {
        info!(%status, error = %refusal, "CONNECT failed");
    } else {
        debug!(%status, error = %refusal, "CONNECT refused");
    }
    let _ = socket.write_all(&head::refusal(&refusal)).await;
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
    opened: Opened,
    ctx: Arc<Context>,
    _tunnel: TaskTrackerToken,
    _connection: GaugeGuard,
) {
    let Opened {
        via,
        early,
        target,
        agent,
        forwarded,
    } = opened;
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
    ctx.metrics.tunnels_open.inc();
    let started = Instant::now();
    let mut moved = Moved::default();
    // A target that speaks first waits for the client's first byte, or the hold time (unless
    // the client already sent bytes behind its head).
    let hold = Some(ctx.config.frontend.target_bytes_hold).filter(|_| early.is_empty());
    let meter = BytesMeter(&ctx.metrics);
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
            let _open = GaugeGuard::inc(&ctx.metrics.fallback_tunnels_open);
            let mut held = Held::new(&mut *socket, hold);
            let (up, down, result) = fallback::splice(&mut held, relayed, early).await;
            (moved.up, moved.down) = (up, down);
            meter.moved(up, down);
            result.map_err(|error| error.to_string())
        }
    };
    ctx.metrics.tunnels_open.dec();
    let duration = started.elapsed();
    ctx.metrics.tunnel_ended(duration.as_secs_f64());
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
