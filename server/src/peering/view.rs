//! What a server tells the peers that forward to it about its agents: one stream of the peer
//! session (the first the forwarding server opens, [`VIEW_STREAM`]) carries a line per change, the
//! whole set first. Pure: [`Sent`] turns the registry's current agents into the lines since
//! the last call, [`parse`] reads one line.
//!
//! ```text
//! agent <key> active|draining <identifier query>
//! gone <key>
//! synced
//! ```
//!
//! `synced` comes once, after the lines of the first set: the forwarding server then knows
//! every agent the peer had when the session started.
//!
//! A peer's key names its agent for as long as the agent's session lives (a reconnected agent
//! gets a new key); the query is the one the agent announced (`id=…&host=…&ipv4=…`).
//!
//! What a peer's view may make the server that reads it hold is bounded ([`Held`],
//! [`ViewLimits`]): a line's length, identifiers per agent (as an agent's own), agents per
//! peer, and the bytes of their identifiers together. A view past a bound ends the session.

use std::collections::HashMap;
use std::sync::Arc;

use bridgehead_proto::ident::{AgentIdentifiers, MAX_IDENTIFIERS, MAX_QUERY_BYTES};
pub use bridgehead_proto::VIEW_STREAM;

use crate::routing::registry::LocalAgent;
use crate::routing::router::AgentKey;

/// What the view stream's DIAL names: nothing the answering server reads (the stream's id
/// says what it is), but a DIAL carries a host and a port.
pub const VIEW_DIAL: (&str, u16) = ("view", 0);
/// Longest line: an agent's identifier query is at most [`MAX_QUERY_BYTES`], which encoding
/// it again may make up to three times as long, behind `agent <key> draining `.
pub const MAX_LINE: usize = 3 * MAX_QUERY_BYTES + 64;
/// Most agents one peer's view may hold: more than a fleet's nodes, far below what a server
/// could hold before it runs out of memory.
pub const MAX_PEER_AGENTS: usize = 65_536;
/// Most bytes of identifier queries one peer's view may hold, all its agents together.
pub const MAX_VIEW_BYTES: usize = 32 << 20;

/// The bounds on one peer's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewLimits {
    pub agents: usize,
    pub bytes: usize,
}

impl Default for ViewLimits {
    fn default() -> ViewLimits {
        ViewLimits {
            agents: MAX_PEER_AGENTS,
            bytes: MAX_VIEW_BYTES,
        }
    }
}

/// Why a peer's view is refused (and its session closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("a line longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("a line is not UTF-8")]
    NotUtf8,
    #[error("{0}")]
    Malformed(String),
    #[error(
        "agent {key}: {count} identifiers, where an agent may announce at most {MAX_IDENTIFIERS}"
    )]
    TooManyIdentifiers { key: u64, count: usize },
    #[error("more than {0} agents")]
    TooManyAgents(usize),
    #[error("more than {0} bytes of agent identifiers")]
    TooManyBytes(usize),
}

/// One change to a peer's agents.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The agent `key` is connected with these identifiers, draining or not.
    Agent {
        key: u64,
        draining: bool,
        identifiers: AgentIdentifiers,
    },
    /// The agent `key` is gone.
    Gone { key: u64 },
    /// The first set is complete.
    Synced,
}

/// The line after the first set.
pub const SYNCED: &[u8] = b"synced\n";

/// What a peer was told so far.
#[derive(Debug, Default)]
pub struct Sent {
    agents: HashMap<AgentKey, (Arc<AgentIdentifiers>, bool)>,
}

impl Sent {
    /// The lines that bring a peer told what `self` holds up to `now` (every agent the
    /// registry holds, in key order); empty when nothing changed.
    pub fn diff(&mut self, now: &[LocalAgent]) -> Vec<u8> {
        let mut lines = Vec::new();
        let mut seen = HashMap::with_capacity(now.len());
        for agent in now {
            let changed = match self.agents.get(&agent.key) {
                Some((identifiers, draining)) => {
                    !Arc::ptr_eq(identifiers, &agent.identifiers) || *draining != agent.draining
                }
                None => true,
            };
            if changed {
                let state = if agent.draining { "draining" } else { "active" };
                let query = agent.identifiers.to_query();
                lines
                    .extend_from_slice(format!("agent {} {state} {query}\n", agent.key).as_bytes());
            }
            seen.insert(agent.key, (agent.identifiers.clone(), agent.draining));
        }
        let mut gone: Vec<AgentKey> = self
            .agents
            .keys()
            .filter(|key| !seen.contains_key(key))
            .copied()
            .collect();
        gone.sort_unstable();
        for key in gone {
            lines.extend_from_slice(format!("gone {key}\n").as_bytes());
        }
        self.agents = seen;
        lines
    }
}

/// Reads one line (without its newline).
pub fn parse(line: &str) -> Result<Update, ViewError> {
    if line.len() > MAX_LINE {
        return Err(ViewError::LineTooLong);
    }
    if line.as_bytes() == &SYNCED[..SYNCED.len() - 1] {
        return Ok(Update::Synced);
    }
    let malformed = |what: String| ViewError::Malformed(what);
    let mut words = line.splitn(4, ' ');
    let kind = words.next().unwrap_or_default();
    let key = words
        .next()
        .and_then(|key| key.parse::<u64>().ok())
        .ok_or_else(|| malformed(format!("no agent key in {line:?}")))?;
    match kind {
        "gone" if words.next().is_none() => Ok(Update::Gone { key }),
        "agent" => {
            let draining = match words.next() {
                Some("active") => false,
                Some("draining") => true,
                other => return Err(malformed(format!("agent {key}: state {other:?}"))),
            };
            let identifiers = AgentIdentifiers::parse(words.next().unwrap_or_default())
                .map_err(|error| malformed(format!("agent {key}: {error}")))?;
            let count = identifiers.count();
            if count > MAX_IDENTIFIERS {
                return Err(ViewError::TooManyIdentifiers { key, count });
            }
            Ok(Update::Agent {
                key,
                draining,
                identifiers,
            })
        }
        _ => Err(malformed(format!("unknown line {line:?}"))),
    }
}

/// What one peer's view holds: each agent's bytes (its line's), and their sum.
#[derive(Debug, Default)]
pub struct Held {
    agents: HashMap<u64, usize>,
    bytes: usize,
}

impl Held {
    /// Takes `update`, read from a line of `len` bytes, into the account; an error when it
    /// would take the view past `limits` (the account is then left as it was).
    pub fn apply(
        &mut self,
        update: &Update,
        len: usize,
        limits: ViewLimits,
    ) -> Result<(), ViewError> {
        match update {
            Update::Agent { key, .. } => {
                let before = self.agents.get(key).copied();
                if before.is_none() && self.agents.len() >= limits.agents {
                    return Err(ViewError::TooManyAgents(limits.agents));
                }
                let bytes = self.bytes - before.unwrap_or(0) + len;
                if bytes > limits.bytes {
                    return Err(ViewError::TooManyBytes(limits.bytes));
                }
                self.agents.insert(*key, len);
                self.bytes = bytes;
            }
            Update::Gone { key } => {
                self.bytes -= self.agents.remove(key).unwrap_or(0);
            }
            Update::Synced => {}
        }
        Ok(())
    }

    /// Agents held.
    pub fn agents(&self) -> usize {
        self.agents.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(key: AgentKey, query: &str, draining: bool) -> LocalAgent {
        LocalAgent {
            key,
            identifiers: Arc::new(AgentIdentifiers::parse(query).unwrap()),
            draining,
        }
    }

    fn text(lines: Vec<u8>) -> String {
        String::from_utf8(lines).unwrap()
    }

    #[test]
    fn the_first_diff_is_every_agent_then_only_changes() {
        let mut sent = Sent::default();
        let a = agent(1, "id=a&host=node-a", false);
        let b = agent(2, "id=b&ipv4=10.0.0.2", false);
        assert_eq!(
            text(sent.diff(&[a.clone(), b.clone()])),
            "agent 1 active id=a&host=node-a\nagent 2 active id=b&ipv4=10.0.0.2\n"
        );
        assert_eq!(text(sent.diff(&[a.clone(), b.clone()])), "");
        let b_draining = LocalAgent {
            draining: true,
            ..b.clone()
        };
        assert_eq!(
            text(sent.diff(&[a.clone(), b_draining])),
            "agent 2 draining id=b&ipv4=10.0.0.2\n"
        );
        let c = agent(3, "id=c&default-route=true", false);
        assert_eq!(
            text(sent.diff(std::slice::from_ref(&c))),
            "agent 3 active id=c&default-route=true\ngone 1\ngone 2\n"
        );
        assert_eq!(text(sent.diff(&[])), "gone 3\n");
    }

    #[test]
    fn every_line_reads_back() {
        let mut sent = Sent::default();
        let a = agent(7, "id=a&host=node-a&cidr=10.1.0.0/16", true);
        let lines = text(sent.diff(std::slice::from_ref(&a)));
        assert_eq!(
            parse(lines.trim_end()).unwrap(),
            Update::Agent {
                key: 7,
                draining: true,
                identifiers: (*a.identifiers).clone(),
            }
        );
        let lines = text(sent.diff(&[]));
        assert_eq!(parse(lines.trim_end()).unwrap(), Update::Gone { key: 7 });
        assert_eq!(parse("synced").unwrap(), Update::Synced);
    }

    /// An agent's identifiers as an agent's own are bounded, and a peer's agents and their
    /// bytes together; an agent announced again is counted once, a gone one no more.
    #[test]
    fn a_view_holds_what_its_limits_allow() {
        let many = (0..=MAX_IDENTIFIERS)
            .map(|i| format!("cidr=10.{}.{}.0/24", i / 256, i % 256))
            .collect::<Vec<_>>()
            .join("&");
        assert_eq!(
            parse(&format!("agent 1 active {many}")),
            Err(ViewError::TooManyIdentifiers {
                key: 1,
                count: MAX_IDENTIFIERS + 1
            })
        );
        let long = format!("agent 1 active x={}", "a".repeat(MAX_LINE));
        assert_eq!(parse(&long), Err(ViewError::LineTooLong));
        // The most an agent may announce, encoded again (each `:` as `%3A`), is a line.
        let colons = format!("x={}", ":".repeat(MAX_QUERY_BYTES - 2));
        let lines = text(Sent::default().diff(&[agent(1, &colons, false)]));
        assert!(lines.len() > 2 * MAX_QUERY_BYTES);
        assert!(parse(lines.trim_end()).is_ok());

        let limits = ViewLimits {
            agents: 2,
            bytes: 100,
        };
        let mut held = Held::default();
        let update = |key| parse(&format!("agent {key} active id=a")).unwrap();
        held.apply(&update(1), 40, limits).unwrap();
        held.apply(&update(1), 40, limits).unwrap();
        held.apply(&update(2), 40, limits).unwrap();
        assert_eq!((held.agents(), held.bytes()), (2, 80));
        assert_eq!(
            held.apply(&update(3), 10, limits),
            Err(ViewError::TooManyAgents(2))
        );
        assert_eq!(
            held.apply(&update(2), 61, limits),
            Err(ViewError::TooManyBytes(100))
        );
        assert_eq!(
            (held.agents(), held.bytes()),
            (2, 80),
            "a refusal changes nothing"
        );
        held.apply(&Update::Gone { key: 1 }, 6, limits).unwrap();
        held.apply(&update(3), 60, limits).unwrap();
        assert_eq!((held.agents(), held.bytes()), (2, 100));
    }

    #[test]
    fn bad_lines_are_refused() {
        for line in [
            "",
            "agent",
            "agent x active id=a",
            "agent 1 sleeping id=a",
            "agent 1 active cidr=nonsense",
            "gone",
            "gone 1 extra",
            "hello 1",
        ] {
            assert!(parse(line).is_err(), "{line:?}");
        }
    }
}
