//! A restart of the server under the fleet: a signal, a new process on the same ports once
//! the old one exited, and the way back of every agent.

use std::time::{Duration, Instant};

use anyhow::bail;
use bridgehead_e2e::{procfs, Server};
use serde_json::json;

use super::counters::Snapshot;
use super::stalled::Stalled;
use super::{agent, check, Fleet, Plan};
use crate::noise::Noise;
use crate::report::Report;

/// How long a SIGTERMed server may take to drain and exit.
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// Issue 38's targets.
const TARGET_RECOVERY: Duration = Duration::from_secs(15);
const TARGET_FAILED_PER_AGENT: f64 = 0.1;

/// What one restart cost.
#[derive(Debug)]
struct Recovery {
    /// From the signal until the old server exited, and until the new one listened.
    exited: Duration,
    listening: Duration,
    /// From the new server listening until every agent was back (`None`: not within the bound).
    back: Option<Duration>,
    /// What the simulator saw from the signal until every agent was back.
    seen: Snapshot,
    /// The new server's CPU until every agent was back, and the simulator's since the signal.
    server_cpu: f64,
    simulator_cpu: f64,
    /// CPU seconds neither the servers, the simulator nor the bench used meanwhile, and the
    /// time they were counted over.
    foreign_cpu: f64,
    wall: f64,
    /// Stalled handshakes held through the restart: opened, and closed by the server.
    stalled: Option<(u64, u64)>,
    error: Option<String>,
}

/// Restarts the server with `signal` (a new process on the same ports once the old one
/// exited) and measures the way back.
pub(super) fn restart(
    fleet: &mut Fleet,
    signal: &str,
    plan: &Plan,
    runtime: &tokio::runtime::Handle,
    report: &mut Report,
) -> anyhow::Result<()> {
    if signal == "KILL" {
        // The agent counts the loss of a session younger than this as a failed attempt and
        // backs off: let every session become healthy first, as in a fleet that ran a while.
        let healthy = fleet.back_at + agent::HEALTHY_SESSION + Duration::from_secs(1);
        std::thread::sleep(healthy.saturating_duration_since(Instant::now()));
    }
    eprintln!("  restart: SIG{signal}, then a new server on the same ports");
    let before = fleet.workers.stats()?;
    let simulator = fleet.workers.pids();
    let noise = Noise::start(&simulator);
    let simulator_before = procfs::cpu_sample(&simulator)?;
    let stalled =
        (plan.stalled > 0).then(|| Stalled::start(runtime, fleet.server.agent_addr, plan.stalled));
    let started = Instant::now();
    fleet.server.process.signal(signal)?;
    fleet.server.process.wait_exit(EXIT_BOUND)?;
    let exited = started.elapsed();
    fleet.server = Server::start(&fleet.pki, fleet.options.clone())?;
    let listening = started.elapsed();
    let waited = fleet.wait_all_back(plan.recovery_bound);
    let after = fleet.workers.stats()?;
    let stalled = stalled.map(|stalled| runtime.block_on(stalled.stop()));
    let server_cpu = procfs::cpu_seconds(fleet.server.process.pid()).unwrap_or(f64::NAN);
    let simulator_cpu = procfs::cpu_sample(&simulator)?.seconds_since(&simulator_before);
    let (wall, foreign, _) = noise.finish();
    let recovery = Recovery {
        exited,
        listening,
        back: waited.as_ref().ok().copied(),
        seen: after.since(&before),
        server_cpu,
        simulator_cpu,
        // The old server's CPU after the signal (its drain) is gone with it and counts here:
        // a little foreign CPU too many after SIGTERM.
        foreign_cpu: (foreign - server_cpu).max(0.0),
        wall,
        stalled,
        error: waited.err().map(|e| format!("{e:#}")),
    };
    report_recovery(report, fleet.agents, signal, &recovery)?;
    match &recovery.error {
        // The next restart needs the whole fleet back.
        Some(error) => bail!("after SIG{signal}: {error}"),
        None => Ok(()),
    }
}

fn report_recovery(
    report: &mut Report,
    n: usize,
    signal: &str,
    r: &Recovery,
) -> anyhow::Result<()> {
    // Linux refuses a connection only where nothing listens (a full backlog drops the SYN
    // instead): a refused attempt found the restart's gap, not the server's admission. Every
    // other failed attempt counts.
    let refused = r.seen.failed_of("refused");
    let failed = r.seen.failed() - refused;
    let mut failures = r.seen.clone();
    failures.failures.remove("refused");
    let back = r.back.map_or_else(
        || "not all back".to_owned(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    );
    eprintln!(
        "  SIG{signal}: old server gone after {:.2} s, new one listening after {:.2} s; all back {back} later; failed attempts {failed} ({}); refused (no server) {refused}; simulator CPU {:.1} s",
        r.exited.as_secs_f64(),
        r.listening.as_secs_f64(),
        failures.failures_text(),
        r.simulator_cpu
    );
    report.record(
        "fleet_restart",
        json!({
            "agents": n,
            "signal": signal,
            "exited_s": r.exited.as_secs_f64(),
            "listening_s": r.listening.as_secs_f64(),
            "back_s": r.back.map(|d| d.as_secs_f64()),
            "failed": failed,
            "failures": failures.failures,
            "refused_no_server": refused,
            "simulator_cpu_s": r.simulator_cpu,
            "attempts": r.seen.attempts,
            "connected": r.seen.connected,
            "drained": r.seen.drained,
            "lost": r.seen.lost,
            "retry_hints": r.seen.hints,
            "stalled_opened": r.stalled.map(|(opened, _)| opened),
            "stalled_closed": r.stalled.map(|(_, closed)| closed),
            "server_cpu_s": r.server_cpu,
            "foreign_cpu_s": r.foreign_cpu,
            "wall_s": r.wall,
            "error": r.error,
        }),
    )?;
    report.row(
        "Fleet: recovery after a server restart (new server on the same ports)",
        &[
            "agents",
            "signal",
            "old gone / new listening",
            "all back (from new server)",
            "failed attempts",
            "by kind",
            "refused (no server)",
            "retry hints",
            "stalled handshakes opened / cut",
            "new server CPU",
            "simulator CPU",
            "other load",
        ],
        vec![
            n.to_string(),
            format!("SIG{signal}"),
            format!(
                "{:.2} s / {:.2} s",
                r.exited.as_secs_f64(),
                r.listening.as_secs_f64()
            ),
            back.clone(),
            failed.to_string(),
            failures.failures_text(),
            refused.to_string(),
            r.seen.hints.to_string(),
            r.stalled.map_or_else(
                || "-".to_owned(),
                |(opened, closed)| format!("{opened} / {closed}"),
            ),
            format!("{:.1} s", r.server_cpu),
            format!("{:.1} s", r.simulator_cpu),
            format!("{:.2} cores", r.foreign_cpu / r.wall.max(1e-9)),
        ],
    );
    check_recovery(report, n, signal, r, back, failed);
    Ok(())
}

/// The targets of one restart: every agent back within 15 s, fewer than one failed attempt
/// per ten agents.
fn check_recovery(
    report: &mut Report,
    n: usize,
    signal: &str,
    r: &Recovery,
    back: String,
    failed: u64,
) {
    check(
        report,
        format!("fleet: {n} agents back after SIG{signal} and a new server"),
        back,
        "≤ 15 s",
        r.back.is_some_and(|d| d <= TARGET_RECOVERY),
    );
    let per_agent = failed as f64 / n.max(1) as f64;
    check(
        report,
        format!("fleet: failed attempts on the way back after SIG{signal}, {n} agents"),
        format!("{failed} ({per_agent:.2} per agent)"),
        "< 0.1 per agent",
        r.back.is_some() && per_agent < TARGET_FAILED_PER_AGENT,
    );
}
