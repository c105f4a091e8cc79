//! The fleet at rest: what idle agents cost the server, how fast it routes to one of them,
//! and what one `/agents` and one `/metrics` cost with all of them.

use std::time::{Duration, Instant};

use anyhow::bail;
use bridgehead_e2e::procfs;
use serde_json::json;

use super::{check, probe, Fleet, Plan};
use crate::report::Report;
use crate::summary::Summary;

/// Requests of each admin path timed (the median counts).
const ADMIN_REQUESTS: usize = 5;
/// Issue 38's targets.
const TARGET_RSS_PER_AGENT: u64 = 32 * 1024;
const TARGET_CPU_PER_1000: f64 = 1.0;
const TARGET_ROUTING_P99: Duration = Duration::from_millis(1);

/// The idle fleet: the server's RSS over its baseline and its CPU, per agent and per 1,000.
pub(super) fn idle(
    fleet: &mut Fleet,
    plan: &Plan,
    baseline: u64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let pid = fleet.server.process.pid();
    let rss = settle(pid);
    let simulator = fleet.workers.pids();
    let (server_before, simulator_before) =
        (procfs::cpu_sample(&[pid])?, procfs::cpu_sample(&simulator)?);
    let started = Instant::now();
    std::thread::sleep(plan.idle_window);
    let wall = started.elapsed().as_secs_f64();
    let server_cpu = procfs::cpu_sample(&[pid])?.seconds_since(&server_before);
    let simulator_cpu = procfs::cpu_sample(&simulator)?.seconds_since(&simulator_before);
    let n = fleet.agents;
    let per_agent = rss.saturating_sub(baseline) / n.max(1) as u64;
    let cpu_per_1000 = server_cpu / wall * 100.0 * 1000.0 / n.max(1) as f64;
    let fds = fleet.server.process.fd_count();
    eprintln!(
        "  idle: server RSS {} KiB (baseline {} KiB), {:.1} KiB per agent, CPU {cpu_per_1000:.2} % of a core per 1,000 agents, {fds} fds",
        rss >> 10,
        baseline >> 10,
        per_agent as f64 / 1024.0
    );
    report.record(
        "fleet_idle",
        json!({
            "agents": n,
            "server_rss": rss,
            "baseline_server_rss": baseline,
            "bytes_per_agent": per_agent,
            "window_s": wall,
            "server_cpu_s": server_cpu,
            "cpu_percent_per_1000": cpu_per_1000,
            "simulator_cpu_s": simulator_cpu,
            "simulator_processes": simulator.len(),
            "simulator_rss": procfs::total_rss(&simulator).unwrap_or(0),
            "server_fds": fds,
        }),
    )?;
    report.row(
        "Fleet: idle agents (server RSS over its baseline, server CPU)",
        &[
            "agents",
            "server RSS",
            "per agent",
            "CPU per 1,000 agents",
            "server fds",
            "simulator CPU",
        ],
        vec![
            n.to_string(),
            format!("{} KiB (base {})", rss >> 10, baseline >> 10),
            format!("{:.1} KiB", per_agent as f64 / 1024.0),
            format!("{cpu_per_1000:.2} % of a core"),
            fds.to_string(),
            format!("{:.0} % of a core", simulator_cpu / wall * 100.0),
        ],
    );
    check(
        report,
        format!("fleet: server RSS per idle agent, {n} agents"),
        format!("{:.1} KiB", per_agent as f64 / 1024.0),
        "≤ 32 KiB",
        per_agent <= TARGET_RSS_PER_AGENT,
    );
    check(
        report,
        format!("fleet: server CPU per 1,000 idle agents, {n} agents"),
        format!("{cpu_per_1000:.2} % of a core"),
        "≤ 1 % of a core",
        cpu_per_1000 <= TARGET_CPU_PER_1000,
    );
    Ok(())
}

/// The RSS of `pid` once two samples a quarter second apart differ by less than 256 KiB (at
/// most 5 s): the allocations of the connection storm have settled.
fn settle(pid: u32) -> u64 {
    let mut last = procfs::rss_bytes(pid).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let now = procfs::rss_bytes(pid).unwrap_or(0);
        if now.abs_diff(last) < 256 * 1024 {
            return now;
        }
        last = now;
    }
    last
}

/// CONNECTs one after another, each to a random agent by its address: time to the `200`.
pub(super) fn routing(
    fleet: &mut Fleet,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> anyhow::Result<()> {
    let before = fleet.workers.stats()?;
    let (mut times, failures) = runtime.block_on(async {
        let mut times = Vec::with_capacity(plan.probes);
        let mut failures = probe::Outcomes::new();
        for _ in 0..plan.probes {
            match probe::tunnel(&fleet.route, probe::random_target(plan.agents)).await {
                Ok(time) => times.push(time),
                Err(kind) => *failures.entry(kind).or_default() += 1,
            }
        }
        (times, failures)
    });
    let seen = fleet.workers.stats()?.since(&before);
    let summary = Summary::of(&mut times);
    let n = fleet.agents;
    eprintln!(
        "  routing: {} CONNECTs, p50 {:?} p99 {:?}, misrouted {}, failed {}",
        summary.n,
        summary.p50,
        summary.p99,
        seen.misrouted,
        probe::outcomes_text(&failures)
    );
    report.record(
        "fleet_routing",
        json!({
            "agents": n,
            "connects": plan.probes,
            "ok": summary.n,
            "p50_us": summary.p50.as_secs_f64() * 1e6,
            "p99_us": summary.p99.as_secs_f64() * 1e6,
            "max_us": summary.max.as_secs_f64() * 1e6,
            "misrouted": seen.misrouted,
            "failures": failures,
        }),
    )?;
    report.row(
        "Fleet: CONNECT routed by destHost to a random agent (Unix socket, connect to 200)",
        &[
            "agents",
            "CONNECTs",
            "p50",
            "p99",
            "max",
            "misrouted",
            "failed",
        ],
        vec![
            n.to_string(),
            summary.n.to_string(),
            crate::report::micros(summary.p50),
            crate::report::micros(summary.p99),
            crate::report::micros(summary.max),
            seen.misrouted.to_string(),
            probe::outcomes_text(&failures),
        ],
    );
    let clean = seen.misrouted == 0 && failures.is_empty() && summary.n > 0;
    check(
        report,
        format!("fleet: routing p99 by destHost, {n} agents"),
        format!(
            "{}{}",
            crate::report::micros(summary.p99),
            if clean { "" } else { " (with errors)" }
        ),
        "≤ 1 ms, no error",
        clean && summary.p99 <= TARGET_ROUTING_P99,
    );
    Ok(())
}

/// One `/agents` (admin port) and one `/metrics` (health port) with the whole fleet: time,
/// bytes and the server's CPU, the median of a few.
pub(super) fn admin_cost(fleet: &Fleet, report: &mut Report) -> anyhow::Result<()> {
    let pid = fleet.server.process.pid();
    for (path, addr) in [
        ("/agents", fleet.server.admin),
        ("/metrics", fleet.server.health),
    ] {
        let mut times = Vec::with_capacity(ADMIN_REQUESTS);
        let mut bytes = 0;
        let before = procfs::cpu_sample(&[pid])?;
        for _ in 0..ADMIN_REQUESTS {
            let started = Instant::now();
            let (status, body) = bridgehead_e2e::client::http_get(addr, path)?;
            times.push(started.elapsed());
            if status != 200 {
                bail!("{path} answered {status}");
            }
            bytes = body.len();
        }
        let cpu = procfs::cpu_sample(&[pid])?.seconds_since(&before) / ADMIN_REQUESTS as f64;
        let summary = Summary::of(&mut times);
        eprintln!(
            "  {path}: {:?} median, {bytes} bytes, {:.1} ms server CPU",
            summary.p50,
            cpu * 1e3
        );
        report.record(
            "fleet_admin",
            json!({
                "agents": fleet.agents,
                "path": path,
                "median_us": summary.p50.as_secs_f64() * 1e6,
                "max_us": summary.max.as_secs_f64() * 1e6,
                "bytes": bytes,
                "server_cpu_s": cpu,
            }),
        )?;
        report.row(
            "Fleet: one admin request with every agent connected (no target in issue 38)",
            &["agents", "path", "time (median)", "bytes", "server CPU"],
            vec![
                fleet.agents.to_string(),
                path.to_owned(),
                crate::report::micros(summary.p50),
                bytes.to_string(),
                format!("{:.2} ms", cpu * 1e3),
            ],
        );
    }
    Ok(())
}
