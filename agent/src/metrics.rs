//! The agent's Prometheus metrics: Bridgehead's own (`bridgehead_agent_*`), konnectivity's
//! names and meanings beside them (`konnectivity_network_proxy_agent_*`), and what its
//! sessions and tunnels count into them.

use std::time::Duration;

use bridgehead_mux::splice::Meter;
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::legacy_counter::LegacyCounter;
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
    pub(crate) fn new() -> Metrics {
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
    pub(crate) fn register(&self, r: &mut Registry) {
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
    pub(crate) fn register_anp(&self, r: &mut Registry) {
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

impl Metrics {
    /// Tunnels open now.
    pub(crate) fn streams_open(&self) -> i64 {
        self.streams_open.get()
    }

    /// The gauges that follow the sessions: `active` of `all` sessions up, `known` servers
    /// looked for.
    pub(crate) fn show_sessions(&self, active: i64, all: i64, known: i64) {
        self.connected.set(i64::from(active > 0));
        self.open_server_connections.set(all);
        self.known_servers.set(known);
        self.server_sessions
            .get_or_create(&[("state", "active")])
            .set(active);
        self.server_sessions
            .get_or_create(&[("state", "draining")])
            .set(all - active);
    }

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
