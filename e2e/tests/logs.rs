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
