//! What every connection task of the server shares.

use std::time::Duration;

use bridgehead_mux::Keepalive;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::agent_auth::AgentAuth;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::registry::Registry;

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
    pub dial_timeout: Duration,
    pub handshake_timeout: Duration,
    pub keepalive: Keepalive,
    /// Every spliced tunnel, so shutdown can wait for them.
    pub tunnels: TaskTracker,
    /// How long a target's first bytes wait for the client's first byte.
    pub target_bytes_hold: Duration,
}

impl Context {
    pub fn new(config: &Config, agent_auth: AgentAuth) -> Context {
        let metrics = Metrics::new();
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
            dial_timeout: config.dial_timeout,
            handshake_timeout: config.handshake_timeout,
            keepalive: config.keepalive,
            tunnels: TaskTracker::new(),
            target_bytes_hold: config.target_bytes_hold,
        }
    }
}
