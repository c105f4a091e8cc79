//! The server's Prometheus metrics: Bridgehead's own (`bridgehead_server_*`), konnectivity's
//! names and meanings beside them (`konnectivity_network_proxy_server_*`, for dashboards and
//! alerts built on ANP), and the standard `process_*` series.

use std::sync::Arc;

use bridgehead_runtime::legacy_counter::LegacyCounter;
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

/// ANP's buckets for dial latency, and for how long a tunnel was open.
const ANP_LATENCY_BUCKETS: [f64; 9] =
    [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];
const ANP_CONNECTION_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

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
struct ResultLabel {
    result: &'static str,
}

/// `token_verifier_state_age_seconds{state}`: how long ago each part of the local verifier's
/// state (issuer keys, the pods', the service account's and the nodes' watches) was last
/// known current; absent while it never was.
#[derive(Debug)]
struct VerifierCollector(bridgehead_kubeapi::serviceaccount::TokenVerifier);

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

/// `bridgehead_server_kube_apiserver_requests_total{verb, resource}`: every request the
/// server's Kubernetes client made, named as kube-apiserver's `apiserver_request_total` names
/// them, read at every scrape.
#[derive(Debug)]
struct KubeRequestsCollector(bridgehead_kubeapi::RequestCounts);

impl prometheus_client::collector::Collector for KubeRequestsCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut family = encoder.encode_descriptor(
            "kube_apiserver_requests",
            "Requests this server made to kube-apiserver (token reviews, Node reads, watches and their lists, issuer discovery, Leases), by verb and resource as kube-apiserver's apiserver_request_total names them",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (verb, resource, n) in self.0.snapshot() {
            let counter = ConstCounter::new(n);
            counter.encode(
                family.encode_family(&[("verb", verb), ("resource", resource.as_str())])?,
            )?;
        }
        Ok(())
    }
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
    /// `--max-pending-dials`, so an alert can see how near the cap the pending dials are.
    pub dials_pending_limit: Gauge,
    dials: Family<ResultLabel, Counter>,
    agent_handshakes: Family<ResultLabel, Counter>,
    fallback_dials: Family<ResultLabel, Counter>,
    /// Tunnels open through `--fallback-proxy` (counted in `tunnels_open` too).
    pub fallback_tunnels_open: Gauge,
    pub dial_duration: Histogram,
    /// `bytes{direction}`'s two counters, taken once: they are counted per spliced chunk.
    bytes_to_target: Counter,
    bytes_from_target: Counter,
    token_reviews: Family<ResultLabel, Counter>,
    token_verifications: Family<VerificationLabel, Counter>,
    handshakes_refused: Family<ListenerLabel, Counter>,
    lease_renewals: Family<ResultLabel, Counter>,
    leases_removed: Counter,
    /// `tunnels_forwarded{server}`: tunnels this server carried to a peer's agent.
    forwarded: Family<ServerLabel, Counter>,
    /// `peer_tunnels{server}`: tunnels peers carried to this server's agents.
    peer_tunnels: Family<ServerLabel, Counter>,
    /// The server ids those two families were given a series for.
    server_labels: ServerLabels,
    /// Peer servers this server holds a session with, to forward to their agents.
    pub peers_connected: Gauge,
    /// Agents of those peers, which tunnels may be forwarded to.
    pub peer_agents: Gauge,
    /// Bytes of identifier lines the peers' views hold, all peers together.
    pub peer_view_bytes: Gauge,
    /// `tunnel_send_waits{reason}`: uploads waiting for the agent's window or the queue.
    pub send_waits: bridgehead_runtime::memory::SendWaits,
    anp: Anp,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerificationLabel {
    result: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

/// One holder's share of a gauge that several add to: set to what the holder holds now, taken
/// back out when it is dropped.
#[derive(Debug)]
pub struct GaugeShare<'a> {
    gauge: &'a Gauge,
    held: i64,
}

impl<'a> GaugeShare<'a> {
    pub fn new(gauge: &'a Gauge) -> GaugeShare<'a> {
        GaugeShare { gauge, held: 0 }
    }

    /// This holder now holds `held`.
    pub fn set(&mut self, held: usize) {
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        self.gauge.inc_by(held - self.held);
        self.held = held;
    }
}

impl Drop for GaugeShare<'_> {
    fn drop(&mut self) {
        self.gauge.dec_by(self.held);
    }
}

/// Most distinct server ids the peer families keep a series for. A peer names itself (and a
/// server without `--server-id` draws a new id at every start), so the ids seen over a
/// server's life have no end; past this many, the rest share [`OTHER_SERVERS`].
pub const MAX_SERVER_LABELS: usize = 64;
/// The `server` label of the ids past [`MAX_SERVER_LABELS`].
pub const OTHER_SERVERS: &str = "other";

/// The server ids given a series so far.
#[derive(Debug, Default)]
struct ServerLabels(std::sync::Mutex<std::collections::HashSet<String>>);

impl ServerLabels {
    fn label(&self, server: &str) -> ServerLabel {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let server = if known.contains(server) {
            server
        } else if known.len() < MAX_SERVER_LABELS {
            known.insert(server.to_owned());
            server
        } else {
            OTHER_SERVERS
        };
        ServerLabel {
            server: server.to_owned(),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrategyLabel {
    proxy_strategy: String,
}

/// konnectivity's series that have no Bridgehead twin of the same meaning.
#[derive(Debug)]
struct Anp {
    dial_duration: Histogram,
    dial_failures: LegacyCounter,
    culled_leases: LegacyCounter,
    connection_duration: Histogram,
    http_connections: Gauge,
    ready_backends: Family<StrategyLabel, Gauge>,
}

impl Default for Anp {
    fn default() -> Anp {
        Anp {
            dial_duration: Histogram::new(ANP_LATENCY_BUCKETS),
            dial_failures: LegacyCounter::with_label("reason"),
            culled_leases: LegacyCounter::single(),
            connection_duration: Histogram::new(ANP_CONNECTION_BUCKETS),
            http_connections: Gauge::default(),
            ready_backends: Family::default(),
        }
    }
}

impl Anp {
    /// konnectivity's series under its names in `registry`: its own, and the twins of
    /// Bridgehead's that `own` already counts.
    fn register(registry: &mut Registry, own: &Metrics) -> Anp {
        let r = registry;
        let anp = Anp::default();
        r.register(
            "dial_duration_seconds",
            "Latency of dial to the remote endpoint in seconds",
            anp.dial_duration.clone(),
        );
        r.register("dial_failure_count", "Number of dial failures observed (reason: no_agent, error_response, backend_dial_timeout, backend_close, frontend_close)", anp.dial_failures.clone());
        r.register("connection_duration_seconds", "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed", anp.connection_duration.clone());
        r.register(
            "http_connections",
            "Number of current HTTP CONNECT connections",
            anp.http_connections.clone(),
        );
        r.register(
            "ready_backend_connections",
            "Number of agents connected to the proxy server (deprecated in ANP for ready_backends)",
            own.agents_connected.clone(),
        );
        r.register(
            "ready_backends",
            "Number of usable agents connected to the proxy server, per proxy strategy",
            anp.ready_backends.clone(),
        );
        r.register(
            "pending_backend_dials",
            "Current number of pending backend dial requests",
            own.dials_pending.clone(),
        );
        r.register(
            "established_connections",
            "Current number of established end-to-end connections (post-dial)",
            own.tunnels_open.clone(),
        );
        r.register(
            "culled_leases_count",
            "Count of expired leases that the lease garbage collection controller has culled",
            anp.culled_leases.clone(),
        );
        anp
    }
}

/// Registers `metric` under `name` and hands it back.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// Creates the series of every label value up front, so that rates and ratios over them
/// have data (zero) on a fleet where nothing went wrong yet.
fn preset<L, M>(family: &Family<L, M>, labels: impl IntoIterator<Item = L>)
where
    L: Clone + std::hash::Hash + Eq,
    M: Default,
{
    for label in labels {
        let _ = family.get_or_create(&label);
    }
}

fn results(values: impl IntoIterator<Item = &'static str>) -> impl Iterator<Item = ResultLabel> {
    values.into_iter().map(|result| ResultLabel { result })
}

impl Metrics {
    /// The server's metrics, `budget`'s and `earned`'s among them.
    pub fn new(
        budget: &bridgehead_proto::budget::Budget,
        earned: &Arc<bridgehead_mux::memory::EarnedTotal>,
    ) -> Metrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(
            bridgehead_runtime::process_metrics::ProcessCollector,
        ));
        root.register_collector(Box::new(bridgehead_runtime::build::BuildInfoCollector));
        let registry = root.sub_registry_with_prefix("bridgehead_server");
        registry.register_collector(Box::new(bridgehead_runtime::logging::DroppedCollector));
        let budget = budget.clone();
        registry.register_collector(Box::new(bridgehead_runtime::memory::BudgetCollector(
            move || (budget.buffered(), budget.limit(), budget.refused()),
        )));
        registry.register_collector(Box::new(bridgehead_runtime::memory::EarnedCollector(
            earned.clone(),
        )));
        let send_waits = bridgehead_runtime::memory::SendWaits::default();
        send_waits.register(registry);
        let mut metrics = Metrics::own(registry, send_waits);
        metrics.anp = Anp::register(
            root.sub_registry_with_prefix("konnectivity_network_proxy_server"),
            &metrics,
        );
        metrics.registry = root;
        metrics
    }

    /// Bridgehead's own series, registered in `registry` (konnectivity's left empty).
    fn own(registry: &mut Registry, send_waits: bridgehead_runtime::memory::SendWaits) -> Metrics {
        let r = registry;
        let lease_renewals = registered(r, "lease_renewals", "This server's Lease created or renewed (result: ok, error), with --enable-lease-controller", Family::default());
        let leases_removed = registered(
            r,
            "leases_removed",
            "Expired Leases of other servers deleted, with --enable-lease-controller",
            Counter::default(),
        );
        let agents_connected = registered(
            r,
            "agents_connected",
            "Agents with a live session",
            Gauge::default(),
        );
        let tunnels_open = registered(
            r,
            "tunnels_open",
            "Tunnels open through this server",
            Gauge::default(),
        );
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
        let agent_handshakes = registered(r, "agent_handshakes", "Agent connections by how their handshake ended: ok, tls_error, unauthorized (401), forbidden (403), refused (another status), timed_out, stalled (cut for room), closed, duplicate (a server the agent holds already)", Family::default());
        let fallback_dials = registered(r, "fallback_dials", "CONNECTs no agent matched, relayed to --fallback-proxy, by result: ok, refused (it answered another status than 200), unreachable, timed_out, bad_answer, denied (by the destination policy, not relayed)", Family::default());
        let fallback_tunnels_open = registered(
            r,
            "fallback_tunnels_open",
            "Tunnels open through --fallback-proxy (counted in tunnels_open too)",
            Gauge::default(),
        );
        preset(&dials, results(DialResult::ALL.map(DialResult::as_str)));
        preset(
            &agent_handshakes,
            results(AgentHandshake::ALL.map(AgentHandshake::as_str)),
        );
        let dial_duration = registered(
            r,
            "dial_duration_seconds",
            "Time from CONNECT to the agent's dial answer",
            Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
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
        let token_reviews = registered(r, "token_reviews", "Agent token checks by result: authenticated, rejected (by kube-apiserver), error (no answer), cached", Family::default());
        let token_verifications = registered(r, "token_verifications", "Agent tokens checked locally (--token-verification=local) by result: verified, refused (reason: why, as kube-apiserver would refuse it), fallback (reason: why it went to TokenReview)", Family::default());
        let handshakes_refused = registered(r, "handshakes_refused", "Handshakes cut because their listener had its limit in progress and a newer connection came (listener: frontend, agent, peer)", Family::default());
        preset(
            &token_reviews,
            results(["authenticated", "rejected", "error", "cached"]),
        );
        preset(&lease_renewals, results(["ok", "error"]));
        let forwarded = registered(r, "tunnels_forwarded", "Tunnels this server forwarded to a peer server that holds their agent, by that server's id", Family::default());
        let peer_tunnels = registered(
            r,
            "peer_tunnels",
            "Tunnels peer servers forwarded to this server's agents, by the forwarding server's id",
            Family::default(),
        );
        let peers_connected = registered(
            r,
            "peers_connected",
            "Peer servers this server holds a session with, to forward tunnels to their agents",
            Gauge::default(),
        );
        let peer_agents = registered(
            r,
            "peer_agents",
            "Agents of peer servers that tunnels may be forwarded to",
            Gauge::default(),
        );
        let peer_view_bytes = registered(
            r,
            "peer_view_bytes",
            "Bytes of identifier lines held for the peers' agents, all peers together (each peer's view is bounded at 32 MiB)",
            Gauge::default(),
        );
        preset(
            &handshakes_refused,
            ["frontend", "agent", "peer"].map(|listener| ListenerLabel { listener }),
        );
        Metrics {
            registry: Registry::default(),
            anp: Anp::default(),
            agents_connected,
            tunnels_open,
            dials_pending,
            dials_pending_limit,
            dials,
            agent_handshakes,
            fallback_dials,
            fallback_tunnels_open,
            dial_duration,
            bytes_to_target: direction(Direction::ToTarget),
            bytes_from_target: direction(Direction::FromTarget),
            token_reviews,
            token_verifications,
            handshakes_refused,
            lease_renewals,
            leases_removed,
            forwarded,
            peer_tunnels,
            server_labels: ServerLabels::default(),
            peers_connected,
            peer_agents,
            peer_view_bytes,
            send_waits,
        }
    }

    /// Exports when each of `files` (role, path) expires, read at every scrape.
    pub fn watch_certificates(&mut self, files: Vec<(&'static str, std::path::PathBuf)>) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(
                bridgehead_runtime::certificates::ExpiryCollector::new(files),
            ));
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
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

    /// A tunnel was forwarded to peer server `server`'s agent.
    pub fn forwarded(&self, server: &str) {
        self.forwarded
            .get_or_create(&self.server_labels.label(server))
            .inc();
    }

    /// Peer server `server` forwarded a tunnel to one of this server's agents.
    pub fn peer_tunnel(&self, server: &str) {
        self.peer_tunnels
            .get_or_create(&self.server_labels.label(server))
            .inc();
    }

    /// A CONNECT relayed to the fallback proxy ended so.
    pub fn fallback_dial(&self, result: &'static str) {
        self.fallback_dials
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// An agent's handshake ended so.
    pub fn agent_handshake(&self, result: AgentHandshake) {
        self.agent_handshakes
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// ANP's `dial_failure_count{reason}`.
    pub fn anp_dial_failure(&self, reason: &'static str) {
        self.anp.dial_failures.inc_by(reason, 1);
    }

    /// A dial answered after `seconds`.
    pub fn dialed(&self, seconds: f64) {
        self.dial_duration.observe(seconds);
        self.anp.dial_duration.observe(seconds);
    }

    /// A tunnel that was open `seconds` ended.
    pub fn tunnel_ended(&self, seconds: f64) {
        self.anp.connection_duration.observe(seconds);
    }

    /// A CONNECT client connection, counted until the guard drops.
    pub fn http_connection(&self) -> GaugeGuard {
        self.anp.http_connections.inc();
        GaugeGuard(self.anp.http_connections.clone())
    }

    /// Usable agents per strategy (`router::Strategy`, printed as its flag's name), after a
    /// change. Generic, since the router is another part's and this one comes after it.
    pub fn set_ready_backends<S: std::fmt::Display>(&self, backends: &[(S, usize)]) {
        for (strategy, count) in backends {
            self.anp
                .ready_backends
                .get_or_create(&StrategyLabel {
                    proxy_strategy: strategy.to_string(),
                })
                .set(*count as i64);
        }
    }

    /// A handshake cut: `listener` had its limit in progress and a newer connection came.
    pub fn handshake_refused(&self, listener: &'static str) {
        self.handshakes_refused
            .get_or_create(&ListenerLabel { listener })
            .inc();
    }

    /// One agent token checked: `authenticated`, `rejected`, `error` or `cached`.
    pub fn token_review(&self, result: &'static str) {
        self.token_reviews().count(result);
    }

    /// A token checked locally: `verified`, `refused` or `fallback`, with the reason.
    pub fn token_verification(&self, result: &'static str, reason: &'static str) {
        self.token_verifications
            .get_or_create(&VerificationLabel { result, reason })
            .inc();
    }

    /// Exports how old the local token verifier's watched state is, read at every scrape.
    pub fn watch_token_verifier(
        &mut self,
        verifier: bridgehead_kubeapi::serviceaccount::TokenVerifier,
    ) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(VerifierCollector(verifier)));
    }

    /// Exports the requests of the server's Kubernetes client, read at every scrape.
    pub fn watch_kube_requests(&mut self, requests: bridgehead_kubeapi::RequestCounts) {
        self.registry
            .sub_registry_with_prefix("bridgehead_server")
            .register_collector(Box::new(KubeRequestsCollector(requests)));
    }

    /// The token review counter, for a review that runs as its own task.
    pub fn token_reviews(&self) -> TokenReviews {
        TokenReviews(self.token_reviews.clone())
    }

    /// What the Lease holder did.
    pub fn lease(&self, event: bridgehead_kubeapi::leases::LeaseEvent) {
        use bridgehead_kubeapi::leases::LeaseEvent;
        let result = match event {
            LeaseEvent::Renewed => "ok",
            LeaseEvent::RenewFailed => "error",
            LeaseEvent::Removed => {
                self.leases_removed.inc();
                self.anp.culled_leases.inc_by("", 1);
                return;
            }
        };
        self.lease_renewals
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn bytes(&self, direction: Direction, n: u64) {
        match direction {
            Direction::ToTarget => self.bytes_to_target.inc_by(n),
            Direction::FromTarget => self.bytes_from_target.inc_by(n),
        };
    }
}

/// Decrements its gauge when dropped.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Raises `gauge` by one until the guard is dropped.
    pub fn inc(gauge: &Gauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(
            &bridgehead_proto::budget::Budget::unlimited(),
            &Arc::new(bridgehead_mux::memory::EarnedTotal::new(0)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::router::Strategy;
    use bridgehead_kubeapi::leases::LeaseEvent;

    fn page(metrics: &Metrics) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, metrics.registry()).unwrap();
        text
    }

    #[test]
    fn each_share_of_a_gauge_is_taken_back_when_dropped() {
        let gauge = Gauge::default();
        let mut a = GaugeShare::new(&gauge);
        let mut b = GaugeShare::new(&gauge);
        a.set(100);
        b.set(30);
        a.set(60);
        assert_eq!(gauge.get(), 90);
        drop(a);
        assert_eq!(gauge.get(), 30);
        drop(b);
        assert_eq!(gauge.get(), 0);
    }

    /// A peer names itself: the ids past the bound share one series instead of growing the
    /// page (and the server) without end.
    #[test]
    fn peer_server_ids_make_a_bounded_number_of_series() {
        let metrics = Metrics::default();
        for i in 0..MAX_SERVER_LABELS + 100 {
            metrics.peer_tunnel(&format!("peer-{i}"));
            metrics.forwarded(&format!("peer-{i}"));
        }
        // One already known keeps its own series.
        metrics.peer_tunnel("peer-0");
        let text = page(&metrics);
        let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        let peer_tunnels = "bridgehead_server_peer_tunnels_total{";
        assert_eq!(series(peer_tunnels), MAX_SERVER_LABELS + 1);
        assert_eq!(
            series("bridgehead_server_tunnels_forwarded_total{"),
            MAX_SERVER_LABELS + 1
        );
        assert!(
            text.contains(&format!("{peer_tunnels}server=\"other\"}} 100\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{peer_tunnels}server=\"peer-0\"}} 2\n")),
            "{text}"
        );
    }

    #[test]
    fn konnectivity_series_mean_what_anps_do() {
        let metrics = Metrics::new(
            &bridgehead_proto::budget::Budget::unlimited(),
            &Arc::new(bridgehead_mux::memory::EarnedTotal::new(0)),
        );
        for result in [
            DialResult::Ok,
            DialResult::BadRequest,
            DialResult::Overloaded,
            DialResult::NoAgent,
            DialResult::Refused,
            DialResult::Unreachable,
            DialResult::NameNotResolved,
            DialResult::NotPermitted,
            DialResult::Other,
            DialResult::TimedOut,
            DialResult::AgentLost,
        ] {
            metrics.dial(result);
        }
        metrics.anp_dial_failure("frontend_close");
        metrics.dialed(0.002);
        metrics.tunnel_ended(3.0);
        metrics.lease(LeaseEvent::Renewed);
        metrics.lease(LeaseEvent::RenewFailed);
        metrics.lease(LeaseEvent::Removed);
        metrics.set_ready_backends(&[(Strategy::DestHost, 2), (Strategy::Default, 5)]);
        let open = metrics.http_connection();
        let second = metrics.http_connection();
        drop(second);
        let text = page(&metrics);
        let anp = "konnectivity_network_proxy_server_";
        for line in [
            // Malformed and overloaded requests never reached a dial: not dial failures.
            format!("{anp}dial_failure_count{{reason=\"no_agent\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"error_response\"}} 5\n"),
            format!("{anp}dial_failure_count{{reason=\"backend_dial_timeout\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"backend_close\"}} 1\n"),
            format!("{anp}dial_failure_count{{reason=\"frontend_close\"}} 1\n"),
            format!("{anp}dial_duration_seconds_count 1\n"),
            format!("{anp}dial_duration_seconds_bucket{{le=\"0.005\"}} 1\n"),
            format!("{anp}dial_duration_seconds_bucket{{le=\"0.0001\"}} 0\n"),
            format!("{anp}connection_duration_seconds_bucket{{le=\"5.0\"}} 1\n"),
            format!("{anp}connection_duration_seconds_bucket{{le=\"1.0\"}} 0\n"),
            format!("{anp}http_connections 1\n"),
            format!("{anp}culled_leases_count 1\n"),
            format!("{anp}ready_backends{{proxy_strategy=\"destHost\"}} 2\n"),
            format!("{anp}ready_backends{{proxy_strategy=\"default\"}} 5\n"),
            "bridgehead_server_dial_duration_seconds_count 1\n".to_owned(),
            "bridgehead_server_leases_removed_total 1\n".to_owned(),
            "bridgehead_server_lease_renewals_total{result=\"ok\"} 1\n".to_owned(),
            "bridgehead_server_lease_renewals_total{result=\"error\"} 1\n".to_owned(),
        ] {
            assert!(text.contains(&line), "{line}{text}");
        }
        assert_eq!(text.matches("dial_failure_count{").count(), 5, "{text}");
        drop(open);
        assert!(page(&metrics).contains(&format!("{anp}http_connections 0\n")));
    }
}
