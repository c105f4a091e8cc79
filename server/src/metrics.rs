//! The server's Prometheus metrics.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How a CONNECT ended up, as a label.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DialResult {
    Ok,
    BadRequest,
    NoAgent,
    Overloaded,
    Refused,
    Unreachable,
    NameNotResolved,
    NotPermitted,
    TimedOut,
    AgentLost,
    Other,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: DialResult,
}

/// Direction of tunnel bytes.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Direction {
    /// From the CONNECT client towards the target.
    ToTarget,
    /// From the target back to the client.
    FromTarget,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: Direction,
}

/// Every metric the server exports, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub agents_connected: Gauge,
    pub tunnels_open: Gauge,
    pub dials_pending: Gauge,
    dials: Family<ResultLabel, Counter>,
    pub dial_duration: Histogram,
    bytes: Family<DirectionLabel, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("bridgehead_server");
        let agents_connected = Gauge::default();
        let tunnels_open = Gauge::default();
        let dials_pending = Gauge::default();
        let dials = Family::<ResultLabel, Counter>::default();
        let dial_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let bytes = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "agents_connected",
            "Agents with a live session",
            agents_connected.clone(),
        );
        registry.register(
            "tunnels_open",
            "Tunnels open through this server",
            tunnels_open.clone(),
        );
        registry.register(
            "dials_pending",
            "Dials waiting for an agent's answer",
            dials_pending.clone(),
        );
        registry.register("dials", "CONNECT requests by result", dials.clone());
        registry.register(
            "dial_duration_seconds",
            "Time from CONNECT to the agent's dial answer",
            dial_duration.clone(),
        );
        registry.register("tunnel_bytes", "Bytes carried by tunnels", bytes.clone());
        Metrics {
            registry,
            agents_connected,
            tunnels_open,
            dials_pending,
            dials,
            dial_duration,
            bytes,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn dial(&self, result: DialResult) {
        self.dials.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn bytes(&self, direction: Direction, n: u64) {
        self.bytes
            .get_or_create(&DirectionLabel { direction })
            .inc_by(n);
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
