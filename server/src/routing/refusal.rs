//! Every way the server turns a CONNECT down, as one type: each [`Refusal`] carries its HTTP
//! status, its one-line reason (its `Display`) and its metric label, so the frontend answers
//! and counts every refusal the same way.

use std::time::Duration;

use bridgehead_proto::ErrorCode;
use http::StatusCode;

use crate::process::metrics::DialResult;
use crate::routing::registry::RouteError;
use crate::routing::router::{BadTarget, Target};

/// Why a CONNECT gets no tunnel.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("request head larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("more than {0} header fields")]
    TooManyHeaders(usize),
    #[error("malformed request: {0}")]
    Malformed(httparse::Error),
    #[error("incomplete request head")]
    Incomplete,
    #[error("only CONNECT is served here")]
    NotConnect,
    #[error("client certificate {0} is not among --allowed-clients")]
    ClientNotAllowed(String),
    #[error(transparent)]
    BadTarget(#[from] BadTarget),
    #[error(transparent)]
    NoAgent(#[from] RouteError),
    #[error("overloaded: {0} dials already pending")]
    Overloaded(usize),
    #[error("overloaded: this client has its limit of {0} dials pending")]
    ClientOverloaded(usize),
    #[error("overloaded: {buffered} bytes of tunnel data buffered, the --tunnel-memory-budget of {limit} is spent")]
    MemoryBudget { buffered: u64, limit: u64 },
    #[error("agent {agent} could not dial {target}: {code}: {message}")]
    Dial {
        agent: String,
        target: Target,
        code: ErrorCode,
        message: String,
    },
    #[error("agent {agent} did not connect to {target} within {timeout:?}")]
    TimedOut {
        agent: String,
        target: Target,
        timeout: Duration,
    },
    /// No agent matched, and the fallback proxy gave no tunnel either (or its destination
    /// policy did not let the target go there).
    #[error(transparent)]
    Fallback(#[from] crate::routing::fallback::FallbackError),
    #[error("agent {agent} was lost before answering the dial to {target}: {reason}")]
    AgentLost {
        agent: String,
        target: Target,
        reason: String,
    },
}

impl Refusal {
    /// The HTTP status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::HeadTooLarge(_) | Refusal::TooManyHeaders(_) => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            Refusal::Malformed(_) | Refusal::Incomplete | Refusal::BadTarget(_) => {
                StatusCode::BAD_REQUEST
            }
            Refusal::NotConnect => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::ClientNotAllowed(_) => StatusCode::FORBIDDEN,
            Refusal::NoAgent(_)
            | Refusal::Overloaded(_)
            | Refusal::ClientOverloaded(_)
            | Refusal::MemoryBudget { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Dial { code, .. } => dial_failure(*code).0,
            Refusal::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            Refusal::AgentLost { .. } => StatusCode::BAD_GATEWAY,
            Refusal::Fallback(error) => error.status(),
        }
    }

    /// The `result` label of the CONNECT counter.
    pub fn result(&self) -> DialResult {
        match self {
            Refusal::HeadTooLarge(_)
            | Refusal::TooManyHeaders(_)
            | Refusal::Malformed(_)
            | Refusal::Incomplete
            | Refusal::NotConnect
            | Refusal::BadTarget(_) => DialResult::BadRequest,
            Refusal::ClientNotAllowed(_) => DialResult::NotPermitted,
            Refusal::NoAgent(_) => DialResult::NoAgent,
            Refusal::Overloaded(_)
            | Refusal::ClientOverloaded(_)
            | Refusal::MemoryBudget { .. } => DialResult::Overloaded,
            Refusal::Dial { code, .. } => dial_failure(*code).1,
            Refusal::TimedOut { .. } => DialResult::TimedOut,
            Refusal::AgentLost { .. } => DialResult::AgentLost,
            // Labelled by what the client saw; fallback_dials_total says what happened there.
            Refusal::Fallback(error) => match error.status() {
                StatusCode::FORBIDDEN => DialResult::NotPermitted,
                StatusCode::GATEWAY_TIMEOUT => DialResult::TimedOut,
                _ => DialResult::Other,
            },
        }
    }
}

/// The status and label of an agent's failed dial, by its error code.
fn dial_failure(code: ErrorCode) -> (StatusCode, DialResult) {
    match code {
        ErrorCode::Refused => (StatusCode::BAD_GATEWAY, DialResult::Refused),
        ErrorCode::Unreachable => (StatusCode::BAD_GATEWAY, DialResult::Unreachable),
        ErrorCode::NameNotResolved => (StatusCode::BAD_GATEWAY, DialResult::NameNotResolved),
        // The agent's destination policy refused it: the target exists, the client may not.
        ErrorCode::NotPermitted => (StatusCode::FORBIDDEN, DialResult::NotPermitted),
        ErrorCode::TimedOut => (StatusCode::GATEWAY_TIMEOUT, DialResult::TimedOut),
        ErrorCode::Draining | ErrorCode::TooManyStreams | ErrorCode::Overloaded => {
            (StatusCode::SERVICE_UNAVAILABLE, DialResult::Overloaded)
        }
        ErrorCode::Other
        | ErrorCode::Cancelled
        | ErrorCode::FlowControl
        | ErrorCode::StreamState
        | ErrorCode::ConnectionReset
        | ErrorCode::Shutdown
        | ErrorCode::Internal
        | ErrorCode::Unknown(_) => (StatusCode::BAD_GATEWAY, DialResult::Other),
    }
}
