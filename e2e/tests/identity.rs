//! `--bind-agent-identifiers` with certificate agents: an agent may announce the names and
//! addresses its certificate's SANs carry (`bridgehead-certs agent --node`), nothing else.
//! (Token agents, bound to their pod's node, are tested against a real kube-apiserver in
//! kubernetes.rs.)

use bridgehead_e2e::client::{agent_upgrade, tls};
use bridgehead_e2e::{Pki, Server, ServerOptions};

#[test]
fn a_certificate_agent_may_announce_only_its_sans() {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec!["--bind-agent-identifiers".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let agent = pki
        .pki
        .issue_agent("node-1", &["10.0.0.5".into(), "fd00::5".into()])
        .unwrap();
    let (cert, key) = (pki.dir().join("node-1.crt"), pki.dir().join("node-1.key"));
    std::fs::write(&cert, &agent.cert_pem).unwrap();
    std::fs::write(&key, &agent.key_pem).unwrap();
    let config = tls::config(&pki.path("cluster-ca.crt"), Some((&cert, &key))).unwrap();
    let upgrade =
        |query: &str| agent_upgrade(config.clone(), server.agent_addr, None, query).unwrap();
    for own in [
        "id=a&host=node-1&ipv4=10.0.0.5&ipv6=fd00::5&cidr=10.244.0.0/24&default-route=true",
        "id=a&host=NODE-1.",
        "id=a",
    ] {
        let reply = upgrade(own);
        assert_eq!(reply.status, 101, "{own}: {}{}", reply.head, reply.body);
    }
    for (foreign, claim) in [
        ("id=a&host=node-2", "host=node-2"),
        ("id=a&host=node-1&ipv4=10.0.0.6", "ipv4=10.0.0.6"),
        ("id=a&ipv6=fd00::6", "ipv6=fd00::6"),
    ] {
        let reply = upgrade(foreign);
        assert_eq!(reply.status, 403, "{foreign}: {}{}", reply.head, reply.body);
        assert!(
            reply.body.contains(claim) && reply.body.contains("CN=node-1"),
            "{foreign}: {}",
            reply.body
        );
    }
    // The PKI's plain agent certificate names no node: it may announce no host or address.
    let plain = tls::config(
        &pki.path("cluster-ca.crt"),
        Some((&pki.path("agent.crt"), &pki.path("agent.key"))),
    )
    .unwrap();
    let reply = agent_upgrade(plain, server.agent_addr, None, "id=b&host=node-1").unwrap();
    assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
}

/// A second session under a live agent's id is refused unless it proves the same identity, so
/// another node's credential cannot take over node-a's traffic by calling itself node-a.
#[test]
fn an_agent_id_cannot_be_taken_over_by_another_identity() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let write = |name: &str| {
        let pair = pki.pki.issue_agent(name, &[]).unwrap();
        let (cert, key) = (
            pki.dir().join(format!("{name}.crt")),
            pki.dir().join(format!("{name}.key")),
        );
        std::fs::write(&cert, &pair.cert_pem).unwrap();
        std::fs::write(&key, &pair.key_pem).unwrap();
        (cert, key)
    };
    let node_a = write("node-a");
    let node_b = write("node-b");
    let _agent = bridgehead_e2e::Agent::start(
        &pki,
        &server,
        bridgehead_e2e::AgentOptions {
            id: Some("node-a".into()),
            identifiers: Some("host=node-a".into()),
            certificate: Some(Some(node_a.clone())),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let impostor = tls::config(&pki.path("cluster-ca.crt"), Some((&node_b.0, &node_b.1))).unwrap();
    let reply = agent_upgrade(impostor, server.agent_addr, None, "id=node-a&host=node-a").unwrap();
    assert_eq!(reply.status, 409, "{}{}", reply.head, reply.body);
    assert!(reply.body.contains("CN=node-a"), "{}", reply.body);
    let agents = server.agents().unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    // Identifiers per agent are capped.
    let honest = tls::config(&pki.path("cluster-ca.crt"), Some((&node_b.0, &node_b.1))).unwrap();
    let many: Vec<String> = (0..300)
        .map(|i| format!("cidr=10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    let reply = agent_upgrade(
        honest,
        server.agent_addr,
        None,
        &format!("id=node-b&{}", many.join("&")),
    )
    .unwrap();
    assert_eq!(reply.status, 400, "{}{}", reply.head, reply.body);
    assert!(reply.body.contains("at most 256"), "{}", reply.body);
}
