//! The connected agents: their sessions, identifiers and the route table over them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;
use serde::Serialize;

use crate::router::{AgentKey, NoRoute, RouteTable, Strategy, TargetHost};

/// Every connected agent, shared by the agent endpoint (which registers sessions) and the
/// frontend (which routes tunnels). The lock is held only for table updates and lookups.
///
/// One live session per agent id: a new session with the id of a live one replaces it when it
/// proves the same identity (a reconnect that came before the old session's death was noticed)
/// and is refused otherwise. Sessions per identity are capped.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<State>>,
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
    pub agents: Vec<(AgentKey, String, Mux)>,
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
                table: RouteTable::new(strategies),
                agents: HashMap::new(),
                by_name: HashMap::new(),
                per_identity: HashMap::new(),
                next_key: 1,
            })),
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
        Ok((key, replaced))
    }

    /// Forgets the session `key` (a no-op when it is gone already, e.g. replaced).
    pub fn unregister(&self, key: AgentKey) {
        self.lock().remove(key);
    }

    /// The agent announced DRAIN: route nothing new to it.
    pub fn set_draining(&self, key: AgentKey) {
        let mut state = self.lock();
        state.table.set_draining(key, true);
        if let Some(agent) = state.agents.get_mut(&key) {
            agent.draining = true;
        }
    }

    /// The agents that may carry a tunnel to `target`, best first, skipping full ones and
    /// those with their limit of dials pending (an agent that never answers cannot take every
    /// dial).
    pub fn route(&self, target: &TargetHost) -> Result<Candidates, RouteError> {
        let state = self.lock();
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
        let route = state.table.route(target, loads, &mut rand::rng())?;
        let mut full = false;
        let agents: Vec<_> = route
            .candidates
            .iter()
            .filter_map(|key| {
                let agent = state.agents.get(key)?;
                let load = agent.mux.load();
                full |= load.0 >= self.max_tunnels_per_agent;
                usable(load).then(|| (*key, agent.name.clone(), agent.mux.clone()))
            })
            .collect();
        if agents.is_empty() {
            return Err(if full {
                RouteError::Full(self.max_tunnels_per_agent)
            } else {
                RouteError::Busy(self.max_pending_dials_per_agent)
            });
        }
        Ok(Candidates {
            strategy: route.strategy,
            agents,
        })
    }

    /// `/readyz`.
    pub fn ready(&self) -> Result<(), String> {
        self.lock().table.ready()
    }

    /// Usable agents per configured strategy.
    pub fn ready_backends(&self) -> Vec<(crate::router::Strategy, usize)> {
        self.lock().table.ready_backends()
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
