//! The dial: the routed candidates are asked in turn to connect to the target, within one
//! deadline for all of them.

use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::{MuxStream, OpenFailure};
use bridgehead_proto::session::OpenError;
use tokio::time::Instant;
use tracing::debug;

use crate::refusal::Refusal;
use crate::registry::{Candidate, Candidates};
use crate::router::Target;

/// A stream to the target.
#[derive(Debug)]
pub struct Dialed {
    pub stream: MuxStream,
    /// The agent that dialed.
    pub agent: String,
    /// The peer server that carried it to the agent, when the agent is not this server's.
    pub via: Option<Arc<str>>,
}

/// Has the best candidate dial `target`, moving to the next one when an agent's session ends
/// or refuses new streams before it answers.
pub async fn dial(
    candidates: Candidates,
    target: &Target,
    timeout: Duration,
) -> Result<Dialed, Refusal> {
    debug!(strategy = %candidates.strategy, candidates = candidates.agents.len(), "routed");
    let deadline = Instant::now() + timeout;
    let mut lost = None;
    for Candidate {
        agent, mux, via, ..
    } in candidates.agents
    {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match mux.open(target.dial_host(), target.port, remaining).await {
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
                    timeout,
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
