//! What every connection task of the server shares.

use std::sync::Arc;
use std::time::Duration;

use bridgehead_runtime::accept::RateLimit;
use bridgehead_runtime::memory::{EarnedTotal, SocketTuning};
use bridgehead_runtime::threads::Shards;

use bridgehead_mux::Keepalive;
use bridgehead_proto::budget::Budget;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::agent_admission::AgentAdmission;
use crate::agent_auth::AgentAuth;
use crate::config::Config;
use crate::fallback::Fallback;
use crate::handshakes::Handshakes;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::revocation::Revocation;

/// Lines about refused or failed connections logged per second at most.
const REFUSALS_LOGGED_PER_SECOND: u32 = 10;

/// The server's shared state: the agents, the metrics, the dial admission, and the settings
/// connection tasks read. Each limit has one owner: the registry the tunnels per agent,
/// admission the pending dials.
#[derive(Debug)]
pub struct Context {
    pub registry: Registry,
    pub metrics: Metrics,
    pub admission: Admission,
    /// How agents prove who they are.
    pub agent_auth: AgentAuth,
    pub server_id: String,
    /// How many servers agents are told there are.
    pub server_count: u32,
    pub dial_timeout: Duration,
    pub handshake_timeout: Duration,
    /// TLS and upgrade of an agent, before authentication.
    pub agent_handshake_timeout: Duration,
    /// CONNECT clients in their handshake: the frontend's pre-authentication bound.
    pub frontend_handshakes: Handshakes,
    /// Agents in their handshake: the agent endpoint's pre-authentication admission.
    pub agent_admission: AgentAdmission,
    /// Lines about refused connections, at most a few a second whatever a flood does.
    pub refusal_log: RateLimit,
    pub keepalive: Keepalive,
    /// Every spliced tunnel, so shutdown can wait for them.
    pub tunnels: TaskTracker,
    /// How long a target's first bytes wait for the client's first byte.
    pub target_bytes_hold: Duration,
    /// `--frontend-keepalive-time`: TCP keepalive on CONNECT clients' connections.
    pub frontend_keepalive: Option<Duration>,
    /// `--log-tunnels`: an info line per tunnel end.
    pub log_tunnels: bool,
    /// `--tunnel-memory-budget`: every agent session's buffered data counts against it.
    pub budget: Budget,
    /// `--tunnel-receive-buffer`, `--tunnel-unsent-limit`: the kernel buffers of every
    /// CONNECT client's TCP socket.
    pub socket_tuning: SocketTuning,
    /// What CONNECT clients' TCP sockets earn beyond `--tunnel-receive-buffer`, all tunnels
    /// together (`--tunnel-receive-buffer-max`).
    pub earned: Arc<EarnedTotal>,
    /// `--tunnel-max-window`: the largest receive window a tunnel earns.
    pub max_window: u32,
    /// `--session-threads`: where agent sessions and their tunnels run.
    pub shards: Shards,
    /// `--fallback-proxy`: where CONNECTs that no agent matches go.
    pub fallback: Option<Fallback>,
    /// Sessions let in by locally verified tokens, closed when those turn invalid.
    pub revocation: Arc<Revocation>,
}

impl Context {
    pub fn new(
        config: &Config,
        agent_auth: AgentAuth,
        shards: Shards,
        fallback: Option<Fallback>,
    ) -> Context {
        let budget = Budget::new(config.memory.tunnel_memory_budget);
        let earned = Arc::new(config.memory.earned_total());
        let mut metrics = Metrics::new(&budget, &earned);
        metrics.watch_certificates(config.certificate_files());
        metrics
            .dials_pending_limit
            .set(i64::try_from(config.max_pending_dials).unwrap_or(i64::MAX));
        Context {
            registry: Registry::with_limits(
                config.strategies.clone(),
                config.max_tunnels_per_agent,
                config.max_sessions_per_identity,
                config.max_pending_dials_per_agent,
            ),
            admission: Admission::new(
                config.max_pending_dials,
                config.max_pending_dials_per_client,
                metrics.dials_pending.clone(),
            ),
            metrics,
            agent_auth,
            server_id: config.server_id.clone(),
            server_count: config.server_count,
            dial_timeout: config.dial_timeout,
            handshake_timeout: config.handshake_timeout,
            agent_handshake_timeout: config.agent_handshake_timeout,
            frontend_handshakes: Handshakes::new(config.max_handshakes),
            agent_admission: AgentAdmission::new(
                config.max_agent_handshakes,
                config.agent_handshake_stall,
            ),
            refusal_log: RateLimit::new(REFUSALS_LOGGED_PER_SECOND),
            keepalive: config.keepalive,
            tunnels: TaskTracker::new(),
            target_bytes_hold: config.target_bytes_hold,
            frontend_keepalive: config.frontend_keepalive,
            log_tunnels: config.log_tunnels,
            budget,
            socket_tuning: config.memory.socket_tuning(),
            earned,
            max_window: config.memory.tunnel_max_window,
            shards,
            fallback,
            revocation: Arc::default(),
        }
    }
}
