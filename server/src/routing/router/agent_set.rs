//! [`AgentSet`]: the agents that match one key, with O(1) insert, remove, drain toggle and
//! uniform sampling of the usable ones.
//!
//! Members live in one `Vec`, partitioned: `members[..active]` are usable, `members[active..]`
//! are draining. Moving an agent across the boundary or removing it is a couple of swaps, and
//! sampling only ever looks at the usable prefix, so a set whose agents are all draining is
//! recognised without looking at any of them.

use std::collections::HashMap;
use std::hash::Hash;

use super::AgentKey;

/// Sets up to this size find a member by a linear search of the `Vec`, which is faster than
/// hashing for a handful of agents and costs no allocation; larger sets keep a position index.
const LINEAR_MAX: usize = 16;

/// The agents that match one key (one host, one network, or a whole strategy).
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentSet {
    /// Usable agents first, then draining ones.
    members: Vec<AgentKey>,
    /// How many of `members` are usable.
    active: usize,
    /// Position of every member in `members`, kept only once the set outgrows [`LINEAR_MAX`].
    positions: Option<HashMap<AgentKey, usize>>,
}

impl AgentSet {
    /// The usable (non-draining) agents, in no particular order.
    pub(crate) fn usable(&self) -> &[AgentKey] {
        &self.members[..self.active]
    }

    /// True when at least one member is not draining.
    pub(crate) fn has_usable(&self) -> bool {
        self.active > 0
    }

    /// True when the set has no members at all, draining or not.
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Adds `agent` (a no-op if it is already a member).
    pub(crate) fn insert(&mut self, agent: AgentKey, draining: bool) {
        if self.position(agent).is_some() {
            return;
        }
        let at = self.members.len();
        self.members.push(agent);
        if let Some(positions) = &mut self.positions {
            positions.insert(agent, at);
        } else if self.members.len() > LINEAR_MAX {
            self.positions = Some(
                self.members
                    .iter()
                    .enumerate()
                    .map(|(i, &a)| (a, i))
                    .collect(),
            );
        }
        if !draining {
            self.swap(at, self.active);
            self.active += 1;
        }
    }

    /// Removes `agent`; returns whether it was a member.
    pub(crate) fn remove(&mut self, agent: AgentKey) -> bool {
        let Some(mut at) = self.position(agent) else {
            return false;
        };
        if at < self.active {
            // Move it to the end of the usable prefix, then shrink the prefix past it.
            self.active -= 1;
            self.swap(at, self.active);
            at = self.active;
        }
        let last = self.members.len() - 1;
        self.swap(at, last);
        self.members.pop();
        if let Some(positions) = &mut self.positions {
            positions.remove(&agent);
            if self.members.len() <= LINEAR_MAX / 2 {
                self.positions = None;
            }
        }
        true
    }

    /// Marks `agent` draining (skipped by sampling) or usable again.
    pub(crate) fn set_draining(&mut self, agent: AgentKey, draining: bool) {
        let Some(at) = self.position(agent) else {
            return;
        };
        match (at < self.active, draining) {
            (true, true) => {
                self.active -= 1;
                self.swap(at, self.active);
            }
            (false, false) => {
                self.swap(at, self.active);
                self.active += 1;
            }
            _ => {}
        }
    }

    fn position(&self, agent: AgentKey) -> Option<usize> {
        match &self.positions {
            Some(positions) => positions.get(&agent).copied(),
            None => self.members.iter().position(|&a| a == agent),
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        if a == b {
            return;
        }
        self.members.swap(a, b);
        if let Some(positions) = &mut self.positions {
            positions.insert(self.members[a], a);
            positions.insert(self.members[b], b);
        }
    }

    #[cfg(test)]
    fn check(&self) {
        assert!(self.active <= self.members.len());
        if let Some(positions) = &self.positions {
            assert_eq!(positions.len(), self.members.len());
            for (i, a) in self.members.iter().enumerate() {
                assert_eq!(positions[a], i);
            }
        }
        let mut sorted = self.members.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), self.members.len(), "duplicate member");
    }
}

/// One [`AgentSet`] per key (a host, a network); a key exists while some agent holds it.
#[derive(Debug, Clone)]
pub(crate) struct KeyedSets<K> {
    sets: HashMap<K, AgentSet>,
}

impl<K> Default for KeyedSets<K> {
    fn default() -> Self {
        KeyedSets {
            sets: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> KeyedSets<K> {
    /// The set for `key`, if some agent holds it.
    pub(crate) fn get(&self, key: &K) -> Option<&AgentSet> {
        self.sets.get(key)
    }

    /// Adds `agent` under `key`; returns true if the key is new.
    pub(crate) fn insert(&mut self, key: K, agent: AgentKey, draining: bool) -> bool {
        let mut created = false;
        self.sets
            .entry(key)
            .or_insert_with(|| {
                created = true;
                AgentSet::default()
            })
            .insert(agent, draining);
        created
    }

    /// Removes `agent` from under `key`; returns true if that left the key without agents
    /// (the key is then dropped).
    pub(crate) fn remove(&mut self, key: &K, agent: AgentKey) -> bool {
        let Some(set) = self.sets.get_mut(key) else {
            return false;
        };
        set.remove(agent);
        if set.is_empty() {
            self.sets.remove(key);
            return true;
        }
        false
    }

    /// Marks `agent` draining or usable under `key`.
    pub(crate) fn set_draining(&mut self, key: &K, agent: AgentKey, draining: bool) {
        if let Some(set) = self.sets.get_mut(key) {
            set.set_draining(agent, draining);
        }
    }

    /// How many keys some agent holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn usable(set: &AgentSet) -> BTreeSet<AgentKey> {
        set.usable().iter().copied().collect()
    }

    #[test]
    fn insert_remove_drain() {
        let mut set = AgentSet::default();
        assert!(set.is_empty());
        assert!(!set.has_usable());
        set.insert(1, false);
        set.insert(2, true);
        set.insert(3, false);
        set.insert(3, false);
        set.check();
        assert_eq!(usable(&set), BTreeSet::from([1, 3]));
        set.set_draining(1, true);
        assert_eq!(usable(&set), BTreeSet::from([3]));
        set.set_draining(2, false);
        assert_eq!(usable(&set), BTreeSet::from([2, 3]));
        assert!(set.remove(3));
        assert!(!set.remove(3));
        set.check();
        assert_eq!(usable(&set), BTreeSet::from([2]));
        set.set_draining(2, true);
        assert!(!set.has_usable());
        assert!(!set.is_empty());
        assert!(set.remove(1));
        assert!(set.remove(2));
        assert!(set.is_empty());
    }

    /// A set keeps its position index only while it has more than [`LINEAR_MAX`] members: it
    /// is built when the 17th joins and let go once removals leave half that.
    #[test]
    fn only_sets_of_more_than_16_keep_a_position_index() {
        let mut set = AgentSet::default();
        for agent in 0..LINEAR_MAX as AgentKey {
            set.insert(agent, false);
            assert!(set.positions.is_none(), "{} members", set.members.len());
        }
        set.insert(LINEAR_MAX as AgentKey, false);
        assert!(set.positions.is_some());
        set.check();
        for agent in (0..=LINEAR_MAX as AgentKey).rev() {
            set.remove(agent);
            set.check();
            let len = set.members.len();
            assert_eq!(
                set.positions.is_some(),
                len > LINEAR_MAX / 2,
                "{len} members"
            );
            if len == LINEAR_MAX / 2 {
                break;
            }
        }
        assert_eq!(set.members.len(), 8);
    }

    /// Random operations against a model, across the linear/indexed threshold both ways.
    #[test]
    fn matches_model() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut set = AgentSet::default();
        let mut model: std::collections::BTreeMap<AgentKey, bool> = Default::default();
        for _ in 0..20_000 {
            let agent = rng.random_range(0..40);
            match rng.random_range(0..4) {
                0 | 1 => {
                    let draining = rng.random_bool(0.3);
                    set.insert(agent, draining);
                    model.entry(agent).or_insert(draining);
                }
                2 => assert_eq!(set.remove(agent), model.remove(&agent).is_some()),
                _ => {
                    let draining = rng.random_bool(0.5);
                    set.set_draining(agent, draining);
                    if let Some(d) = model.get_mut(&agent) {
                        *d = draining;
                    }
                }
            }
            set.check();
            let want: BTreeSet<_> = model.iter().filter(|(_, &d)| !d).map(|(&a, _)| a).collect();
            assert_eq!(usable(&set), want);
            assert_eq!(set.members.len(), model.len());
        }
    }
}
