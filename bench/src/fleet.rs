//! `bench --only fleet`: one server with N agents, simulated (issue 38). Each simulated agent
//! is a real session — TCP, TLS with the agent certificate (or a bearer token from a file),
//! the upgrade with its own `id`/`host`/`ipv4`, pings answered, dials answered by an echo —
//! spread over as few processes as the descriptor limit allows ([`workers`]), each agent
//! coming back after a loss on the agent's own schedule ([`agent`]).
//!
//! Measured, each a row with its target from issue 38: the server's RSS and CPU per 1,000 idle
//! agents; the routing latency of CONNECTs routed by destHost to random agents; the cost of one
//! `/agents` and one `/metrics` request; and the recovery after a restart (SIGKILL, then a new
//! server on the same ports; then the same after SIGTERM): the time until every agent is back,
//! by the server's agent gauge and the simulator's live sessions, and the failed attempts on
//! the way by kind. A trickle of tunnels runs through the restarts.
//!
//! The server runs with its default flags plus what the rig needs: the Unix-socket frontend
//! (the probes' path); `--proxy-strategies=destHost` (the probes route by address; without
//! `default` behind it, a CONNECT for an agent that is not back yet is a 503 rather than a
//! dial sent to another agent, so every dial an agent gets for another's address is a
//! routing error); `--max-sessions-per-identity` above N, since every agent presents the same
//! certificate; no `--cluster-ca-cert` when the agents present tokens alone. `--server-arg`
//! adds more (token authentication's flags, say).

pub mod agent;
pub mod connect;
pub mod counters;
pub mod identity;
pub mod probe;
pub mod worker;
pub mod workers;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bridgehead_e2e::{procfs, Pki, Server, ServerOptions};
use serde_json::json;

use crate::noise::Noise;
use crate::report::{Check, Outcome, Report};
use crate::rig::ExtraArgs;
use crate::route::Route;
use crate::summary::Summary;
use counters::Snapshot;
use probe::Trickle;
use workers::Workers;

/// The gauge of agents with a live session on the server's `/metrics`.
const AGENTS_GAUGE: &str = "bridgehead_server_agents_connected";
/// How often the bench looks whether every agent is back.
const POLL: Duration = Duration::from_millis(100);
/// How long a SIGTERMed server may take to drain and exit.
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// Requests of each admin path timed (the median counts).
const ADMIN_REQUESTS: usize = 5;

/// Issue 38's targets.
const TARGET_RECOVERY: Duration = Duration::from_secs(15);
const TARGET_FAILED_PER_AGENT: f64 = 0.1;
const TARGET_RSS_PER_AGENT: u64 = 32 * 1024;
const TARGET_CPU_PER_1000: f64 = 1.0;
const TARGET_ROUTING_P99: Duration = Duration::from_millis(1);

/// The size and bounds of one fleet run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub agents: usize,
    /// How the agents authenticate.
    pub auth: Auth,
    /// Bearer tokens, one a line, agent `i` presenting line `i` (for [`Auth::Token`] and
    /// [`Auth::Both`]).
    pub tokens: Option<PathBuf>,
    /// How long the idle fleet's CPU is measured.
    pub idle_window: Duration,
    /// CONNECTs of the routing probe.
    pub probes: usize,
    /// Longest wait for every agent to be back.
    pub recovery_bound: Duration,
    /// One trickle tunnel every this.
    pub trickle_interval: Duration,
}

/// How the simulated agents prove who they are; the server is started to match (its token
/// settings come from `--server-arg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Auth {
    /// The agent certificate, one for all.
    Cert,
    /// A bearer token each and no certificate: the server runs without `--cluster-ca-cert`,
    /// as in konnectivity's documented setup.
    Token,
    /// The certificate and a token each (a server that checks both).
    Both,
}

/// The server under test, the simulator and the probes' route.
#[derive(Debug)]
struct Fleet {
    pki: Pki,
    options: ServerOptions,
    server: Server,
    workers: Workers,
    route: Route,
    agents: usize,
    /// When every agent was last back.
    back_at: Instant,
    _dir: tempfile::TempDir,
}

/// Runs every fleet measurement; a failure becomes an ERROR row.
pub fn run(plan: &Plan, extra: &ExtraArgs, runtime: &tokio::runtime::Runtime, report: &mut Report) {
    eprintln!("== fleet: {} simulated agents", plan.agents);
    if let Err(error) = measure(plan, extra, runtime, report) {
        report.failed(
            &format!("fleet, {} agents", plan.agents),
            "every measurement ran",
            &error,
        );
    }
}

fn measure(
    plan: &Plan,
    extra: &ExtraArgs,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> anyhow::Result<()> {
    match (plan.auth, &plan.tokens) {
        (Auth::Cert, _) => {}
        // Checked before anything starts: each worker reads its own slice again.
        (_, Some(path)) => drop(worker::tokens(path, 0, plan.agents)?),
        (_, None) => bail!("--fleet-auth token and both need --fleet-tokens"),
    }
    let (mut fleet, baseline_rss) = Fleet::start(plan, extra)?;
    first_start(&mut fleet, plan, report)?;
    let mut pids = fleet.workers.pids();
    pids.push(fleet.server.process.pid());
    let noise = Noise::start(&pids);
    idle(&mut fleet, plan, baseline_rss, report)?;
    routing(&mut fleet, plan, runtime, report)?;
    admin_cost(&fleet, report)?;
    crate::record_noise(report, "fleet (idle, routing, admin)", &noise);
    let before_trickle = fleet.workers.stats()?;
    let trickle = Trickle::start(
        runtime.handle(),
        fleet.route.clone(),
        plan.agents,
        plan.trickle_interval,
    );
    // SIGKILL first: it needs sessions past the agent's healthy age, which the phases before
    // give them; a drain does not look at their age.
    let restarts = ["KILL", "TERM"]
        .into_iter()
        .try_for_each(|signal| restart(&mut fleet, signal, plan, report));
    let outcomes = runtime.block_on(trickle.stop());
    let misrouted = fleet.workers.stats()?.since(&before_trickle).misrouted;
    eprintln!(
        "  trickle through the restarts: {}; dials misrouted {misrouted}",
        probe::outcomes_text(&outcomes)
    );
    report.record(
        "fleet_trickle",
        json!({ "agents": plan.agents, "outcomes": outcomes, "misrouted": misrouted }),
    )?;
    restarts
}

impl Fleet {
    /// A fresh server (its RSS with no agent returned) and the simulator connecting to it.
    fn start(plan: &Plan, extra: &ExtraArgs) -> anyhow::Result<(Fleet, u64)> {
        let pki = Pki::new()?;
        let dir = tempfile::tempdir()?;
        let uds = dir.path().join("bridgehead.sock");
        let mut args = vec![
            "--proxy-strategies=destHost".to_owned(),
            format!("--max-sessions-per-identity={}", plan.agents * 2),
        ];
        args.extend(extra.server.iter().cloned());
        let options = ServerOptions {
            uds: Some(uds.clone()),
            args,
            without_cluster_ca: plan.auth == Auth::Token,
            ..Default::default()
        };
        let server = Server::start(&pki, options.clone())?;
        // What the server holds before any agent came: its baseline.
        std::thread::sleep(Duration::from_millis(500));
        let baseline = procfs::rss_bytes(server.process.pid())?;
        let spec = worker::Spec {
            server: server.agent_addr,
            ca: pki.path("cluster-ca.crt"),
            certificate: (plan.auth != Auth::Token)
                .then(|| (pki.path("agent.crt"), pki.path("agent.key"))),
            tokens: (plan.auth != Auth::Cert)
                .then(|| plan.tokens.clone())
                .flatten(),
            first: 0,
            count: plan.agents,
            start_within: Duration::from_secs(1),
        };
        let workers = Workers::start(plan.agents, &spec)?;
        let options = ServerOptions {
            agent_port: Some(server.agent_addr.port()),
            ..options
        };
        Ok((
            Fleet {
                pki,
                options,
                server,
                workers,
                route: Route::uds(uds),
                agents: plan.agents,
                back_at: Instant::now(),
                _dir: dir,
            },
            baseline,
        ))
    }

    /// The server's agent gauge.
    fn gauge(&self) -> anyhow::Result<u64> {
        let (status, page) = self.server.get("/metrics")?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        let value = bridgehead_e2e::client::metric_in(&page, AGENTS_GAUGE)
            .with_context(|| format!("no {AGENTS_GAUGE} on /metrics"))?;
        Ok(value as u64)
    }

    /// Waits until every simulated agent holds a live session and the server counts every
    /// agent (bounded poll: neither side can be waited on directly); the time it took. The
    /// server is asked only once the simulator holds them all: a `/metrics` costs the server
    /// CPU in proportion to its agents, which ten a second would add to what is measured.
    fn wait_all_back(&mut self, bound: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let n = self.agents as u64;
        loop {
            let up = self.workers.stats()?.up;
            let gauge = if up >= n { self.gauge()? } else { 0 };
            if up >= n && gauge >= n {
                self.back_at = Instant::now();
                return Ok(started.elapsed());
            }
            if started.elapsed() > bound {
                bail!(
                    "after {bound:?}: the simulator holds {up} sessions of {n}, the server counts {}",
                    self.gauge().map_or_else(|e| format!("none ({e:#})"), |g| g.to_string())
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The fleet's first connections: every agent's first attempt at a random moment within a
/// second, as when the agents start together.
fn first_start(fleet: &mut Fleet, plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    let started = Instant::now();
    let waited = fleet.wait_all_back(plan.recovery_bound);
    let seen = fleet.workers.stats()?;
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "  first start: {} agents in {elapsed:.1} s, failed attempts {} ({}), simulator pids {:?}",
        plan.agents,
        seen.failed(),
        seen.failures_text(),
        fleet.workers.pids()
    );
    report.record(
        "fleet_start",
        json!({
            "agents": plan.agents,
            "back_s": waited.as_ref().ok().map(Duration::as_secs_f64),
            "failed": seen.failed(),
            "failures": seen.failures,
            "simulator_processes": fleet.workers.pids().len(),
        }),
    )?;
    waited.context("the fleet's first connections")?;
    Ok(())
}

/// The idle fleet: the server's RSS over its baseline and its CPU, per agent and per 1,000.
fn idle(fleet: &mut Fleet, plan: &Plan, baseline: u64, report: &mut Report) -> anyhow::Result<()> {
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
fn routing(
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
fn admin_cost(fleet: &Fleet, report: &mut Report) -> anyhow::Result<()> {
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

/// Adds a check of a fleet target.
fn check(report: &mut Report, what: String, value: String, target: &str, ok: bool) {
    let _ = report.check(Check {
        what,
        bridgehead: value,
        direct: "-".to_owned(),
        ratio: "-".to_owned(),
        target: target.to_owned(),
        outcome: Outcome::of(ok),
    });
}

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
    error: Option<String>,
}

/// Restarts the server with `signal` (a new process on the same ports once the old one
/// exited) and measures the way back.
fn restart(
    fleet: &mut Fleet,
    signal: &str,
    plan: &Plan,
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
    let started = Instant::now();
    fleet.server.process.signal(signal)?;
    fleet.server.process.wait_exit(EXIT_BOUND)?;
    let exited = started.elapsed();
    fleet.server = Server::start(&fleet.pki, fleet.options.clone())?;
    let listening = started.elapsed();
    let waited = fleet.wait_all_back(plan.recovery_bound);
    let after = fleet.workers.stats()?;
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
