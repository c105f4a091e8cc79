//! One simulated agent: connects, holds its sessions (the session driver answers pings; every
//! dial is answered by an in-process echo), one per server when several answer behind one
//! address, and after losing one comes back on the agent's own schedule
//! (`bridgehead_agent::schedule`, the code the agent runs), as the agent's search loop
//! (agent/src/servers.rs) uses it: a lost healthy session is looked for again within one sync
//! interval, a drained one within a quarter, a failed attempt waits the growing base, a
//! success (a session, or a 409 from a server held already) one interval. A `Retry-After` on a 503 or 429 replaces the backoff's delay, jittered as
//! the schedule jitters (the agent itself does not read it yet: this is the simulator's
//! reading of the hint, for a server that sends one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bridgehead_agent::schedule::{self, Schedule};
use bridgehead_mux::{DialRequest, Keepalive, Mux, SessionEnd};
use bridgehead_proto::session::{Role, SessionConfig};
use bridgehead_proto::ErrorCode;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::connect::{self, AgentWebSocket, Endpoint, Failure};
use super::counters::{Counters, UpGuard};
use super::identity::Identity;

/// The agent's defaults: `--sync-interval`, `--sync-interval-cap`.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
const SYNC_INTERVAL_CAP: Duration = Duration::from_secs(10);
/// A session that lasted this long was healthy (the agent's `HEALTHY_SESSION`): losing it
/// starts again from the first step; a shorter one counts as a failed attempt.
pub const HEALTHY_SESSION: Duration = Duration::from_secs(10);
/// The agent's default keepalive: a ping every 5 s, dead after 3 silent intervals.
const KEEPALIVE: Keepalive = Keepalive {
    interval_ms: 5_000,
    timeout_ms: 15_000,
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

/// A session the agent holds.
#[derive(Debug)]
struct Held<'a> {
    started: Instant,
    /// Counts the session as up until it ends or drains.
    _up: UpGuard<'a>,
}

/// How a held session stopped counting.
#[derive(Debug)]
enum Stopped {
    /// Its server announced DRAIN (the session finishes in its own task).
    Drained,
    /// It ended without a DRAIN first.
    Ended,
}

/// Runs the agent until `shared.stop`: its first attempt at a random moment within `start`.
/// It keeps one session with each of as many distinct servers as the last server announced
/// (`bridgehead-server-count`; one until told), as the agent's search loop does: an attempt
/// tells the server which it holds, a 409 is a server held already, and while it holds the
/// count it waits for a session to end or drain.
pub async fn run(agent: Agent, shared: Arc<Shared>, start: Duration) {
    let mut rng = StdRng::from_os_rng();
    let mut schedule = Schedule::new(SYNC_INTERVAL, SYNC_INTERVAL_CAP);
    let query = agent.identity.query();
    let identity = Arc::new(agent.identity);
    let counters = &shared.counters;
    let mut wanted = 1;
    let mut held: HashMap<String, Held<'_>> = HashMap::new();
    let mut watchers: JoinSet<(String, Stopped)> = JoinSet::new();
    let mut next = Some(Instant::now() + schedule::spread(start, &mut rng));
    loop {
        let attempt_due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = attempt_due => {}
            Some(Ok((server_id, stopped))) = watchers.join_next() => {
                let Some(session) = held.remove(&server_id) else { continue };
                let delay = match stopped {
                    Stopped::Drained => {
                        counters.drained();
                        schedule.after_drain(&mut rng)
                    }
                    Stopped::Ended if session.started.elapsed() > HEALTHY_SESSION => {
                        counters.lost();
                        schedule.after_loss(&mut rng)
                    }
                    Stopped::Ended => {
                        counters.failed("session ended early");
                        schedule.after_failure(&mut rng)
                    }
                };
                let at = Instant::now() + delay;
                next = Some(next.map_or(at, |next| next.min(at)));
                continue;
            }
            () = shared.stop.cancelled() => return,
        }
        let live: Vec<String> = held.keys().cloned().collect();
        if live.len() >= wanted {
            // Nothing to look for until a session ends or drains.
            next = None;
            continue;
        }
        counters.attempt();
        let began = std::time::SystemTime::now();
        let attempt = tokio::select! {
            attempt = connect::connect(&shared.endpoint, &query, agent.token.as_deref(), &live) => attempt,
            () = shared.stop.cancelled() => return,
        };
        let delay = match attempt {
            Ok(connected) if held.contains_key(&connected.server_id) => {
                // A server that ignored the header: keep the older session.
                schedule.after_success(&mut rng)
            }
            Ok(connected) => {
                wanted = connected.server_count.unwrap_or(wanted);
                let up = counters.connected();
                let mux = Mux::new(SessionConfig::new(Role::Agent));
                // The session runs in a task of its own: after a DRAIN it finishes there
                // while this loop already looks for the replacement, as the agent does.
                let session = tokio::spawn(session(
                    mux.clone(),
                    connected.ws,
                    identity.clone(),
                    shared.clone(),
                ));
                watchers.spawn(watch(mux, session, connected.server_id.clone()));
                held.insert(
                    connected.server_id,
                    Held {
                        started: Instant::now(),
                        _up: up,
                    },
                );
                schedule.after_success(&mut rng)
            }
            Err(Failure::Duplicate(_)) => {
                counters.duplicate();
                schedule.after_success(&mut rng)
            }
            Err(failure) => {
                counters.failed_began(&failure.kind(), began);
                let backoff = schedule.after_failure(&mut rng);
                match failure.retry_after() {
                    Some(hint) => {
                        counters.hint();
                        schedule::jitter(hint, &mut rng)
                    }
                    None => backoff,
                }
            }
        };
        next = Some(Instant::now() + delay);
    }
}

/// Waits until a session's server drains it or it ends.
async fn watch(
    mux: Mux,
    session: tokio::task::JoinHandle<SessionEnd>,
    server_id: String,
) -> (String, Stopped) {
    let drained = async {
        mux.peer_drained().await;
        if !mux.peer_draining() {
            // The session ended: its task says how.
            std::future::pending::<()>().await;
        }
    };
    let stopped = tokio::select! {
        _ = session => {
            // The DRAIN and the end came together: a drain.
            if mux.peer_draining() { Stopped::Drained } else { Stopped::Ended }
        }
        () = drained => Stopped::Drained,
    };
    (server_id, stopped)
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
