//! The destination policy: where a tunnel may lead. One rule for both ends that hand a target
//! on: the agent checks every address a dial resolves to, after DNS, so a name cannot smuggle a
//! forbidden address past it; the server checks the IP-literal targets it relays to
//! `--fallback-proxy`, whose own agents (konnectivity's) check nothing.
//!
//! Denied by default: the link-local ranges (`169.254.0.0/16`, `fe80::/10`) and so the cloud
//! metadata endpoints in them (`169.254.169.254`, and AWS's `fd00:ec2::254`), `0.0.0.0/8` and
//! `::` (which reach the host itself), and the checker's own listening ports on its loopback,
//! its unspecified address and the addresses it announces. Loopback stays allowed by default:
//! single-host setups and tests use it; docs/security.md recommends denying it in production.
//!
//! Operators add rules (on the agent `--allowed-destinations`, `--denied-destinations`; for the
//! fallback `--fallback-denied-destinations`, `--fallback-exempt-destinations`), each a
//! comma-separated list of `CIDR`, `CIDR:PORT` or `CIDR:LOW-HIGH`, IPv6 CIDRs in brackets when
//! a port follows: with an allow list, only what it matches is allowed; a deny rule always
//! wins; an exemption lifts a default denial for what it matches. An allow rule that names a
//! destination exactly (a /32 or /128) is an exemption too, to reach a link-local service on
//! purpose; a broader one is not, so that `0.0.0.0/0` does not open the metadata endpoint.
//!
//! What this leaves out: names. Whoever resolves a name checks its addresses; a name relayed to
//! the fallback is resolved, and so checked, by nobody here.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;

use ipnet::IpNet;

/// One rule: a network and a port range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    net: IpNet,
    ports: RangeInclusive<u16>,
}

impl Rule {
    fn matches(&self, addr: SocketAddr) -> bool {
        self.net.contains(&canonical(addr.ip())) && self.ports.contains(&addr.port())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (*self.ports.start(), *self.ports.end()) {
            (0, u16::MAX) => write!(f, "{}", self.net),
            (low, high) if low == high => match self.net {
                IpNet::V6(_) => write!(f, "[{}]:{low}", self.net),
                IpNet::V4(_) => write!(f, "{}:{low}", self.net),
            },
            (low, high) => match self.net {
                IpNet::V6(_) => write!(f, "[{}]:{low}-{high}", self.net),
                IpNet::V4(_) => write!(f, "{}:{low}-{high}", self.net),
            },
        }
    }
}

/// As the operator writes it, for `/config`.
impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        to.collect_str(self)
    }
}

/// Why a rule list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad destination rule {rule:?}: {reason} (expected CIDR, CIDR:PORT or CIDR:LOW-HIGH; [IPv6/len]:PORT)")]
pub struct RuleError {
    rule: String,
    reason: &'static str,
}

/// Parses a comma-separated rule list (empty entries ignored).
pub fn parse_rules(list: &str) -> Result<Vec<Rule>, RuleError> {
    list.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(parse_rule)
        .collect()
}

fn parse_rule(entry: &str) -> Result<Rule, RuleError> {
    let bad = |reason| RuleError {
        rule: entry.to_owned(),
        reason,
    };
    let (net, ports) = if let Some(rest) = entry.strip_prefix('[') {
        let (net, rest) = rest.split_once(']').ok_or(bad("unclosed ["))?;
        let ports = match rest {
            "" => None,
            rest => Some(rest.strip_prefix(':').ok_or(bad("expected : after ]"))?),
        };
        (net, ports)
    } else if entry.matches(':').count() == 1 {
        let (net, ports) = entry.split_once(':').ok_or(bad("no port"))?;
        (net, Some(ports))
    } else {
        (entry, None)
    };
    let net = match net.parse::<IpNet>() {
        Ok(net) => net.trunc(),
        Err(_) => {
            let ip = net.parse::<IpAddr>().map_err(|_| bad("not a network"))?;
            IpNet::from(ip)
        }
    };
    let ports = match ports {
        None => 0..=u16::MAX,
        Some(ports) => {
            let (low, high) = ports.split_once('-').unwrap_or((ports, ports));
            let port = |p: &str| p.parse::<u16>().map_err(|_| bad("not a port"));
            let (low, high) = (port(low)?, port(high)?);
            if low > high {
                return Err(bad("port range upside down"));
            }
            low..=high
        }
    };
    Ok(Rule { net, ports })
}

/// Why a destination was refused; the flag named is the one whose rule decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("{0} is not in {1}")]
    NotAllowed(SocketAddr, &'static str),
    #[error("{0} is denied by {1} {2}")]
    Operator(SocketAddr, &'static str, String),
    #[error("{0} is denied by default: {1}")]
    BuiltIn(SocketAddr, &'static str),
}

/// The flags an operator writes a policy's rules in, for refusals to name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleFlags {
    pub allowed: &'static str,
    pub denied: &'static str,
}

impl RuleFlags {
    /// The agent's.
    pub const AGENT: RuleFlags = RuleFlags {
        allowed: "--allowed-destinations",
        denied: "--denied-destinations",
    };
    /// The server's, for what it relays to `--fallback-proxy`.
    pub const FALLBACK: RuleFlags = RuleFlags {
        allowed: "--fallback-allowed-destinations",
        denied: "--fallback-denied-destinations",
    };
}

impl Default for RuleFlags {
    fn default() -> RuleFlags {
        RuleFlags::AGENT
    }
}

/// A destination policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    flags: RuleFlags,
    allowed: Vec<Rule>,
    denied: Vec<Rule>,
    /// What the default denials do not cover: exact allow rules, and explicit exemptions.
    exempt: Vec<Rule>,
    /// The checker's own listening ports.
    own_ports: Vec<u16>,
    /// Addresses that are this host (besides loopback and unspecified): what it announces.
    own_addresses: Vec<IpAddr>,
}

impl Policy {
    /// The policy of `allowed` and `denied` rules, written in `flags`, with `own_ports`
    /// denied on this host (loopback, unspecified, `own_addresses`).
    pub fn new(
        flags: RuleFlags,
        allowed: Vec<Rule>,
        denied: Vec<Rule>,
        own_ports: Vec<u16>,
        own_addresses: Vec<IpAddr>,
    ) -> Policy {
        // Only an allow rule that names one address lifts a default denial.
        let exempt = allowed
            .iter()
            .filter(|rule| rule.net.prefix_len() == rule.net.max_prefix_len())
            .cloned()
            .collect();
        Policy {
            flags,
            allowed,
            denied,
            exempt,
            own_ports,
            own_addresses: own_addresses.into_iter().map(canonical).collect(),
        }
    }

    /// This policy with the default denials lifted for what `rules` match, whatever their
    /// prefix length (a deny rule and the allow list still apply).
    pub fn exempting(mut self, rules: Vec<Rule>) -> Policy {
        self.exempt.extend(rules);
        self
    }

    /// Whether the agent may connect to `addr`.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Denied> {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        if let Some(rule) = self.denied.iter().find(|rule| rule.matches(addr)) {
            return Err(Denied::Operator(addr, self.flags.denied, rule.to_string()));
        }
        let allowed = self.allowed.iter().any(|rule| rule.matches(addr));
        if !self.allowed.is_empty() && !allowed {
            return Err(Denied::NotAllowed(addr, self.flags.allowed));
        }
        match self.built_in(addr) {
            Some(reason) if !self.exempt.iter().any(|rule| rule.matches(addr)) => {
                Err(Denied::BuiltIn(addr, reason))
            }
            _ => Ok(()),
        }
    }

    fn built_in(&self, addr: SocketAddr) -> Option<&'static str> {
        let ip = addr.ip();
        let is_self = ip.is_loopback() || ip.is_unspecified() || self.own_addresses.contains(&ip);
        if is_self && self.own_ports.contains(&addr.port()) {
            return Some("this process's own port");
        }
        match ip {
            IpAddr::V4(v4) if v4.is_link_local() => Some("link-local (cloud metadata)"),
            IpAddr::V4(v4) if v4.octets()[0] == 0 => Some("0.0.0.0/8 (this host)"),
            IpAddr::V6(v6) if v6.is_unspecified() => Some(":: (this host)"),
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => {
                Some("link-local (cloud metadata)")
            }
            IpAddr::V6(v6) if v6 == AWS_METADATA_V6 => Some("cloud metadata"),
            _ => None,
        }
    }
}

/// AWS's IPv6 instance metadata endpoint.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// An IPv4-mapped IPv6 address is its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rules_parse_and_print() {
        let rules = parse_rules(
            "10.0.0.0/8, 10.1.2.3:10250 ,[fd00::/8]:443,192.168.0.0/16:80-90,[fd00::1]",
        )
        .unwrap();
        let printed: Vec<String> = rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            [
                "10.0.0.0/8",
                "10.1.2.3/32:10250",
                "[fd00::/8]:443",
                "192.168.0.0/16:80-90",
                "fd00::1/128"
            ]
        );
        for bad in [
            "10.0.0.0/33",
            "x",
            "10.0.0.0/8:x",
            "10.0.0.0/8:9-1",
            "[fd00::/8",
            "[fd00::]x",
        ] {
            assert!(parse_rules(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rules(" , ").unwrap(), []);
    }

    #[test]
    fn defaults_deny_metadata_this_host_and_own_ports() {
        let policy = Policy::new(
            RuleFlags::AGENT,
            vec![],
            vec![],
            vec![8093],
            vec!["10.0.0.5".parse().unwrap()],
        );
        for denied in [
            "169.254.169.254:80",
            "169.254.0.1:443",
            "0.0.0.0:22",
            "[::]:22",
            "[fe80::1]:80",
            "[fd00:ec2::254]:80",
            "[::ffff:169.254.169.254]:80",
            "127.0.0.1:8093",
            "10.0.0.5:8093",
            "0.0.0.0:8093",
        ] {
            assert!(policy.check(addr(denied)).is_err(), "{denied}");
        }
        for allowed in [
            "127.0.0.1:8080",
            "10.0.0.5:10250",
            "10.0.0.6:8093",
            "[fd00::1]:443",
        ] {
            assert_eq!(policy.check(addr(allowed)), Ok(()), "{allowed}");
        }
    }

    #[test]
    fn operator_rules() {
        let policy = Policy::new(
            RuleFlags::AGENT,
            parse_rules("10.0.0.0/8,169.254.169.254/32:80").unwrap(),
            parse_rules("10.9.0.0/16,10.0.0.1:22").unwrap(),
            vec![],
            vec![],
        );
        assert_eq!(policy.check(addr("10.1.1.1:443")), Ok(()));
        assert!(matches!(
            policy.check(addr("192.168.1.1:443")),
            Err(Denied::NotAllowed(..))
        ));
        assert!(matches!(
            policy.check(addr("10.9.1.1:443")),
            Err(Denied::Operator(..))
        ));
        assert!(matches!(
            policy.check(addr("10.0.0.1:22")),
            Err(Denied::Operator(..))
        ));
        assert_eq!(policy.check(addr("10.0.0.1:23")), Ok(()));
        // An exact allow lifts the default denial; a broader one does not.
        assert_eq!(policy.check(addr("169.254.169.254:80")), Ok(()));
        assert!(matches!(
            policy.check(addr("169.254.169.254:81")),
            Err(Denied::NotAllowed(..))
        ));
        let broad = Policy::new(
            RuleFlags::AGENT,
            parse_rules("169.254.0.0/16").unwrap(),
            vec![],
            vec![],
            vec![],
        );
        assert!(matches!(
            broad.check(addr("169.254.169.254:80")),
            Err(Denied::BuiltIn(..))
        ));
    }

    #[test]
    fn exemptions_lift_default_denials_only_and_refusals_name_their_flag() {
        let policy = Policy::new(
            RuleFlags::FALLBACK,
            vec![],
            parse_rules("169.254.0.0/16:22").unwrap(),
            vec![],
            vec![],
        )
        .exempting(parse_rules("169.254.0.0/16").unwrap());
        // Broad, unlike an allow rule: the whole range is exempt from the default denial.
        assert_eq!(policy.check(addr("169.254.169.254:80")), Ok(()));
        assert_eq!(policy.check(addr("169.254.1.1:443")), Ok(()));
        // A deny rule still wins, and says which flag denied it.
        let denied = policy.check(addr("169.254.1.1:22")).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "169.254.1.1:22 is denied by --fallback-denied-destinations 169.254.0.0/16:22"
        );
        // What the exemption does not cover keeps its default denial.
        assert!(matches!(
            policy.check(addr("[fe80::1]:80")),
            Err(Denied::BuiltIn(..))
        ));
        let allow_list = Policy::new(
            RuleFlags::FALLBACK,
            parse_rules("10.0.0.0/8").unwrap(),
            vec![],
            vec![],
            vec![],
        );
        assert_eq!(
            allow_list
                .check(addr("192.168.0.1:80"))
                .unwrap_err()
                .to_string(),
            "192.168.0.1:80 is not in --fallback-allowed-destinations"
        );
    }
}
