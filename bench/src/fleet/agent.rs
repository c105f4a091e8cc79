//! One simulated agent: connects, holds its session (the session driver answers pings; every
//! dial is answered by an in-process echo), and after losing it comes back on the agent's own
//! schedule (`bridgehead_agent::schedule`, the code the agent runs), as the agent's search loop
//! (agent/src/servers.rs) uses it with one server: a lost healthy session is looked for again
//! within one sync interval, a drained one within a quarter, a failed attempt waits the
//! growing base. A `Retry-After` on a 503 or 429 replaces the backoff's delay, jittered as
//! the schedule jitters (the agent itself does not read it yet: this is the simulator's
//! reading of the hint, for a server that sends one).

use std::sync::Arc;
use std::time::Duration;

use bridgehead_agent::schedule::{self, Schedule};
use bridgehead_mux::{DialRequest, Keepalive, Mux, SessionEnd};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::ErrorCode;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connect::{self, AgentWebSocket, Endpoint};
use super::counters::Counters;
use super::identity::Identity;

/// The agent's defaults: `--sync-interval`, `--sync-interval-cap`.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
const SYNC_INTERVAL_CAP: Duration = Duration::from_secs(10);
/// A session that lasted this long was healthy (the agent's `HEALTHY_SESSION`): losing it
/// starts again from the first step; a shorter one counts as a failed attempt.
pub const HEALTHY_SESSION: Duration = Duration::from_secs(10);
/// The agent's default keepalive: a ping every 5 s, dead after 3 silent intervals.
const KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(5),
    timeout: Duration::from_secs(15),
};

/// What every agent of a process shares.
#[derive(Debug)]
pub struct Shared {
    pub endpoint: Endpoint,
    pub counters: Counters,
    /// Ends every agent (and its session) of the process.
    pub stop: CancellationToken,
}

/// One agent's credentials and identifiers.
#[derive(Debug)]
pub struct Agent {
    pub identity: Identity,
    /// A bearer token to present, when the fleet runs with tokens.
    pub token: Option<String>,
}

/// Runs the agent until `shared.stop`: its first attempt at a random moment within `start`.
pub async fn run(agent: Agent, shared: Arc<Shared>, start: Duration) {
    let mut rng = StdRng::from_os_rng();
    let mut schedule = Schedule::new(SYNC_INTERVAL, SYNC_INTERVAL_CAP);
    let query = agent.identity.query();
    let identity = Arc::new(agent.identity);
    let mut delay = schedule::spread(start, &mut rng);
    let counters = &shared.counters;
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shared.stop.cancelled() => return,
        }
        counters.attempt();
        let attempt = tokio::select! {
            attempt = connect::connect(&shared.endpoint, &query, agent.token.as_deref()) => attempt,
            () = shared.stop.cancelled() => return,
        };
        let ws = match attempt {
            Ok(ws) => ws,
            Err(failure) => {
                counters.failed(&failure.kind());
                let backoff = schedule.after_failure(&mut rng);
                delay = match failure.retry_after() {
                    Some(hint) => {
                        counters.hint();
                        schedule::jitter(hint, &mut rng)
                    }
                    None => backoff,
                };
                continue;
            }
        };
        schedule.after_success(&mut rng);
        let started = Instant::now();
        let up = counters.connected();
        let mux = Mux::new(SessionConfig::new(Role::Agent));
        // The session runs in a task of its own: after a DRAIN it finishes there while this
        // loop already looks for the replacement, as the agent does.
        let session = tokio::spawn(session(mux.clone(), ws, identity.clone(), shared.clone()));
        let drained = async {
            mux.peer_drained().await;
            if !mux.peer_draining() {
                // The session ended: its task says how.
                std::future::pending::<()>().await;
            }
        };
        delay = tokio::select! {
            _ = session => {
                drop(up);
                if mux.peer_draining() {
                    // The DRAIN and the end came together: a drain.
                    counters.drained();
                    schedule.after_drain(&mut rng)
                } else if started.elapsed() > HEALTHY_SESSION {
                    counters.lost();
                    schedule.after_loss(&mut rng)
                } else {
                    counters.failed("session ended early");
                    schedule.after_failure(&mut rng)
                }
            }
            () = drained => {
                drop(up);
                counters.drained();
                schedule.after_drain(&mut rng)
            }
            () = shared.stop.cancelled() => return,
        };
    }
}

/// Drives one session until it ends, answering the server's dials.
async fn session(
    mux: Mux,
    ws: AgentWebSocket,
    identity: Arc<Identity>,
    shared: Arc<Shared>,
) -> SessionEnd {
    let accept = {
        let (mux, shared) = (mux.clone(), shared.clone());
        // Ends with the session (accept gives `None` then).
        tokio::spawn(async move {
            while let Some(request) = mux.accept().await {
                tokio::spawn(answer(request, identity.clone(), shared.clone()));
            }
        })
    };
    let ended = match mux.run(ws, KEEPALIVE, shared.stop.clone()).await {
        Ok(()) => mux.closed().await,
        Err(end) => end,
    };
    let _ = accept.await;
    ended
}

/// Answers a dial: refused unless it names this agent (the router sent it to the wrong one),
/// otherwise accepted and every byte echoed until the server finishes its direction.
async fn answer(request: DialRequest, identity: Arc<Identity>, shared: Arc<Shared>) {
    let counters = &shared.counters;
    counters.dial();
    if !identity.owns(&request.host) {
        counters.misrouted();
        request.reject(ErrorCode::Unreachable, "not this agent's host");
        return;
    }
    let Ok(stream) = request.accept() else {
        return;
    };
    loop {
        match stream.read().await {
            Ok(Some(chunk)) => {
                let len = chunk.len();
                if stream.write(chunk).await.is_err() {
                    return;
                }
                counters.echoed(len);
            }
            Ok(None) => {
                let _ = stream.finish();
                return;
            }
            Err(_) => return,
        }
    }
}
