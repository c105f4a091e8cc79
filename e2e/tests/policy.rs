//! The agent's destination policy, on a test host: the cloud metadata address, the agent's own
//! health port, 0.0.0.0 and operator rules are refused with 403 and the reason; loopback and
//! other addresses stay reachable. Every target listens inside the host's namespace, so a
//! refused dial shows the policy, not a missing listener.

use bridgehead_e2e::client::{request_reply, tls_connect};
use bridgehead_e2e::netns::TestNet;
use bridgehead_e2e::{AgentOptions, Pki, Server, ServerOptions};

/// The answer to a CONNECT: (status, text): on 200 what the target said until it closed
/// (a who-am-i target answers its name), else the refusal's reason.
fn ask(pki: &Pki, server: &Server, target: &str) -> (u16, String) {
    let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
    let head = bridgehead_e2e::client::kube::connect_head(target);
    let reply = request_reply(conn.as_mut(), head.as_bytes()).unwrap();
    (reply.status, reply.body.trim().to_owned())
}

#[test]
fn the_agent_refuses_metadata_its_own_ports_and_denied_destinations() {
    if !bridgehead_e2e::skip::require_root(
        "the_agent_refuses_metadata_its_own_ports_and_denied_destinations",
    ) {
        return;
    }
    let mut net = TestNet::new(1).unwrap();
    // What a cloud VM has: the metadata endpoint on a link-local address of the host.
    net.add_local_address(0, "169.254.169.254/32").unwrap();
    net.add_local_address(0, "10.77.0.1/32").unwrap();
    net.add_local_address(0, "10.77.0.2/32").unwrap();
    let metadata = net.who_am_i(0, "169.254.169.254:0", "metadata").unwrap();
    let loopback = net.who_am_i(0, "127.0.0.1:0", "loopback").unwrap();
    let open = net.who_am_i(0, "10.77.0.1:0", "open").unwrap();
    let closed = net.who_am_i(0, "10.77.0.2:0", "operator-denied").unwrap();
    let any = net.who_am_i(0, "0.0.0.0:0", "any").unwrap();
    let pki = Pki::new().unwrap();
    let (server, agent) = bridgehead_e2e::netns::start_pair_on_host(
        &pki,
        &net,
        0,
        ServerOptions::default(),
        AgentOptions {
            args: vec!["--denied-destinations".into(), "10.77.0.2/32".into()],
            ..Default::default()
        },
    )
    .unwrap();

    assert_eq!(
        ask(&pki, &server, &loopback.to_string()),
        (200, "loopback".into())
    );
    assert_eq!(ask(&pki, &server, &open.to_string()), (200, "open".into()));
    let health = format!("127.0.0.1:{}", agent.health.port());
    for (target, reason) in [
        (metadata.to_string(), "link-local"),
        (format!("0.0.0.0:{}", any.port()), "0.0.0.0/8"),
        (health, "own port"),
        (closed.to_string(), "--denied-destinations 10.77.0.2/32"),
    ] {
        let (status, body) = ask(&pki, &server, &target);
        assert_eq!(status, 403, "{target}: {body}");
        assert!(body.contains(reason), "{target}: {body}");
    }
    let refused = server
        .metric("bridgehead_server_dials_total{result=\"not_permitted\"}")
        .unwrap();
    assert_eq!(refused, 4.0);
}

#[test]
fn an_allow_list_permits_only_what_it_names() {
    if !bridgehead_e2e::skip::require_root("an_allow_list_permits_only_what_it_names") {
        return;
    }
    let mut net = TestNet::new(1).unwrap();
    net.add_local_address(0, "10.78.0.1/32").unwrap();
    net.add_local_address(0, "169.254.169.254/32").unwrap();
    let listed = net.who_am_i(0, "10.78.0.1:0", "listed").unwrap();
    let loopback = net.who_am_i(0, "127.0.0.1:0", "loopback").unwrap();
    let metadata = net.who_am_i(0, "169.254.169.254:0", "metadata").unwrap();
    let pki = Pki::new().unwrap();
    // An exact address lifts the default denial of the metadata endpoint.
    let allowed = format!("10.78.0.0/24,169.254.169.254/32:{}", metadata.port());
    let (server, _agent) = bridgehead_e2e::netns::start_pair_on_host(
        &pki,
        &net,
        0,
        ServerOptions::default(),
        AgentOptions {
            args: vec!["--allowed-destinations".into(), allowed],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        ask(&pki, &server, &listed.to_string()),
        (200, "listed".into())
    );
    assert_eq!(
        ask(&pki, &server, &metadata.to_string()),
        (200, "metadata".into())
    );
    let (status, body) = ask(&pki, &server, &loopback.to_string());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not in --allowed-destinations"), "{body}");
}
