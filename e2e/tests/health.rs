//! The health ports (liveness, readiness that follows the agent session, metrics) and the
//! admin port (/agents), each serving only its own routes.

use bridgehead_e2e::client::{http_get, http_request, kube_connect, tls_connect, IO_TIMEOUT};
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
