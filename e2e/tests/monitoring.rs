//! deploy/monitoring against the real things: the generated files are current, promtool
//! passes the rules and their tests (each alert fires on its case and stays silent on a
//! healthy fleet), every dashboard query and alert signal returns data from a Prometheus that
//! scraped a running server and agents, and the kustomization (PrometheusRule, PodMonitors)
//! validates against kube-apiserver with the prometheus-operator's CRDs. Needs Python,
//! `scripts/prometheus.sh`, and for the last test root, Go and `scripts/k8s-build.sh`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bridgehead_e2e::client::{kube_connect, open_tunnel, tls_connect};
use bridgehead_e2e::process::{start_pair, wait_until};
use bridgehead_e2e::prometheus::{self, promtool, Prometheus};
use bridgehead_e2e::{kubernetes, netns, target, Agent, AgentOptions, Pki, ServerOptions};

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// `generate.py` with `args`: its standard output.
fn generate(args: &[&str]) -> String {
    let output = Command::new("python3")
        .arg(monitoring().join("generate.py"))
        .args(args)
        .output()
        .expect("running deploy/monitoring/generate.py");
    assert!(
        output.status.success(),
        "generate.py {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_generated_files_are_current_and_the_rule_tests_pass() {
    let test = "the_generated_files_are_current_and_the_rule_tests_pass";
    generate(&["--check"]);
    let Some(binaries) = prometheus::require(test) else {
        return;
    };
    let dir = monitoring();
    let checked = promtool(
        &binaries,
        &dir,
        &["check", "rules", "bridgehead.rules.yaml"],
    )
    .unwrap();
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(
        &binaries,
        &dir.join("tests"),
        &["test", "rules", "bridgehead.rules.test.yaml"],
    )
    .unwrap();
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Serves `page` as `/metrics` to every request: kube-state-metrics' series for the test's
/// nodes, which the node alerts join with the agents' (no kube-state-metrics runs here).
fn serve_page(page: String) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{page}",
                page.len()
            );
        }
    });
    addr
}

#[test]
fn every_dashboard_query_and_alert_signal_returns_data_from_a_scraped_fleet() {
    let test = "every_dashboard_query_and_alert_signal_returns_data_from_a_scraped_fleet";
    let Some(binaries) = prometheus::require(test) else {
        return;
    };
    let pki = Pki::new().unwrap();
    let (server, agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let second = Agent::start(
        &pki,
        &server,
        AgentOptions {
            id: Some("edge-2".into()),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(2).unwrap();
    // Traffic of both kinds: a tunnel that works and a dial that is refused.
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut tunnel = open_tunnel(&pki, server.frontend_addr(), &echo.to_string());
    tunnel.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).unwrap();
    let closed = target::closed_port().unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &closed.to_string())
            .unwrap()
            .status,
        502
    );

    let kube_state = serve_page(
        [
            "kube_node_info{node=\"n1\"} 1",
            "kube_node_info{node=\"n2\"} 1",
            "kube_pod_info{node=\"n1\",pod=\"web-1\",created_by_kind=\"ReplicaSet\"} 1",
            "kube_pod_info{node=\"n2\",pod=\"web-2\",created_by_kind=\"ReplicaSet\"} 1",
        ]
        .join("\n")
            + "\n",
    );
    let rules = monitoring().join("bridgehead.rules.yaml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files: [\"{rules}\"]\n\
         scrape_configs:\n\
         - job_name: bridgehead-server\n  static_configs:\n  - targets: [\"{server}\"]\n\
         - job_name: bridgehead-agent\n  static_configs:\n  - targets: [\"{a1}\"]\n    labels: {{node: n1}}\n  - targets: [\"{a2}\"]\n    labels: {{node: n2}}\n\
         - job_name: kube-state-metrics\n  static_configs:\n  - targets: [\"{kube_state}\"]\n",
        rules = rules.display(),
        server = server.health,
        a1 = agent.health,
        a2 = second.health,
    );
    let prometheus = Prometheus::start(&binaries, &config).unwrap();

    let queries: Vec<String> = generate(&["--queries"]).lines().map(Into::into).collect();
    assert!(queries.len() > 20, "{queries:?}");
    let mut empty = BTreeMap::new();
    let all_answer = wait_until(Duration::from_secs(60), || {
        empty.clear();
        for query in &queries {
            match prometheus.query(query) {
                Ok(result) if !result.is_empty() => {}
                Ok(_) => {
                    empty.insert(query.clone(), "no data".to_owned());
                }
                Err(error) => {
                    empty.insert(query.clone(), format!("{error:#}"));
                }
            }
        }
        empty.is_empty()
    });
    assert!(
        all_answer.is_ok(),
        "queries without data after a minute of scrapes:\n{empty:#?}"
    );
    // And on this healthy fleet, no Bridgehead alert fires.
    let firing = prometheus.query("ALERTS{alertstate=\"firing\"}").unwrap();
    assert!(firing.is_empty(), "{firing:#?}");
    drop((tunnel, conn));
}

#[test]
fn the_monitoring_kustomization_validates_against_kube_apiserver() {
    let test = "the_monitoring_kustomization_validates_against_kube_apiserver";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    let Some(crds) = prometheus::operator_crds().unwrap() else {
        bridgehead_e2e::skip::skip(test, "needs Go for the prometheus-operator's CRDs");
        return;
    };
    netns::with_net(test, 1, Duration::from_secs(180), move |mut net| {
        let control_plane = kubernetes::ControlPlane::start(
            &binaries,
            &mut net,
            0,
            kubernetes::Egress::Direct,
            &[],
        )
        .unwrap();
        prometheus::install_operator_crds(&control_plane, &crds).unwrap();
        let out = control_plane
            .kubectl_ok(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-k",
                &monitoring().display().to_string(),
            ])
            .unwrap_or_else(|e| panic!("deploy/monitoring: {e:#}"));
        for created in [
            "prometheusrule.monitoring.coreos.com/bridgehead created (server dry run)",
            "podmonitor.monitoring.coreos.com/bridgehead-server created (server dry run)",
            "podmonitor.monitoring.coreos.com/bridgehead-agent created (server dry run)",
            "configmap/bridgehead-dashboard created (server dry run)",
        ] {
            assert!(out.contains(created), "{created}\n{out}");
        }
        // kube-prometheus-stack's overlay: what its default selectors pick (`release`), and
        // the dashboard where its Grafana sidecar looks (`grafana_dashboard`); the scrapes by
        // port name (`targetPort` is deprecated).
        let out = control_plane
            .kubectl_ok(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-o",
                "json",
                "-k",
                &monitoring()
                    .join("../monitoring-kube-prometheus-stack")
                    .display()
                    .to_string(),
            ])
            .unwrap_or_else(|e| panic!("deploy/monitoring-kube-prometheus-stack: {e:#}"));
        let objects: serde_json::Value = serde_json::from_str(&out).unwrap();
        let items = objects["items"].as_array().unwrap();
        assert_eq!(items.len(), 4, "{out}");
        for item in items {
            let labels = &item["metadata"]["labels"];
            assert_eq!(labels["release"], "kube-prometheus-stack", "{item}");
            match item["kind"].as_str().unwrap() {
                "ConfigMap" => {
                    assert_eq!(labels["grafana_dashboard"], "1");
                    let board: serde_json::Value =
                        serde_json::from_str(item["data"]["bridgehead.json"].as_str().unwrap())
                            .unwrap();
                    assert_eq!(board["uid"], "bridgehead-fleet");
                }
                "PodMonitor" => {
                    for endpoint in item["spec"]["podMetricsEndpoints"].as_array().unwrap() {
                        assert!(endpoint["port"].is_string(), "{endpoint}");
                        assert!(endpoint.get("targetPort").is_none(), "{endpoint}");
                    }
                }
                _ => {}
            }
        }
    });
}
