//! What a server tells the peers that forward to it about its agents: one stream of the peer
//! session (opened by the forwarding server to [`VIEW_HOST`]) carries a line per change, the
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

use std::collections::HashMap;
use std::sync::Arc;

use bridgehead_proto::ident::AgentIdentifiers;

use crate::registry::LocalAgent;
use crate::router::AgentKey;

/// The dial target of the view stream (`.invalid`: no real host has this name).
pub const VIEW_HOST: &str = "agents.bridgehead.invalid";
/// The view stream's port.
pub const VIEW_PORT: u16 = 1;
/// Longest line: an agent's identifier query is at most 8 KiB (`MAX_QUERY_BYTES`).
pub const MAX_LINE: usize = 16 * 1024;

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
pub fn parse(line: &str) -> Result<Update, String> {
    if line.as_bytes() == &SYNCED[..SYNCED.len() - 1] {
        return Ok(Update::Synced);
    }
    let mut words = line.splitn(4, ' ');
    let kind = words.next().unwrap_or_default();
    let key = words
        .next()
        .and_then(|key| key.parse::<u64>().ok())
        .ok_or_else(|| format!("no agent key in {line:?}"))?;
    match kind {
        "gone" if words.next().is_none() => Ok(Update::Gone { key }),
        "agent" => {
            let draining = match words.next() {
                Some("active") => false,
                Some("draining") => true,
                other => return Err(format!("agent {key}: state {other:?}")),
            };
            let identifiers = AgentIdentifiers::parse(words.next().unwrap_or_default())
                .map_err(|error| format!("agent {key}: {error}"))?;
            Ok(Update::Agent {
                key,
                draining,
                identifiers,
            })
        }
        _ => Err(format!("unknown line {line:?}")),
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
