//! Where the servers are: the addresses `--proxy-server-host` (an agent's) or `--peer-host` (a
//! server's, for the peers it forwards to) resolves to. For an agent, one address is a
//! load balancer (or the only server): the agent dials the name and lets the balancer spread
//! its connections. Several — a DNS name with a record per server (a headless Service), or a
//! comma-separated list — are the servers themselves: the agent dials each address whose
//! server it holds no session with, in turn, and counts the servers behind them. What it
//! learns of an address (the server id that answered there) keeps it from counting one
//! server twice (a dual-stack server's A and AAAA records) or dialing a held one again.
//!
//! The names are resolved again at most once a sync interval, so records that appear (a server
//! added) are dialed within one, and records that disappear are no longer dialed (the sessions
//! with them end when their servers go). A failed resolution keeps the last addresses.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

/// The servers' addresses, as last resolved.
#[derive(Debug)]
pub struct Addresses {
    /// Each entry's host and port.
    hosts: Vec<(String, u16)>,
    every: Duration,
    resolved: Vec<SocketAddr>,
    /// The `--proxy-server-host` entry each address came from.
    entries: HashMap<SocketAddr, String>,
    /// The server id that answered at an address.
    known: HashMap<SocketAddr, String>,
    at: Option<Instant>,
    /// Where the last pick stopped, so that each address gets its turn.
    cursor: usize,
}

impl Addresses {
    /// The addresses of `hosts` at `port`, resolved at most once per `every`.
    /// An entry may name its own port (`name:port`, `192.0.2.1:8132`, `[2001:db8::1]:8132`).
    pub fn new(hosts: Vec<String>, port: u16, every: Duration) -> Addresses {
        Addresses {
            hosts: hosts.iter().map(|entry| split_port(entry, port)).collect(),
            every,
            resolved: Vec::new(),
            entries: HashMap::new(),
            known: HashMap::new(),
            at: None,
            cursor: 0,
        }
    }

    /// Resolves the hosts again if the last resolution is older than the interval.
    pub async fn refresh(&mut self) {
        if self.at.is_some_and(|at| at.elapsed() < self.every) {
            return;
        }
        self.at = Some(Instant::now());
        let mut found = BTreeSet::new();
        let mut entries = HashMap::new();
        let mut failed = false;
        for (host, port) in &self.hosts {
            match tokio::net::lookup_host((host.as_str(), *port)).await {
                Ok(addresses) => {
                    for address in addresses {
                        found.insert(address);
                        entries.entry(address).or_insert_with(|| host.clone());
                    }
                }
                Err(error) => {
                    failed = true;
                    debug!(%host, %error, "resolving a server address");
                }
            }
        }
        if found.is_empty() && failed {
            return;
        }
        let found: Vec<SocketAddr> = found.into_iter().collect();
        if found != self.resolved {
            if found.len() > 1 || self.resolved.len() > 1 {
                info!(addresses = ?found, "the servers' addresses changed");
            }
            self.known.retain(|address, _| found.contains(address));
            self.resolved = found;
        }
        self.entries = entries;
    }

    /// Whether these are the addresses of exactly `hosts` (as given to [`Addresses::new`]).
    pub fn is_for(&self, hosts: &[String]) -> bool {
        self.hosts.len() == hosts.len()
            && self
                .hosts
                .iter()
                .zip(hosts)
                .all(|((host, port), entry)| split_port(entry, *port) == (host.clone(), *port))
    }

    /// How often the names are resolved again.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Starts the turns at the address `n` (modulo their number) instead of the first.
    pub fn start_at(&mut self, n: usize) {
        self.cursor = n;
    }

    /// Every address, as last resolved, in order.
    pub fn resolved(&self) -> &[SocketAddr] {
        &self.resolved
    }

    /// The server id that answered at `address`, if one did since it was resolved.
    pub fn known(&self, address: SocketAddr) -> Option<&str> {
        self.known.get(&address).map(String::as_str)
    }

    /// The host of the `--proxy-server-host` entry `address` was resolved from (without its
    /// port).
    pub fn entry(&self, address: SocketAddr) -> Option<&str> {
        self.entries.get(&address).map(String::as_str)
    }

    /// Server `server_id` answered at `address`.
    pub fn learn(&mut self, address: SocketAddr, server_id: &str) {
        if self.resolved.contains(&address) {
            self.known.insert(address, server_id.to_owned());
        }
    }

    /// How many servers the addresses stand for: each address is one when there are several,
    /// but addresses where one server answered count once; a single address (a load
    /// balancer) says nothing.
    pub fn count(&self) -> u32 {
        if self.resolved.len() < 2 {
            return 0;
        }
        let servers: BTreeSet<String> = self
            .resolved
            .iter()
            .map(|address| {
                self.known
                    .get(address)
                    .map_or_else(|| address.to_string(), |id| format!("id {id}"))
            })
            .collect();
        u32::try_from(servers.len()).unwrap_or(u32::MAX)
    }

    /// The next address to dial, skipping those where a server in `held` (ids of sessions
    /// open) answered; `None` when there is only one address (dial the name) or every
    /// address leads to a held server.
    pub fn next(&mut self, held: &[String]) -> Option<SocketAddr> {
        if self.resolved.len() < 2 {
            return None;
        }
        let n = self.resolved.len();
        for step in 0..n {
            let at = (self.cursor % n + step) % n;
            let candidate = self.resolved[at];
            let is_held = self
                .known
                .get(&candidate)
                .is_some_and(|id| held.contains(id));
            if !is_held {
                self.cursor = (at + 1) % n;
                return Some(candidate);
            }
        }
        None
    }
}

/// `entry`'s host and port: the port it names, or `default`. A bare IPv6 literal names none.
pub fn split_port(entry: &str, default: u16) -> (String, u16) {
    if let Ok(address) = entry.parse::<SocketAddr>() {
        return (address.ip().to_string(), address.port());
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host.to_owned(), port),
            Err(_) => (entry.to_owned(), default),
        },
        _ => (entry.to_owned(), default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(hosts: &[&str]) -> Addresses {
        Addresses::new(
            hosts.iter().map(|h| h.to_string()).collect(),
            8132,
            Duration::from_secs(1),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn several_addresses_are_dialed_in_turn_skipping_held_servers() {
        let mut found = addresses(&["10.0.0.2", "10.0.0.1", "10.0.0.3"]);
        found.refresh().await;
        assert_eq!(found.count(), 3);
        let a: SocketAddr = "10.0.0.1:8132".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:8132".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:8132".parse().unwrap();
        assert_eq!(found.next(&[]), Some(a));
        assert_eq!(found.entry(a), Some("10.0.0.1"));
        assert_eq!(found.next(&[]), Some(b));
        found.learn(b, "s-b");
        let held = ["s-b".to_owned()];
        assert_eq!(found.next(&held), Some(c));
        assert_eq!(found.next(&held), Some(a));
        found.learn(a, "s-a");
        found.learn(c, "s-c");
        let all = ["s-a".to_owned(), "s-b".to_owned(), "s-c".to_owned()];
        assert_eq!(found.next(&all), None);
    }

    #[tokio::test(start_paused = true)]
    async fn two_addresses_of_one_server_count_once() {
        let mut found = addresses(&["10.0.0.1", "fd00::1"]);
        found.refresh().await;
        assert_eq!(found.count(), 2);
        found.learn("10.0.0.1:8132".parse().unwrap(), "s1");
        found.learn("[fd00::1]:8132".parse().unwrap(), "s1");
        assert_eq!(found.count(), 1);
        assert_eq!(found.next(&["s1".to_owned()]), None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_address_is_a_load_balancer_dialed_by_name() {
        let mut found = addresses(&["10.0.0.1"]);
        found.refresh().await;
        assert_eq!(found.count(), 0);
        assert_eq!(found.next(&[]), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_hosts_are_resolved_again_only_after_the_interval() {
        // IP literals and localhost only: resolving them sends no query anywhere.
        let mut found = addresses(&["localhost"]);
        found.refresh().await;
        let first = found.resolved.clone();
        assert!(!first.is_empty());
        found.hosts = vec![("10.0.0.9".into(), 8132), ("10.0.0.8".into(), 8132)];
        found.refresh().await;
        assert_eq!(found.resolved, first, "resolved again within the interval");
        tokio::time::advance(Duration::from_secs(1)).await;
        found.refresh().await;
        assert_eq!(found.count(), 2);
    }

    #[test]
    fn an_entry_may_name_its_port() {
        assert_eq!(split_port("10.0.0.1", 8132), ("10.0.0.1".into(), 8132));
        assert_eq!(split_port("10.0.0.1:9000", 8132), ("10.0.0.1".into(), 9000));
        assert_eq!(
            split_port("servers.test:9000", 1),
            ("servers.test".into(), 9000)
        );
        assert_eq!(split_port("servers.test", 1), ("servers.test".into(), 1));
        assert_eq!(split_port("[fd00::1]:9000", 1), ("fd00::1".into(), 9000));
        assert_eq!(split_port("fd00::1", 1), ("fd00::1".into(), 1));
        assert_eq!(split_port("name:x", 1), ("name:x".into(), 1));
    }
}
