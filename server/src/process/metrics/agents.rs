//! The agent endpoint's series: agents connected, how their handshakes ended, and how their
//! tokens were checked (reviewed, verified locally, and how fresh the local verifier is).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{preset, registered, results, ResultLabel};

/// How an agent's connection ended before (or when) its session started, as a label.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum AgentHandshake {
    Ok,
    TlsError,
    Unauthorized,
    Forbidden,
    Refused,
    TimedOut,
    Stalled,
    Closed,
    /// The agent reached a server it holds a session with (normal while it looks for the
    /// other servers behind one address).
    Duplicate,
}

impl AgentHandshake {
    pub const ALL: [AgentHandshake; 9] = [
        AgentHandshake::Ok,
        AgentHandshake::TlsError,
        AgentHandshake::Unauthorized,
        AgentHandshake::Forbidden,
        AgentHandshake::Refused,
        AgentHandshake::TimedOut,
        AgentHandshake::Stalled,
        AgentHandshake::Closed,
        AgentHandshake::Duplicate,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentHandshake::Ok => "ok",
            AgentHandshake::TlsError => "tls_error",
            AgentHandshake::Unauthorized => "unauthorized",
            AgentHandshake::Forbidden => "forbidden",
            AgentHandshake::Refused => "refused",
            AgentHandshake::TimedOut => "timed_out",
            AgentHandshake::Stalled => "stalled",
            AgentHandshake::Closed => "closed",
            AgentHandshake::Duplicate => "duplicate",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerificationLabel {
    result: &'static str,
    reason: &'static str,
}

/// `bridgehead_server_token_reviews_total`, held by a review task.
#[derive(Debug, Clone)]
pub struct TokenReviews(Family<ResultLabel, Counter>);

impl TokenReviews {
    /// One agent token checked: `authenticated`, `rejected`, `error` or `cached`.
    pub fn count(&self, result: &'static str) {
        self.0.get_or_create(&ResultLabel { result }).inc();
    }
}

/// The agent endpoint's series.
#[derive(Debug)]
pub struct Agents {
    /// Agents with a live session (konnectivity's `ready_backend_connections` too).
    pub agents_connected: Gauge,
    agent_handshakes: Family<ResultLabel, Counter>,
    token_reviews: Family<ResultLabel, Counter>,
    token_verifications: Family<VerificationLabel, Counter>,
}

impl Agents {
    /// The agent endpoint's series, registered in `r`.
    pub(super) fn register(r: &mut Registry) -> Agents {
        let agents_connected = registered(
            r,
            "agents_connected",
            "Agents with a live session",
            Gauge::default(),
        );
        let agent_handshakes = registered(r, "agent_handshakes", "Agent connections by how their handshake ended: ok, tls_error, unauthorized (401), forbidden (403), refused (another status), timed_out, stalled (cut for room), closed, duplicate (a server the agent holds already)", Family::default());
        let token_reviews = registered(r, "token_reviews", "Agent token checks by result: authenticated, rejected (by kube-apiserver), error (no answer), cached", Family::default());
        let token_verifications = registered(r, "token_verifications", "Agent tokens checked locally (--token-verification=local) by result: verified, refused (reason: why, as kube-apiserver would refuse it), fallback (reason: why it went to TokenReview)", Family::default());
        preset(
            &agent_handshakes,
            results(AgentHandshake::ALL.map(AgentHandshake::as_str)),
        );
        preset(
            &token_reviews,
            results(["authenticated", "rejected", "error", "cached"]),
        );
        Agents {
            agents_connected,
            agent_handshakes,
            token_reviews,
            token_verifications,
        }
    }

    /// An agent's handshake ended so.
    pub fn agent_handshake(&self, result: AgentHandshake) {
        self.agent_handshakes
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// One agent token checked: `authenticated`, `rejected`, `error` or `cached`.
    pub fn token_review(&self, result: &'static str) {
        self.token_reviews().count(result);
    }

    /// The token review counter, for a review that runs as its own task.
    pub fn token_reviews(&self) -> TokenReviews {
        TokenReviews(self.token_reviews.clone())
    }

    /// A token checked locally: `verified`, `refused` or `fallback`, with the reason.
    pub fn token_verification(&self, result: &'static str, reason: &'static str) {
        self.token_verifications
            .get_or_create(&VerificationLabel { result, reason })
            .inc();
    }
}

/// `token_verifier_state_age_seconds{state}`: how long ago each part of the local verifier's
/// state (issuer keys, the pods', the service account's and the nodes' watches) was last
/// known current; absent while it never was.
#[derive(Debug)]
pub(super) struct VerifierCollector(pub(super) bridgehead_kubeapi::serviceaccount::TokenVerifier);

impl prometheus_client::collector::Collector for VerifierCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let freshness = self.0.freshness();
        let parts = [
            ("keys", freshness.keys),
            ("pods", freshness.pods),
            ("service_account", freshness.service_account),
            ("nodes", freshness.nodes),
        ];
        let mut family = encoder.encode_descriptor(
            "token_verifier_state_age_seconds",
            "How long ago each part of the local token verifier's state was last known current (past --token-verification's bound, tokens go to TokenReview)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, age) in parts {
            if let Some(age) = age {
                let gauge = ConstGauge::new(age.as_secs_f64());
                gauge.encode(family.encode_family(&[("state", state)])?)?;
            }
        }
        Ok(())
    }
}
