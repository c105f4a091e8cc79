//! The server's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How a CONNECT ended up, as a label (spelled as the agent spells its own: snake case).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
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

impl DialResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DialResult::Ok => "ok",
            DialResult::BadRequest => "bad_request",
            DialResult::NoAgent => "no_agent",
            DialResult::Overloaded => "overloaded",
            DialResult::Refused => "refused",
            DialResult::Unreachable => "unreachable",
            DialResult::NameNotResolved => "name_not_resolved",
            DialResult::NotPermitted => "not_permitted",
            DialResult::TimedOut => "timed_out",
            DialResult::AgentLost => "agent_lost",
            DialResult::Other => "other",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

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
    token_reviews: Family<ResultLabel, Counter>,
    handshakes_refused: Family<ListenerLabel, Counter>,
    lease_renewals: Family<ResultLabel, Counter>,
    leases_removed: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
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
        let token_reviews = Family::<ResultLabel, Counter>::default();
        let handshakes_refused = Family::<ListenerLabel, Counter>::default();
        let lease_renewals = Family::<ResultLabel, Counter>::default();
        let leases_removed = Counter::default();
        registry.register(
            "lease_renewals",
            "This server's Lease created or renewed (result: ok, error), with --enable-lease-controller",
            lease_renewals.clone(),
        );
        registry.register(
            "leases_removed",
            "Expired Leases of other servers deleted, with --enable-lease-controller",
            leases_removed.clone(),
        );
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
        registry.register("bytes", "Bytes carried by tunnels", bytes.clone());
        registry.register(
            "token_reviews",
            "Agent token checks by result: authenticated, rejected (by kube-apiserver), error (no answer), cached",
            token_reviews.clone(),
        );
        registry.register(
            "handshakes_refused",
            "Handshakes cut because their listener had its limit in progress and a newer connection came (listener: frontend, agent)",
            handshakes_refused.clone(),
        );
        Metrics {
            registry,
            agents_connected,
            tunnels_open,
            dials_pending,
            dials,
            dial_duration,
            bytes,
            token_reviews,
            handshakes_refused,
            lease_renewals,
            leases_removed,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn dial(&self, result: DialResult) {
        self.dials
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// A handshake cut: `listener` had its limit in progress and a newer connection came.
    pub fn handshake_refused(&self, listener: &'static str) {
        self.handshakes_refused
            .get_or_create(&ListenerLabel { listener })
            .inc();
    }

    /// One agent token checked: `authenticated`, `rejected`, `error` or `cached`.
    pub fn token_review(&self, result: &'static str) {
        self.token_reviews
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// What the Lease holder did.
    pub fn lease(&self, event: bridgehead_kubeapi::leases::LeaseEvent) {
        use bridgehead_kubeapi::leases::LeaseEvent;
        let result = match event {
            LeaseEvent::Renewed => "ok",
            LeaseEvent::RenewFailed => "error",
            LeaseEvent::Removed => {
                self.leases_removed.inc();
                return;
            }
        };
        self.lease_renewals
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn bytes(&self, direction: Direction, n: u64) {
        self.bytes
            .get_or_create(&DirectionLabel {
                direction: direction.as_str(),
            })
            .inc_by(n);
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
