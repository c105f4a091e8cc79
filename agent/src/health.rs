//! What the health port shows: `/healthz`, `/readyz` (connected to the server?) and
//! `/metrics`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridgehead_mux::splice::Moved;
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::health::{metrics_reply, Reply};
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

/// Where the agent stands with the server, for `/readyz`.
#[derive(Debug, Clone)]
enum Status {
    NotConnected(String),
    Connected(SocketAddr),
    ShuttingDown,
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
}

/// The agent's metrics. Clones share the values.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    connected: Gauge,
    streams_open: Gauge,
    dials: Family<Label, Counter>,
    dial_duration: Histogram,
    bytes: Family<Label, Counter>,
    reconnects: Counter,
}

impl Health {
    pub(crate) fn new(server: &str) -> Health {
        let metrics = Metrics {
            connected: Gauge::default(),
            streams_open: Gauge::default(),
            dials: Family::default(),
            // 1 ms .. ~16 s.
            dial_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            bytes: Family::default(),
            reconnects: Counter::default(),
        };
        for result in DIAL_RESULTS {
            let _ = metrics.dials.get_or_create(&[("result", result)]);
        }
        for direction in ["to_target", "from_target"] {
            let _ = metrics.bytes.get_or_create(&[("direction", direction)]);
        }
        let mut registry = Registry::with_prefix("bridgehead_agent");
        registry.register(
            "connected",
            "1 while a session with the server is up",
            metrics.connected.clone(),
        );
        registry.register(
            "streams_open",
            "Tunnels currently open",
            metrics.streams_open.clone(),
        );
        registry.register(
            "dials",
            "Dials the server asked for, by result",
            metrics.dials.clone(),
        );
        registry.register_with_unit(
            "dial_duration",
            "Time to resolve and connect a target",
            Unit::Seconds,
            metrics.dial_duration.clone(),
        );
        registry.register(
            "bytes",
            "Bytes carried, by direction",
            metrics.bytes.clone(),
        );
        registry.register(
            "reconnects",
            "Connection attempts after the first",
            metrics.reconnects.clone(),
        );
        Health {
            inner: Arc::new(Inner {
                status: Mutex::new(Status::NotConnected(format!("connecting to {server}"))),
                registry,
                metrics,
            }),
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub(crate) fn set_connected(&self, server: SocketAddr) {
        self.set(Status::Connected(server));
        self.inner.metrics.connected.set(1);
    }

    pub(crate) fn set_not_connected(&self, reason: String) {
        self.set(Status::NotConnected(reason));
        self.inner.metrics.connected.set(0);
    }

    pub(crate) fn set_shutting_down(&self) {
        self.set(Status::ShuttingDown);
    }

    fn set(&self, status: Status) {
        let mut current = self
            .inner
            .status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Shutting down is final.
        if !matches!(*current, Status::ShuttingDown) {
            *current = status;
        }
    }

    fn status(&self) -> Status {
        self.inner
            .status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The health server's routes.
    /// Answers one GET on the admin port; `config` is the configuration as text (paths, never
    /// keys or tokens).
    pub(crate) fn admin(&self, path: &str, config: &str) -> Reply {
        match path {
            "/status" => {
                let status = match self.status() {
                    Status::Connected(server) => format!("connected to {server}"),
                    Status::NotConnected(reason) => format!("not connected: {reason}"),
                    Status::ShuttingDown => "shutting down".to_owned(),
                };
                Reply::text(
                    StatusCode::OK,
                    format!(
                        "{status}\nopen tunnels: {}",
                        self.inner.metrics.streams_open.get()
                    ),
                )
            }
            "/config" => Reply::text(StatusCode::OK, config),
            _ => Reply::text(StatusCode::NOT_FOUND, "not found (try /status, /config)"),
        }
    }

    pub(crate) fn reply(&self, path: &str) -> Reply {
        match path {
            "/healthz" | "/livez" => Reply::text(StatusCode::OK, "ok"),
            "/readyz" => match self.status() {
                Status::Connected(server) => {
                    Reply::text(StatusCode::OK, format!("ok: connected to {server}"))
                }
                Status::NotConnected(reason) => Reply::text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not connected to server: {reason}"),
                ),
                Status::ShuttingDown => {
                    Reply::text(StatusCode::SERVICE_UNAVAILABLE, "shutting down")
                }
            },
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
    }

    /// A tunnel opened; it counts as open until the guard drops.
    pub(crate) fn stream_opened(&self) -> OpenStream {
        self.streams_open.inc();
        OpenStream {
            gauge: self.streams_open.clone(),
        }
    }

    /// A splice finished having moved `moved` (`up` came from the target).
    pub(crate) fn moved(&self, moved: Moved) {
        self.bytes
            .get_or_create(&[("direction", "from_target")])
            .inc_by(moved.up);
        self.bytes
            .get_or_create(&[("direction", "to_target")])
            .inc_by(moved.down);
    }

    pub(crate) fn reconnecting(&self) {
        self.reconnects.inc();
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
