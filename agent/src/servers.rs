//! The agent's sessions with the servers behind its address: the search that keeps one session
//! per distinct server id, as many as the server count says (or more, with `--sync-forever`),
//! and what it does when a session drains or ends. The address may be one (a load balancer,
//! dialed by name) or several ([`Addresses`]: each dialed in turn until held).
//!
//! One loop owns the set of sessions. It dials the address when it holds fewer live sessions
//! than the count (always, with `--sync-forever`), telling the server which ids it holds: a
//! server already held refuses (409 naming itself), a new one becomes a session of its own, run
//! in a task with its own keepalive, drain and tunnels. The tasks report back when their server
//! drains (the session stops counting and the search starts again at once: the replacement may
//! be listening already) and when they end. The delays between attempts are [`Schedule`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_runtime::threads::{Home, Shards};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::addresses::Addresses;
use crate::config::Config;
use crate::health::Health;
use crate::policy::Policy;
use crate::schedule::Schedule;
use crate::server_connection::{self, ConnectError, Connected};
use crate::server_count::ServerCount;

/// A session that lasted this long was healthy: losing it starts the search from the first
/// step; a shorter one counts as a failed attempt (a server that accepts and drops at once
/// does not get hammered).
const HEALTHY_SESSION: Duration = Duration::from_secs(10);

/// Reports queued for the search loop; a session task waits for room (each sends two at most).
const EVENTS: usize = 64;

/// What a session task reports to the search loop.
#[derive(Debug)]
enum Event {
    /// The session's server announced that it drains.
    Draining(u64),
    /// The session ended.
    Ended(u64),
}

/// A session the search loop holds.
#[derive(Debug)]
struct Held {
    server_id: String,
    started: Instant,
    draining: bool,
}

/// Keeps sessions with the servers until `shutdown`, then waits for every session to drain.
pub(crate) async fn run(
    config: Arc<Config>,
    health: Health,
    policy: Arc<Policy>,
    mut count: ServerCount,
    shards: Shards,
    shutdown: CancellationToken,
) {
    let sessions = TaskTracker::new();
    let (events_tx, mut events) = mpsc::channel(EVENTS);
    let mut held: BTreeMap<u64, Held> = BTreeMap::new();
    let mut next_key: u64 = 0;
    let mut schedule = Schedule::new(
        config.servers.sync_interval,
        config.servers.sync_interval_cap,
    );
    let mut rng = StdRng::from_os_rng();
    let mut next_attempt = tokio::time::Instant::now();
    let mut attempts: u64 = 0;
    let mut addresses = Addresses::new(
        config.servers.hosts.clone(),
        config.servers.port,
        config.servers.sync_interval,
    );

    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next_attempt) => {}
            Some(event) = events.recv() => {
                let delay = match event {
                    Event::Draining(key) => {
                        let Some(session) = held.get_mut(&key) else { continue };
                        session.draining = true;
                        health.session_draining(key);
                        info!(
                            server_id = %session.server_id,
                            "the server drains: looking for its replacement now; its open tunnels finish on the old session"
                        );
                        schedule.after_drain(&mut rng)
                    }
                    Event::Ended(key) => {
                        let Some(session) = held.remove(&key) else { continue };
                        if session.draining {
                            // Replaced already, or being replaced.
                            continue;
                        }
                        if session.started.elapsed() > HEALTHY_SESSION {
                            schedule.after_loss(&mut rng)
                        } else {
                            schedule.after_failure(&mut rng)
                        }
                    }
                };
                let at = tokio::time::Instant::now() + delay;
                next_attempt = next_attempt.min(at);
                continue;
            }
            () = shutdown.cancelled() => break,
        }

        addresses.refresh().await;
        count.found(addresses.count());
        let wanted = count.count();
        health.set_known(wanted);
        let live: Vec<String> = held
            .values()
            .filter(|s| !s.draining)
            .map(|s| s.server_id.clone())
            .collect();
        if !config.servers.sync_forever && live.len() >= wanted as usize {
            next_attempt = tokio::time::Instant::now() + schedule.after_success(&mut rng);
            continue;
        }

        if attempts > 0 {
            health.metrics().reconnecting();
        }
        attempts += 1;
        // A session's connection is made on the thread the session will run on, so that its
        // socket is that thread's runtime's.
        let home = shards.home();
        // With several addresses, one whose server the agent holds no session with yet.
        let address = addresses.next(&live);
        // Each entry of a list is its own server, verified for its own name unless
        // --server-name says otherwise.
        let name = address
            .filter(|_| !config.tls.server_name_given)
            .and_then(|address| addresses.entry(address))
            .and_then(|entry| rustls_pki_types::ServerName::try_from(entry.to_owned()).ok());
        let connect = {
            let (config, live) = (config.clone(), live.clone());
            async move { server_connection::connect_to_server(&config, &live, address, name).await }
        };
        let attempt = match &home {
            Some(home) => {
                let connecting = AbortOnDropHandle::new(home.handle().spawn(connect));
                tokio::select! {
                    joined = connecting => match joined {
                        Ok(attempt) => attempt,
                        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
                    },
                    () = shutdown.cancelled() => break,
                }
            }
            None => tokio::select! {
                attempt = connect => attempt,
                () = shutdown.cancelled() => break,
            },
        };
        let delay = match attempt {
            Ok(connected) if live.contains(&connected.server_id) => {
                addresses.learn(connected.peer, &connected.server_id);
                // A server that did not honour the header: keep the older session.
                debug!(server_id = %connected.server_id, "reached a server held already; closing the new session");
                drop(connected);
                schedule.after_success(&mut rng)
            }
            Ok(connected) => {
                addresses.learn(connected.peer, &connected.server_id);
                if let Some(n) = connected.server_count {
                    count.received(n);
                }
                let key = next_key;
                next_key += 1;
                held.insert(
                    key,
                    Held {
                        server_id: connected.server_id.clone(),
                        started: Instant::now(),
                        draining: false,
                    },
                );
                let live = held.values().filter(|s| !s.draining).count();
                info!(
                    server = %connected.peer,
                    server_id = %connected.server_id,
                    server_count = count.count(),
                    sessions = live,
                    identifiers = %config.identifiers,
                    "connected to server"
                );
                health.set_known(count.count());
                spawn_session(
                    &sessions, key, connected, home, &config, &health, &policy, &shutdown,
                    &events_tx,
                );
                schedule.after_success(&mut rng)
            }
            Err(ConnectError::Duplicate(server_id)) => {
                if let Some(address) = address {
                    addresses.learn(address, &server_id);
                }
                debug!(%server_id, "reached a server held already");
                schedule.after_success(&mut rng)
            }
            Err(error) => {
                let mut delay = schedule.after_failure(&mut rng);
                // A server that said when its answer is due (a queued token review) is asked
                // again then, each agent at its own moment around it.
                if let ConnectError::Refused {
                    retry_after: Some(after),
                    ..
                } = &error
                {
                    delay = delay.max(crate::schedule::jitter(*after, &mut rng));
                }
                // Nothing held: the agent is down, and that is worth a line every time.
                match &error {
                    // The server looked at us and said no (bad identifiers, auth): that needs
                    // an operator, whatever the retries do.
                    ConnectError::Refused { status, body, .. } => error!(
                        status = status.as_u16(),
                        reason = %body,
                        retry_in = ?delay,
                        "server refused the connection"
                    ),
                    _ if live.is_empty() => {
                        warn!(%error, retry_in = ?delay, "connecting to server failed")
                    }
                    _ => {
                        info!(%error, retry_in = ?delay, sessions = live.len(), "looking for more servers: connecting failed")
                    }
                }
                health.attempt_failed(error.to_string());
                delay
            }
        };
        next_attempt = tokio::time::Instant::now() + delay;
    }

    health.set_shutting_down();
    // Session tasks waiting for room to report see the loop gone.
    drop(events);
    sessions.close();
    sessions.wait().await;
}

/// Runs one session in its own task, reporting its drain and its end.
#[allow(clippy::too_many_arguments, reason = "the task takes a clone of each")]
fn spawn_session(
    sessions: &TaskTracker,
    key: u64,
    connected: Connected,
    home: Option<Home>,
    config: &Arc<Config>,
    health: &Health,
    policy: &Arc<Policy>,
    shutdown: &CancellationToken,
    events: &mpsc::Sender<Event>,
) {
    let Connected {
        ws,
        peer,
        server_id,
        server_count: _,
    } = connected;
    health.session_opened(key, &server_id, peer);
    let (config, health, policy, shutdown, events) = (
        config.clone(),
        health.clone(),
        policy.clone(),
        shutdown.clone(),
        events.clone(),
    );
    let span = info_span!("session", server = %peer, server_id = %server_id);
    let handle = home.as_ref().map(|home| home.handle().clone());
    let session = async move {
        // Counted on its thread while it runs.
        let _home = home;
        let drained = {
            let events = events.clone();
            async move {
                let _ = events.send(Event::Draining(key)).await;
            }
        };
        let reason = crate::session::run(ws, &config, &health, &policy, &shutdown, drained).await;
        health.metrics().session_ended(&reason);
        health.session_closed(key, reason.to_string());
        if shutdown.is_cancelled() {
            info!(%reason, "session closed");
        } else {
            warn!(%reason, "session with server ended");
        }
        let _ = events.send(Event::Ended(key)).await;
    }
    .instrument(span);
    // Its tunnels' tasks are spawned from it, onto the same thread.
    match handle {
        Some(handle) => drop(handle.spawn(sessions.track_future(session))),
        None => drop(sessions.spawn(session)),
    }
}
