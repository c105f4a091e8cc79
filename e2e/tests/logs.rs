//! `--log-format json`: every line on stderr is one JSON object a log collector can read, with
//! the structured fields (the agent's announced identifiers, bound addresses).

use bridgehead_e2e::client::{echo_round_trip, http_get, kube_connect, uds_connect};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

fn json_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// A server and its agent logging JSON lines, both with `env`; `agent` as the agent's
/// options otherwise.
fn json_pair(pki: &Pki, env: &[(&str, &str)], agent: AgentOptions) -> (Server, Agent) {
    let json = vec!["--log-format".to_owned(), "json".to_owned()];
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    let server = Server::start(
        pki,
        ServerOptions {
            args: json.clone(),
            env: env.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(
        pki,
        &server,
        AgentOptions {
            args: json,
            env,
            ..agent
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    (server, agent)
}

#[test]
fn server_and_agent_log_json_lines() {
    let pki = Pki::new().unwrap();
    let (server, agent) = json_pair(
        &pki,
        &[],
        AgentOptions {
            id: Some("json-agent".into()),
            identifiers: Some("host=node-j&ipv4=10.9.8.7".into()),
            ..Default::default()
        },
    );
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

/// At `info` (the level without `-v` or `RUST_LOG`) nothing below it shows, the libraries'
/// lines included: a directive that capped rustls at debug once switched its lines on, two to
/// ten for every TLS handshake.
#[test]
fn info_shows_no_library_debug_lines() {
    let pki = Pki::new().unwrap();
    let (server, agent) = json_pair(&pki, &[("RUST_LOG", "info")], AgentOptions::default());
    let echo = bridgehead_e2e::target::echo("127.0.0.1:0").unwrap();
    let mut conn = bridgehead_e2e::client::tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    echo_round_trip(conn.as_mut(), b"ping");
    drop(conn);
    for (what, log) in [
        ("server", server.process.stderr()),
        ("agent", agent.process.stderr()),
    ] {
        let lines = json_lines(&log);
        assert!(!lines.is_empty(), "{what} logged nothing");
        for line in lines {
            let level = line["level"].as_str().unwrap_or_default();
            assert!(
                ["INFO", "WARN", "ERROR"].contains(&level),
                "{what} logged below info: {line}"
            );
        }
    }
}

/// A `RUST_LOG` directive that names a span still filters by it: debug lines inside the
/// agent's session span show, and none outside it. (The level filter is told of span enters
/// and exits only while a directive names a span; it skips them otherwise.)
#[test]
fn a_span_directive_shows_debug_lines_inside_that_span_only() {
    let pki = Pki::new().unwrap();
    let mut server = Server::start(&pki, ServerOptions::default()).unwrap();
    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            env: vec![("RUST_LOG".to_owned(), "info,[session]=debug".to_owned())],
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    // The server going away ends the agent's session, which the session's driver logs at
    // debug inside the session span.
    server.process.kill();
    agent
        .process
        .wait_log("session ending", std::time::Duration::from_secs(30))
        .unwrap();
    let log = agent.process.stderr();
    let debug: Vec<&str> = log.lines().filter(|line| line.contains("DEBUG")).collect();
    assert!(!debug.is_empty(), "{log}");
    for line in debug {
        assert!(
            line.contains("session{"),
            "a debug line outside the span: {line}"
        );
    }
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

/// Reads `child`'s stdout until it has announced `wants` (`<binary> <what> listening on
/// <address>`); the addresses, in order.
fn announced(stdout: &mut impl std::io::BufRead, wants: &[&str]) -> Vec<String> {
    let mut found = vec![String::new(); wants.len()];
    let mut line = String::new();
    while found.iter().any(String::is_empty) {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "stdout ended early"
        );
        for (i, what) in wants.iter().enumerate() {
            if let Some((_, address)) = line.split_once(&format!(" {what} listening on ")) {
                found[i] = address.trim().to_owned();
            }
        }
    }
    found
}

/// A process whose log readers went away (a collector that died, a closed terminal): every
/// line after that meets a broken pipe. Logging must drop them, not panic and not wedge: a
/// tunnel still works and logs its end, and SIGTERM still drains and exits 0.
#[test]
fn closed_output_pipes_neither_crash_nor_wedge_either_binary() {
    use std::io::BufReader;
    use std::process::{Command, Stdio};

    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock");
    let path = |f: &str| pki.path(f).display().to_string();
    let mut server = Command::new(bridgehead_e2e::process::binary("bridgehead-server").unwrap())
        .args([
            "--uds-name",
            &socket.display().to_string(),
            "--server-port=0",
        ])
        .args([
            "--cluster-cert",
            &path("cluster.crt"),
            "--cluster-key",
            &path("cluster.key"),
        ])
        .args(["--cluster-ca-cert", &path("cluster-ca.crt")])
        .args([
            "--agent-port=0",
            "--agent-bind-address=127.0.0.1",
            "--health-port=0",
        ])
        .args([
            "--health-bind-address=127.0.0.1",
            "--admin-port=0",
            "--shutdown-grace-period=5s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let addresses = announced(&mut out, &["agent endpoint", "admin", "health"]);
    let agent_port = addresses[0].rsplit(':').next().unwrap().to_owned();
    let admin: std::net::SocketAddr = addresses[1].parse().unwrap();
    let health: std::net::SocketAddr = addresses[2].parse().unwrap();
    let mut agent = Command::new(bridgehead_e2e::process::binary("bridgehead-agent").unwrap())
        .args([
            "--proxy-server-port",
            &agent_port,
            "--ca-cert",
            &path("cluster-ca.crt"),
        ])
        .args([
            "--agent-cert",
            &path("agent.crt"),
            "--agent-key",
            &path("agent.key"),
        ])
        .args(["--health-server-port=0", "--health-bind-address=127.0.0.1"])
        .args([
            "--admin-server-port=0",
            "--keepalive-time=1s",
            "--drain-grace-period=5s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The readers go away: the agent's before it has written anything (even the addresses it
    // announces on stdout), the server's once it has announced its own.
    drop(agent.stdout.take());
    drop(agent.stderr.take());
    drop(out);
    drop(server.stderr.take());

    // Both still work, every line they log meanwhile meeting a closed pipe.
    let agents = || -> usize {
        let Ok((_, body)) = http_get(admin, "/agents") else {
            return 0;
        };
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["agents"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    wait_until(std::time::Duration::from_secs(20), || agents() == 1).unwrap_or_else(|_| {
        panic!(
            "the agent did not connect; it exited: {:?}",
            agent.try_wait()
        )
    });
    let echo = bridgehead_e2e::target::echo("127.0.0.1:0").unwrap();
    for round in 0..3 {
        let mut conn = uds_connect(&socket).unwrap();
        assert_eq!(
            kube_connect(conn.as_mut(), &echo.to_string())
                .unwrap()
                .status,
            200
        );
        echo_round_trip(conn.as_mut(), format!("round {round}").as_bytes());
    }
    // The lines that met the closed pipe are counted, not lost silently.
    let (_, page) = http_get(health, "/metrics").unwrap();
    let dropped =
        bridgehead_e2e::client::metric_in(&page, "bridgehead_server_log_lines_dropped_total")
            .unwrap_or(0.0);
    assert!(dropped >= 3.0, "dropped lines: {dropped}\n{page}");
    for (child, name) in [(&mut agent, "agent"), (&mut server, "server")] {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} still running after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "{name}: {status}");
    }
}
