//! The `destHost` storage: one hash lookup from a target host to the agents that announced it.

use super::agent_set::{AgentSet, KeyedSets};
use super::target::{HostKey, TargetHost};
use super::AgentKey;

/// Agents by [`HostKey`]: every agent's `host=`, `ipv4=` and `ipv6=` identifiers.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostIndex {
    keys: KeyedSets<HostKey>,
    /// Agents holding at least one key, for readiness.
    members: AgentSet,
}

impl HostIndex {
    /// The agents whose identifiers equal `target`, if any of them is usable.
    pub(crate) fn lookup(&self, target: &TargetHost) -> Option<&AgentSet> {
        self.keys
            .get(&HostKey::from(target))
            .filter(|set| set.has_usable())
    }

    /// Agents holding at least one key.
    pub(crate) fn members(&self) -> &AgentSet {
        &self.members
    }

    /// Adds `agent` under each of `keys` (deduplicated by the caller).
    pub(crate) fn insert(&mut self, agent: AgentKey, keys: &[HostKey], draining: bool) {
        for key in keys {
            self.keys.insert(key.clone(), agent, draining);
        }
        if !keys.is_empty() {
            self.members.insert(agent, draining);
        }
    }

    /// Removes `agent` from under each of `keys`, the keys it was inserted with.
    pub(crate) fn remove(&mut self, agent: AgentKey, keys: &[HostKey]) {
        for key in keys {
            self.keys.remove(key, agent);
        }
        self.members.remove(agent);
    }

    /// Marks `agent` draining or usable under each of `keys`.
    pub(crate) fn set_draining(&mut self, agent: AgentKey, keys: &[HostKey], draining: bool) {
        for key in keys {
            self.keys.set_draining(key, agent, draining);
        }
        self.members.set_draining(agent, draining);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_by_kind_and_cleanup() {
        let mut index = HostIndex::default();
        let keys = [HostKey::from_host("node1"), HostKey::from_host("10.0.0.5")];
        index.insert(7, &keys, false);
        assert_eq!(
            index
                .lookup(&TargetHost::parse("NODE1."))
                .map(AgentSet::usable),
            Some(&[7][..])
        );
        assert!(index
            .lookup(&TargetHost::parse("::ffff:10.0.0.5"))
            .is_some());
        assert!(index.lookup(&TargetHost::parse("node2")).is_none());
        index.set_draining(7, &keys, true);
        assert!(index.lookup(&TargetHost::parse("node1")).is_none());
        assert!(!index.members().has_usable());
        index.remove(7, &keys);
        assert_eq!(index.keys.len(), 0);
        assert!(index.members().is_empty());
    }
}
