//! The connected agents: their sessions, identifiers and the route table over them; and the
//! agents of peer servers, reached by forwarding (`crate::peering`), in a table of their own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;
use serde::Serialize;
use tokio::sync::watch;

use crate::router::{AgentKey, NoRoute, RouteTable, Strategy, TargetHost};

/// Every connected agent, shared by the agent endpoint (which registers sessions) and the
/// frontend (which routes tunnels). The lock is held only for table updates and lookups.
///
/// One live session per agent id: a new session with the id of a live one replaces it when it
/// proves the same identity (a reconnect that came before the old session's death was noticed)
/// and is refused otherwise. Sessions per identity are capped.
///
/// Routing tries the strategies in order; within each, this server's own agents come first,
/// then its peers' (a tunnel forwarded to the peer that holds the agent, one hop).
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<State>>,
    /// Bumped on every change of the own agents (connected, drained, gone): what peers are
    /// told is kept current from it.
    changes: Arc<watch::Sender<u64>>,
    max_tunnels_per_agent: usize,
    max_sessions_per_identity: usize,
    max_pending_dials_per_agent: usize,
}

#[derive(Debug)]
struct State {
    table: RouteTable,
    agents: HashMap<AgentKey, Agent>,
    by_name: HashMap<String, AgentKey>,
    per_identity: HashMap<String, usize>,
    next_key: AgentKey,
    /// The peers' agents, by the keys this registry gave them.
    remote: RouteTable,
    remote_agents: HashMap<AgentKey, RemoteAgent>,
    peers: HashMap<Arc<str>, Peer>,
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

/// One session with a peer, as registered: what its updates and its end name, so that an
/// old session's end does not remove the one that replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSession(u64);

#[derive(Debug)]
struct Agent {
    mux: Mux,
    name: String,
    identity: String,
    identifiers: Arc<AgentIdentifiers>,
    peer: SocketAddr,
    since: SystemTime,
    draining: bool,
}

/// A session that asks to be registered.
#[derive(Debug)]
pub struct Registration {
    /// The agent's id (or its peer address when it gave none).
    pub name: String,
    /// Who it proved to be (certificate, token): what a replacement must match.
    pub identity: String,
    pub identifiers: AgentIdentifiers,
    pub peer: SocketAddr,
    pub mux: Mux,
}

/// Why a session was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("agent id {id} is connected already as {existing}")]
    IdTaken { id: String, existing: String },
    #[error("{identity} holds its limit of {limit} sessions")]
    TooManySessions { identity: String, limit: usize },
}

/// The agents chosen for one tunnel, best first.
#[derive(Debug)]
pub struct Candidates {
    pub strategy: Strategy,
    pub agents: Vec<Candidate>,
}

/// One agent that may carry a tunnel.
#[derive(Debug)]
pub struct Candidate {
    pub key: AgentKey,
    /// The agent's id.
    pub agent: String,
    /// The session a stream is opened on: the agent's own, or the one with the peer server
    /// that holds it.
    pub mux: Mux,
    /// The peer server that holds the agent, when it is not this server's.
    pub via: Option<Arc<str>>,
}

/// An agent of this server, as peers are told of it.
#[derive(Debug, Clone)]
pub struct LocalAgent {
    pub key: AgentKey,
    pub identifiers: Arc<AgentIdentifiers>,
    pub draining: bool,
}

/// Why no agent can take a tunnel.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(transparent)]
    NoRoute(#[from] NoRoute),
    #[error("every matching agent carries its limit of {0} tunnels")]
    Full(usize),
    #[error("every matching agent has its limit of {0} dials pending")]
    Busy(usize),
}

/// One agent as `GET /agents` shows it.
#[derive(Debug, Serialize)]
pub struct AgentView {
    pub key: AgentKey,
    pub id: String,
    pub peer: String,
    pub connected_unix: u64,
    pub identifiers: IdentifiersView,
    pub open_tunnels: usize,
    pub draining: bool,
}

/// Decoded identifiers for JSON.
#[derive(Debug, Serialize)]
pub struct IdentifiersView {
    pub host: Vec<String>,
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    pub cidr: Vec<String>,
    pub default_route: bool,
}

impl Registry {
    /// A registry routing by `strategies`; sessions per identity and dials per agent
    /// unlimited.
    pub fn new(strategies: Vec<Strategy>, max_tunnels_per_agent: usize) -> Registry {
        Registry::with_limits(strategies, max_tunnels_per_agent, usize::MAX, usize::MAX)
    }

    /// A registry with `--max-sessions-per-identity` and `--max-pending-dials-per-agent`.
    pub fn with_limits(
        strategies: Vec<Strategy>,
        max_tunnels_per_agent: usize,
        max_sessions_per_identity: usize,
        max_pending_dials_per_agent: usize,
    ) -> Registry {
        Registry {
            inner: Arc::new(Mutex::new(State {
                remote: RouteTable::new(strategies.clone()),
                table: RouteTable::new(strategies),
                agents: HashMap::new(),
                by_name: HashMap::new(),
                per_identity: HashMap::new(),
                next_key: 1,
                remote_agents: HashMap::new(),
                peers: HashMap::new(),
            })),
            changes: Arc::new(watch::Sender::new(0)),
            max_tunnels_per_agent,
            max_sessions_per_identity,
            max_pending_dials_per_agent,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a connected agent; returns its key for [`Registry::unregister`] and the session it
    /// replaced (same id, same identity), which the caller closes.
    pub fn register(
        &self,
        registration: Registration,
    ) -> Result<(AgentKey, Option<Mux>), RegisterError> {
        let mut state = self.lock();
        let replaced = match state.by_name.get(&registration.name) {
            Some(old) => {
                let existing = &state.agents[old];
                if existing.identity != registration.identity {
                    return Err(RegisterError::IdTaken {
                        id: registration.name,
                        existing: format!("{} from {}", existing.identity, existing.peer),
                    });
                }
                let old = *old;
                state.remove(old).map(|agent| agent.mux)
            }
            None => None,
        };
        let sessions = state
            .per_identity
            .get(&registration.identity)
            .copied()
            .unwrap_or(0);
        if sessions >= self.max_sessions_per_identity {
            return Err(RegisterError::TooManySessions {
                identity: registration.identity,
                limit: self.max_sessions_per_identity,
            });
        }
        let key = state.next_key;
        state.next_key += 1;
        state.table.insert(key, &registration.identifiers);
        state.by_name.insert(registration.name.clone(), key);
        *state
            .per_identity
            .entry(registration.identity.clone())
            .or_default() += 1;
        state.agents.insert(
            key,
            Agent {
                mux: registration.mux,
                name: registration.name,
                identity: registration.identity,
                identifiers: Arc::new(registration.identifiers),
                peer: registration.peer,
                since: SystemTime::now(),
                draining: false,
            },
        );
        drop(state);
        self.changed();
        Ok((key, replaced))
    }

    /// Forgets the session `key` (a no-op when it is gone already, e.g. replaced).
    pub fn unregister(&self, key: AgentKey) {
        let removed = self.lock().remove(key).is_some();
        if removed {
            self.changed();
        }
    }

    /// The agent announced DRAIN: route nothing new to it.
    pub fn set_draining(&self, key: AgentKey) {
        let mut state = self.lock();
        state.table.set_draining(key, true);
        if let Some(agent) = state.agents.get_mut(&key) {
            agent.draining = true;
        }
        drop(state);
        self.changed();
    }

    fn changed(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// Changes when this server's own agents change (for what peers are told).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// This server's own agents, as peers are told of them, in key order.
    pub fn local_agents(&self) -> Vec<LocalAgent> {
        let state = self.lock();
        let mut agents: Vec<LocalAgent> = state
            .agents
            .iter()
            .map(|(&key, agent)| LocalAgent {
                key,
                identifiers: agent.identifiers.clone(),
                draining: agent.draining || agent.mux.peer_draining(),
            })
            .collect();
        drop(state);
        agents.sort_by_key(|agent| agent.key);
        agents
    }

    /// A session with peer server `id` that forwards to its agents: it replaces an earlier
    /// session with the same peer (whose agents are forgotten, and which is returned to be
    /// closed). Its agents are added with [`Registry::set_peer_agent`].
    pub fn add_peer(&self, id: &str, mux: Mux) -> (PeerSession, Option<Mux>) {
        let mut state = self.lock();
        let replaced = state.remove_peer(id, None);
        let session = PeerSession(state.next_key);
        state.next_key += 1;
        let id: Arc<str> = Arc::from(id);
        state.peers.insert(
            id.clone(),
            Peer {
                id,
                mux,
                session,
                agents: HashMap::new(),
            },
        );
        (session, replaced)
    }

    /// The session `session` with peer `id` ended: its agents are forgotten (a no-op when a
    /// newer session replaced it).
    pub fn remove_peer(&self, id: &str, session: PeerSession) {
        self.lock().remove_peer(id, Some(session));
    }

    /// Peer `id` holds agent `remote` (its key for it) with `identifiers`, draining or not.
    /// Ignored when `session` is no longer the peer's session.
    pub fn set_peer_agent(
        &self,
        id: &str,
        session: PeerSession,
        remote: u64,
        identifiers: &AgentIdentifiers,
        draining: bool,
    ) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(peer) = state.peers.get_mut(id) else {
            return;
        };
        if peer.session != session {
            return;
        }
        let key = match peer.agents.get(&remote) {
            Some(&key) => key,
            None => {
                let key = state.next_key;
                state.next_key += 1;
                peer.agents.insert(remote, key);
                key
            }
        };
        let name = identifiers
            .id
            .clone()
            .unwrap_or_else(|| format!("{id}/{remote}"));
        state.remote.insert(key, identifiers);
        state.remote.set_draining(key, draining);
        state.remote_agents.insert(
            key,
            RemoteAgent {
                name,
                peer: peer.id.clone(),
                mux: peer.mux.clone(),
            },
        );
    }

    /// Peer `id` no longer holds agent `remote`.
    pub fn remove_peer_agent(&self, id: &str, session: PeerSession, remote: u64) {
        let mut state = self.lock();
        let Some(peer) = state.peers.get_mut(id) else {
            return;
        };
        if peer.session != session {
            return;
        }
        if let Some(key) = peer.agents.remove(&remote) {
            state.remote.remove(key);
            state.remote_agents.remove(&key);
        }
    }

    /// How many agents the peers hold, together.
    pub fn peer_agent_count(&self) -> usize {
        self.lock().remote_agents.len()
    }

    /// The peers this server forwards to, with how many agents each holds, by id.
    pub fn peers(&self) -> Vec<(String, usize)> {
        let state = self.lock();
        let mut peers: Vec<(String, usize)> = state
            .peers
            .iter()
            .map(|(id, peer)| (id.to_string(), peer.agents.len()))
            .collect();
        peers.sort();
        peers
    }

    /// The agents that may carry a tunnel to `target`, best first, skipping full ones and
    /// those with their limit of dials pending (an agent that never answers cannot take every
    /// dial). Strategy by strategy, this server's own agents first, then its peers'.
    pub fn route(&self, target: &TargetHost) -> Result<Candidates, RouteError> {
        self.route_among(target, true)
    }

    /// [`Registry::route`] among this server's own agents only: what a peer's forwarded
    /// tunnel may use (one hop, never forwarded again).
    pub fn route_local(&self, target: &TargetHost) -> Result<Candidates, RouteError> {
        self.route_among(target, false)
    }

    fn route_among(&self, target: &TargetHost, peers: bool) -> Result<Candidates, RouteError> {
        let state = self.lock();
        let mut rng = rand::rng();
        let usable = |load: (usize, usize)| {
            load.0 < self.max_tunnels_per_agent && load.1 < self.max_pending_dials_per_agent
        };
        // An agent without room ranks last, so a sample with room anywhere yields that agent
        // first.
        let loads = |key: AgentKey| {
            state
                .agents
                .get(&key)
                .map(|agent| agent.mux.load())
                .filter(|&load| usable(load))
                .map_or(usize::MAX, |(open, _)| open)
        };
        let remote_loads = |key: AgentKey| {
            state
                .remote_agents
                .get(&key)
                .map_or(usize::MAX, |agent| agent.mux.open_streams())
        };
        for &strategy in state.table.strategies() {
            let mut full = None;
            if let Some(keys) = state.table.route_by(strategy, target, loads, &mut rng) {
                let mut any_full = false;
                let agents: Vec<_> = keys
                    .iter()
                    .filter_map(|key| {
                        let agent = state.agents.get(key)?;
                        let load = agent.mux.load();
                        any_full |= load.0 >= self.max_tunnels_per_agent;
                        usable(load).then(|| Candidate {
                            key: *key,
                            agent: agent.name.clone(),
                            mux: agent.mux.clone(),
                            via: None,
                        })
                    })
                    .collect();
                if !agents.is_empty() {
                    return Ok(Candidates { strategy, agents });
                }
                full = Some(if any_full {
                    RouteError::Full(self.max_tunnels_per_agent)
                } else {
                    RouteError::Busy(self.max_pending_dials_per_agent)
                });
            }
            let remote = peers
                .then(|| {
                    state
                        .remote
                        .route_by(strategy, target, remote_loads, &mut rng)
                })
                .flatten();
            if let Some(keys) = remote {
                let agents: Vec<_> = keys
                    .iter()
                    .filter_map(|key| {
                        let agent = state.remote_agents.get(key)?;
                        Some(Candidate {
                            key: *key,
                            agent: agent.name.clone(),
                            mux: agent.mux.clone(),
                            via: Some(agent.peer.clone()),
                        })
                    })
                    .collect();
                if !agents.is_empty() {
                    return Ok(Candidates { strategy, agents });
                }
            }
            if let Some(full) = full {
                return Err(full);
            }
        }
        Err(RouteError::NoRoute(NoRoute {
            tried: state.table.strategies().to_vec(),
        }))
    }

    /// `/readyz`: ready when the first strategy finds an agent of this server's or of a
    /// peer's.
    pub fn ready(&self) -> Result<(), String> {
        let state = self.lock();
        state
            .table
            .ready()
            .or_else(|own| state.remote.ready().map_err(|_| own))
    }

    /// Usable agents per configured strategy, this server's and its peers'.
    pub fn ready_backends(&self) -> Vec<(crate::router::Strategy, usize)> {
        let state = self.lock();
        let remote = state.remote.ready_backends();
        let mut backends = state.table.ready_backends();
        for ((_, own), (_, theirs)) in backends.iter_mut().zip(remote) {
            *own += theirs;
        }
        backends
    }

    /// `--max-tunnels-per-agent`: routing skips an agent that carries this many, and each
    /// agent session refuses more streams.
    pub fn max_tunnels_per_agent(&self) -> usize {
        self.max_tunnels_per_agent
    }

    /// Every live session, e.g. to drain them at shutdown.
    pub fn sessions(&self) -> Vec<Mux> {
        self.lock().agents.values().map(|a| a.mux.clone()).collect()
    }

    /// What `GET /agents` shows, ordered by key (connection order). The lock is held only to
    /// copy handles (an `Arc` of each agent's identifiers); formatting happens after it.
    pub fn views(&self) -> Vec<AgentView> {
        let snapshot: Vec<_> = {
            let state = self.lock();
            state
                .agents
                .iter()
                .map(|(key, agent)| {
                    (
                        *key,
                        agent.name.clone(),
                        agent.peer,
                        agent.since,
                        agent.identifiers.clone(),
                        agent.mux.clone(),
                        agent.draining,
                    )
                })
                .collect()
        };
        let mut views: Vec<AgentView> = snapshot
            .into_iter()
            .map(|(key, name, peer, since, ids, mux, draining)| AgentView {
                key,
                id: name,
                peer: peer.to_string(),
                connected_unix: since
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                identifiers: IdentifiersView {
                    host: ids.hosts.clone(),
                    ipv4: ids.ipv4.iter().map(ToString::to_string).collect(),
                    ipv6: ids.ipv6.iter().map(ToString::to_string).collect(),
                    cidr: ids.cidrs.iter().map(ToString::to_string).collect(),
                    default_route: ids.default_route,
                },
                open_tunnels: mux.open_streams(),
                draining: draining || mux.peer_draining(),
            })
            .collect();
        views.sort_by_key(|view| view.key);
        views
    }
}

impl State {
    /// Forgets peer `id` and its agents, if its session is `session` (any session: `None`);
    /// returns the session.
    fn remove_peer(&mut self, id: &str, session: Option<PeerSession>) -> Option<Mux> {
        let peer = self.peers.get(id)?;
        if session.is_some_and(|session| session != peer.session) {
            return None;
        }
        let peer = self.peers.remove(id)?;
        for key in peer.agents.values() {
            self.remote.remove(*key);
            self.remote_agents.remove(key);
        }
        Some(peer.mux)
    }

    fn remove(&mut self, key: AgentKey) -> Option<Agent> {
        let agent = self.agents.remove(&key)?;
        self.table.remove(key);
        if self.by_name.get(&agent.name) == Some(&key) {
            self.by_name.remove(&agent.name);
        }
        if let Some(count) = self.per_identity.get_mut(&agent.identity) {
            *count -= 1;
            if *count == 0 {
                self.per_identity.remove(&agent.identity);
            }
        }
        Some(agent)
    }
}

#[cfg(test)]
mod tests;
