//! The `destCIDR` storage: longest-prefix match without scanning agents.
//!
//! Per address family, one hash map keyed by (prefix length, network address) and the list of
//! prefix lengths in use, longest first. A lookup masks the target address to each length in use
//! and probes the map: at most 33 probes for IPv4 and 129 for IPv6, in practice one per distinct
//! length the agents announced (usually one or two). The first length whose network has a usable
//! agent wins, so the longest prefix wins even when a shorter one has less loaded agents, and a
//! network whose agents are all draining falls back to the next shorter one.

use std::net::IpAddr;

use ipnet::IpNet;

use super::agent_set::{AgentSet, KeyedSets};
use super::target::canonical_ip;
use super::AgentKey;

/// A normalised network: family, prefix length and network address (host bits cleared),
/// right-aligned in a `u128`. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are IPv4 ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Prefix {
    v6: bool,
    len: u8,
    network: u128,
}

impl From<IpNet> for Prefix {
    fn from(net: IpNet) -> Prefix {
        let net = net.trunc();
        match net {
            IpNet::V4(v4) => Prefix::new(false, v4.prefix_len(), u32::from(v4.network()).into()),
            IpNet::V6(v6) => match v6.network().to_ipv4_mapped() {
                Some(v4) if v6.prefix_len() >= 96 => {
                    Prefix::new(false, v6.prefix_len() - 96, u32::from(v4).into())
                }
                _ => Prefix::new(true, v6.prefix_len(), u128::from(v6.network())),
            },
        }
    }
}

impl Prefix {
    fn new(v6: bool, len: u8, address: u128) -> Prefix {
        let bits = if v6 { 128 } else { 32 };
        Prefix {
            v6,
            len,
            network: mask(address, bits, len),
        }
    }
}

/// `address` (right-aligned, `bits` wide) with all but its first `len` bits cleared.
fn mask(address: u128, bits: u8, len: u8) -> u128 {
    let host_bits = u32::from(bits.saturating_sub(len));
    address & u128::MAX.checked_shl(host_bits).unwrap_or(0)
}

/// Agents by network, for one address family.
#[derive(Debug, Clone)]
struct Family {
    /// Address width: 32 or 128.
    bits: u8,
    /// Agents by (prefix length, network address).
    networks: KeyedSets<(u8, u128)>,
    /// How many networks of each prefix length exist (index = length).
    per_len: Vec<usize>,
    /// The prefix lengths in use, longest first.
    lens: Vec<u8>,
}

impl Family {
    fn new(bits: u8) -> Family {
        Family {
            bits,
            networks: KeyedSets::default(),
            per_len: vec![0; usize::from(bits) + 1],
            lens: Vec::new(),
        }
    }

    fn lookup(&self, address: u128) -> Option<&AgentSet> {
        self.lens.iter().find_map(|&len| {
            self.networks
                .get(&(len, mask(address, self.bits, len)))
                .filter(|set| set.has_usable())
        })
    }

    fn insert(&mut self, prefix: Prefix, agent: AgentKey, draining: bool) {
        if self
            .networks
            .insert((prefix.len, prefix.network), agent, draining)
        {
            let count = &mut self.per_len[usize::from(prefix.len)];
            *count += 1;
            if *count == 1 {
                self.refresh_lens();
            }
        }
    }

    fn remove(&mut self, prefix: Prefix, agent: AgentKey) {
        if self.networks.remove(&(prefix.len, prefix.network), agent) {
            let count = &mut self.per_len[usize::from(prefix.len)];
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.refresh_lens();
            }
        }
    }

    fn refresh_lens(&mut self) {
        self.lens = (0..=self.bits)
            .rev()
            .filter(|&len| self.per_len[usize::from(len)] > 0)
            .collect();
    }
}

/// Agents by the networks they announced (`cidr=`), IPv4 and IPv6.
#[derive(Debug, Clone)]
pub(crate) struct CidrIndex {
    v4: Family,
    v6: Family,
    /// Agents holding at least one network, for readiness.
    members: AgentSet,
}

impl Default for CidrIndex {
    fn default() -> Self {
        CidrIndex {
            v4: Family::new(32),
            v6: Family::new(128),
            members: AgentSet::default(),
        }
    }
}

impl CidrIndex {
    /// The agents of the longest announced network containing `ip` that has a usable agent.
    pub(crate) fn lookup(&self, ip: IpAddr) -> Option<&AgentSet> {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => self.v4.lookup(u32::from(v4).into()),
            IpAddr::V6(v6) => self.v6.lookup(u128::from(v6)),
        }
    }

    /// Agents holding at least one network.
    pub(crate) fn members(&self) -> &AgentSet {
        &self.members
    }

    /// Adds `agent` under each of `prefixes` (deduplicated by the caller).
    pub(crate) fn insert(&mut self, agent: AgentKey, prefixes: &[Prefix], draining: bool) {
        for &prefix in prefixes {
            self.family(prefix).insert(prefix, agent, draining);
        }
        if !prefixes.is_empty() {
            self.members.insert(agent, draining);
        }
    }

    /// Removes `agent` from under each of `prefixes`, the ones it was inserted with.
    pub(crate) fn remove(&mut self, agent: AgentKey, prefixes: &[Prefix]) {
        for &prefix in prefixes {
            self.family(prefix).remove(prefix, agent);
        }
        self.members.remove(agent);
    }

    /// Marks `agent` draining or usable under each of `prefixes`.
    pub(crate) fn set_draining(&mut self, agent: AgentKey, prefixes: &[Prefix], draining: bool) {
        for &prefix in prefixes {
            self.family(prefix).networks.set_draining(
                &(prefix.len, prefix.network),
                agent,
                draining,
            );
        }
        self.members.set_draining(agent, draining);
    }

    fn family(&mut self, prefix: Prefix) -> &mut Family {
        if prefix.v6 {
            &mut self.v6
        } else {
            &mut self.v4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(s: &str) -> Prefix {
        Prefix::from(s.parse::<IpNet>().unwrap())
    }

    fn hit(index: &CidrIndex, ip: &str) -> Option<Vec<AgentKey>> {
        index.lookup(ip.parse().unwrap()).map(|s| {
            let mut v = s.usable().to_vec();
            v.sort_unstable();
            v
        })
    }

    #[test]
    fn normalises_prefixes() {
        assert_eq!(prefix("10.1.2.3/8"), prefix("10.0.0.0/8"));
        assert_eq!(prefix("::ffff:10.0.0.0/104"), prefix("10.0.0.0/8"));
        assert_eq!(prefix("::ffff:0.0.0.0/96"), prefix("0.0.0.0/0"));
        assert_ne!(prefix("::/0"), prefix("0.0.0.0/0"));
        assert_eq!(prefix("fd00:0:0:0::1/64"), prefix("fd00::/64"));
        assert_eq!(mask(u128::MAX, 128, 128), u128::MAX);
        assert_eq!(mask(u128::MAX, 128, 0), 0);
        assert_eq!(mask(0xffff_ffff, 32, 0), 0);
        assert_eq!(mask(0xffff_ffff, 32, 32), 0xffff_ffff);
    }

    #[test]
    fn longest_prefix_then_fallback() {
        let mut index = CidrIndex::default();
        index.insert(1, &[prefix("10.0.0.0/8")], false);
        index.insert(2, &[prefix("10.1.0.0/16")], false);
        index.insert(3, &[prefix("10.1.2.0/24"), prefix("fd00::/64")], false);
        index.insert(4, &[prefix("0.0.0.0/0"), prefix("::/0")], false);
        assert_eq!(hit(&index, "10.1.2.3"), Some(vec![3]));
        assert_eq!(hit(&index, "::ffff:10.1.2.3"), Some(vec![3]));
        assert_eq!(hit(&index, "10.1.3.3"), Some(vec![2]));
        assert_eq!(hit(&index, "10.2.3.3"), Some(vec![1]));
        assert_eq!(hit(&index, "192.168.0.1"), Some(vec![4]));
        assert_eq!(hit(&index, "fd00::1"), Some(vec![3]));
        assert_eq!(hit(&index, "fd01::1"), Some(vec![4]));
        index.set_draining(3, &[prefix("10.1.2.0/24"), prefix("fd00::/64")], true);
        assert_eq!(hit(&index, "10.1.2.3"), Some(vec![2]));
        assert_eq!(hit(&index, "fd00::1"), Some(vec![4]));
        index.remove(4, &[prefix("0.0.0.0/0"), prefix("::/0")]);
        assert_eq!(hit(&index, "fd00::1"), None);
        assert_eq!(index.v6.lens, vec![64]);
        index.remove(3, &[prefix("10.1.2.0/24"), prefix("fd00::/64")]);
        assert_eq!(index.v4.lens, vec![16, 8]);
        assert!(index.v6.lens.is_empty());
    }
}
