//! The peers' half of the registry's state: the sessions with peer servers that forward to
//! their agents (`crate::peering`), and those agents in a route table of their own, keyed by
//! the keys this registry gave them.

use std::collections::HashMap;
use std::sync::Arc;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;

use super::Candidate;
use crate::routing::router::{AgentKey, RouteTable, Strategy};

/// One session with a peer, as registered: what its updates and its end name, so that an
/// old session's end does not remove the one that replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSession(pub(super) u64);

/// The peers and their agents.
#[derive(Debug)]
pub(super) struct Peers {
    /// The peers' agents, by the keys this registry gave them.
    pub(super) table: RouteTable,
    agents: HashMap<AgentKey, RemoteAgent>,
    sessions: HashMap<Arc<str>, Peer>,
}

/// An agent of a peer server: a tunnel to it is a stream on the session with that peer.
#[derive(Debug)]
struct RemoteAgent {
    name: String,
    peer: Arc<str>,
    mux: Mux,
}

/// A peer server's session and its agents, by the peer's keys.
#[derive(Debug)]
struct Peer {
    id: Arc<str>,
    mux: Mux,
    session: PeerSession,
    agents: HashMap<u64, AgentKey>,
}

impl Peers {
    pub(super) fn new(strategies: Vec<Strategy>) -> Peers {
        Peers {
            table: RouteTable::new(strategies),
            agents: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    /// Registers `mux` as peer `id`'s session `session`; returns the one it replaced.
    pub(super) fn add(&mut self, id: &str, mux: Mux, session: PeerSession) -> Option<Mux> {
        let replaced = self.remove(id, None);
        let id: Arc<str> = Arc::from(id);
        self.sessions.insert(
            id.clone(),
            Peer {
                id,
                mux,
                session,
                agents: HashMap::new(),
            },
        );
        replaced
    }

    /// Forgets peer `id` and its agents, if its session is `session` (any session: `None`);
    /// returns the session.
    pub(super) fn remove(&mut self, id: &str, session: Option<PeerSession>) -> Option<Mux> {
        let peer = self.sessions.get(id)?;
        if session.is_some_and(|session| session != peer.session) {
            return None;
        }
        let peer = self.sessions.remove(id)?;
        for key in peer.agents.values() {
            self.table.remove(*key);
            self.agents.remove(key);
        }
        Some(peer.mux)
    }

    /// See `Registry::set_peer_agent`; a new agent's key comes from `next_key`.
    pub(super) fn set_agent(
        &mut self,
        id: &str,
        session: PeerSession,
        remote: u64,
        identifiers: &AgentIdentifiers,
        draining: bool,
        next_key: &mut AgentKey,
    ) {
        let Some(peer) = self.sessions.get_mut(id) else {
            return;
        };
        if peer.session != session {
            return;
        }
        let key = *peer.agents.entry(remote).or_insert_with(|| {
            let key = *next_key;
            *next_key += 1;
            key
        });
        let name = identifiers
            .id
            .clone()
            .unwrap_or_else(|| format!("{id}/{remote}"));
        self.table.insert(key, identifiers);
        self.table.set_draining(key, draining);
        self.agents.insert(
            key,
            RemoteAgent {
                name,
                peer: peer.id.clone(),
                mux: peer.mux.clone(),
            },
        );
    }

    /// See `Registry::remove_peer_agent`.
    pub(super) fn remove_agent(&mut self, id: &str, session: PeerSession, remote: u64) {
        let Some(peer) = self.sessions.get_mut(id) else {
            return;
        };
        if peer.session != session {
            return;
        }
        if let Some(key) = peer.agents.remove(&remote) {
            self.table.remove(key);
            self.agents.remove(&key);
        }
    }

    /// How many agents the peers hold, together.
    pub(super) fn agent_count(&self) -> usize {
        self.agents.len()
    }

    /// The peers with how many agents each holds, by id.
    pub(super) fn list(&self) -> Vec<(String, usize)> {
        let mut peers: Vec<(String, usize)> = self
            .sessions
            .iter()
            .map(|(id, peer)| (id.to_string(), peer.agents.len()))
            .collect();
        peers.sort();
        peers
    }

    /// The open streams on the session that carries a tunnel to agent `key` (all of them: a
    /// peer's limits are its own to enforce), or `None` for an agent not known.
    pub(super) fn load(&self, key: AgentKey) -> Option<usize> {
        self.agents.get(&key).map(|agent| agent.mux.open_streams())
    }

    /// Agent `key` as a route's candidate, through its peer.
    pub(super) fn candidate(&self, key: AgentKey) -> Option<Candidate> {
        let agent = self.agents.get(&key)?;
        Some(Candidate {
            key,
            agent: agent.name.clone(),
            mux: agent.mux.clone(),
            via: Some(agent.peer.clone()),
        })
    }
}
