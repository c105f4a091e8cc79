//! Forwarding between servers (`--peer-port`): a CONNECT to a server that holds no session
//! with the agent it routes to is carried to the peer server that holds one, with the bytes,
//! the flow control and the ends of a direct tunnel; the peer's view of its agents follows
//! agents that come and go; nothing is ever forwarded twice. Servers on 127.0.0.1-3 share one
//! peer port, each given every address (its own among them). Three servers on three test
//! hosts found by one DNS name, scaled and restarted under load: `scale_and_restart.rs`.

use std::io::{Read, Write};
use std::time::Instant;

use bridgehead_e2e::client::{
    kube_connect, metric_in, tls_config, tls_stream, TlsStream, IO_TIMEOUT,
};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Peering, Pki, Server, ServerOptions};

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
    // Its line counted in the bytes s1 holds for its peers' views.
    assert!(metric(&servers[0], "bridgehead_server_peer_view_bytes") > 0.0);

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
    assert_eq!(
        metric(&servers[0], "bridgehead_server_peer_view_bytes"),
        0.0
    );
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

/// An agent that holds one session (`--max-server-sessions=1`) though it is given three
/// servers: it counts three, holds one, and every server reaches it, two of them through the
/// one it holds.
#[test]
fn an_agent_with_one_session_is_reached_through_every_server() {
    let pki = pki();
    let servers = servers(&pki, 3);
    let hosts: Vec<String> = servers.iter().map(|s| s.agent_addr.to_string()).collect();
    let agent = Agent::start(
        &pki,
        &servers[0],
        AgentOptions {
            args: vec![
                format!("--proxy-server-host={}", hosts.join(",")),
                "--max-server-sessions=1".into(),
            ],
            ..Default::default()
        },
    )
    .unwrap();
    wait_until(IO_TIMEOUT, || {
        servers
            .iter()
            .map(|s| s.agents().map_or(0, |a| a.len()))
            .sum::<usize>()
            == 1
    })
    .unwrap();
    let holder = servers
        .iter()
        .position(|s| s.agents().is_ok_and(|a| a.len() == 1))
        .unwrap();
    for (i, server) in servers.iter().enumerate() {
        if i != holder {
            wait_peer_agents(server, 1);
        }
    }
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    for server in &servers {
        let (mut tls, status, _) = open(&pki, server, &echo);
        assert_eq!(status, 200);
        tls.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        tls.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping");
    }
    let forwarded: f64 = servers
        .iter()
        .map(|s| {
            metric(
                s,
                &format!(
                    "bridgehead_server_tunnels_forwarded_total{{server=\"s{}\"}}",
                    holder + 1
                ),
            )
        })
        .sum();
    assert_eq!(forwarded, 2.0);
    // It counts three servers and holds one session, and says so.
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(
        metrics.contains("bridgehead_agent_known_servers 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("bridgehead_agent_server_sessions{state=\"active\"} 1"),
        "{metrics}"
    );
}
