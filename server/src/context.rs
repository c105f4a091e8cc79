//! What every connection task of the server shares.

use std::sync::Arc;

use bridgehead_runtime::accept::RateLimit;
use bridgehead_runtime::threads::Shards;

use bridgehead_mux::memory::TunnelMemory;
use tokio_util::task::TaskTracker;

use crate::agents::admission::HandshakeAdmission;
use crate::agents::auth::AgentAuth;
use crate::agents::revocation::Revocation;
use crate::config::Config;
use crate::frontend::handshakes::Handshakes;
use crate::process::metrics::Metrics;
use crate::routing::admission::Admission;
use crate::routing::fallback::Fallback;
use crate::routing::registry::Registry;
use crate::routing::settled::Settled;

/// Lines about refused or failed connections logged per second at most.
const REFUSALS_LOGGED_PER_SECOND: u32 = 10;

/// The server's shared state: the validated configuration, the agents, the metrics, the dial
/// admission, and what connection tasks share beyond the flags. Each limit has one owner:
/// the registry the tunnels per agent, admission the pending dials.
#[derive(Debug)]
pub struct Context {
    /// Every flag, validated: read from here, never copied.
    pub config: Config,
    pub registry: Registry,
    pub metrics: Metrics,
    pub admission: Admission,
    /// How agents prove who they are.
    pub agent_auth: AgentAuth,
    /// CONNECT clients in their handshake: the frontend's pre-authentication bound.
    pub frontend_handshakes: Handshakes,
    /// Agents in their handshake: the agent endpoint's pre-authentication admission.
    pub agent_admission: HandshakeAdmission,
    /// Lines about refused connections, at most a few a second whatever a flood does.
    pub refusal_log: RateLimit,
    /// Every spliced tunnel, so shutdown can wait for them.
    pub tunnels: TaskTracker,
    /// The tunnels' memory: the budget every agent session's buffered data counts against,
    /// the kernel buffers of every CONNECT client's socket, the largest window.
    pub memory: TunnelMemory,
    /// `--session-threads`: where agent sessions and their tunnels run.
    pub shards: Shards,
    /// `--fallback-proxy`: where CONNECTs that no agent matches go.
    pub fallback: Option<Fallback>,
    /// Sessions let in by locally verified tokens, closed when those turn invalid.
    pub revocation: Arc<Revocation>,
    /// Whether the first round of dialing the peers is over (always, without peers).
    pub peers_settled: Settled,
}

impl Context {
    pub fn new(
        config: Config,
        agent_auth: AgentAuth,
        shards: Shards,
        fallback: Option<Fallback>,
    ) -> Context {
        let memory = config.memory.tunnel_memory();
        let mut metrics = Metrics::new(&memory.budget, &memory.earned);
        metrics.watch_certificates(config.certificate_files());
        let limits = &config.limits;
        metrics
            .routing
            .dials_pending_limit
            .set(i64::try_from(limits.max_pending_dials).unwrap_or(i64::MAX));
        Context {
            registry: Registry::with_limits(
                config.routing.strategies.clone(),
                limits.max_tunnels_per_agent,
                limits.max_sessions_per_identity,
                limits.max_pending_dials_per_agent,
            ),
            admission: Admission::new(
                limits.max_pending_dials,
                limits.max_pending_dials_per_client,
                metrics.routing.dials_pending.clone(),
            ),
            metrics,
            agent_auth,
            frontend_handshakes: Handshakes::new(config.frontend.max_handshakes),
            agent_admission: HandshakeAdmission::new(
                config.agent_endpoint.max_handshakes,
                config.agent_endpoint.handshake_stall,
                config.agent_endpoint.handshake_timeout,
            ),
            refusal_log: RateLimit::new(REFUSALS_LOGGED_PER_SECOND),
            tunnels: TaskTracker::new(),
            memory,
            shards,
            fallback,
            revocation: Arc::default(),
            peers_settled: Settled::already(),
            config,
        }
    }
}
