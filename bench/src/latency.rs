//! Round-trip latency of small request/response exchanges on an open tunnel, and the
//! percentile summary the setup measurement shares.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::report::{micros, Check, Outcome, Report};
use crate::rig::Rig;
use crate::route::{Conn, Route};
use crate::summary::Summary;
use crate::Budget;
use bridgehead_e2e::client::tunnel::Frontend;
use bridgehead_e2e::procfs;
use bridgehead_e2e::target::bulk as target;

/// Size of each request and of its response.
const MESSAGE: usize = 64;
/// Exchanges before timing starts.
const WARMUP: usize = 200;
/// An exchange may run this much past its time bound before it counts as hung.
const GRACE: Duration = Duration::from_secs(10);
/// The round trip through Bridgehead may add this much to the direct p50.
const RTT_BUDGET: Duration = Duration::from_micros(50);

/// Round trips on one connection: their times, and the CPU the proxy's processes spent on
/// each.
#[derive(Debug)]
pub struct RoundTrips {
    pub summary: Summary,
    /// CPU seconds per exchange of the processes measured (none when none were given or
    /// `/proc` could not be read). Wait-dominated latency hides the work a round trip costs;
    /// this shows it.
    pub cpu_per_exchange: Option<f64>,
}

/// Times up to `count` exchanges of [`MESSAGE`] bytes (at most `limit`) on one connection,
/// counting the CPU `pids` spend on them (the warm-up not included).
pub async fn round_trips(
    route: &Route,
    target: SocketAddr,
    count: usize,
    limit: Duration,
    pids: &[u32],
) -> anyhow::Result<RoundTrips> {
    let mut conn = echo_tunnel(route, target, limit).await?;
    timed_round_trips(&mut conn, count, limit, pids).await
}

/// Times up to `count` exchanges (at most `limit`) on an echo connection already warmed up
/// ([`echo_tunnel`]), counting the CPU `pids` spend on them.
pub async fn timed_round_trips(
    conn: &mut Conn,
    count: usize,
    limit: Duration,
    pids: &[u32],
) -> anyhow::Result<RoundTrips> {
    let cpu_before = procfs::cpu_sample(pids).ok();
    let mut samples = exchanges(conn, count, limit).await?;
    let cpu_after = procfs::cpu_sample(pids).ok();
    let cpu_per_exchange = cpu_before
        .zip(cpu_after)
        .filter(|_| !pids.is_empty() && !samples.is_empty())
        .map(|(before, after)| after.seconds_since(&before) / samples.len() as f64);
    Ok(RoundTrips {
        summary: Summary::of(&mut samples),
        cpu_per_exchange,
    })
}

/// Opens a connection to the echo target and warms it up with [`WARMUP`] exchanges (the
/// warm-up at most `limit`).
pub async fn echo_tunnel(
    route: &Route,
    target: SocketAddr,
    limit: Duration,
) -> anyhow::Result<Conn> {
    let mut conn = route.open(target).await?;
    target::start_echo(&mut conn).await?;
    exchanges(&mut conn, WARMUP, limit).await?;
    Ok(conn)
}

/// Up to `count` exchanges on an echo connection, stopping after `limit`; the time of each.
pub async fn exchanges(
    conn: &mut Conn,
    count: usize,
    limit: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let message = [0x42u8; MESSAGE];
    let mut reply = [0u8; MESSAGE];
    let exchanges = async {
        let mut samples = Vec::with_capacity(count);
        let deadline = Instant::now() + limit;
        while samples.len() < count && Instant::now() < deadline {
            let started = Instant::now();
            target::echo(conn, &message, &mut reply).await?;
            samples.push(started.elapsed());
        }
        anyhow::Ok(samples)
    };
    tokio::time::timeout(limit + GRACE, exchanges)
        .await
        .map_err(|_| anyhow::anyhow!("round trips did not finish in time"))?
}

/// Round trips direct, through the mTLS frontend and through the Unix socket.
pub async fn run(rig: &Rig, target: SocketAddr, budget: &Budget, report: &mut Report) {
    eprintln!("== round trip, {MESSAGE}-byte request/response on an open tunnel");
    let mut direct = None;
    for route in rig.routes() {
        // Whose CPU counts: the route's server and agent (none for direct).
        let pids = match &route {
            Route::Bridgehead(Frontend::Mtls { .. }) => rig.pids(),
            Route::Bridgehead(_) => rig.uds().map(|(_, pids)| pids.to_vec()).unwrap_or_default(),
            _ => Vec::new(),
        };
        let result = round_trips(&route, target, budget.rtt_count, budget.rtt_time, &pids).await;
        let (summary, cpu) = match result {
            Ok(trips) => (trips.summary, trips.cpu_per_exchange),
            Err(error) => {
                report.failed(
                    &format!("round trip {}", route.label()),
                    "p50 ≤ direct + 50 µs",
                    &error,
                );
                continue;
            }
        };
        eprintln!(
            "  {}: p50 {} p99 {} (n={})",
            route.label(),
            micros(summary.p50),
            micros(summary.p99),
            summary.n
        );
        let _ = report.record(
            "rtt",
            json!({
                "route": route.label(),
                "message_bytes": MESSAGE,
                "n": summary.n,
                "p50_us": summary.p50.as_secs_f64() * 1e6,
                "p99_us": summary.p99.as_secs_f64() * 1e6,
                "mean_us": summary.mean.as_secs_f64() * 1e6,
                "max_us": summary.max.as_secs_f64() * 1e6,
                "server_agent_cpu_us_per_round_trip": cpu.map(|cpu| cpu * 1e6),
            }),
        );
        report.row(
            "Round trip (64 B request/response, open tunnel)",
            &["route", "p50", "p99", "mean", "samples", "server+agent CPU"],
            vec![
                route.label().to_owned(),
                micros(summary.p50),
                micros(summary.p99),
                micros(summary.mean),
                summary.n.to_string(),
                cpu.map_or_else(|| "–".to_owned(), |cpu| format!("{:.1} µs", cpu * 1e6)),
            ],
        );
        match (&route, direct) {
            (Route::Direct, _) => direct = Some(summary),
            (Route::Bridgehead(Frontend::Mtls { .. }), Some(direct)) => {
                let added = summary.p50.saturating_sub(direct.p50);
                let _ = report.check(Check {
                    what: "round trip p50 (mTLS tunnel)".to_owned(),
                    bridgehead: micros(summary.p50),
                    direct: micros(direct.p50),
                    ratio: format!("+{}", micros(added)),
                    target: "≤ direct + 50 µs".to_owned(),
                    outcome: Outcome::of(summary.p50 <= direct.p50 + RTT_BUDGET),
                });
            }
            _ => {}
        }
    }
}
