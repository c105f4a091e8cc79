//! Who simulated agent `i` says it is: an id, a node name and an IPv4 address, distinct per
//! agent. The addresses are synthetic (10.0.0.0/8): the server only routes by them, and the
//! simulated agent answers every dial itself, so nothing ever dials them.

use std::net::Ipv4Addr;

/// Port of the CONNECTs the bench sends to an agent's address (kubelet's, as kube-apiserver
/// would); the simulated agent echoes whatever port is asked for.
pub const TARGET_PORT: u16 = 10250;

/// Most agents the synthetic addresses number (10.0.0.1 up to 10.255.255.254).
pub const MAX_AGENTS: usize = (1 << 24) - 2;

/// The identifiers of one simulated agent.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `fleet-00042`.
    pub id: String,
    /// `node-00042`.
    pub host: String,
    /// `10.0.0.43` (agent 0 is 10.0.0.1).
    pub ipv4: Ipv4Addr,
}

impl Identity {
    /// Agent `index` (below [`MAX_AGENTS`]).
    pub fn of(index: usize) -> Identity {
        Identity {
            id: format!("fleet-{index:05}"),
            host: format!("node-{index:05}"),
            ipv4: ipv4(index),
        }
    }

    /// The upgrade URL's query (docs/protocol.md §2): every value is plain ASCII, so nothing
    /// needs encoding.
    pub fn query(&self) -> String {
        format!("id={}&host={}&ipv4={}", self.id, self.host, self.ipv4)
    }

    /// Whether a dial for `host` was meant for this agent (its node name or its address), as
    /// the server's destHost strategy matches them.
    pub fn owns(&self, host: &str) -> bool {
        host.parse::<Ipv4Addr>().map_or_else(
            |_| host.trim_end_matches('.').eq_ignore_ascii_case(&self.host),
            |ip| ip == self.ipv4,
        )
    }
}

/// The synthetic address of agent `index`.
pub fn ipv4(index: usize) -> Ipv4Addr {
    let n = u32::try_from(index.min(MAX_AGENTS - 1)).unwrap_or(0) + 1;
    Ipv4Addr::from(0x0A00_0000 | n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_distinct_and_own_only_their_own_names() {
        let a = Identity::of(0);
        let b = Identity::of(255);
        assert_eq!(a.ipv4, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(b.ipv4, Ipv4Addr::new(10, 0, 1, 0));
        assert_eq!(a.query(), "id=fleet-00000&host=node-00000&ipv4=10.0.0.1");
        assert!(a.owns("10.0.0.1"));
        assert!(a.owns("NODE-00000."));
        assert!(!a.owns("10.0.1.0"));
        assert!(!a.owns("node-00255"));
        assert!(b.owns("node-00255"));
    }
}
