//! Forwarding between servers (`--peer-port`): a CONNECT to a server that holds no session
//! with the agent it routes to is carried to the peer server that holds one, with the bytes,
//! the flow control and the ends of a direct tunnel; the peer's view of its agents follows
//! agents that come and go; nothing is ever forwarded twice. Servers on 127.0.0.1-3 share one
//! peer port, each given every address (its own among them); then three servers on three
//! test hosts found by one DNS name, scaled and restarted under a CONNECT loop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{
    kube_connect, metric_in, tls_config, tls_stream, who_am_i_with, TlsStream, IO_TIMEOUT,
};
use bridgehead_e2e::dns::Resolver;
use bridgehead_e2e::netns::TestNet;
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Peering, Pki, Server, ServerOptions};
use rustls::ClientConfig;

const ADDRESSES: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];

fn pki() -> Pki {
    Pki::with_sans(
        &ADDRESSES[1..]
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// Server `id` on `ip`, forwarding to and from the servers at `peers` on `peer_port` (0: a
/// free one).
fn server(pki: &Pki, ip: &str, id: &str, peer_port: u16, peers: &[&str]) -> Server {
    Server::start(
        pki,
        ServerOptions {
            bind: Some(ip.to_owned()),
            args: vec![format!("--server-id={id}")],
            peering: Some(Peering {
                port: peer_port,
                hosts: peers.iter().map(|p| p.to_string()).collect(),
                bind: None,
            }),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Servers s1..sN on 127.0.0.1..N, each given all N addresses.
fn servers(pki: &Pki, n: usize) -> Vec<Server> {
    let peers = &ADDRESSES[..n];
    let first = server(pki, ADDRESSES[0], "s1", 0, peers);
    let port = first.peer_addr.unwrap().port();
    let mut servers = vec![first];
    for (i, ip) in ADDRESSES.iter().enumerate().take(n).skip(1) {
        servers.push(server(pki, ip, &format!("s{}", i + 1), port, peers));
    }
    servers
}

fn metric(server: &Server, series: &str) -> f64 {
    let (_, page) = server.get("/metrics").unwrap();
    metric_in(&page, series).unwrap_or(0.0)
}

/// Waits until `server` knows `n` agents of its peers.
fn wait_peer_agents(server: &Server, n: usize) {
    wait_until(IO_TIMEOUT, || {
        metric(server, "bridgehead_server_peer_agents") == n as f64
    })
    .unwrap_or_else(|_| panic!("never {n} peer agents; log:\n{}", server.process.stderr()));
}

fn open(pki: &Pki, server: &Server, target: &str) -> (TlsStream, u16, Vec<u8>) {
    let config = tls_config(pki, Some(("client.crt", "client.key"))).unwrap();
    let mut tls = tls_stream(config, server.frontend_addr()).unwrap();
    let reply = kube_connect(&mut tls, target).unwrap();
    (tls, reply.status, reply.extra)
}

#[test]
fn a_connect_to_a_server_without_the_agent_goes_through_the_peer_that_has_it() {
    let pki = pki();
    let servers = servers(&pki, 2);
    // The agent holds a session with s2 only.
    let agent = Agent::start(&pki, &servers[1], AgentOptions::default()).unwrap();
    servers[1].wait_agents(1).unwrap();
    wait_peer_agents(&servers[0], 1);
    assert!(servers[0].agents().unwrap().is_empty());

    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let (mut tls, status, _) = open(&pki, &servers[0], &echo);
    assert_eq!(status, 200);
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    tls.write_all(&data).unwrap();
    let mut back = vec![0u8; data.len()];
    tls.read_exact(&mut back).unwrap();
    assert!(back == data, "the echo differs");
    drop(tls);

    // Which server carried it: a metric on each side, and the tunnel's log line.
    let forwarded = "bridgehead_server_tunnels_forwarded_total{server=\"s2\"}";
    assert_eq!(metric(&servers[0], forwarded), 1.0);
    assert_eq!(
        metric(
            &servers[1],
            "bridgehead_server_peer_tunnels_total{server=\"s1\"}"
        ),
        1.0
    );
    wait_until(IO_TIMEOUT, || {
        servers[0]
            .process
            .stderr()
            .lines()
            .any(|l| l.contains("tunnel ended") && l.contains("server=s2"))
    })
    .unwrap();

    // A CONNECT to s2 itself is not forwarded.
    let (_, status, _) = open(&pki, &servers[1], &echo);
    assert_eq!(status, 200);
    assert_eq!(
        metric(
            &servers[1],
            "bridgehead_server_tunnels_forwarded_total{server=\"s1\"}"
        ),
        0.0
    );

    // The agent leaves: s1 hears it and answers 503 as a server without agents does.
    drop(agent);
    wait_peer_agents(&servers[0], 0);
    let (_, status, _) = open(&pki, &servers[0], &echo);
    assert_eq!(status, 503);
}

#[test]
fn a_dial_that_fails_at_the_peer_answers_what_the_peer_would() {
    let pki = pki();
    let servers = servers(&pki, 2);
    let _agent = Agent::start(&pki, &servers[1], AgentOptions::default()).unwrap();
    wait_peer_agents(&servers[0], 1);
    let closed = target::closed_port().unwrap();
    let (_, status, _) = open(&pki, &servers[0], &closed.addr.to_string());
    assert_eq!(status, 502, "a refused dial through the peer");
    let (_, status, _) = open(&pki, &servers[1], &closed.addr.to_string());
    assert_eq!(status, 502, "the same dial at the peer itself");
}

#[test]
fn a_stalled_forwarded_tunnel_does_not_slow_a_bulk_one_through_the_same_peer() {
    const STALLED: usize = 20 << 20;
    const BULK: usize = 50 << 20;
    let pki = pki();
    let servers = servers(&pki, 2);
    let _agent = Agent::start(&pki, &servers[1], AgentOptions::default()).unwrap();
    wait_peer_agents(&servers[0], 1);
    let stalled_target = target::source("127.0.0.1:0", STALLED).unwrap();
    let bulk_target = target::source("127.0.0.1:0", BULK).unwrap();

    // Both through s1, the peer session to s2 and the agent's session with s2.
    let (mut stalled, status, stalled_early) = open(&pki, &servers[0], &stalled_target.to_string());
    assert_eq!(status, 200);
    let started = Instant::now();
    let (mut bulk, status, bulk_early) = open(&pki, &servers[0], &bulk_target.to_string());
    assert_eq!(status, 200);
    target::read_pattern_to_eof(&mut bulk, &bulk_early, BULK);
    let elapsed = started.elapsed();
    assert!(
        elapsed < IO_TIMEOUT,
        "the bulk tunnel took {elapsed:?} beside a stalled one"
    );
    target::read_pattern_to_eof(&mut stalled, &stalled_early, STALLED);
}

#[test]
fn a_server_that_starts_knows_its_peers_agents_before_it_answers() {
    let pki = pki();
    let mut servers = servers(&pki, 2);
    let _agent = Agent::start(&pki, &servers[1], AgentOptions::default()).unwrap();
    servers[1].wait_agents(1).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    // s1 restarts on its address; its first CONNECT comes as soon as it listens.
    let port = servers[0].peer_addr.unwrap().port();
    drop(servers.remove(0));
    let restarted = server(&pki, ADDRESSES[0], "s1", port, &ADDRESSES[..2]);
    let (_, status, _) = open(&pki, &restarted, &echo);
    assert_eq!(status, 200, "log:\n{}", restarted.process.stderr());
}

/// Three servers on three test hosts, three agents on three more, one DNS name for every
/// server (dnsmasq in a seventh host), no load balancer. Servers find each other by the same
/// name and forward. While a CONNECT loop runs through every server to every node's own
/// address (`destHost`: only that node's agent reaches it), the fleet grows from two servers
/// to three by DNS alone, then each server restarts in turn (SIGTERM, a new process on the
/// same address). No CONNECT gets a 503 or reaches the wrong node; the only failures are
/// connections to a server while it restarts.
#[test]
fn servers_found_by_dns_scale_and_restart_in_turn_without_a_503() {
    let test = "servers_found_by_dns_scale_and_restart_in_turn_without_a_503";
    if !Resolver::available() {
        return bridgehead_e2e::skip::skip(test, "needs dnsmasq (Debian's dnsmasq-base)");
    }
    bridgehead_e2e::netns::with_net(test, 7, Duration::from_secs(300), move |mut net| {
        rolling(&mut net);
    });
}

const NAME: &str = "servers.bridgehead.test";

/// The agents' `--sync-interval` (their default).
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

fn rolling(net: &mut TestNet) {
    net.route_between_hosts().unwrap();
    let dns_ip = net.host(6).v4();
    for host in 0..7 {
        net.set_hosts_and_resolver(host, &[], &dns_ip.to_string())
            .unwrap();
    }
    let server_ips: Vec<Ipv4Addr> = (0..3).map(|i| net.host(i).v4()).collect();
    let mut sans: Vec<String> = server_ips.iter().map(ToString::to_string).collect();
    sans.push(NAME.to_owned());
    let pki = Pki::with_sans(&sans).unwrap();
    let dns = Resolver::start(net, 6, dns_ip, NAME, &server_ips[..2]).unwrap();
    dns.wait_answer(net, 0, &server_ips[..2]).unwrap();

    // The first server picks the ports; the others, each in its own namespace, take the same.
    let mut fleet = Fleet::new(net, &pki);
    fleet.start(0, Ports::default());
    let ports = fleet.ports(0);
    fleet.start(1, ports);

    let nodes: Vec<(SocketAddr, String)> = (3..6)
        .map(|host| {
            let name = format!("node-{host}");
            let ip = net.host(host).v4();
            (net.who_am_i(host, &format!("{ip}:0"), &name).unwrap(), name)
        })
        .collect();
    let _agents: Vec<Agent> = (3..6)
        .map(|host| {
            let ip = net.host(host).v4();
            let options = AgentOptions {
                id: Some(format!("node-{host}")),
                netns: Some(net.host(host).ns_name().to_owned()),
                health_bind: Some(ip.to_string()),
                identifiers: Some(format!("ipv4={ip}")),
                args: vec![format!("--proxy-server-host={NAME}")],
                ..Default::default()
            };
            Agent::start_at(&pki, fleet.agent_addr(0), options).unwrap()
        })
        .collect();
    for i in 0..2 {
        fleet.wait_agents(i, 3);
    }

    let board = Arc::new(Board::default());
    board.set(0, fleet.frontend(0));
    board.set(1, fleet.frontend(1));
    let looping = {
        let board = board.clone();
        let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
        std::thread::spawn(move || connect_loop(&board, config, &nodes))
    };

    // A third server: in the loop as soon as it listens, while no agent can know of it (its
    // record is not there yet), so it forwards every CONNECT to its peers, found by the name.
    fleet.start(2, ports);
    board.set(2, fleet.frontend(2));
    board.wait_rounds(2);
    assert!(fleet.server(2).agents().unwrap().is_empty());
    let forwarded = fleet.forwarded(2);
    assert!(forwarded >= 3.0, "s3 forwarded {forwarded} tunnels");
    // Then its record: the agents find it by DNS alone, within their sync interval.
    let announced = Instant::now();
    dns.set(&server_ips).unwrap();
    fleet.wait_agents(2, 3);
    let found = announced.elapsed();
    eprintln!("a server added by DNS alone held every agent {found:?} after its record");
    assert!(found < SYNC_INTERVAL * 3, "found after {found:?}");
    board.wait_rounds(3);

    for i in 0..3 {
        board.restarting(i, true);
        fleet.stop(i);
        fleet.start(i, ports);
        board.set(i, fleet.frontend(i));
        board.restarting(i, false);
        board.wait_rounds(3);
    }
    board.stop();
    let outcomes = looping.join().unwrap();
    eprintln!("{} CONNECTs through the servers", outcomes.total);
    assert!(outcomes.total > 100, "only {} CONNECTs", outcomes.total);
    assert!(
        outcomes.refused.is_empty(),
        "CONNECTs that failed: {:#?}",
        outcomes.refused
    );
    drop(dns);
}

/// The ports every server of [`Fleet`] listens on (each in its own namespace); 0 picks one.
#[derive(Debug, Clone, Copy, Default)]
struct Ports {
    agent: u16,
    frontend: u16,
    peer: u16,
}

/// Servers s1..s3, server `i` in test host `i`, all given [`NAME`] for their peers.
struct Fleet<'a> {
    pki: &'a Pki,
    hosts: Vec<(String, Ipv4Addr)>,
    servers: Vec<Option<Server>>,
}

impl<'a> Fleet<'a> {
    fn new(net: &TestNet, pki: &'a Pki) -> Fleet<'a> {
        let hosts = (0..3)
            .map(|i| (net.host(i).ns_name().to_owned(), net.host(i).v4()))
            .collect();
        Fleet {
            pki,
            hosts,
            servers: (0..3).map(|_| None).collect(),
        }
    }

    fn start(&mut self, i: usize, ports: Ports) {
        let (ns, ip) = &self.hosts[i];
        let options = ServerOptions {
            netns: Some(ns.clone()),
            bind: Some(ip.to_string()),
            agent_port: Some(ports.agent),
            frontend_port: Some(ports.frontend),
            args: vec![
                format!("--server-id=s{}", i + 1),
                "--proxy-strategies=destHost".into(),
                "--shutdown-grace-period=2s".into(),
            ],
            peering: Some(Peering {
                port: ports.peer,
                hosts: vec![NAME.to_owned()],
                bind: None,
            }),
            ..Default::default()
        };
        self.servers[i] = Some(Server::start(self.pki, options).unwrap());
    }

    fn server(&self, i: usize) -> &Server {
        self.servers[i].as_ref().expect("a running server")
    }

    fn ports(&self, i: usize) -> Ports {
        let server = self.server(i);
        Ports {
            agent: server.agent_addr.port(),
            frontend: server.frontend_addr().port(),
            peer: server.peer_addr.unwrap().port(),
        }
    }

    /// SIGTERM, and the exit.
    fn stop(&mut self, i: usize) {
        let mut server = self.servers[i].take().expect("a running server");
        server.process.signal("TERM").unwrap();
        server.process.wait_exit(IO_TIMEOUT).unwrap();
    }

    fn frontend(&self, i: usize) -> SocketAddr {
        self.server(i).frontend_addr()
    }

    fn agent_addr(&self, i: usize) -> SocketAddr {
        self.server(i).agent_addr
    }

    fn wait_agents(&self, i: usize, n: usize) {
        self.server(i).wait_agents(n).unwrap();
    }

    /// Tunnels server `i` forwarded to its peers, all peers together.
    fn forwarded(&self, i: usize) -> f64 {
        let (_, page) = self.server(i).get("/metrics").unwrap();
        page.lines()
            .filter(|line| line.starts_with("bridgehead_server_tunnels_forwarded_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// What the CONNECT loop goes through, and how far it got.
#[derive(Default)]
struct Board {
    state: Mutex<Round>,
    turned: Condvar,
}

#[derive(Default)]
struct Round {
    /// Each server's frontend, once started.
    frontends: [Option<SocketAddr>; 3],
    /// Bumped when a server starts restarting and when it is back: odd while it restarts.
    epochs: [u64; 3],
    rounds: u64,
    stop: bool,
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.state.lock().unwrap()
    }

    fn set(&self, i: usize, frontend: SocketAddr) {
        self.lock().frontends[i] = Some(frontend);
    }

    fn restarting(&self, i: usize, restarting: bool) {
        let mut round = self.lock();
        assert_eq!(round.epochs[i] % 2 == 1, !restarting);
        round.epochs[i] += 1;
    }

    fn epoch(&self, i: usize) -> u64 {
        self.lock().epochs[i]
    }

    /// Waits until the loop went through every server `n` more times.
    fn wait_rounds(&self, n: u64) {
        let round = self.lock();
        let until = round.rounds + n;
        let (round, waited) = self
            .turned
            .wait_timeout_while(round, IO_TIMEOUT * 6, |round| round.rounds < until)
            .unwrap();
        drop(round);
        assert!(!waited.timed_out(), "the CONNECT loop stalled");
    }

    fn stop(&self) {
        self.lock().stop = true;
    }
}

/// What the loop saw: how many CONNECTs, and each that failed where it must not have.
#[derive(Debug, Default)]
struct Outcomes {
    total: usize,
    refused: Vec<String>,
}

/// Until stopped: a CONNECT through every server to every node, in turn. A failure is
/// excused only for a server that was restarting when it began or ended; a 503 or an answer
/// from the wrong node never is.
fn connect_loop(
    board: &Board,
    config: Arc<ClientConfig>,
    nodes: &[(SocketAddr, String)],
) -> Outcomes {
    let mut outcomes = Outcomes::default();
    loop {
        let (frontends, stop) = {
            let round = board.lock();
            (round.frontends, round.stop)
        };
        if stop {
            return outcomes;
        }
        for (i, frontend) in frontends.iter().enumerate() {
            let Some(frontend) = *frontend else {
                continue;
            };
            for (target, name) in nodes {
                let before = board.epoch(i);
                let answer = who_am_i_with(config.clone(), frontend, &target.to_string());
                let excused = before % 2 == 1 || board.epoch(i) != before;
                outcomes.total += 1;
                let problem = match answer {
                    Ok(answer) if answer.status == 200 && answer.text == *name => continue,
                    Ok(answer) if answer.status == 503 => format!("503: {}", answer.text),
                    Ok(answer) if answer.status == 200 => format!("reached {}", answer.text),
                    _ if excused => continue,
                    Ok(answer) => format!("{}: {}", answer.status, answer.text),
                    Err(error) => format!("{error:#}"),
                };
                outcomes
                    .refused
                    .push(format!("s{} to {name}: {problem}", i + 1));
            }
        }
        board.lock().rounds += 1;
        board.turned.notify_all();
    }
}
