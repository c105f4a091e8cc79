//! The dial: the routed candidates are asked in turn to connect to the target, within one
//! deadline for all of them ([`Deadline`], which the tunnel opener also bounds its other waits
//! by).

use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::{MuxStream, OpenFailure};
use bridgehead_proto::session::OpenError;
use tokio::time::Instant;
use tracing::debug;

use crate::routing::refusal::Refusal;
use crate::routing::registry::{Candidate, Candidates};
use crate::routing::router::Target;

/// A stream to the target.
#[derive(Debug)]
pub struct Dialed {
    pub stream: MuxStream,
    /// The agent that dialed.
    pub agent: String,
    /// The peer server that carried it to the agent, when the agent is not this server's.
    pub via: Option<Arc<str>>,
}

/// When a tunnel must be open by: one instant for every wait on the way (the first round of
/// peers, each candidate's dial, the fallback proxy), and the timeout it was set from, which
/// a refusal names.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    /// The instant it passes.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The timeout it was set from.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What is left of it (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// Has the best candidate dial `target`, moving to the next one when an agent's session ends
/// or refuses new streams before it answers; all of them before `deadline`.
pub async fn dial(
    candidates: Candidates,
    target: &Target,
    deadline: Deadline,
) -> Result<Dialed, Refusal> {
    debug!(strategy = %candidates.strategy, candidates = candidates.agents.len(), "routed");
    let mut lost = None;
    for Candidate {
        agent, mux, via, ..
    } in candidates.agents
    {
        match mux
            .open(target.dial_host(), target.port, deadline.remaining())
            .await
        {
            Ok(stream) => return Ok(Dialed { stream, agent, via }),
            Err(OpenFailure::Dial { code, message }) => {
                return Err(Refusal::Dial {
                    agent,
                    target: target.clone(),
                    code,
                    message,
                })
            }
            Err(OpenFailure::TimedOut(_)) => {
                return Err(Refusal::TimedOut {
                    agent,
                    target: target.clone(),
                    timeout: deadline.timeout(),
                })
            }
            Err(OpenFailure::SessionClosed(reason)) => {
                debug!(%agent, %reason, "agent lost before answering; trying the next one");
                lost = Some((agent, reason.to_string()));
            }
            Err(OpenFailure::Refused(error)) => {
                let reason = match error {
                    OpenError::Draining => "draining".to_owned(),
                    other => other.to_string(),
                };
                debug!(%agent, %reason, "agent refused a new stream; trying the next one");
                lost = Some((agent, reason));
            }
        }
    }
    let (agent, reason) = lost.unwrap_or_default();
    Err(Refusal::AgentLost {
        agent,
        target: target.clone(),
        reason,
    })
}
