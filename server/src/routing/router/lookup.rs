//! The strategy loop: the one place that decides which strategy, and which of several tables'
//! agents, carries a tunnel. [`RouteTable::route`] asks it with one table; the registry with
//! its own agents' table and then its peers' (`crate::routing::registry`), on every CONNECT.

use rand::Rng;

use super::{pick, AgentKey, NoRoute, Route, RouteTable, Strategy, TargetHost};

/// Why [`route`] found no agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted<E> {
    /// No strategy matched a usable agent in any table.
    NoRoute(NoRoute),
    /// A strategy matched agents, but none of those ranked first had room, in any table: the
    /// worst reason `load` gave for them (the first table's that had one).
    NoRoom(E),
}

/// Finds agents for `target`: `strategies` are tried in order and, for each, the `tables` in
/// order; the first table where the strategy matches a usable (non-draining) agent with room
/// wins. Its [`pick`]: up to [`MAX_CANDIDATES`](super::MAX_CANDIDATES) agents, least loaded
/// first, ties in random order, a sample of [`SAMPLE`](super::SAMPLE) ranked when more match.
///
/// `load(table, agent)` is the agent's open tunnel count, or why it has no room for another
/// (`E`, ordered from mild to worst); the agents without room rank last and are left out. When
/// a strategy matches but every agent ranked first lacks room in every table, the strategies
/// after it are not tried: its reason is the answer, as a client is better told "full" than
/// sent through a worse route. Each table is named by the caller's `T`, handed back with the
/// route.
pub fn route<T: Copy, E: Ord + Copy, R: Rng + ?Sized>(
    strategies: &[Strategy],
    tables: &[(T, &RouteTable)],
    target: &TargetHost,
    load: impl Fn(T, AgentKey) -> Result<usize, E>,
    rng: &mut R,
) -> Result<(T, Route), Unrouted<E>> {
    for &strategy in strategies {
        let mut no_room = None;
        for &(name, table) in tables {
            let Some(set) = table.matching(strategy, target) else {
                continue;
            };
            match pick::rank(set.usable(), |agent| load(name, agent), rng) {
                Ok(candidates) if !candidates.is_empty() => {
                    return Ok((
                        name,
                        Route {
                            strategy,
                            candidates,
                        },
                    ))
                }
                Ok(_) => {}
                Err(reason) => no_room = no_room.or(Some(reason)),
            }
        }
        if let Some(reason) = no_room {
            return Err(Unrouted::NoRoom(reason));
        }
    }
    Err(Unrouted::NoRoute(NoRoute {
        tried: strategies.to_vec(),
    }))
}
