//! `--log-format json`: every line on stderr is one JSON object a log collector can read, with
//! the structured fields (the agent's announced identifiers, bound addresses).

use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

#[test]
fn server_and_agent_log_json_lines() {
    let pki = Pki::new().unwrap();
    let json = vec!["--log-format".to_owned(), "json".to_owned()];
    let server = Server::start(
        &pki,
        ServerOptions {
            args: json.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            id: Some("json-agent".into()),
            identifiers: Some("host=node-j&ipv4=10.9.8.7".into()),
            args: json,
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let server_lines = json_lines(&server.process.stderr());
    let agent_lines = json_lines(&agent.process.stderr());
    assert!(!server_lines.is_empty() && !agent_lines.is_empty());
    for line in server_lines.iter().chain(&agent_lines) {
        assert!(
            line.get("level").is_some() && line.get("timestamp").is_some(),
            "{line}"
        );
    }
    let connected = server_lines
        .iter()
        .find(|line| line["message"] == "agent connected")
        .expect("an `agent connected` line");
    let identifiers = connected["identifiers"].as_str().unwrap_or_default();
    assert!(
        identifiers.contains("host=node-j") && identifiers.contains("ipv4=10.9.8.7"),
        "{connected}"
    );
}

/// At trace level, neither binary logs the agent's bearer token or a byte of tunnel data (the
/// WebSocket and TLS libraries' trace output is capped).
#[test]
fn trace_logs_carry_no_token_and_no_payload() {
    const TOKEN: &str = "token-marker-0123456789abcdef";
    const PAYLOAD: &[u8] = b"payload-marker-fedcba9876543210";
    let pki = Pki::new().unwrap();
    let trace = vec![("RUST_LOG".to_owned(), "trace".to_owned())];
    let server = Server::start(
        &pki,
        ServerOptions {
            env: trace.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    let token = pki.dir().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            token: Some(token),
            env: trace,
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let echo = bridgehead_e2e::target::echo("127.0.0.1:0").unwrap();
    let mut conn = bridgehead_e2e::client::tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = bridgehead_e2e::client::kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    bridgehead_e2e::client::echo_round_trip(conn.as_mut(), PAYLOAD);
    drop(conn);
    let payload = String::from_utf8_lossy(PAYLOAD).into_owned();
    for (what, log) in [
        ("server", server.process.stderr()),
        ("agent", agent.process.stderr()),
    ] {
        assert!(
            log.contains("TRACE") || log.contains("DEBUG"),
            "{what} logged nothing at trace"
        );
        for secret in [TOKEN, payload.as_str()] {
            let line = log.lines().find(|line| line.contains(secret));
            assert!(line.is_none(), "{what} logged {secret:?}: {line:?}");
        }
    }
}
