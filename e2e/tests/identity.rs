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
    let config = tls::config(&pki.path("ca.crt"), Some((&cert, &key))).unwrap();
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
        &pki.path("ca.crt"),
        Some((&pki.path("agent.crt"), &pki.path("agent.key"))),
    )
    .unwrap();
    let reply = agent_upgrade(plain, server.agent_addr, None, "id=b&host=node-1").unwrap();
    assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
}
