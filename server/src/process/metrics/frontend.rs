//! The frontend's series: the tunnels open through this server and the bytes they carry.

use bridgehead_runtime::memory::SendWaits;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{registered, GaugeGuard};

/// konnectivity's buckets for how long a tunnel was open.
const ANP_CONNECTION_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// Direction of tunnel bytes.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Direction {
    /// From the CONNECT client towards the target.
    ToTarget,
    /// From the target back to the client.
    FromTarget,
}

impl Direction {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::ToTarget => "to_target",
            Direction::FromTarget => "from_target",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

/// The frontend's series.
#[derive(Debug)]
pub struct Frontend {
    /// `tunnel_send_waits{reason}`: uploads waiting for the agent's window or the queue.
    pub send_waits: SendWaits,
    pub tunnels_open: Gauge,
    /// Tunnels open through `--fallback-proxy` (counted in `tunnels_open` too).
    pub fallback_tunnels_open: Gauge,
    /// `bytes{direction}`'s two counters, taken once: they are counted per spliced chunk.
    bytes_to_target: Counter,
    bytes_from_target: Counter,
    /// konnectivity's `http_connections` (registered in `konnectivity.rs`).
    pub(super) anp_http_connections: Gauge,
    /// konnectivity's `connection_duration_seconds` (registered in `konnectivity.rs`).
    pub(super) anp_connection_duration: Histogram,
}

impl Frontend {
    /// The frontend's series, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Frontend {
        let send_waits = SendWaits::default();
        send_waits.register(r);
        let tunnels_open = registered(
            r,
            "tunnels_open",
            "Tunnels open through this server",
            Gauge::default(),
        );
        let fallback_tunnels_open = registered(
            r,
            "fallback_tunnels_open",
            "Tunnels open through --fallback-proxy (counted in tunnels_open too)",
            Gauge::default(),
        );
        let bytes: Family<DirectionLabel, Counter> =
            registered(r, "bytes", "Bytes carried by tunnels", Family::default());
        let direction = |d: Direction| {
            bytes
                .get_or_create(&DirectionLabel {
                    direction: d.as_str(),
                })
                .clone()
        };
        Frontend {
            send_waits,
            tunnels_open,
            fallback_tunnels_open,
            bytes_to_target: direction(Direction::ToTarget),
            bytes_from_target: direction(Direction::FromTarget),
            anp_http_connections: Gauge::default(),
            anp_connection_duration: Histogram::new(ANP_CONNECTION_BUCKETS),
        }
    }

    pub fn bytes(&self, direction: Direction, n: u64) {
        match direction {
            Direction::ToTarget => self.bytes_to_target.inc_by(n),
            Direction::FromTarget => self.bytes_from_target.inc_by(n),
        };
    }

    /// A tunnel that was open `seconds` ended.
    pub fn tunnel_ended(&self, seconds: f64) {
        self.anp_connection_duration.observe(seconds);
    }

    /// A CONNECT client connection, counted until the guard drops.
    pub fn http_connection(&self) -> GaugeGuard {
        GaugeGuard::inc(&self.anp_http_connections)
    }
}
