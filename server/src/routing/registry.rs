//! The connected agents: their sessions, identifiers and the route table over them; and the
//! agents of peer servers, reached by forwarding (`crate::peering`), in a table of their own
//! (`peers`). One strategy loop (`router::route`) routes over both.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;
use serde::Serialize;
use tokio::sync::watch;

use crate::routing::router::{self, AgentKey, NoRoute, RouteTable, Strategy, TargetHost, Unrouted};

mod peers;

pub use peers::PeerSession;
use peers::Peers;

/// Every connected agent, shared by the agent endpoint (which registers sessions) and the
/// frontend (which routes tunnels). The lock is held only for table updates and lookups.
///
/// One routable session per agent id: a new session with the id of a live one takes its place
/// when it proves the same identity and is refused otherwise. The session it replaces is kept,
/// draining, while the identity has room under its cap: it may be a rolling update's old pod
/// (a DaemonSet rolled with `maxSurge` starts the new one first), whose open tunnels must
/// finish, or a connection that died unnoticed, which its keepalive ends. Sessions per
/// identity are capped, the draining ones included.
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
    local: Local,
    peers: Peers,
    /// The next key for an agent, own or a peer's, or a peer session: keys are never reused.
    next_key: AgentKey,
}

/// This server's own agents.
#[derive(Debug)]
struct Local {
    table: RouteTable,
    agents: HashMap<AgentKey, Agent>,
    by_name: HashMap<String, AgentKey>,
    per_identity: HashMap<String, usize>,
}

/// Which of the registry's tables a route came from: the strategy loop tries them in this
/// order for each strategy.
#[derive(Debug, Clone, Copy)]
enum Table {
    Local,
    Peers,
}

/// Why a matching agent cannot take a tunnel now, mild to worst: when no agent a strategy
/// ranked first has room, the worst reason among them is the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum NoRoom {
    /// Its limit of dials pending (or not known: the table and the agents change together
    /// under the lock, so never).
    Busy,
    /// Its limit of tunnels.
    Full,
}

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

/// What became of the session a new one of the same agent replaced ([`Registry::register`]).
#[derive(Debug)]
pub enum Replaced {
    /// Kept, draining: routed nothing new, its open tunnels go on until its agent ends the
    /// session (an old pod, once told to stop) or its keepalive gives up on it.
    Draining,
    /// To be closed by the caller: keeping it would pass the identity's session cap, and a
    /// reconnect is never refused for its own predecessor.
    Close(Mux),
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
                peers: Peers::new(strategies.clone()),
                local: Local {
                    table: RouteTable::new(strategies),
                    agents: HashMap::new(),
                    by_name: HashMap::new(),
                    per_identity: HashMap::new(),
                },
                next_key: 1,
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

    /// Adds a connected agent; returns its key for [`Registry::unregister`] and what became of
    /// the session it replaced (same id, same identity).
    pub fn register(
        &self,
        registration: Registration,
    ) -> Result<(AgentKey, Option<Replaced>), RegisterError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let local = &mut state.local;
        let replaced = match local.by_name.get(&registration.name) {
            Some(&old) => {
                let existing = &local.agents[&old];
                if existing.identity != registration.identity {
                    return Err(RegisterError::IdTaken {
                        id: registration.name,
                        existing: format!("{} from {}", existing.identity, existing.peer),
                    });
                }
                Some(old)
            }
            None => None,
        };
        let sessions = local
            .per_identity
            .get(&registration.identity)
            .copied()
            .unwrap_or(0);
        // The session it replaces makes room for it, if need be (closed below).
        if sessions - usize::from(replaced.is_some()) >= self.max_sessions_per_identity {
            return Err(RegisterError::TooManySessions {
                identity: registration.identity,
                limit: self.max_sessions_per_identity,
            });
        }
        let replaced = replaced.and_then(|old| {
            if sessions < self.max_sessions_per_identity {
                local.drain(old);
                Some(Replaced::Draining)
            } else {
                local.remove(old).map(|agent| Replaced::Close(agent.mux))
            }
        });
        let key = state.next_key;
        state.next_key += 1;
        local.table.insert(key, &registration.identifiers);
        local.by_name.insert(registration.name.clone(), key);
        *local
            .per_identity
            .entry(registration.identity.clone())
            .or_default() += 1;
        local.agents.insert(
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
        drop(guard);
        self.changed();
        Ok((key, replaced))
    }

    /// Forgets the session `key` (a no-op when it is gone already, e.g. replaced).
    pub fn unregister(&self, key: AgentKey) {
        let removed = self.lock().local.remove(key).is_some();
        if removed {
            self.changed();
        }
    }

    /// The agent announced DRAIN: route nothing new to it.
    pub fn set_draining(&self, key: AgentKey) {
        self.lock().local.drain(key);
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
            .local
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
        let session = PeerSession(state.next_key);
        state.next_key += 1;
        let replaced = state.peers.add(id, mux, session);
        (session, replaced)
    }

    /// The session `session` with peer `id` ended: its agents are forgotten (a no-op when a
    /// newer session replaced it).
    pub fn remove_peer(&self, id: &str, session: PeerSession) {
        self.lock().peers.remove(id, Some(session));
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
        let State {
            peers, next_key, ..
        } = &mut *state;
        peers.set_agent(id, session, remote, identifiers, draining, next_key);
    }

    /// Peer `id` no longer holds agent `remote`.
    pub fn remove_peer_agent(&self, id: &str, session: PeerSession, remote: u64) {
        self.lock().peers.remove_agent(id, session, remote);
    }

    /// How many agents the peers hold, together.
    pub fn peer_agent_count(&self) -> usize {
        self.lock().peers.agent_count()
    }

    /// The peers this server forwards to, with how many agents each holds, by id.
    pub fn peers(&self) -> Vec<(String, usize)> {
        self.lock().peers.list()
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
        let tables = [
            (Table::Local, &state.local.table),
            (Table::Peers, &state.peers.table),
        ];
        let tables = if peers { &tables[..] } else { &tables[..1] };
        let load = |table, key| match table {
            Table::Local => state.local.room(
                key,
                self.max_tunnels_per_agent,
                self.max_pending_dials_per_agent,
            ),
            Table::Peers => state.peers.load(key).ok_or(NoRoom::Busy),
        };
        let strategies = state.local.table.strategies();
        match router::route(strategies, tables, target, load, &mut rand::rng()) {
            Ok((table, route)) => Ok(Candidates {
                strategy: route.strategy,
                agents: route
                    .candidates
                    .into_iter()
                    .filter_map(|key| match table {
                        Table::Local => state.local.candidate(key),
                        Table::Peers => state.peers.candidate(key),
                    })
                    .collect(),
            }),
            Err(Unrouted::NoRoute(no_route)) => Err(RouteError::NoRoute(no_route)),
            Err(Unrouted::NoRoom(NoRoom::Full)) => {
                Err(RouteError::Full(self.max_tunnels_per_agent))
            }
            Err(Unrouted::NoRoom(NoRoom::Busy)) => {
                Err(RouteError::Busy(self.max_pending_dials_per_agent))
            }
        }
    }

    /// `/readyz`: ready when the first strategy finds an agent of this server's or of a
    /// peer's.
    pub fn ready(&self) -> Result<(), String> {
        let state = self.lock();
        state
            .local
            .table
            .ready()
            .or_else(|own| state.peers.table.ready().map_err(|_| own))
    }

    /// Usable agents per configured strategy, this server's and its peers'.
    pub fn ready_backends(&self) -> Vec<(crate::routing::router::Strategy, usize)> {
        let state = self.lock();
        let remote = state.peers.table.ready_backends();
        let mut backends = state.local.table.ready_backends();
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
        self.lock()
            .local
            .agents
            .values()
            .map(|a| a.mux.clone())
            .collect()
    }

    /// What `GET /agents` shows, ordered by key (connection order). The lock is held only to
    /// copy handles (an `Arc` of each agent's identifiers); formatting happens after it.
    pub fn views(&self) -> Vec<AgentView> {
        let snapshot: Vec<_> = {
            let state = self.lock();
            state
                .local
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

impl Local {
    /// Agent `key`'s open tunnels, or why it has no room for another.
    fn room(
        &self,
        key: AgentKey,
        max_tunnels: usize,
        max_pending_dials: usize,
    ) -> Result<usize, NoRoom> {
        let (open, pending) = self
            .agents
            .get(&key)
            .map(|agent| agent.mux.load())
            .ok_or(NoRoom::Busy)?;
        if open >= max_tunnels {
            Err(NoRoom::Full)
        } else if pending >= max_pending_dials {
            Err(NoRoom::Busy)
        } else {
            Ok(open)
        }
    }

    /// Agent `key` as a route's candidate.
    fn candidate(&self, key: AgentKey) -> Option<Candidate> {
        let agent = self.agents.get(&key)?;
        Some(Candidate {
            key,
            agent: agent.name.clone(),
            mux: agent.mux.clone(),
            via: None,
        })
    }

    /// Routes nothing new to `key`; its open tunnels go on.
    fn drain(&mut self, key: AgentKey) {
        self.table.set_draining(key, true);
        if let Some(agent) = self.agents.get_mut(&key) {
            agent.draining = true;
        }
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
