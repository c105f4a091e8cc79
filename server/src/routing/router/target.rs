//! What the router matches on: a CONNECT target ([`Target`], parsed and checked once by the
//! frontend), its host ([`TargetHost`]) and an agent's host identifiers ([`HostKey`]), the last
//! two in canonical form.
//!
//! IP literals become addresses, so `fd00:0:0:0:0:0:0:a` and `fd00::a` are one key and an
//! IPv4-mapped IPv6 address (`::ffff:10.0.0.5`) is its IPv4 address. Anything else is a DNS name,
//! compared ASCII-case-insensitively without one trailing dot. A name never equals an address,
//! whatever it spells.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bridgehead_proto::host::{self, HostPort, NameError};

/// A CONNECT request target, checked: an IPv4 literal, a bracketed IPv6 literal or a DNS name,
/// and a port from 1 to 65535.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What the router matches on.
    pub host: TargetHost,
    /// The port.
    pub port: u16,
    /// The host as the client wrote it, without brackets: what the agent dials (a name keeps
    /// its spelling, trailing dot included, for the agent's resolver).
    dial_host: String,
}

/// A request target that is not `host:port`, `[ipv6]:port` or `name:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed CONNECT target {authority:?}: {problem}")]
pub struct BadTarget {
    /// The target as the client sent it.
    pub authority: String,
    /// What is wrong with it.
    pub problem: TargetProblem,
}

/// What is wrong with a [`BadTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetProblem {
    #[error("expected host:port, [ipv6]:port or name:port")]
    Shape,
    #[error("the port must be a number from 1 to 65535")]
    Port,
    #[error("{0}")]
    Name(NameError),
}

impl Target {
    /// Parses the request target of `CONNECT host:port`.
    pub fn parse(authority: &str) -> Result<Target, BadTarget> {
        let bad = |problem| BadTarget {
            authority: authority.to_owned(),
            problem,
        };
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (v6, port) = rest.split_once("]:").ok_or(bad(TargetProblem::Shape))?;
            v6.parse::<Ipv6Addr>()
                .map_err(|_| bad(TargetProblem::Shape))?;
            (v6, port)
        } else {
            let (host, port) = authority
                .rsplit_once(':')
                .ok_or(bad(TargetProblem::Shape))?;
            if host.contains(':') {
                return Err(bad(TargetProblem::Shape));
            }
            host::check_host(host).map_err(|error| bad(TargetProblem::Name(error)))?;
            (host, port)
        };
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(TargetProblem::Port));
        }
        let port = match port.parse::<u16>() {
            Ok(port) if port != 0 => port,
            _ => return Err(bad(TargetProblem::Port)),
        };
        Ok(Target {
            host: TargetHost::parse(host),
            port,
            dial_host: host.to_owned(),
        })
    }

    /// The host the agent dials: an IP literal (IPv6 without brackets) or a name to resolve.
    pub fn dial_host(&self) -> &str {
        &self.dial_host
    }
}

impl fmt::Display for Target {
    /// As the client wrote it: `host:port`, `[ipv6]:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        HostPort(&self.dial_host, self.port).fmt(f)
    }
}

/// The host part of a CONNECT target, normalised for matching.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// An IP literal; IPv4-mapped IPv6 addresses are stored as IPv4.
    Ip(IpAddr),
    /// A DNS name, lower-cased, without a trailing dot.
    Name(String),
}

impl TargetHost {
    /// Normalises `host` as it appears in a CONNECT target, without the port and with the
    /// brackets around an IPv6 literal already removed (brackets that are still there are
    /// stripped too).
    ///
    /// Never fails: whatever is not an IP literal is a name. Rejecting malformed targets is the
    /// frontend's job; a name that no agent announced simply matches nothing.
    pub fn parse(host: &str) -> TargetHost {
        match host::strip_brackets(host).parse::<IpAddr>() {
            Ok(ip) => TargetHost::Ip(canonical_ip(ip)),
            Err(_) => TargetHost::Name(canonical_name(host)),
        }
    }

    /// The target's address, if it is an IP literal.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            TargetHost::Ip(ip) => Some(*ip),
            TargetHost::Name(_) => None,
        }
    }
}

impl fmt::Display for TargetHost {
    /// The canonical form: an address as `Display` writes it (IPv6 without brackets), or the
    /// normalised name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Ip(ip) => ip.fmt(f),
            TargetHost::Name(name) => f.write_str(name),
        }
    }
}

/// One `destHost` key: an agent's `host=`, `ipv4=` or `ipv6=` identifier, typed by kind so that
/// a name and an address never collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostKey {
    /// A DNS name, lower-cased, without a trailing dot.
    Name(String),
    /// An IPv4 address (including IPv4-mapped IPv6 addresses).
    V4(Ipv4Addr),
    /// An IPv6 address that is not IPv4-mapped.
    V6(Ipv6Addr),
}

impl HostKey {
    /// The key for an agent's `host=` value: an IP literal is keyed as that address.
    pub fn from_host(host: &str) -> HostKey {
        HostKey::from(&TargetHost::parse(host))
    }
}

impl From<IpAddr> for HostKey {
    fn from(ip: IpAddr) -> HostKey {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => HostKey::V4(v4),
            IpAddr::V6(v6) => HostKey::V6(v6),
        }
    }
}

impl From<Ipv4Addr> for HostKey {
    fn from(ip: Ipv4Addr) -> HostKey {
        HostKey::V4(ip)
    }
}

impl From<Ipv6Addr> for HostKey {
    fn from(ip: Ipv6Addr) -> HostKey {
        HostKey::from(IpAddr::V6(ip))
    }
}

impl From<&TargetHost> for HostKey {
    fn from(target: &TargetHost) -> HostKey {
        match target {
            TargetHost::Ip(ip) => HostKey::from(*ip),
            TargetHost::Name(name) => HostKey::Name(name.clone()),
        }
    }
}

/// An IPv4-mapped IPv6 address becomes its IPv4 address; everything else is unchanged.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 @ IpAddr::V4(_) => v4,
    }
}

fn canonical_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        let v4 = |s: &str| TargetHost::Ip(IpAddr::V4(s.parse().unwrap()));
        let v6 = |s: &str| TargetHost::Ip(IpAddr::V6(s.parse().unwrap()));
        let name = |s: &str| TargetHost::Name(s.to_owned());
        let cases = [
            ("10.0.0.5", v4("10.0.0.5")),
            ("fd00::a", v6("fd00::a")),
            ("fd00:0:0:0:0:0:0:a", v6("fd00::a")),
            ("FD00::A", v6("fd00::a")),
            ("[fd00::a]", v6("fd00::a")),
            ("::ffff:10.0.0.5", v4("10.0.0.5")),
            ("::ffff:a00:5", v4("10.0.0.5")),
            // IPv4-compatible (deprecated) addresses are not mapped ones.
            ("::10.0.0.5", v6("::a00:5")),
            ("Node1.Example.COM.", name("node1.example.com")),
            ("node1", name("node1")),
            ("node1..", name("node1.")),
            ("10.0.0.5.", name("10.0.0.5")),
            ("fd00--a", name("fd00--a")),
            ("", name("")),
        ];
        for (input, want) in cases {
            assert_eq!(TargetHost::parse(input), want, "{input:?}");
        }
    }

    #[test]
    fn keys_carry_their_kind() {
        assert_eq!(
            HostKey::from_host("10.0.0.5"),
            HostKey::V4(Ipv4Addr::new(10, 0, 0, 5))
        );
        assert_eq!(
            HostKey::from_host("::ffff:10.0.0.5"),
            HostKey::V4(Ipv4Addr::new(10, 0, 0, 5))
        );
        assert_eq!(
            HostKey::from("::ffff:10.0.0.5".parse::<Ipv6Addr>().unwrap()),
            HostKey::V4(Ipv4Addr::new(10, 0, 0, 5))
        );
        assert_eq!(HostKey::from_host("NODE1."), HostKey::Name("node1".into()));
        assert_ne!(HostKey::from_host("fd00--a"), HostKey::from_host("fd00::a"));
    }

    #[test]
    fn targets() {
        let ok = |s: &str, host: &str, port| {
            let target = Target::parse(s).unwrap();
            assert_eq!((target.dial_host(), target.port), (host, port), "{s}");
            assert_eq!(target.host, TargetHost::parse(host), "{s}");
        };
        ok("10.0.0.5:10250", "10.0.0.5", 10250);
        ok("[fd00::5]:10250", "fd00::5", 10250);
        ok("[::1]:80", "::1", 80);
        ok("node-1.example.com:443", "node-1.example.com", 443);
        ok("Node1.:1", "Node1.", 1);
        ok("localhost:65535", "localhost", 65535);
        for bad in [
            "",
            "10.0.0.5",
            "10.0.0.5:",
            ":80",
            "10.0.0.5:0",
            "10.0.0.5:65536",
            "fd00::5:80",
            "[fd00::5]",
            "[fd00::5]80",
            "[nothex]:80",
            "a b:80",
            "host:+80",
            "-bad:80",
            "a..b:80",
            "host:80/path",
            "http://x:80",
            // Spellings resolvers read as 127.0.0.1: no names, and no canonical addresses.
            "2130706433:80",
            "0x7f.1:80",
            "0177.0.0.1:80",
            "127.0.0.1.:80",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(
            Target::parse("[fd00::5]:1").unwrap().to_string(),
            "[fd00::5]:1"
        );
        assert_eq!(Target::parse("Node1.:1").unwrap().to_string(), "Node1.:1");
    }

    #[test]
    fn display_is_canonical() {
        assert_eq!(TargetHost::parse("fd00:0::a").to_string(), "fd00::a");
        assert_eq!(TargetHost::parse("::ffff:10.0.0.5").to_string(), "10.0.0.5");
        assert_eq!(TargetHost::parse("Node1.").to_string(), "node1");
        assert_eq!(TargetHost::parse("Node1.").ip(), None);
    }
}
