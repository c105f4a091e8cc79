//! Agent identifiers: what an agent announces in its upgrade URL's query string.
//!
//! STRUCT ONLY — parsing/encoding to be written (see issue 2 item 3).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// What one agent announced about itself, in announcement order, keys repeatable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentIdentifiers {
    /// `id=`: the agent's name (unique per agent; at most one).
    pub id: Option<String>,
    /// `host=`: DNS names that reach this agent's network (as announced; validated).
    pub hosts: Vec<String>,
    /// `ipv4=`: IPv4 addresses.
    pub ipv4: Vec<Ipv4Addr>,
    /// `ipv6=`: IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
    /// `cidr=`: networks this agent can reach, normalised (host bits cleared).
    pub cidrs: Vec<IpNet>,
    /// `default-route=true`.
    pub default_route: bool,
    /// Keys this version does not know, with their values, in order.
    pub unknown: Vec<(String, String)>,
}
