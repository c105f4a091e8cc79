//! What the health port shows: `/healthz`, `/readyz` (a session with a server?) and
//! `/metrics`; and the admin port's `/status` (every session) and `/config`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bridgehead_mux::splice::Meter;

use bridgehead_mux::memory::TunnelMemory;
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::health::{metrics_reply, Reply};
use bridgehead_runtime::legacy_counter::LegacyCounter;
use http::StatusCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Every `result` label of `bridgehead_agent_dials_total`.
const DIAL_RESULTS: [&str; 7] = [
    "ok",
    "refused",
    "unreachable",
    "timed_out",
    "name_not_resolved",
    "not_permitted",
    "other",
];

type Label = [(&'static str, &'static str); 1];

/// One session with a server, as `/readyz` and `/status` show it.
#[derive(Debug, Clone)]
struct SessionView {
    server_id: String,
    peer: SocketAddr,
    since: Instant,
    draining: bool,
}

/// Where the agent stands with its servers.
#[derive(Debug)]
struct Status {
    /// Live sessions by the supervisor's key.
    sessions: BTreeMap<u64, SessionView>,
    /// Why the last attempt failed or the last session ended.
    last_problem: String,
    /// How many servers the agent looks for.
    known: u32,
    shutting_down: bool,
}

impl Status {
    fn active(&self) -> impl Iterator<Item = &SessionView> {
        self.sessions.values().filter(|s| !s.draining)
    }
}

/// The health state and metrics; clones share them.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    status: Mutex<Status>,
    registry: Registry,
    metrics: Metrics,
    /// The tunnels' memory: the budget every session's buffered data counts against, the
    /// kernel buffers of every target socket, the largest window.
    memory: TunnelMemory,
}

/// The agent's metrics. Clones share the values.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    connected: Gauge,
    server_sessions: Family<Label, Gauge>,
    open_server_connections: Gauge,
    known_servers: Gauge,
    streams_open: Gauge,
    dials: Family<Label, Counter>,
    dial_duration: Histogram,
    bytes: Family<Label, Counter>,
    /// `bytes{direction}`'s two counters, taken once: they are counted per spliced chunk.
    bytes_from_target: Counter,
    bytes_to_target: Counter,
    reconnects: Counter,
    /// `tunnel_send_waits{reason}`: downloads waiting for the server's window or the queue.
    send_waits: bridgehead_runtime::memory::SendWaits,
    anp_dial_duration: Histogram,
    anp_dial_failures: Family<Label, Counter>,
    anp_server_failures: LegacyCounter,
}

/// ANP's dial latency buckets.
const ANP_LATENCY_BUCKETS: [f64; 9] =
    [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

impl Metrics {
    /// Every series at zero, with the series of each label value created up front (so
    /// that rates over them have data on an agent where nothing went wrong yet).
    fn new() -> Metrics {
        let bytes = Family::<Label, Counter>::default();
        let direction = |direction| bytes.get_or_create(&[("direction", direction)]).clone();
        let (bytes_from_target, bytes_to_target) =
            (direction("from_target"), direction("to_target"));
        let metrics = Metrics {
            connected: Gauge::default(),
            server_sessions: Family::default(),
            open_server_connections: Gauge::default(),
            known_servers: Gauge::default(),
            streams_open: Gauge::default(),
            dials: Family::default(),
            // 1 ms .. ~16 s.
            dial_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            bytes_from_target,
            bytes_to_target,
            bytes,
            reconnects: Counter::default(),
            send_waits: Default::default(),
            anp_dial_duration: Histogram::new(ANP_LATENCY_BUCKETS),
            anp_dial_failures: Family::default(),
            anp_server_failures: LegacyCounter::with_label("direction"),
        };
        for result in DIAL_RESULTS {
            let _ = metrics.dials.get_or_create(&[("result", result)]);
        }
        for state in ["active", "draining"] {
            let _ = metrics.server_sessions.get_or_create(&[("state", state)]);
        }
        metrics.known_servers.set(1);
        metrics
    }

    /// Bridgehead's series, under `bridgehead_agent_`.
    fn register(&self, r: &mut Registry) {
        r.register(
            "connected",
            "1 while at least one session with a server is up and not draining",
            self.connected.clone(),
        );
        r.register(
            "server_sessions",
            "Sessions with servers, by state",
            self.server_sessions.clone(),
        );
        r.register(
            "known_servers",
            "How many servers the agent looks for (the server count)",
            self.known_servers.clone(),
        );
        r.register(
            "streams_open",
            "Tunnels currently open",
            self.streams_open.clone(),
        );
        r.register(
            "dials",
            "Dials the servers asked for, by result",
            self.dials.clone(),
        );
        r.register_with_unit(
            "dial_duration",
            "Time to resolve and connect a target",
            Unit::Seconds,
            self.dial_duration.clone(),
        );
        r.register("bytes", "Bytes carried, by direction", self.bytes.clone());
        r.register(
            "reconnects",
            "Attempts to reach a server after the first",
            self.reconnects.clone(),
        );
        self.send_waits.register(r);
    }

    /// konnectivity's series under its names (`konnectivity_network_proxy_agent_`).
    fn register_anp(&self, r: &mut Registry) {
        r.register(
            "open_server_connections",
            "Current number of open server connections",
            self.open_server_connections.clone(),
        );
        r.register(
            "known_server_count",
            "Current number of servers the agent knows of",
            self.known_servers.clone(),
        );
        r.register(
            "open_endpoint_connections",
            "Current number of open endpoint connections",
            self.streams_open.clone(),
        );
        r.register(
            "dial_duration_seconds",
            "Latency of dial to the remote endpoint in seconds",
            self.anp_dial_duration.clone(),
        );
        r.register(
            "endpoint_dial_failure",
            "Number of failures dialing the remote endpoint, by reason (timeout, unknown)",
            self.anp_dial_failures.clone(),
        );
        r.register("server_connection_failure_count", "Sessions with a server that failed, by direction (to_server: writing failed; from_server: reading, keepalive or protocol)", self.anp_server_failures.clone());
    }
}

impl Health {
    /// The health state of an agent of `server`, its metrics showing `memory`'s budget and
    /// what target sockets earned, and when each of `certificates` (role, file) expires.
    pub(crate) fn new(
        server: &str,
        memory: TunnelMemory,
        certificates: Vec<(&'static str, std::path::PathBuf)>,
    ) -> Health {
        let metrics = Metrics::new();
        let mut root = Registry::default();
        root.register_collector(Box::new(
            bridgehead_runtime::process_metrics::ProcessCollector,
        ));
        let registry = root.sub_registry_with_prefix("bridgehead_agent");
        registry.register_collector(Box::new(bridgehead_runtime::logging::DroppedCollector));
        registry.register_collector(Box::new(
            bridgehead_runtime::certificates::ExpiryCollector::new(certificates),
        ));
        let shown = memory.budget.clone();
        registry.register_collector(Box::new(bridgehead_runtime::memory::BudgetCollector(
            move || (shown.buffered(), shown.limit(), shown.refused()),
        )));
        registry.register_collector(Box::new(bridgehead_runtime::memory::EarnedCollector(
            memory.earned.clone(),
        )));
        metrics.register(registry);
        // konnectivity's names, for dashboards built on them.
        metrics.register_anp(root.sub_registry_with_prefix("konnectivity_network_proxy_agent"));
        Health {
            inner: Arc::new(Inner {
                status: Mutex::new(Status {
                    sessions: BTreeMap::new(),
                    last_problem: format!("connecting to {server}"),
                    known: 1,
                    shutting_down: false,
                }),
                registry: root,
                metrics,
                memory,
            }),
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The tunnels' memory: budget, target sockets' buffers, largest window.
    pub(crate) fn memory(&self) -> &TunnelMemory {
        &self.inner.memory
    }

    /// Session `key` with `server_id` at `peer` is up.
    pub(crate) fn session_opened(&self, key: u64, server_id: &str, peer: SocketAddr) {
        self.update(|status| {
            status.sessions.insert(
                key,
                SessionView {
                    server_id: server_id.to_owned(),
                    peer,
                    since: Instant::now(),
                    draining: false,
                },
            );
        });
    }

    /// Session `key`'s server drains.
    pub(crate) fn session_draining(&self, key: u64) {
        self.update(|status| {
            if let Some(session) = status.sessions.get_mut(&key) {
                session.draining = true;
            }
        });
    }

    /// Session `key` ended, for `reason`.
    pub(crate) fn session_closed(&self, key: u64, reason: String) {
        self.update(|status| {
            if let Some(session) = status.sessions.remove(&key) {
                status.last_problem = format!(
                    "session with server {} at {} ended: {reason}",
                    session.server_id, session.peer
                );
            }
        });
    }

    /// An attempt to reach a server failed.
    pub(crate) fn attempt_failed(&self, reason: String) {
        self.update(|status| status.last_problem = reason);
    }

    /// The agent looks for `count` servers.
    pub(crate) fn set_known(&self, count: u32) {
        self.update(|status| status.known = count);
    }

    pub(crate) fn set_shutting_down(&self) {
        self.update(|status| status.shutting_down = true);
    }

    /// Changes the status and sets the gauges that follow it.
    fn update(&self, change: impl FnOnce(&mut Status)) {
        let mut status = self.lock();
        change(&mut status);
        let active = status.active().count() as i64;
        let all = status.sessions.len() as i64;
        let metrics = &self.inner.metrics;
        metrics.connected.set(i64::from(active > 0));
        metrics.open_server_connections.set(all);
        metrics.known_servers.set(i64::from(status.known));
        metrics
            .server_sessions
            .get_or_create(&[("state", "active")])
            .set(active);
        metrics
            .server_sessions
            .get_or_create(&[("state", "draining")])
            .set(all - active);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Status> {
        self.inner
            .status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One line per session, for `/status`.
    fn sessions_text(status: &Status) -> String {
        let mut text = String::new();
        for session in status.sessions.values() {
            text.push_str(&format!(
                "server {} at {}, up {}s{}\n",
                session.server_id,
                session.peer,
                session.since.elapsed().as_secs(),
                if session.draining { ", draining" } else { "" }
            ));
        }
        text
    }

    /// Answers one GET on the admin port; `config` is the configuration as text (paths, never
    /// keys or tokens).
    pub(crate) fn admin(&self, path: &str, config: &str) -> Reply {
        match path {
            "/status" => {
                let status = self.lock();
                let active = status.active().count();
                let summary = if status.shutting_down {
                    "shutting down".to_owned()
                } else if active == 0 {
                    format!("not connected: {}", status.last_problem)
                } else {
                    format!("connected to {active} of {} servers", status.known)
                };
                Reply::text(
                    StatusCode::OK,
                    format!(
                        "{summary}\n{}open tunnels: {}",
                        Self::sessions_text(&status),
                        self.inner.metrics.streams_open.get()
                    ),
                )
            }
            "/config" => Reply::text(StatusCode::OK, config),
            _ => Reply::text(StatusCode::NOT_FOUND, "not found (try /status, /config)"),
        }
    }

    /// Answers one GET on the health port. Ready while at least one session is up and not
    /// draining: a server can route to this agent.
    pub(crate) fn reply(&self, path: &str) -> Reply {
        match path {
            "/healthz" | "/livez" => Reply::text(StatusCode::OK, "ok"),
            "/readyz" => {
                let status = self.lock();
                let active: Vec<&str> = status.active().map(|s| s.server_id.as_str()).collect();
                if status.shutting_down {
                    Reply::text(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                } else if active.is_empty() {
                    Reply::text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not connected to server: {}", status.last_problem),
                    )
                } else {
                    Reply::text(
                        StatusCode::OK,
                        format!(
                            "ok: connected to {} of {} servers ({})",
                            active.len(),
                            status.known,
                            active.join(", ")
                        ),
                    )
                }
            }
            "/metrics" => metrics_reply(&self.inner.registry),
            _ => Reply::text(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

impl Metrics {
    /// A dial finished after `elapsed`; `None` means it succeeded.
    pub(crate) fn dial_finished(&self, failure: Option<ErrorCode>, elapsed: Duration) {
        let result = match failure {
            None => "ok",
            Some(code) => match code.as_str() {
                known if DIAL_RESULTS.contains(&known) => known,
                _ => "other",
            },
        };
        self.dials.get_or_create(&[("result", result)]).inc();
        self.dial_duration.observe(elapsed.as_secs_f64());
        match result {
            "ok" => self.anp_dial_duration.observe(elapsed.as_secs_f64()),
            "timed_out" => {
                self.anp_dial_failures
                    .get_or_create(&[("reason", "timeout")])
                    .inc();
            }
            _ => {
                self.anp_dial_failures
                    .get_or_create(&[("reason", "unknown")])
                    .inc();
            }
        }
    }

    /// A session ended for `end`: a failure counts by direction, as ANP's
    /// `server_connection_failure_count`.
    pub(crate) fn session_ended(&self, end: &bridgehead_mux::SessionEnd) {
        use bridgehead_mux::SessionEnd;
        let direction = match end {
            SessionEnd::Write(_) => "to_server",
            SessionEnd::Protocol(_)
            | SessionEnd::KeepaliveTimeout(_)
            | SessionEnd::WebSocket(_) => "from_server",
            SessionEnd::ClosedByPeer | SessionEnd::Shutdown | SessionEnd::Closed(_) => return,
        };
        self.anp_server_failures.inc_by(direction, 1);
    }

    /// A tunnel opened; it counts as open until the guard drops.
    pub(crate) fn stream_opened(&self) -> OpenStream {
        self.streams_open.inc();
        OpenStream {
            gauge: self.streams_open.clone(),
        }
    }

    /// An attempt to reach a server, other than the first.
    pub(crate) fn reconnecting(&self) {
        self.reconnects.inc();
    }
}

/// Counts a tunnel's bytes as they flow (the socket is the target: `up` came from it).
impl Meter for Metrics {
    fn moved(&self, up: u64, down: u64) {
        if up > 0 {
            self.bytes_from_target.inc_by(up);
        }
        if down > 0 {
            self.bytes_to_target.inc_by(down);
        }
    }

    fn waited(&self, why: bridgehead_mux::splice::SendWait) {
        self.send_waits.waited(why);
    }
}

/// Keeps `bridgehead_agent_streams_open` up while a tunnel lives.
#[derive(Debug)]
pub(crate) struct OpenStream {
    gauge: Gauge,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
