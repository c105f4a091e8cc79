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
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<State>>,
    max_tunnels_per_agent: usize,
}

#[derive(Debug)]
struct State {
    table: RouteTable,
    agents: HashMap<AgentKey, Agent>,
    next_key: AgentKey,
}

#[derive(Debug)]
struct Agent {
    mux: Mux,
    name: String,
    identifiers: AgentIdentifiers,
    peer: SocketAddr,
    since: SystemTime,
    draining: bool,
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
    pub fn new(strategies: Vec<Strategy>, max_tunnels_per_agent: usize) -> Registry {
        Registry {
            inner: Arc::new(Mutex::new(State {
                table: RouteTable::new(strategies),
                agents: HashMap::new(),
                next_key: 1,
            })),
            max_tunnels_per_agent,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a connected agent; returns its key for [`Registry::unregister`].
    pub fn register(
        &self,
        name: String,
        identifiers: AgentIdentifiers,
        peer: SocketAddr,
        mux: Mux,
    ) -> AgentKey {
        let mut state = self.lock();
        let key = state.next_key;
        state.next_key += 1;
        state.table.insert(key, &identifiers);
        state.agents.insert(
            key,
            Agent {
                mux,
                name,
                identifiers,
                peer,
                since: SystemTime::now(),
                draining: false,
            },
        );
        key
    }

    pub fn unregister(&self, key: AgentKey) {
        let mut state = self.lock();
        state.table.remove(key);
        state.agents.remove(&key);
    }

    /// The agent announced DRAIN: route nothing new to it.
    pub fn set_draining(&self, key: AgentKey) {
        let mut state = self.lock();
        state.table.set_draining(key, true);
        if let Some(agent) = state.agents.get_mut(&key) {
            agent.draining = true;
        }
    }

    /// The agents that may carry a tunnel to `target`, best first, skipping full ones.
    pub fn route(&self, target: &TargetHost) -> Result<Candidates, RouteError> {
        let state = self.lock();
        // A full agent ranks last, so a sample with room anywhere yields that agent first.
        let loads = |key: AgentKey| {
            state
                .agents
                .get(&key)
                .map(|agent| agent.mux.open_streams())
                .filter(|&open| open < self.max_tunnels_per_agent)
                .unwrap_or(usize::MAX)
        };
        let route = state.table.route(target, loads, &mut rand::rng())?;
        let agents: Vec<_> = route
            .candidates
            .iter()
            .filter_map(|key| {
                let agent = state.agents.get(key)?;
                (agent.mux.open_streams() < self.max_tunnels_per_agent)
                    .then(|| (*key, agent.name.clone(), agent.mux.clone()))
            })
            .collect();
        if agents.is_empty() {
            return Err(RouteError::Full(self.max_tunnels_per_agent));
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

    /// `--max-tunnels-per-agent`: routing skips an agent that carries this many, and each
    /// agent session refuses more streams.
    pub fn max_tunnels_per_agent(&self) -> usize {
        self.max_tunnels_per_agent
    }

    /// Every live session, e.g. to drain them at shutdown.
    pub fn sessions(&self) -> Vec<Mux> {
        self.lock().agents.values().map(|a| a.mux.clone()).collect()
    }

    /// What `GET /agents` shows, ordered by key (connection order).
    pub fn views(&self) -> Vec<AgentView> {
        let state = self.lock();
        let mut views: Vec<AgentView> = state
            .agents
            .iter()
            .map(|(key, agent)| {
                let ids = &agent.identifiers;
                AgentView {
                    key: *key,
                    id: agent.name.clone(),
                    peer: agent.peer.to_string(),
                    connected_unix: agent
                        .since
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    identifiers: IdentifiersView {
                        host: ids.hosts.clone(),
                        ipv4: ids.ipv4.iter().map(ToString::to_string).collect(),
                        ipv6: ids.ipv6.iter().map(ToString::to_string).collect(),
                        cidr: ids.cidrs.iter().map(ToString::to_string).collect(),
                        default_route: ids.default_route,
                    },
                    open_tunnels: agent.mux.open_streams(),
                    draining: agent.draining || agent.mux.peer_draining(),
                }
            })
            .collect();
        views.sort_by_key(|view| view.key);
        views
    }
}
