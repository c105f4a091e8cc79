//! Several servers without a load balancer: an agent given every server's address (a
//! comma-separated list, or a name that resolves to several addresses) holds a session with
//! each server it finds, counts them itself, and finds a restarted one again, all without
//! haproxy in front. Loopback only: three servers on 127.0.0.1-3 with one port, given as a
//! list (each entry is resolved as a name with several records is: `lookup_host`; a real
//! resolver in test hosts is the next step, issue 42).

use std::time::Duration;

use bridgehead_e2e::client::{kube_connect, tls_connect};
use bridgehead_e2e::dns::Resolver;
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

/// How long an agent may take to find every server (its sync interval is 100 ms here).
const FIND: Duration = Duration::from_secs(20);

fn server_on(pki: &Pki, ip: &str, agent_port: u16, id: &str) -> anyhow::Result<Server> {
    Server::start(
        pki,
        ServerOptions {
            agent_bind: Some(ip.to_owned()),
            agent_port: Some(agent_port),
            args: vec![format!("--server-id={id}")],
            ..Default::default()
        },
    )
}

/// A CONNECT through `server`'s frontend reaches an echo target through its agent.
fn tunnel_works(pki: &Pki, server: &Server, echo: &str) {
    let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), echo).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
}

#[test]
fn an_agent_given_every_servers_address_holds_a_session_with_each() {
    // Each server is verified for the entry it was dialed at (no --server-name).
    let pki = Pki::with_sans(&["127.0.0.2".to_owned(), "127.0.0.3".to_owned()]).unwrap();
    let first = server_on(&pki, "127.0.0.1", 0, "s1").unwrap();
    let port = first.agent_addr.port();
    let mut servers = vec![first];
    for (ip, id) in [("127.0.0.2", "s2"), ("127.0.0.3", "s3")] {
        servers.push(server_on(&pki, ip, port, id).unwrap());
    }
    let agent = Agent::start(
        &pki,
        &servers[0],
        AgentOptions {
            args: vec!["--proxy-server-host=127.0.0.1,127.0.0.2,127.0.0.3".into()],
            ..Default::default()
        },
    )
    .unwrap();
    for server in &servers {
        server.wait_agents(1).unwrap();
    }
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    for server in &servers {
        tunnel_works(&pki, server, &echo);
    }
    // The agent counted three servers itself: every server still says a count of one.
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(
        metrics.contains("bridgehead_agent_known_servers 3"),
        "{metrics}"
    );

    // The second server restarts on its address: found again, no balancer in between.
    drop(servers.remove(1));
    let restarted = server_on(&pki, "127.0.0.2", port, "s2").unwrap();
    restarted.wait_agents(1).unwrap();
    tunnel_works(&pki, &restarted, &echo);
    wait_until(FIND, || {
        agent
            .get("/metrics")
            .is_ok_and(|(_, m)| m.contains("bridgehead_agent_server_sessions{state=\"active\"} 3"))
    })
    .unwrap();
}

/// A real resolver: dnsmasq in the agent's test host answers one name with a record per
/// server; the agent, given only that name, holds a session with each, and a server added by
/// DNS alone (a record added, dnsmasq told to reload) is found without any other change.
#[test]
fn servers_found_by_dns_and_one_added_by_dns_alone() {
    let test = "servers_found_by_dns_and_one_added_by_dns_alone";
    if !bridgehead_e2e::skip::require_root(test) {
        return;
    }
    if !Resolver::available() {
        return bridgehead_e2e::skip::skip(test, "needs dnsmasq (Debian's dnsmasq-base)");
    }
    bridgehead_e2e::netns::with_net(test, 3, Duration::from_secs(120), move |mut net| {
        // The servers in the root namespace, each on the root end of one host's link (all
        // reachable from host 0, where the agent and the resolver run), on one port.
        let ips: Vec<_> = (0..3).map(|i| net.root_v4(i)).collect();
        let addresses: Vec<String> = ips.iter().map(ToString::to_string).collect();
        // Host 0 reaches the root side of the other links too (the root namespace owns them).
        for address in &addresses[1..] {
            let ns = net.host(0).ns_name();
            bridgehead_e2e::netns::ip(&["-n", ns, "route", "add", address, "dev", "eth0"]).unwrap();
        }
        let pki = Pki::with_sans(&addresses).unwrap();
        let first = server_on(&pki, &addresses[0], 0, "s1").unwrap();
        let port = first.agent_addr.port();
        let second = server_on(&pki, &addresses[1], port, "s2").unwrap();
        // Host 0 resolves through its own loopback, where dnsmasq answers.
        net.set_hosts(0, &[]).unwrap();
        let localhost = std::net::Ipv4Addr::LOCALHOST;
        let dns =
            Resolver::start(&net, 0, localhost, "servers.bridgehead.test", &ips[..2]).unwrap();
        dns.wait_answer(&net, 0, &ips[..2]).unwrap();

        let agent = Agent::start(
            &pki,
            &first,
            AgentOptions {
                netns: Some(net.host(0).ns_name().to_owned()),
                health_bind: Some("127.0.0.1".into()),
                args: vec![
                    "--proxy-server-host=servers.bridgehead.test".into(),
                    format!("--server-name={}", addresses[0]),
                ],
                ..Default::default()
            },
        )
        .unwrap();
        first.wait_agents(1).unwrap();
        second.wait_agents(1).unwrap();

        // A third server, announced by DNS alone.
        let third = server_on(&pki, &addresses[2], port, "s3").unwrap();
        dns.set(&ips).unwrap();
        dns.wait_answer(&net, 0, &ips).unwrap();
        third.wait_agents(1).unwrap();
        drop((agent, dns));
    });
}
