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

use bridgehead_runtime::threads::{spawn_home, Home, Shards};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::config::Config;
use crate::context::Context;
use crate::schedule::Schedule;
use crate::server_connection::{self, ConnectError, Connected};
use crate::server_count::ServerCount;
use bridgehead_runtime::addresses::Addresses;
use bridgehead_runtime::destinations::Policy;

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
    ctx: Context,
    policy: Arc<Policy>,
    count: ServerCount,
    shards: Shards,
    shutdown: CancellationToken,
) {
    let (events_tx, mut events) = mpsc::channel(EVENTS);
    let mut search = Search {
        schedule: Schedule::new(
            config.servers.sync_interval,
            config.servers.sync_interval_cap,
        ),
        addresses: Addresses::new(
            config.servers.hosts.clone(),
            config.servers.port,
            config.servers.sync_interval,
        ),
        config,
        ctx,
        policy,
        count,
        shards,
        shutdown,
        sessions: TaskTracker::new(),
        events: events_tx,
        held: BTreeMap::new(),
        next_key: 0,
        rng: StdRng::from_os_rng(),
        attempts: 0,
    };
    if search.config.servers.max_sessions > 0 {
        // Agents that hold only some of the servers start at a random one, so that a fleet
        // given one list spreads over it.
        let start = rand::Rng::random_range(&mut search.rng, 0..1024);
        search.addresses.start_at(start);
    }
    let mut next_attempt = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next_attempt) => {}
            Some(event) = events.recv() => {
                if let Some(delay) = search.on_event(event) {
                    next_attempt = next_attempt.min(tokio::time::Instant::now() + delay);
                }
                continue;
            }
            () = search.shutdown.cancelled() => break,
        }
        let Some(delay) = search.attempt().await else {
            break;
        };
        next_attempt = tokio::time::Instant::now() + delay;
    }
    search.ctx.set_shutting_down();
    // Session tasks waiting for room to report see the loop gone.
    drop(events);
    search.sessions.close();
    search.sessions.wait().await;
}

/// The search loop's state: the sessions it holds, when to try next, where the servers are.
struct Search {
    config: Arc<Config>,
    ctx: Context,
    policy: Arc<Policy>,
    count: ServerCount,
    shards: Shards,
    shutdown: CancellationToken,
    /// Every session's task.
    sessions: TaskTracker,
    /// Where session tasks report their drain and their end.
    events: mpsc::Sender<Event>,
    held: BTreeMap<u64, Held>,
    next_key: u64,
    schedule: Schedule,
    rng: StdRng,
    addresses: Addresses,
    attempts: u64,
}

impl Search {
    /// A session drained or ended: when to look again, if at all.
    fn on_event(&mut self, event: Event) -> Option<Duration> {
        match event {
            Event::Draining(key) => {
                let session = self.held.get_mut(&key)?;
                session.draining = true;
                self.ctx.session_draining(key);
                info!(
                    server_id = %session.server_id,
                    "the server drains: looking for its replacement now; its open tunnels finish on the old session"
                );
                Some(self.schedule.after_drain(&mut self.rng))
            }
            Event::Ended(key) => {
                let session = self.held.remove(&key)?;
                if session.draining {
                    // Replaced already, or being replaced.
                    return None;
                }
                Some(if session.started.elapsed() > HEALTHY_SESSION {
                    self.schedule.after_loss(&mut self.rng)
                } else {
                    self.schedule.after_failure(&mut self.rng)
                })
            }
        }
    }

    /// One look for a server the agent lacks: the delay until the next, or `None` at
    /// shutdown.
    async fn attempt(&mut self) -> Option<Duration> {
        self.addresses.refresh().await;
        self.count.found(self.addresses.count());
        let wanted = self.count.count();
        self.ctx.set_known(wanted);
        let live: Vec<String> = self
            .held
            .values()
            .filter(|s| !s.draining)
            .map(|s| s.server_id.clone())
            .collect();
        // `--max-server-sessions`: the rest of the servers reach this agent by forwarding.
        let max = self.config.servers.max_sessions;
        let enough = match max {
            0 => !self.config.servers.sync_forever && live.len() >= wanted as usize,
            max => live.len() >= max.min(wanted as usize),
        };
        if enough {
            return Some(self.schedule.after_success(&mut self.rng));
        }
        if self.attempts > 0 {
            self.ctx.metrics().reconnecting();
        }
        self.attempts += 1;
        // A session's connection is made on the thread the session will run on, so that its
        // socket is that thread's runtime's.
        let home = self.shards.home();
        // With several addresses, one whose server the agent holds no session with yet.
        let address = self.addresses.next(&live);
        let attempt = self.connect(address, &live, home.as_ref()).await?;
        Some(match attempt {
            Ok(connected) if live.contains(&connected.server_id) => {
                self.addresses.learn(connected.peer, &connected.server_id);
                // A server that did not honour the header: keep the older session.
                debug!(server_id = %connected.server_id, "reached a server held already; closing the new session");
                drop(connected);
                self.schedule.after_success(&mut self.rng)
            }
            Ok(connected) => self.hold(connected, home),
            Err(ConnectError::Duplicate(server_id)) => {
                if let Some(address) = address {
                    self.addresses.learn(address, &server_id);
                }
                debug!(%server_id, "reached a server held already");
                self.schedule.after_success(&mut self.rng)
            }
            Err(error) => self.failed(&error, live.len()),
        })
    }

    /// Connects to `address` (the configured name when `None`) on `home`'s thread; `None` at
    /// shutdown.
    async fn connect(
        &self,
        address: Option<std::net::SocketAddr>,
        live: &[String],
        home: Option<&Home>,
    ) -> Option<Result<Connected, ConnectError>> {
        // Each entry of a list is its own server, verified for its own name unless
        // --server-name says otherwise.
        let name = address
            .filter(|_| !self.config.tls.server_name_given)
            .and_then(|address| self.addresses.entry(address))
            .and_then(|entry| rustls_pki_types::ServerName::try_from(entry.to_owned()).ok());
        let connect = {
            let (config, live) = (self.config.clone(), live.to_vec());
            async move { server_connection::connect_to_server(&config, &live, address, name).await }
        };
        match home {
            Some(home) => {
                let connecting = AbortOnDropHandle::new(home.handle().spawn(connect));
                tokio::select! {
                    joined = connecting => match joined {
                        Ok(attempt) => Some(attempt),
                        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
                    },
                    () = self.shutdown.cancelled() => None,
                }
            }
            None => tokio::select! {
                attempt = connect => Some(attempt),
                () = self.shutdown.cancelled() => None,
            },
        }
    }

    /// A new server: held, its session started on `home`.
    fn hold(&mut self, connected: Connected, home: Option<Home>) -> Duration {
        self.addresses.learn(connected.peer, &connected.server_id);
        if let Some(n) = connected.server_count {
            self.count.received(n);
        }
        let key = self.next_key;
        self.next_key += 1;
        self.held.insert(
            key,
            Held {
                server_id: connected.server_id.clone(),
                started: Instant::now(),
                draining: false,
            },
        );
        let live = self.held.values().filter(|s| !s.draining).count();
        info!(
            server = %connected.peer,
            server_id = %connected.server_id,
            server_count = self.count.count(),
            sessions = live,
            identifiers = %self.config.identifiers,
            "connected to server"
        );
        self.ctx.set_known(self.count.count());
        self.spawn_session(key, connected, home);
        self.schedule.after_success(&mut self.rng)
    }

    /// A failed attempt: logged by how much it matters, and the delay before the next (at
    /// least what a server's `Retry-After` asked for).
    fn failed(&mut self, error: &ConnectError, live: usize) -> Duration {
        let mut delay = self.schedule.after_failure(&mut self.rng);
        // A server that said when its answer is due (a queued token review) is asked again
        // then, each agent at its own moment around it.
        if let ConnectError::Refused {
            retry_after: Some(after),
            ..
        } = error
        {
            delay = delay.max(crate::schedule::jitter(*after, &mut self.rng));
        }
        match error {
            // The server looked at us and said no (bad identifiers, auth): that needs an
            // operator, whatever the retries do.
            ConnectError::Refused { status, body, .. } => error!(
                status = status.as_u16(),
                reason = %body,
                retry_in = ?delay,
                "server refused the connection"
            ),
            // Nothing held: the agent is down, and that is worth a line every time.
            _ if live == 0 => {
                warn!(%error, retry_in = ?delay, "connecting to server failed")
            }
            _ => {
                info!(%error, retry_in = ?delay, sessions = live, "looking for more servers: connecting failed")
            }
        }
        self.ctx.attempt_failed(error.to_string());
        delay
    }

    /// Runs one session in its own task, reporting its drain and its end.
    fn spawn_session(&self, key: u64, connected: Connected, home: Option<Home>) {
        let Connected {
            ws,
            peer,
            server_id,
            server_count: _,
        } = connected;
        self.ctx.session_opened(key, &server_id, peer);
        let (config, ctx, policy, shutdown, events) = (
            self.config.clone(),
            self.ctx.clone(),
            self.policy.clone(),
            self.shutdown.clone(),
            self.events.clone(),
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
            let reason = crate::session::run(ws, &config, &ctx, &policy, &shutdown, drained).await;
            ctx.metrics().session_ended(&reason);
            ctx.session_closed(key, reason.to_string());
            if shutdown.is_cancelled() {
                info!(%reason, "session closed");
            } else {
                warn!(%reason, "session with server ended");
            }
            let _ = events.send(Event::Ended(key)).await;
        }
        .instrument(span);
        // Its tunnels' tasks are spawned from it, onto the same thread.
        spawn_home(handle.as_ref(), &self.sessions, session);
    }
}
