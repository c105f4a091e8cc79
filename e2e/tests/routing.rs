//! Routing end to end: agents on separate test hosts (network namespaces), each host with a
//! who-am-i target answering its own name, so the answer proves which agent carried a tunnel.
//! A host can only reach its own addresses (no routes between hosts), so a tunnel routed to the
//! wrong agent either fails (502) or answers the wrong name.
//!
//! The client runs in the root namespace and talks to the frontend on 127.0.0.1; the server's
//! agent endpoint listens on the root side of the first host's link; the agents run inside the
//! namespaces. These tests need root; without it each one is skipped loudly (`bridgehead_e2e::skip`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{who_am_i, WhoAmI};
use bridgehead_e2e::netns::{self, TestNet};
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

/// Every test gives up after this long.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

fn with_net(test: &str, hosts: usize, body: impl FnOnce(TestNet) + Send + 'static) {
    netns::with_net(test, hosts, TEST_TIMEOUT, body);
}

/// A server with `--proxy-strategies strategies`, its frontend and health port on loopback and
/// its agent endpoint where every host of `net` reaches it.
fn start_server(net: &TestNet, strategies: &str) -> (Pki, Server) {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec!["--proxy-strategies".into(), strategies.into()],
            agent_bind: Some(net.server_v4().to_string()),
            ..Default::default()
        },
    )
    .unwrap();
    (pki, server)
}

/// An agent inside host `i` with id = the host's name, announcing `identifiers`.
fn agent(pki: &Pki, server: &Server, net: &TestNet, i: usize, identifiers: &str) -> Agent {
    let host = net.host(i);
    Agent::start(
        pki,
        server,
        AgentOptions {
            id: Some(host.name().to_owned()),
            identifiers: Some(identifiers.to_owned()),
            // The server certificate names 127.0.0.1, not the link address the agent dials.
            args: vec!["--server-name".into(), "127.0.0.1".into()],
            netns: Some(host.ns_name().to_owned()),
            server: Some(server.agent_addr),
            ..Default::default()
        },
    )
    .unwrap()
}

fn open(pki: &Pki, server: &Server, target: &str) -> WhoAmI {
    who_am_i(pki, server.frontend_addr(), target).unwrap()
}

/// The name of the host that answered a tunnel to `target` (which must succeed).
fn who(pki: &Pki, server: &Server, target: &str) -> String {
    let tunnel = open(pki, server, target);
    assert_eq!(
        tunnel.status,
        200,
        "CONNECT {target}: {}; server log:\n{}",
        tunnel.text,
        server.process.stderr()
    );
    tunnel.text
}

/// `/agents` as id -> (open_tunnels, draining).
fn agents(server: &Server) -> BTreeMap<String, (u64, bool)> {
    server
        .agents()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap_or_default().to_owned(),
                (
                    a["open_tunnels"].as_u64().unwrap_or(u64::MAX),
                    a["draining"].as_bool().unwrap_or(false),
                ),
            )
        })
        .collect()
}

/// Waits (bounded poll of `/agents`, the state the server exposes) until agent `id` is draining.
fn wait_draining(server: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while agents(server).get(id).map(|&(_, draining)| draining) != Some(true) {
        assert!(
            Instant::now() < deadline,
            "agent {id} never showed as draining: {:?}",
            agents(server)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dest_host_by_name_is_case_insensitive_without_trailing_dot() {
    with_net(
        "dest_host_by_name_is_case_insensitive_without_trailing_dot",
        2,
        |mut net| {
            // Each name resolves only on its own host, to that host's loopback (with and without
            // the trailing dot, which the agent may pass on to its resolver).
            net.set_hosts(0, &[("127.0.0.1", "node-a node-a.")])
                .unwrap();
            net.set_hosts(1, &[("127.0.0.1", "node-b.example node-b.example.")])
                .unwrap();
            let port = net.who_am_i_everywhere().unwrap();
            let (pki, server) = start_server(&net, "destHost");
            let _a = agent(&pki, &server, &net, 0, "host=node-a");
            // An identifier in mixed case with a trailing dot is the same name.
            let _b = agent(&pki, &server, &net, 1, "host=Node-B.Example.");
            server.wait_agents(2).unwrap();

            for target in ["node-a", "NODE-A.", "Node-A"] {
                assert_eq!(
                    who(&pki, &server, &format!("{target}:{port}")),
                    "A",
                    "{target}"
                );
            }
            for target in ["node-b.example", "NODE-B.EXAMPLE.", "node-b.Example"] {
                assert_eq!(
                    who(&pki, &server, &format!("{target}:{port}")),
                    "B",
                    "{target}"
                );
            }
            let unknown = open(&pki, &server, &format!("node-c:{port}"));
            assert_eq!(unknown.status, 503, "{}", unknown.text);
        },
    );
}

#[test]
fn dest_host_by_ip_compares_addresses() {
    with_net("dest_host_by_ip_compares_addresses", 2, |mut net| {
        let port = net.who_am_i_everywhere().unwrap();
        let (a4, b4) = (net.host(0).v4(), net.host(1).v4());
        let (a6, b6) = (net.host(0).v6(), net.host(1).v6());
        let expanded = |ip: std::net::Ipv6Addr| {
            ip.segments()
                .iter()
                .map(|s| format!("{s:x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let (pki, server) = start_server(&net, "destHost");
        // A announces its IPv6 address fully written out, B compressed.
        let _a = agent(
            &pki,
            &server,
            &net,
            0,
            &format!("ipv4={a4}&ipv6={}", expanded(a6)),
        );
        let _b = agent(&pki, &server, &net, 1, &format!("ipv4={b4}&ipv6={b6}"));
        server.wait_agents(2).unwrap();

        assert_eq!(who(&pki, &server, &format!("{a4}:{port}")), "A");
        assert_eq!(who(&pki, &server, &format!("{b4}:{port}")), "B");
        assert_eq!(who(&pki, &server, &format!("[{a6}]:{port}")), "A");
        let b6_upper = expanded(b6).to_uppercase();
        assert_eq!(who(&pki, &server, &format!("[{b6_upper}]:{port}")), "B");
        // An IPv4-mapped IPv6 target is the IPv4 address.
        assert_eq!(who(&pki, &server, &format!("[::ffff:{a4}]:{port}")), "A");
    });
}

#[test]
fn dest_cidr_longest_prefix_wins() {
    with_net("dest_cidr_longest_prefix_wins", 2, |mut net| {
        // 10.251.7.9 exists on both hosts, 10.251.3.3 only on A; the same in IPv6.
        for i in 0..2 {
            net.add_local_address(i, "10.251.7.9/32").unwrap();
            net.add_local_address(i, "fd00:251:7::9/128").unwrap();
        }
        net.add_local_address(0, "10.251.3.3/32").unwrap();
        net.add_local_address(0, "fd00:251:3::3/128").unwrap();
        let port = net.who_am_i_everywhere().unwrap();
        let (pki, server) = start_server(&net, "destCIDR");
        let _a = agent(
            &pki,
            &server,
            &net,
            0,
            "cidr=10.251.0.0/16&cidr=fd00:251::/32",
        );
        let _b = agent(
            &pki,
            &server,
            &net,
            1,
            "cidr=10.251.7.0/24&cidr=fd00:251:7::/48",
        );
        server.wait_agents(2).unwrap();

        // B's /24 is more specific; it wins although every tunnel closes and loads stay equal.
        for _ in 0..4 {
            assert_eq!(who(&pki, &server, &format!("10.251.7.9:{port}")), "B");
            assert_eq!(who(&pki, &server, &format!("[fd00:251:7::9]:{port}")), "B");
        }
        assert_eq!(who(&pki, &server, &format!("10.251.3.3:{port}")), "A");
        assert_eq!(who(&pki, &server, &format!("[fd00:251:3::3]:{port}")), "A");
        // An IPv4-mapped target is matched as IPv4.
        assert_eq!(
            who(&pki, &server, &format!("[::ffff:10.251.7.9]:{port}")),
            "B"
        );
        // A name never matches destCIDR.
        let name = open(&pki, &server, &format!("localhost:{port}"));
        assert_eq!(name.status, 503, "{}", name.text);
        let outside = open(&pki, &server, &format!("10.252.0.1:{port}"));
        assert_eq!(outside.status, 503, "{}", outside.text);
    });
}

#[test]
fn strategies_fall_through_in_order() {
    with_net("strategies_fall_through_in_order", 3, |mut net| {
        // 10.251.7.9 on every host: whichever agent dials it, the answer names that agent.
        for i in 0..3 {
            net.add_local_address(i, "10.251.7.9/32").unwrap();
            net.add_local_address(i, "10.252.0.1/32").unwrap();
        }
        let port = net.who_am_i_everywhere().unwrap();
        let (pki, server) = start_server(&net, "destHost,destCIDR,default");
        // A claims 10.251.7.9 by address, B the network around it; C claims nothing.
        let _a = agent(&pki, &server, &net, 0, "ipv4=10.251.7.9");
        let _b = agent(&pki, &server, &net, 1, "cidr=10.251.0.0/16");
        let _c = agent(&pki, &server, &net, 2, "");
        server.wait_agents(3).unwrap();

        for _ in 0..4 {
            // destHost beats destCIDR.
            assert_eq!(who(&pki, &server, &format!("10.251.7.9:{port}")), "A");
        }
        net.add_local_address(1, "10.251.8.8/32").unwrap();
        for _ in 0..4 {
            // No host matches: destCIDR.
            assert_eq!(who(&pki, &server, &format!("10.251.8.8:{port}")), "B");
        }
        // Nothing matches: default, which any agent satisfies.
        let mut seen = BTreeMap::new();
        for _ in 0..12 {
            *seen
                .entry(who(&pki, &server, &format!("10.252.0.1:{port}")))
                .or_insert(0) += 1;
        }
        assert!(
            seen.keys().all(|k| ["A", "B", "C"].contains(&k.as_str())),
            "{seen:?}"
        );
        assert!(
            seen.len() >= 2,
            "default should spread idle agents: {seen:?}"
        );
    });
}

#[test]
fn default_route_only_takes_unmatched_traffic_when_listed() {
    with_net(
        "default_route_only_takes_unmatched_traffic_when_listed",
        3,
        |mut net| {
            for i in 0..3 {
                net.add_local_address(i, "10.252.0.1/32").unwrap();
            }
            let port = net.who_am_i_everywhere().unwrap();
            let (pki, server) = start_server(&net, "destHost,defaultRoute");
            let b4 = net.host(1).v4();
            let _a = agent(&pki, &server, &net, 0, "default-route=true");
            let _b = agent(&pki, &server, &net, 1, &format!("ipv4={b4}"));
            // C's network is not used: destCIDR is not in the list.
            let _c = agent(&pki, &server, &net, 2, "cidr=10.252.0.0/16");
            server.wait_agents(3).unwrap();

            for _ in 0..6 {
                assert_eq!(who(&pki, &server, &format!("10.252.0.1:{port}")), "A");
            }
            assert_eq!(who(&pki, &server, &format!("{b4}:{port}")), "B");
            assert_eq!(who(&pki, &server, &format!("localhost:{port}")), "A");
        },
    );
}

#[test]
fn default_route_agent_is_not_chosen_unless_listed() {
    with_net(
        "default_route_agent_is_not_chosen_unless_listed",
        2,
        |mut net| {
            let port = net.who_am_i_everywhere().unwrap();
            let (pki, server) = start_server(&net, "destHost");
            let b4 = net.host(1).v4();
            let _a = agent(&pki, &server, &net, 0, "default-route=true");
            let _b = agent(&pki, &server, &net, 1, &format!("ipv4={b4}"));
            server.wait_agents(2).unwrap();
            assert_eq!(who(&pki, &server, &format!("{b4}:{port}")), "B");
            let other = open(&pki, &server, &format!("localhost:{port}"));
            assert_eq!(other.status, 503, "{}", other.text);
        },
    );
}

#[test]
fn tunnels_spread_over_agents_sharing_an_identifier() {
    with_net(
        "tunnels_spread_over_agents_sharing_an_identifier",
        2,
        |mut net| {
            for i in 0..2 {
                net.add_local_address(i, "10.251.7.9/32").unwrap();
            }
            let port = net.who_am_i_everywhere().unwrap();
            let (pki, server) = start_server(&net, "destCIDR");
            let _a = agent(&pki, &server, &net, 0, "cidr=10.251.0.0/16");
            let _b = agent(&pki, &server, &net, 1, "cidr=10.251.0.0/16");
            server.wait_agents(2).unwrap();

            // Keep every tunnel open, so each one adds to its agent's load.
            let tunnels: Vec<WhoAmI> = (0..20)
                .map(|_| open(&pki, &server, &format!("10.251.7.9:{port}")))
                .collect();
            let mut answered = BTreeMap::new();
            for t in &tunnels {
                assert_eq!(t.status, 200, "{}", t.text);
                *answered.entry(t.text.clone()).or_insert(0u64) += 1;
            }
            let (a, b) = (answered.get("A").copied(), answered.get("B").copied());
            let (a, b) = (a.unwrap_or(0), b.unwrap_or(0));
            assert_eq!(a + b, 20, "{answered:?}");
            // Least loaded first: sequential opens alternate, give or take a tie.
            assert!(a.abs_diff(b) <= 2, "uneven spread: {answered:?}");
            let listed = agents(&server);
            assert_eq!(listed.get("A"), Some(&(a, false)), "{listed:?}");
            assert_eq!(listed.get("B"), Some(&(b, false)), "{listed:?}");
        },
    );
}

#[test]
fn draining_agent_gets_no_new_tunnels() {
    with_net("draining_agent_gets_no_new_tunnels", 2, |mut net| {
        for i in 0..2 {
            net.add_local_address(i, "10.251.7.9/32").unwrap();
        }
        let port = net.who_am_i_everywhere().unwrap();
        let (pki, server) = start_server(&net, "destCIDR");
        let a = agent(&pki, &server, &net, 0, "cidr=10.251.0.0/16");
        let _b = agent(&pki, &server, &net, 1, "cidr=10.251.0.0/16");
        server.wait_agents(2).unwrap();
        let target = format!("10.251.7.9:{port}");

        // Open tunnels (kept open) until A carries one; least loaded makes that the first or
        // second.
        let mut held = Vec::new();
        while !held.iter().any(|t: &WhoAmI| t.text == "A") {
            assert!(held.len() < 4, "A never got a tunnel");
            held.push(open(&pki, &server, &target));
        }
        // SIGTERM: A drains, and stays connected while its tunnel is open.
        a.process.signal("TERM").unwrap();
        wait_draining(&server, "A");

        for _ in 0..10 {
            assert_eq!(who(&pki, &server, &target), "B");
        }
        let listed = agents(&server);
        assert_eq!(listed.get("A"), Some(&(1, true)), "{listed:?}");
        assert_eq!(listed.get("B").map(|&(_, d)| d), Some(false), "{listed:?}");
    });
}

#[test]
fn no_match_is_503_naming_the_strategies_tried() {
    with_net(
        "no_match_is_503_naming_the_strategies_tried",
        1,
        |mut net| {
            net.add_local_address(0, "10.251.7.9/32").unwrap();
            let port = net.who_am_i_everywhere().unwrap();
            let (pki, server) = start_server(&net, "destHost");
            let _a = agent(&pki, &server, &net, 0, "host=node-a&cidr=10.251.0.0/16");
            server.wait_agents(1).unwrap();
            let t = open(&pki, &server, &format!("10.251.7.9:{port}"));
            assert_eq!(t.status, 503, "{}", t.text);
            assert_eq!(t.text, "no agent matches (tried destHost)");

            let (pki, server) = start_server(&net, "destHost,defaultRoute");
            let _a = agent(&pki, &server, &net, 0, "host=node-a&cidr=10.251.0.0/16");
            server.wait_agents(1).unwrap();
            let t = open(&pki, &server, &format!("10.251.7.9:{port}"));
            assert_eq!(t.status, 503, "{}", t.text);
            assert_eq!(t.text, "no agent matches (tried destHost, defaultRoute)");
        },
    );
}

#[test]
fn readyz_follows_the_first_strategy() {
    with_net("readyz_follows_the_first_strategy", 2, |mut net| {
        let port = net.who_am_i_everywhere().unwrap();
        let (pki, server) = start_server(&net, "destHost,default");
        let (status, body) = server.get("/readyz").unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("destHost"), "{body}");

        // An agent that announces nothing serves `default` but not readiness.
        let _c = agent(&pki, &server, &net, 1, "");
        server.wait_agents(1).unwrap();
        let (status, body) = server.get("/readyz").unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body.trim(), "no agent registered for strategy destHost");
        assert_eq!(who(&pki, &server, &format!("localhost:{port}")), "B");

        let a4 = net.host(0).v4();
        let a = agent(&pki, &server, &net, 0, &format!("host=node-a&ipv4={a4}"));
        server.wait_agents(2).unwrap();
        let (status, body) = server.get("/readyz").unwrap();
        assert_eq!(status, 200, "{body}");

        // A drains while carrying a tunnel: destHost has no usable agent again.
        let held = open(&pki, &server, &format!("{a4}:{port}"));
        assert_eq!(held.text, "A");
        a.process.signal("TERM").unwrap();
        wait_draining(&server, "A");
        let (status, body) = server.get("/readyz").unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body.trim(), "every agent for strategy destHost is draining");
        // Its own address now falls through to default, whose only usable agent is B.
        let t = open(&pki, &server, &format!("{a4}:{port}"));
        assert_eq!(t.status, 502, "B cannot reach A's address: {}", t.text);
        drop(held);
    });
}
