//! Routing's series: CONNECTs by result, the dials in flight and their cap, how long dials
//! took, the fallback proxy's dials, and the usable agents per strategy.

use bridgehead_runtime::legacy_counter::LegacyCounter;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{preset, registered, results, ResultLabel};

/// konnectivity's buckets for dial latency.
const ANP_LATENCY_BUCKETS: [f64; 9] =
    [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

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
    pub const ALL: [DialResult; 11] = [
        DialResult::Ok,
        DialResult::BadRequest,
        DialResult::NoAgent,
        DialResult::Overloaded,
        DialResult::Refused,
        DialResult::Unreachable,
        DialResult::NameNotResolved,
        DialResult::NotPermitted,
        DialResult::TimedOut,
        DialResult::AgentLost,
        DialResult::Other,
    ];

    /// ANP's `dial_failure_count` reason for a failed dial, if it counts as one: ANP counts
    /// dials that reached routing, not malformed or overloaded requests.
    fn anp_failure(self) -> Option<&'static str> {
        match self {
            DialResult::NoAgent => Some("no_agent"),
            DialResult::Refused
            | DialResult::Unreachable
            | DialResult::NameNotResolved
            | DialResult::NotPermitted
            | DialResult::Other => Some("error_response"),
            DialResult::TimedOut => Some("backend_dial_timeout"),
            DialResult::AgentLost => Some("backend_close"),
            DialResult::Ok | DialResult::BadRequest | DialResult::Overloaded => None,
        }
    }

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
pub(super) struct StrategyLabel {
    proxy_strategy: String,
}

/// Routing's series.
#[derive(Debug)]
pub struct Routing {
    /// Dials waiting for an agent's answer (konnectivity's `pending_backend_dials` too).
    pub dials_pending: Gauge,
    /// `--max-pending-dials`, so an alert can see how near the cap the pending dials are.
    pub dials_pending_limit: Gauge,
    dials: Family<ResultLabel, Counter>,
    fallback_dials: Family<ResultLabel, Counter>,
    dial_duration: Histogram,
    /// konnectivity's `dial_duration_seconds`, `dial_failure_count` and `ready_backends`
    /// (registered in `konnectivity.rs`).
    pub(super) anp_dial_duration: Histogram,
    pub(super) anp_dial_failures: LegacyCounter,
    pub(super) anp_ready_backends: Family<StrategyLabel, Gauge>,
}

impl Routing {
    /// Routing's series, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Routing {
        let dials_pending = registered(
            r,
            "dials_pending",
            "Dials waiting for an agent's answer",
            Gauge::default(),
        );
        let dials_pending_limit = registered(
            r,
            "dials_pending_limit",
            "--max-pending-dials: past it new CONNECTs get 503",
            Gauge::default(),
        );
        let dials = registered(r, "dials", "CONNECT requests by result", Family::default());
        let fallback_dials = registered(r, "fallback_dials", "CONNECTs no agent matched, relayed to --fallback-proxy, by result: ok, refused (it answered another status than 200), unreachable, timed_out, bad_answer, denied (by the destination policy, not relayed)", Family::default());
        let dial_duration = registered(
            r,
            "dial_duration_seconds",
            "Time from CONNECT to the agent's dial answer",
            Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
        );
        preset(&dials, results(DialResult::ALL.map(DialResult::as_str)));
        Routing {
            dials_pending,
            dials_pending_limit,
            dials,
            fallback_dials,
            dial_duration,
            anp_dial_duration: Histogram::new(ANP_LATENCY_BUCKETS),
            anp_dial_failures: LegacyCounter::with_label("reason"),
            anp_ready_backends: Family::default(),
        }
    }

    pub fn dial(&self, result: DialResult) {
        if let Some(reason) = result.anp_failure() {
            self.anp_dial_failure(reason);
        }
        self.dials
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// A CONNECT relayed to the fallback proxy ended so.
    pub fn fallback_dial(&self, result: &'static str) {
        self.fallback_dials
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// ANP's `dial_failure_count{reason}`.
    pub fn anp_dial_failure(&self, reason: &'static str) {
        self.anp_dial_failures.inc_by(reason, 1);
    }

    /// A dial answered after `seconds`.
    pub fn dialed(&self, seconds: f64) {
        self.dial_duration.observe(seconds);
        self.anp_dial_duration.observe(seconds);
    }

    /// Usable agents per strategy (`router::Strategy`, printed as its flag's name), after a
    /// change. Generic, since the router is another part's and this one comes after it.
    pub fn set_ready_backends<S: std::fmt::Display>(&self, backends: &[(S, usize)]) {
        for (strategy, count) in backends {
            self.anp_ready_backends
                .get_or_create(&StrategyLabel {
                    proxy_strategy: strategy.to_string(),
                })
                .set(*count as i64);
        }
    }
}
