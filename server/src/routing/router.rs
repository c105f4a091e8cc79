//! The router: which connected agent carries a tunnel to a given target.
//!
//! [`RouteTable`] is a pure, synchronous data structure (no I/O, no locks, no clock); the agent
//! registry keeps it behind its mutex and calls it on every CONNECT, agent connect, disconnect
//! and drain. It tries the `--proxy-strategies` in order ([`Strategy`]); the first strategy with
//! a usable (non-draining) matching agent wins, and up to [`MAX_CANDIDATES`] of its agents come
//! back, least loaded first, ties at random. Above [`SAMPLE`] matches only a random sample of
//! that many is ranked, so a lookup never scans the agents: `destHost` is one hash probe,
//! `destCIDR` one probe per prefix length in use.
//!
//! Layout: [`strategy`](Strategy) names and parsing; [`target`](TargetHost) canonical hosts and
//! keys; `agent_set` the per-key agent sets (O(1) insert, remove, drain, sample); `host_index`
//! and `cidr_index` the `destHost` and `destCIDR` storages; `pick` the ranking; `lookup` the
//! strategy loop ([`route`]), over one table or several (the registry's own agents', then its
//! peers'), the one every route takes.
//!
//! Left out: what "load" is (the caller passes it in) and dialing (the registry tries the
//! candidates in order). `docs/routing.md` is the user-facing description.

mod agent_set;
mod cidr_index;
mod host_index;
mod lookup;
mod pick;
mod strategy;
mod target;

use std::collections::HashMap;
use std::convert::Infallible;

use bridgehead_proto::ident::AgentIdentifiers;
use rand::Rng;

use agent_set::AgentSet;
use cidr_index::{CidrIndex, Prefix};
use host_index::HostIndex;

pub use lookup::{route, Unrouted};
pub use strategy::{parse_strategies, Strategy, StrategyError, VALID_STRATEGIES};
pub use target::{BadTarget, HostKey, Target, TargetHost, TargetProblem};

/// The registry's handle for one connected agent session.
pub type AgentKey = u64;

/// How many agents [`RouteTable::route`] returns at most: the dial is retried on the next one
/// when an agent's session ends before it answers.
pub const MAX_CANDIDATES: usize = 3;

/// Above this many usable matches, [`RouteTable::route`] ranks a uniform random sample of this
/// many instead of all of them (best-of-k sampling).
pub const SAMPLE: usize = 8;

/// The agents chosen for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The strategy that matched.
    pub strategy: Strategy,
    /// One to [`MAX_CANDIDATES`] distinct agents, best first.
    pub candidates: Vec<AgentKey>,
}

/// No strategy found a usable agent for the target (HTTP 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no agent matches (tried {})", list(.tried))]
pub struct NoRoute {
    /// The strategies tried, in order: all of them.
    pub tried: Vec<Strategy>,
}

fn list(strategies: &[Strategy]) -> String {
    let names: Vec<&str> = strategies.iter().map(|s| s.as_str()).collect();
    names.join(", ")
}

/// What the table remembers about one agent, to undo its insertion and toggle its drain.
#[derive(Debug, Clone)]
struct AgentEntry {
    hosts: Vec<HostKey>,
    prefixes: Vec<Prefix>,
    default_route: bool,
    draining: bool,
}

/// The routing state: one storage per strategy in use, and every registered agent.
#[derive(Debug, Clone)]
pub struct RouteTable {
    strategies: Vec<Strategy>,
    agents: HashMap<AgentKey, AgentEntry>,
    dest_host: Option<HostIndex>,
    dest_cidr: Option<CidrIndex>,
    default_route: Option<AgentSet>,
    default: Option<AgentSet>,
}

impl RouteTable {
    /// An empty table for `strategies` (tried in this order). Storages are built only for the
    /// strategies listed.
    pub fn new(strategies: Vec<Strategy>) -> RouteTable {
        let uses = |s| strategies.contains(&s);
        RouteTable {
            dest_host: uses(Strategy::DestHost).then(HostIndex::default),
            dest_cidr: uses(Strategy::DestCidr).then(CidrIndex::default),
            default_route: uses(Strategy::DefaultRoute).then(AgentSet::default),
            default: uses(Strategy::Default).then(AgentSet::default),
            agents: HashMap::new(),
            strategies,
        }
    }

    /// The strategies, in the order they are tried.
    pub fn strategies(&self) -> &[Strategy] {
        &self.strategies
    }

    /// Registers `agent` with its identifiers in every strategy's storage, replacing the
    /// identifiers it had if it is already registered (its draining flag is kept).
    pub fn insert(&mut self, agent: AgentKey, identifiers: &AgentIdentifiers) {
        let draining = self.remove_entry(agent).is_some_and(|e| e.draining);
        let entry = AgentEntry::new(identifiers, draining);
        if let Some(index) = &mut self.dest_host {
            index.insert(agent, &entry.hosts, draining);
        }
        if let Some(index) = &mut self.dest_cidr {
            index.insert(agent, &entry.prefixes, draining);
        }
        if let Some(set) = &mut self.default_route {
            if entry.default_route {
                set.insert(agent, draining);
            }
        }
        if let Some(set) = &mut self.default {
            set.insert(agent, draining);
        }
        self.agents.insert(agent, entry);
    }

    /// Forgets `agent` everywhere (a no-op for an unknown agent).
    pub fn remove(&mut self, agent: AgentKey) {
        self.remove_entry(agent);
    }

    /// Marks `agent` draining: it stays registered but no route chooses it until it is marked
    /// usable again. A no-op for an unknown agent.
    pub fn set_draining(&mut self, agent: AgentKey, draining: bool) {
        let Some(entry) = self.agents.get_mut(&agent) else {
            return;
        };
        if entry.draining == draining {
            return;
        }
        entry.draining = draining;
        if let Some(index) = &mut self.dest_host {
            index.set_draining(agent, &entry.hosts, draining);
        }
        if let Some(index) = &mut self.dest_cidr {
            index.set_draining(agent, &entry.prefixes, draining);
        }
        if let Some(set) = &mut self.default_route {
            set.set_draining(agent, draining);
        }
        if let Some(set) = &mut self.default {
            set.set_draining(agent, draining);
        }
    }

    /// Finds agents for `target`: the strategies are tried in order and the first whose storage
    /// has a usable agent matching `target` wins. This is [`route`] (the loop the registry
    /// routes every CONNECT with) over this one table, every agent with room.
    ///
    /// `load(agent)` is the agent's open tunnel count. Returns up to [`MAX_CANDIDATES`] distinct
    /// agents of the winning strategy, least loaded first, ties in random order. When more than
    /// [`SAMPLE`] agents match, [`SAMPLE`] of them are drawn uniformly at random and only those
    /// are ranked (best-of-k), so the cost does not grow with the number of agents.
    pub fn route<R: Rng + ?Sized>(
        &self,
        target: &TargetHost,
        load: impl Fn(AgentKey) -> usize,
        rng: &mut R,
    ) -> Result<Route, NoRoute> {
        let load = |(), agent| Ok::<_, Infallible>(load(agent));
        match route(&self.strategies, &[((), self)], target, load, rng) {
            Ok(((), route)) => Ok(route),
            Err(Unrouted::NoRoute(no_route)) => Err(no_route),
            Err(Unrouted::NoRoom(never)) => match never {},
        }
    }

    /// For `/readyz`: ready when the first strategy's storage holds at least one usable agent
    /// (as ANP does); otherwise the reason, e.g. `no agent registered for strategy destHost`.
    pub fn ready(&self) -> Result<(), String> {
        let Some(&first) = self.strategies.first() else {
            return Err("no proxy strategy configured".to_owned());
        };
        let members = self.members_of(first);
        if members.is_some_and(AgentSet::has_usable) {
            return Ok(());
        }
        if members.is_some_and(|m| !m.is_empty()) {
            return Err(format!("every agent for strategy {first} is draining"));
        }
        Err(format!("no agent registered for strategy {first}"))
    }

    /// For each configured strategy, how many usable agents its storage holds (ANP's
    /// `ready_backends{proxy_strategy}`).
    pub fn ready_backends(&self) -> Vec<(Strategy, usize)> {
        self.strategies
            .iter()
            .map(|&strategy| {
                let usable = self.members_of(strategy).map_or(0, |m| m.usable().len());
                (strategy, usable)
            })
            .collect()
    }

    /// Every agent `strategy`'s storage holds (`None` when it is not configured).
    fn members_of(&self, strategy: Strategy) -> Option<&AgentSet> {
        match strategy {
            Strategy::DestHost => self.dest_host.as_ref().map(HostIndex::members),
            Strategy::DestCidr => self.dest_cidr.as_ref().map(CidrIndex::members),
            Strategy::DefaultRoute => self.default_route.as_ref(),
            Strategy::Default => self.default.as_ref(),
        }
    }

    /// How many agents are registered, draining or not.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// True when no agent is registered.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The usable agents `strategy` finds for `target`, if any.
    fn matching(&self, strategy: Strategy, target: &TargetHost) -> Option<&AgentSet> {
        match strategy {
            Strategy::DestHost => self.dest_host.as_ref()?.lookup(target),
            Strategy::DestCidr => self.dest_cidr.as_ref()?.lookup(target.ip()?),
            Strategy::DefaultRoute => self.default_route.as_ref(),
            Strategy::Default => self.default.as_ref(),
        }
        .filter(|set| set.has_usable())
    }

    fn remove_entry(&mut self, agent: AgentKey) -> Option<AgentEntry> {
        let entry = self.agents.remove(&agent)?;
        if let Some(index) = &mut self.dest_host {
            index.remove(agent, &entry.hosts);
        }
        if let Some(index) = &mut self.dest_cidr {
            index.remove(agent, &entry.prefixes);
        }
        if let Some(set) = &mut self.default_route {
            set.remove(agent);
        }
        if let Some(set) = &mut self.default {
            set.remove(agent);
        }
        Some(entry)
    }
}

impl AgentEntry {
    /// Canonical, deduplicated keys: `host=10.0.0.5` and `ipv4=10.0.0.5` are one key.
    fn new(identifiers: &AgentIdentifiers, draining: bool) -> AgentEntry {
        let mut hosts: Vec<HostKey> = identifiers
            .hosts
            .iter()
            .map(|h| HostKey::from_host(h))
            .chain(identifiers.ipv4.iter().map(|&ip| HostKey::from(ip)))
            .chain(identifiers.ipv6.iter().map(|&ip| HostKey::from(ip)))
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        let mut prefixes: Vec<Prefix> =
            identifiers.cidrs.iter().map(|&n| Prefix::from(n)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        AgentEntry {
            hosts,
            prefixes,
            default_route: identifiers.default_route,
            draining,
        }
    }
}
