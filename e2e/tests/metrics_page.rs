//! The server's `/metrics` page, family by family, is the one kept in
//! `e2e/tests/metrics_page/server.txt`: every family's `# HELP` and `# TYPE` lines, every series
//! (name and labels, the preset label values among them) and, on a fresh server with one agent
//! and one tunnel, every value that does not depend on time or the machine. Where a metric is
//! registered in the code may change; what a scraper reads may not.
//!
//! The page is compared in a canonical order: families by name, series sorted within a family.
//! prometheus_client writes a family's series in its hash map's order, which changes from one
//! start to the next, so no two pages of the same build are byte for byte alike in order; each
//! line is. When the page changes on purpose, the assertion prints the new canonical page to
//! keep.

use std::collections::BTreeMap;

use bridgehead_e2e::client::{echo_round_trip, open_tunnel};
use bridgehead_e2e::process::{start_pair, wait_until};
use bridgehead_e2e::{target, Pki, ServerOptions};

/// The page as kept: `e2e/tests/metrics_page/server.txt`.
fn kept() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/metrics_page/server.txt"
    ))
    .unwrap()
}

/// Families whose values depend on the clock or the machine: their lines are kept, their
/// values written as `_`.
const VOLATILE: [&str; 6] = [
    "process_",
    "bridgehead_server_dial_duration_seconds",
    "konnectivity_network_proxy_server_dial_duration_seconds",
    "konnectivity_network_proxy_server_connection_duration_seconds",
    "bridgehead_server_certificate_expiry",
    "bridgehead_server_tunnel_send_waits",
];

/// `page` in the canonical order, volatile values and the build's commit masked.
fn canonical(page: &str) -> String {
    let mut families: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut current = String::new();
    for line in page.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            current = rest.split(' ').next().unwrap_or(rest).to_owned();
        }
        let entry = families.entry(current.clone()).or_default();
        if line.starts_with('#') {
            entry.0.push(line.to_owned());
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let series = match series.strip_prefix("bridgehead_build_info{") {
            Some(_) => "bridgehead_build_info{commit=_,version=_}".to_owned(),
            None => series.to_owned(),
        };
        let value = if VOLATILE.iter().any(|prefix| series.starts_with(prefix)) {
            "_"
        } else {
            value
        };
        entry.1.push(format!("{series} {value}"));
    }
    let mut text = String::new();
    for (_, (mut head, mut series)) in families {
        head.sort();
        series.sort();
        for line in head.iter().chain(&series) {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

#[test]
fn the_servers_metrics_page_is_the_one_kept() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = open_tunnel(&pki, server.frontend_addr(), &echo.to_string());
    echo_round_trip(conn.as_mut(), b"hello");
    drop(conn);
    wait_until(bridgehead_e2e::client::IO_TIMEOUT, || {
        server.metric("bridgehead_server_tunnels_open").unwrap() == 0.0
    })
    .unwrap();
    let (status, page) = server.get("/metrics").unwrap();
    assert_eq!(status, 200);
    let page = canonical(&page);
    assert!(
        page == kept(),
        "the server's /metrics page differs from e2e/tests/metrics_page/server.txt; it reads:\n{page}"
    );
}
