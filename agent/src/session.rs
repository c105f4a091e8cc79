//! One connected session with one server: drive the multiplexer, take the server's dials,
//! splice each tunnel, tell the supervisor when the server drains, and drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_mux::memory::{EarnedBuffer, SocketTuning};
use bridgehead_mux::splice::{self, Moved, TunnelSocket};
use bridgehead_mux::{DialRequest, Mux, MuxStream, Serve, SessionEnd};
use bridgehead_proto::host::HostPort;
use bridgehead_proto::session::{Role, SessionConfig, DEFAULT_INITIAL_WINDOW};
use bytes::Bytes;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, debug_span, info, warn, Instrument};

use crate::config::Config;
use crate::context::Context;
use crate::dial::{self, DialError};
use crate::metrics::Metrics;
use crate::server_connection::ServerWebSocket;
use bridgehead_runtime::destinations::Policy;
use bridgehead_runtime::timeouts::AGENT_SESSION_TASKS;

/// Runs the session until it ends (server gone, keepalive timeout, protocol error) or, once
/// `shutdown` fires, until it drained. Runs `on_server_drain` when the server announces that
/// it drains. Returns why it ended.
pub(crate) async fn run(
    ws: ServerWebSocket,
    config: &Config,
    ctx: &Context,
    policy: &Arc<Policy>,
    shutdown: &CancellationToken,
    on_server_drain: impl Future<Output = ()>,
) -> SessionEnd {
    let mux = Mux::new(SessionConfig {
        budget: ctx.memory().budget.clone(),
        max_streams: config.sessions.max_tunnels,
        max_window: ctx.memory().max_window,
        ..SessionConfig::new(Role::Agent)
    });
    let tracker = TaskTracker::new();
    // Stops the driver; cancelled only at the end of a drain, never straight from `shutdown`.
    let stop = CancellationToken::new();

    // Beside the driver: the server's dials, and the drain once `shutdown` fires.
    let beside = async {
        let accept = accept_loop(&mux, &tracker, ctx, policy);
        let grace = config.sessions.drain_grace_period;
        let drain = drain_on_shutdown(&mux, &tracker, shutdown, grace, &stop);
        tokio::join!(accept, drain);
    };
    let serve = Serve::new(config.sessions.keepalive(), stop.clone())
        .on_peer_drain(on_server_drain)
        .beside(beside);
    let reason = match mux.serve(ws, serve).await {
        Ok(()) => mux.closed().await,
        Err(end) => end,
    };

    // Every stream failed with the session; let their tasks see it and finish.
    tracker.close();
    if tokio::time::timeout(AGENT_SESSION_TASKS, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            tasks = tracker.len(),
            "tunnel tasks still running after the session ended"
        );
    }
    reason
}

/// Spawns a tunnel task for every dial the server asks for, until the session ends.
async fn accept_loop(mux: &Mux, tracker: &TaskTracker, ctx: &Context, policy: &Arc<Policy>) {
    while let Some(request) = mux.accept().await {
        // At the level of the lines logged in it: an enabled span costs every tunnel memory
        // (its slab entry and formatted fields) for as long as the tunnel lives.
        let span = debug_span!(
            "stream",
            stream = request.id(),
            target = %HostPort(&request.host, request.port),
        );
        tracker.spawn(tunnel(request, ctx.clone(), policy.clone()).instrument(span));
    }
}

/// On shutdown: announce DRAIN, wait for the tunnels to finish (at most `grace`), then stop
/// the session.
async fn drain_on_shutdown(
    mux: &Mux,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    grace: Duration,
    stop: &CancellationToken,
) {
    shutdown.cancelled().await;
    info!(
        open_streams = mux.open_streams(),
        grace_period = ?grace,
        "draining: the server routes no new tunnels here"
    );
    mux.drain();
    tracker.close();
    let started = Instant::now();
    // Closing the session afterwards loses nothing: the session flushes frames queued before
    // the close, and the server still delivers what it received before the close.
    match tokio::time::timeout(grace, tracker.wait()).await {
        Ok(()) => info!(elapsed = ?started.elapsed(), "drain complete: every tunnel finished"),
        Err(_) => warn!(
            open_streams = mux.open_streams(),
            "drain grace period passed; cutting the remaining tunnels"
        ),
    }
    stop.cancel();
}

/// One tunnel: dial within the server's deadline (unless the server gives up first), answer,
/// then splice until both directions end.
///
/// The task lives as long as the tunnel, so its future is kept small: not an `async fn`, which
/// would hold a second copy of its arguments, and the dial in a future of its own, done before
/// the splice starts.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in the task"
)]
fn tunnel(request: DialRequest, ctx: Context, policy: Arc<Policy>) -> impl Future<Output = ()> {
    async move {
        let metrics = ctx.metrics();
        // A server under memory pressure grants new streams less than its usual window:
        // the target socket then starts small too, and earns the rest by reading.
        let pressed = request.window < DEFAULT_INITIAL_WINDOW;
        let sockets = &ctx.memory().sockets;
        let earned = sockets.dial_receive(pressed);
        let dialed = {
            let policy = policy;
            dial_target(request, metrics, &policy, sockets, earned).await
        };
        let Some((mut socket, stream)) = dialed else {
            return;
        };
        let _open = metrics.stream_opened();
        let mut moved = Moved::default();
        let result =
            splice::splice_metered(&mut socket, &stream, Bytes::new(), &mut moved, metrics)
                .earning_within(earned, None, Some(&ctx.memory().earned))
                .reading_when_ready()
                .await;
        match result {
            Ok(()) => debug!(
                from_target = moved.up,
                to_target = moved.down,
                "tunnel closed"
            ),
            Err(error) => {
                // The client's end failed: let the target see a reset, not a clean close.
                socket.abort_on_close();
                debug!(
                    %error,
                    from_target = moved.up,
                    to_target = moved.down,
                    "tunnel reset"
                );
            }
        }
    }
}

/// Dials the target and answers the server: the connection and the stream, or `None` when
/// the dial failed or the server gave up.
async fn dial_target(
    request: DialRequest,
    metrics: &Metrics,
    policy: &Policy,
    sockets: &SocketTuning,
    receive: Option<EarnedBuffer>,
) -> Option<(TcpStream, MuxStream)> {
    let started = Instant::now();
    // Boxed: a large state, and needed only until the connection is up.
    let dial = Box::pin(dial::dial(
        &request.host,
        request.port,
        request.timeout,
        policy,
        sockets,
        receive,
    ));
    let dialed = tokio::select! {
        dialed = dial => dialed,
        () = request.cancelled() => {
            debug!("the server gave up on the dial");
            return None;
        }
    };
    metrics.dial_finished(
        dialed.as_ref().err().map(DialError::code),
        started.elapsed(),
    );
    let socket = match dialed {
        Ok(socket) => socket,
        Err(error) => {
            let code = error.code();
            debug!(%error, %code, "dial failed");
            request.reject(code, &error.to_string());
            return None;
        }
    };
    match request.accept() {
        Ok(stream) => {
            debug!(elapsed = ?started.elapsed(), "tunnel open");
            Some((socket, stream))
        }
        Err(end) => {
            debug!(reason = %end, "the server gave up before the dial finished");
            None
        }
    }
}
