//! The health ports (liveness, readiness that follows the agent session, metrics) and the
//! admin port (/agents, /config), each serving only its own routes.

use bridgehead_e2e::client::{
    http_get, http_request, kube_connect, open_tunnel, tls_connect, IO_TIMEOUT,
};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

/// The value of the series whose name and labels equal `series`, ignoring ASCII case.
fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            name.eq_ignore_ascii_case(series)
                .then(|| value.parse().ok())
                .flatten()
        })
}

#[test]
fn health_readiness_metrics_and_agents() {
    let pki = Pki::new().unwrap();
    let mut server = Server::start(&pki, ServerOptions::default()).unwrap();
    assert_eq!(server.get("/healthz").unwrap().0, 200);
    let (status, reason) = server.get("/readyz").unwrap();
    assert_eq!(status, 503, "ready without an agent: {reason}");
    assert!(reason.contains("agent"), "{reason}");

    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            id: Some("edge-1".into()),
            identifiers: Some("host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24".into()),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    assert_eq!(server.get("/readyz").unwrap().0, 200);
    assert_eq!(agent.get("/healthz").unwrap().0, 200);
    assert_eq!(agent.get("/readyz").unwrap().0, 200);

    // Endpoints by audience: the agents' addresses are on the admin port only.
    assert_eq!(server.get("/agents").unwrap().0, 404);
    let agents = server.agents().unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    let listed = &agents[0];
    assert_eq!(listed["id"], "edge-1");
    assert_eq!(listed["draining"], false);
    assert_eq!(listed["identifiers"]["host"], serde_json::json!(["node1"]));
    assert_eq!(
        listed["identifiers"]["ipv4"],
        serde_json::json!(["10.0.0.5"])
    );
    assert_eq!(
        listed["identifiers"]["cidr"],
        serde_json::json!(["10.244.1.0/24"])
    );

    // A refused dial shows on both sides' metrics.
    let closed = target::closed_port().unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &closed.to_string())
            .unwrap()
            .status,
        502
    );
    let (status, body) = server.get("/metrics").unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        metric(&body, "bridgehead_server_agents_connected"),
        Some(1.0)
    );
    assert_eq!(metric(&body, "bridgehead_server_tunnels_open"), Some(0.0));
    assert_eq!(
        metric(&body, "bridgehead_server_dials_total{result=\"refused\"}"),
        Some(1.0),
        "{body}"
    );
    let (_, body) = agent.get("/metrics").unwrap();
    assert_eq!(
        metric(&body, "bridgehead_agent_dials_total{result=\"refused\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(metric(&body, "bridgehead_agent_connected"), Some(1.0));

    // The agent is ready only while its session is up.
    server.process.kill();
    wait_until(IO_TIMEOUT, || matches!(agent.get("/readyz"), Ok((503, _)))).unwrap();
    assert_eq!(agent.get("/healthz").unwrap().0, 200);
    let (_, body) = http_get(agent.health, "/metrics").unwrap();
    assert_eq!(metric(&body, "bridgehead_agent_connected"), Some(0.0));
}

#[test]
fn metric_labels_are_spelled_alike_on_server_and_agent() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    let closed = target::closed_port().unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &closed.to_string())
            .unwrap()
            .status,
        502
    );
    let (_, body) = agent.get("/metrics").unwrap();
    assert!(body.contains("bridgehead_agent_dials_total{result=\"refused\"} 1"));
    let (_, body) = server.get("/metrics").unwrap();
    assert!(
        body.contains("bridgehead_server_dials_total{result=\"refused\"} 1"),
        "{body}"
    );
}

/// The admin ports change the log level at run time as Kubernetes components do (`PUT
/// /debug/flags/v`); the health ports, reachable from the cluster, do not.
#[test]
fn the_log_level_changes_at_run_time_on_the_admin_ports_only() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    for (admin, health, log) in [
        (server.admin, server.health, &server.process),
        (agent.admin, agent.health, &agent.process),
    ] {
        let (status, body) = http_request(admin, "PUT", "/debug/flags/v", "9").unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("log level trace"), "{body}");
        log.wait_log("log level changed", std::time::Duration::from_secs(10))
            .unwrap();
        let (status, body) = http_request(admin, "PUT", "/debug/flags/v", "loud").unwrap();
        assert_eq!(status, 400, "{body}");
        let (status, _) = http_request(health, "PUT", "/debug/flags/v", "9").unwrap();
        assert_eq!(status, 405);
        let (status, body) = http_request(admin, "PUT", "/debug/flags/v", "2").unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("log level info"), "{body}");
    }
}

/// Each `# TYPE` line of a scrape, as name → type.
fn types(body: &str) -> std::collections::BTreeMap<String, String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

/// The label names of `name`'s first sample (after its suffix, if any).
fn label_names(body: &str, name: &str) -> Option<Vec<String>> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = rest
                .strip_prefix("_total")
                .or_else(|| rest.strip_prefix("_bucket"))
                .unwrap_or(rest);
            if let Some(labels) = rest.strip_prefix('{') {
                let labels = &labels[..labels.find('}')?];
                let mut names: Vec<String> = labels
                    .split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.to_owned()))
                    .filter(|k| k != "le")
                    .collect();
                names.sort();
                Some(names)
            } else {
                rest.starts_with(' ').then(Vec::new)
            }
        })
}

/// konnectivity's series (name, type, labels) on both binaries, beside Bridgehead's, and the
/// standard process series: what dashboards and alerts built on ANP query.
#[test]
fn konnectivity_and_process_metrics_by_name_type_and_labels() {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec!["--proxy-strategies".into(), "destHost,default".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    // One tunnel that works, one dial the target refuses.
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = open_tunnel(&pki, server.frontend_addr(), &echo.to_string());
    bridgehead_e2e::client::echo_round_trip(conn.as_mut(), b"hello");
    drop(conn);
    let closed = target::closed_port().unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &closed.to_string())
            .unwrap()
            .status,
        502
    );
    wait_until(IO_TIMEOUT, || {
        server.metric("bridgehead_server_tunnels_open").unwrap() == 0.0
    })
    .unwrap();

    let server_expected: &[(&str, &str, &[&str])] = &[
        (
            "konnectivity_network_proxy_server_dial_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "konnectivity_network_proxy_server_dial_failure_count",
            "unknown",
            &["reason"],
        ),
        (
            "konnectivity_network_proxy_server_pending_backend_dials",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_server_ready_backend_connections",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_server_ready_backends",
            "gauge",
            &["proxy_strategy"],
        ),
        (
            "konnectivity_network_proxy_server_established_connections",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_server_http_connections",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_server_connection_duration_seconds",
            "histogram",
            &[],
        ),
        ("bridgehead_server_dials", "counter", &["result"]),
        ("bridgehead_server_bytes", "counter", &["direction"]),
        ("bridgehead_build_info", "gauge", &["commit", "version"]),
    ];
    let agent_expected: &[(&str, &str, &[&str])] = &[
        (
            "konnectivity_network_proxy_agent_dial_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "konnectivity_network_proxy_agent_endpoint_dial_failure",
            "counter",
            &["reason"],
        ),
        (
            "konnectivity_network_proxy_agent_open_server_connections",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_agent_known_server_count",
            "gauge",
            &[],
        ),
        (
            "konnectivity_network_proxy_agent_open_endpoint_connections",
            "gauge",
            &[],
        ),
        ("bridgehead_agent_dials", "counter", &["result"]),
        ("bridgehead_build_info", "gauge", &["commit", "version"]),
    ];
    let process: &[(&str, &str, &[&str])] = &[
        ("process_cpu_seconds", "counter", &[]),
        ("process_resident_memory_bytes", "gauge", &[]),
        ("process_virtual_memory_bytes", "gauge", &[]),
        ("process_open_fds", "gauge", &[]),
        ("process_max_fds", "gauge", &[]),
        ("process_start_time_seconds", "gauge", &[]),
    ];
    let (_, server_body) = server.get("/metrics").unwrap();
    let (_, agent_body) = agent.get("/metrics").unwrap();
    for (body, expected) in [
        (&server_body, server_expected),
        (&agent_body, agent_expected),
        (&server_body, process),
        (&agent_body, process),
    ] {
        let types = types(body);
        for (name, kind, labels) in expected {
            assert_eq!(
                types.get(*name).map(String::as_str),
                Some(*kind),
                "{name}\n{body}"
            );
            let found =
                label_names(body, name).unwrap_or_else(|| panic!("{name} has no sample\n{body}"));
            assert_eq!(found, *labels, "{name}");
        }
    }
    // The values mean what ANP's do.
    assert!(
        server_body.contains("konnectivity_network_proxy_server_ready_backend_connections 1\n"),
        "{server_body}"
    );
    assert!(
        server_body.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 1\n"
        ),
        "{server_body}"
    );
    assert!(
        server_body.contains(
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"destHost\"} 0\n"
        ),
        "{server_body}"
    );
    assert!(
        server_body.contains(
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"} 1\n"
        ),
        "{server_body}"
    );
    assert!(
        server_body.contains("konnectivity_network_proxy_server_dial_duration_seconds_count 1\n"),
        "{server_body}"
    );
    assert!(
        server_body
            .contains("konnectivity_network_proxy_server_connection_duration_seconds_count 1\n"),
        "{server_body}"
    );
    assert!(
        agent_body.contains(
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"} 1\n"
        ),
        "{agent_body}"
    );
    assert!(
        agent_body.contains("konnectivity_network_proxy_agent_open_server_connections 1\n"),
        "{agent_body}"
    );
    let rss = metric(&server_body, "process_resident_memory_bytes").unwrap();
    assert!(rss > 1e6, "resident {rss}");
    let started = metric(&agent_body, "process_start_time_seconds").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "start {started}, now {now}"
    );
}

/// Bytes are counted as they flow, not when the tunnel ends; its end is one info line.
#[test]
fn bytes_count_while_a_tunnel_runs_and_its_end_is_logged() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = open_tunnel(&pki, server.frontend_addr(), &echo.to_string());
    let message = vec![b'x'; 100_000];
    bridgehead_e2e::client::echo_round_trip(conn.as_mut(), &message);
    // Still open: both sides have counted every byte already.
    wait_until(IO_TIMEOUT, || {
        server
            .metric("bridgehead_server_bytes_total{direction=\"to_target\"}")
            .unwrap()
            == 100_000.0
            && server
                .metric("bridgehead_server_bytes_total{direction=\"from_target\"}")
                .unwrap()
                == 100_000.0
    })
    .unwrap();
    assert_eq!(
        agent
            .metric("bridgehead_agent_bytes_total{direction=\"to_target\"}")
            .unwrap(),
        100_000.0
    );
    assert_eq!(
        server.metric("bridgehead_server_tunnels_open").unwrap(),
        1.0
    );
    assert!(!server.process.stderr().contains("tunnel ended"));
    drop(conn);
    server.process.wait_log("tunnel ended", IO_TIMEOUT).unwrap();
    let log = server.process.stderr();
    let line = log.lines().find(|l| l.contains("tunnel ended")).unwrap();
    for part in [
        &format!("target={echo}") as &str,
        "to_target=100000",
        "from_target=100000",
        "duration_ms=",
        "agent=",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    assert!(line.contains("INFO"), "{line}");
}

/// Every certificate file each binary uses has its expiry on `/metrics`, by role, read from
/// the file (the alerts on expiry in deploy/monitoring use these).
#[test]
fn certificate_expiry_is_exported_by_role() {
    use bridgehead_runtime::certificates::earliest_not_after;
    let pki = Pki::new().unwrap();
    let (server, agent) =
        bridgehead_e2e::process::start_pair(&pki, ServerOptions::default()).unwrap();
    let (_, body) = server.get("/metrics").unwrap();
    for (role, file) in [
        ("frontend", "server.crt"),
        ("frontend-client-ca", "frontend-ca.crt"),
        ("agent-endpoint", "cluster.crt"),
        ("agent-client-ca", "cluster-ca.crt"),
    ] {
        let series =
            format!("bridgehead_server_certificate_expiry_timestamp_seconds{{role=\"{role}\"}}");
        let expected = earliest_not_after(&pki.path(file)).unwrap() as f64;
        assert_eq!(
            metric(&body, &series),
            Some(expected),
            "{series} in:\n{body}"
        );
    }
    let (_, body) = agent.get("/metrics").unwrap();
    for (role, file) in [("server-ca", "cluster-ca.crt"), ("client", "agent.crt")] {
        let series =
            format!("bridgehead_agent_certificate_expiry_timestamp_seconds{{role=\"{role}\"}}");
        let expected = earliest_not_after(&pki.path(file)).unwrap() as f64;
        assert_eq!(
            metric(&body, &series),
            Some(expected),
            "{series} in:\n{body}"
        );
    }
}

#[test]
fn the_admin_port_shows_the_whole_effective_configuration() {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec![
                "--dial-timeout=1m30s".into(),
                "--proxy-strategies=destHost,default".into(),
                "--max-pending-dials-per-agent=7".into(),
                "--tunnel-memory-budget=64Mi".into(),
            ],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(server.get("/config").unwrap().0, 404, "admin port only");
    let (status, body) = http_get(server.admin, "/config").unwrap();
    assert_eq!(status, 200);
    let config: serde_json::Value = serde_json::from_str(&body).unwrap();
    // What was given, and the defaults beside it, each in its group.
    assert_eq!(config["routing"]["dial_timeout"], "1m30s");
    assert_eq!(
        config["routing"]["strategies"],
        serde_json::json!(["destHost", "default"])
    );
    assert_eq!(config["limits"]["max_pending_dials_per_agent"], 7);
    assert_eq!(config["limits"]["max_pending_dials"], 1024);
    assert_eq!(config["memory"]["tunnel_memory_budget"], 64 << 20);
    assert_eq!(config["agent_endpoint"]["keepalive_time"], "5s");
    assert_eq!(config["agent_endpoint"]["handshake_stall"], "2s");
    assert_eq!(config["frontend"]["listener"]["kind"], "tcp");
    assert_eq!(config["process"]["grace_period"], "30s");
    assert_eq!(config["logging"]["format"], "text");
    for group in ["kubernetes", "tls"] {
        assert!(config[group].is_object(), "{group}: {body}");
    }

    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            id: Some("edge-1".into()),
            args: vec![
                "--sync-interval-cap=20s".into(),
                "--denied-destinations=10.0.0.0/8".into(),
            ],
            ..Default::default()
        },
    )
    .unwrap();
    let (status, body) = http_get(agent.admin, "/config").unwrap();
    assert_eq!(status, 200);
    let config: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(config["identifiers"], "id=edge-1");
    assert_eq!(config["servers"]["sync_interval_cap"], "20s");
    // The harness's own pace.
    assert_eq!(config["servers"]["sync_interval"], "100ms");
    assert_eq!(
        config["destinations"]["denied"],
        serde_json::json!(["10.0.0.0/8"])
    );
    assert_eq!(config["sessions"]["max_tunnels"], 10_000);
    assert_eq!(config["tls"]["token_path"], serde_json::Value::Null);
    for group in ["memory", "logging", "process"] {
        assert!(config[group].is_object(), "{group}: {body}");
    }
}
