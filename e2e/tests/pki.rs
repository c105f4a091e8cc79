//! The two CAs keep the roles apart: an agent certificate opens no CONNECT tunnel and a client
//! certificate no agent session; one CA for both is refused at startup unless the operator
//! accepts it; `--allowed-clients` narrows the frontend to named clients.

use std::process::Command;

use bridgehead_e2e::client::{
    agent_upgrade, kube_connect, request_reply, tls, tls_config, tls_connect_with,
};
use bridgehead_e2e::process::binary;
use bridgehead_e2e::{target, Pki, Server, ServerOptions};

#[test]
fn an_agent_certificate_opens_no_tunnel_and_a_client_certificate_no_session() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    // The agent's certificate, presented to the frontend (whose certificate it trusts).
    let agent_on_frontend = tls::config(
        &pki.path("frontend-ca.crt"),
        Some((&pki.path("agent.crt"), &pki.path("agent.key"))),
    )
    .unwrap();
    let result = tls_connect_with(agent_on_frontend, server.frontend_addr())
        .and_then(|mut conn| kube_connect(conn.as_mut(), &echo.to_string()));
    assert!(
        result.is_err(),
        "an agent certificate opened a tunnel: {result:?}"
    );
    // kube-apiserver's certificate, presented to the agent endpoint.
    let client_as_agent = tls::config(
        &pki.path("cluster-ca.crt"),
        Some((&pki.path("client.crt"), &pki.path("client.key"))),
    )
    .unwrap();
    let result = agent_upgrade(client_as_agent, server.agent_addr, None, "id=impostor");
    assert!(
        result.as_ref().map_or(true, |reply| reply.status != 101),
        "a client certificate opened an agent session: {result:?}"
    );
    assert!(server.agents().unwrap().is_empty());
}

#[test]
fn one_ca_for_both_ends_stops_the_server_unless_allowed() {
    let pki = Pki::new().unwrap();
    let run = |extra: &[&str]| {
        Command::new(binary("bridgehead-server").unwrap())
            .args([
                "--server-port",
                "0",
                "--agent-port",
                "0",
                "--health-port",
                "0",
            ])
            .args([
                "--server-bind-address",
                "127.0.0.1",
                "--agent-bind-address",
                "127.0.0.1",
            ])
            .args(["--health-bind-address", "127.0.0.1"])
            .arg("--server-cert")
            .arg(pki.path("server.crt"))
            .arg("--server-key")
            .arg(pki.path("server.key"))
            .arg("--server-ca-cert")
            .arg(pki.path("cluster-ca.crt"))
            .arg("--cluster-cert")
            .arg(pki.path("cluster.crt"))
            .arg("--cluster-key")
            .arg(pki.path("cluster.key"))
            .arg("--cluster-ca-cert")
            .arg(pki.path("cluster-ca.crt"))
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = run(&[]);
    assert_eq!(refused.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("same CA") && stderr.contains("--allow-shared-ca"),
        "{stderr}"
    );
    // Accepted on request, with a warning at startup.
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec![
                "--allow-shared-ca".into(),
                "--server-ca-cert".into(),
                pki.path("cluster-ca.crt").display().to_string(),
            ],
            ..Default::default()
        },
    )
    .unwrap();
    server
        .process
        .wait_log("hold the same CA", std::time::Duration::from_secs(10))
        .unwrap();
}

#[test]
fn allowed_clients_narrow_the_frontend_to_named_certificates() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = bridgehead_e2e::process::start_pair(
        &pki,
        ServerOptions {
            args: vec!["--allowed-clients".into(), "bridgehead-client".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut conn = bridgehead_e2e::client::tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(kube_connect(conn.as_mut(), &echo).unwrap().status, 200);
    // Another certificate from the same CA (say curl's): refused, and told why.
    let curl = pki.pki.issue_client("curl-on-a-laptop").unwrap();
    std::fs::write(pki.dir().join("curl.crt"), &curl.cert_pem).unwrap();
    std::fs::write(pki.dir().join("curl.key"), &curl.key_pem).unwrap();
    let config = tls_config(&pki, Some(("curl.crt", "curl.key"))).unwrap();
    let mut conn = tls_connect_with(config, server.frontend_addr()).unwrap();
    let reply = request_reply(
        conn.as_mut(),
        bridgehead_e2e::client::kube::connect_head(&echo).as_bytes(),
    )
    .unwrap();
    assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("CN=curl-on-a-laptop") && reply.body.contains("--allowed-clients"),
        "{}",
        reply.body
    );
}
