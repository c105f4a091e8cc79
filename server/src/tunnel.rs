//! Opening one tunnel: parse the CONNECT target, route it, have an agent dial it.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use bridgehead_mux::{MuxStream, OpenFailure};
use bridgehead_proto::session::OpenError;
use bridgehead_proto::ErrorCode;
use http::StatusCode;
use tokio::time::Instant;
use tracing::debug;

use crate::metrics::DialResult;
use crate::registry::{Registry, RouteError};
use crate::router::TargetHost;

/// A CONNECT target, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host without brackets: an IPv4 or IPv6 literal or a DNS name.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Why a tunnel could not be opened. [`TunnelError::status`] is the one place that turns these
/// into HTTP statuses.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("malformed CONNECT target {0:?}: expected host:port, [ipv6]:port or name:port")]
    BadTarget(String),
    #[error("{0}")]
    NoAgent(RouteError),
    #[error("overloaded: {0} dials already pending")]
    Overloaded(usize),
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
    #[error("agent {agent} was lost before answering the dial to {target}: {reason}")]
    AgentLost {
        agent: String,
        target: Target,
        reason: String,
    },
}

impl TunnelError {
    /// The HTTP status a CONNECT client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            TunnelError::BadTarget(_) => StatusCode::BAD_REQUEST,
            TunnelError::NoAgent(_) | TunnelError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            TunnelError::Dial { code, .. } => match code {
                ErrorCode::TimedOut => StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::Draining | ErrorCode::TooManyStreams => StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Refused
                | ErrorCode::Unreachable
                | ErrorCode::NameNotResolved
                | ErrorCode::NotPermitted
                | ErrorCode::Other
                | ErrorCode::Cancelled
                | ErrorCode::FlowControl
                | ErrorCode::StreamState
                | ErrorCode::ConnectionReset
                | ErrorCode::Shutdown
                | ErrorCode::Internal
                | ErrorCode::Unknown(_) => StatusCode::BAD_GATEWAY,
            },
            TunnelError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            TunnelError::AgentLost { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// The metrics label.
    pub fn result(&self) -> DialResult {
        match self {
            TunnelError::BadTarget(_) => DialResult::BadRequest,
            TunnelError::NoAgent(_) => DialResult::NoAgent,
            TunnelError::Overloaded(_) => DialResult::Overloaded,
            TunnelError::Dial { code, .. } => match code {
                ErrorCode::Refused => DialResult::Refused,
                ErrorCode::Unreachable => DialResult::Unreachable,
                ErrorCode::NameNotResolved => DialResult::NameNotResolved,
                ErrorCode::NotPermitted => DialResult::NotPermitted,
                ErrorCode::TimedOut => DialResult::TimedOut,
                ErrorCode::Draining | ErrorCode::TooManyStreams => DialResult::Overloaded,
                _ => DialResult::Other,
            },
            TunnelError::TimedOut { .. } => DialResult::TimedOut,
            TunnelError::AgentLost { .. } => DialResult::AgentLost,
        }
    }
}

/// Parses the request target of `CONNECT host:port`: IPv4, `[IPv6]` or a DNS name, and a port
/// from 1 to 65535.
pub fn parse_target(authority: &str) -> Result<Target, TunnelError> {
    let bad = || TunnelError::BadTarget(authority.to_owned());
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, port) = rest.split_once("]:").ok_or_else(bad)?;
        v6.parse::<Ipv6Addr>().map_err(|_| bad())?;
        (v6, port)
    } else {
        let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
        if host.contains(':') || !valid_name_or_ipv4(host) {
            return Err(bad());
        }
        (host, port)
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    Ok(Target {
        host: host.to_owned(),
        port,
    })
}

fn valid_name_or_ipv4(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Routes `target` and has the best candidate agent dial it, moving to the next candidate when
/// an agent's session ends or refuses new streams before it answers. Returns the open stream
/// and the agent's name.
pub async fn open(
    registry: &Registry,
    target: &Target,
    dial_timeout: Duration,
) -> Result<(MuxStream, String), TunnelError> {
    let candidates = registry
        .route(&TargetHost::parse(&target.host))
        .map_err(TunnelError::NoAgent)?;
    debug!(strategy = %candidates.strategy, candidates = candidates.agents.len(), "routed");
    let deadline = Instant::now() + dial_timeout;
    let mut lost = None;
    for (_, agent, mux) in candidates.agents {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match mux.open(&target.host, target.port, remaining).await {
            Ok(stream) => return Ok((stream, agent)),
            Err(OpenFailure::Dial { code, message }) => {
                return Err(TunnelError::Dial {
                    agent,
                    target: target.clone(),
                    code,
                    message,
                })
            }
            Err(OpenFailure::TimedOut(_)) => {
                return Err(TunnelError::TimedOut {
                    agent,
                    target: target.clone(),
                    timeout: dial_timeout,
                })
            }
            Err(OpenFailure::SessionClosed(reason)) => {
                debug!(%agent, %reason, "agent lost before answering; trying the next one");
                lost = Some((agent, reason));
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
    Err(TunnelError::AgentLost {
        agent,
        target: target.clone(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let ok = |s: &str, host: &str, port| {
            assert_eq!(
                parse_target(s).unwrap(),
                Target {
                    host: host.into(),
                    port
                },
                "{s}"
            )
        };
        ok("10.0.0.5:10250", "10.0.0.5", 10250);
        ok("[fd00::5]:10250", "fd00::5", 10250);
        ok("[::1]:80", "::1", 80);
        ok("node-1.example.com:443", "node-1.example.com", 443);
        ok("Node1.:1", "Node1.", 1);
        ok("localhost:65535", "localhost", 65535);
        for bad in [
            "",
            "10.0.0.5",
            "10.0.0.5:",
            ":80",
            "10.0.0.5:0",
            "10.0.0.5:65536",
            "fd00::5:80",
            "[fd00::5]",
            "[fd00::5]80",
            "[nothex]:80",
            "a b:80",
            "host:+80",
            "-bad:80",
            "a..b:80",
            "host:80/path",
            "http://x:80",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(
            Target {
                host: "fd00::5".into(),
                port: 1
            }
            .to_string(),
            "[fd00::5]:1"
        );
    }
}
