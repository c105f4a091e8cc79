//! A restart of the server under the fleet: a signal, a new process on the same ports once
//! the old one exited, and the way back of every agent.

use std::time::{Duration, Instant};

use anyhow::bail;
use bridgehead_e2e::{procfs, Server};
use serde_json::json;

use super::counters::Snapshot;
use super::kube_load::{KubeLoad, Sampler};
use super::stalled::Stalled;
use super::{agent, check, Auth, Fleet, Plan};
use crate::noise::Noise;
use crate::report::Report;

/// How long a SIGTERMed server may take to drain and exit.
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// Issue 38's targets: back within 15 s with certificates, 20 s with tokens.
const TARGET_RECOVERY_CERT: Duration = Duration::from_secs(15);
const TARGET_RECOVERY_TOKEN: Duration = Duration::from_secs(20);
const TARGET_FAILED_PER_AGENT: f64 = 0.1;

/// What one restart cost.
#[derive(Debug)]
struct Recovery {
    /// From the signal until the old server exited, and until the new one listened.
    exited: Duration,
    listening: Duration,
    /// When the new server listened, by the clock the simulator's processes share.
    listening_at: std::time::SystemTime,
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
    /// The new server's requests to kube-apiserver until every agent was back, when it has a
    /// Kubernetes client; and kube-apiserver's own count of the per-agent kinds
    /// (`cluster::PER_AGENT`) over the restart, when the bench runs the control plane.
    kube: Option<KubeLoad>,
    apiserver_per_agent: Option<Vec<f64>>,
    /// The new server's agent handshakes by how they ended, until every agent was back
    /// (`bridgehead_server_agent_handshakes_total`): whether it cut or refused any itself.
    handshakes: String,
    /// The recovery target.
    target: Duration,
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
    let apiserver_before = match &fleet.cluster {
        Some(cluster) => Some(cluster.per_agent_requests()?),
        None => None,
    };
    let started = Instant::now();
    fleet.server.process.signal(signal)?;
    fleet.server.process.wait_exit(EXIT_BOUND)?;
    let exited = started.elapsed();
    let spawned = Instant::now();
    fleet.server = Server::start(&fleet.pki, fleet.options.clone())?;
    let listening = started.elapsed();
    let listening_at = std::time::SystemTime::now();
    let mut sampler = (plan.auth != Auth::Cert).then(|| Sampler::new(spawned));
    let waited = fleet.wait_all_back(plan.recovery_bound, sampler.as_mut());
    let kube = sampler.map(|sampler| sampler.finish(&fleet.server));
    let apiserver_per_agent = match (&fleet.cluster, apiserver_before) {
        (Some(cluster), Some(before)) => Some(
            cluster
                .per_agent_requests()?
                .iter()
                .zip(&before)
                .map(|(after, before)| after - before)
                .collect(),
        ),
        _ => None,
    };
    let after = fleet.workers.stats()?;
    let handshakes = handshakes_text(&fleet.server);
    let stalled = stalled.map(|stalled| runtime.block_on(stalled.stop()));
    let server_cpu = procfs::cpu_seconds(fleet.server.process.pid()).unwrap_or(f64::NAN);
    let simulator_cpu = procfs::cpu_sample(&simulator)?.seconds_since(&simulator_before);
    let (wall, foreign, _) = noise.finish();
    let recovery = Recovery {
        exited,
        listening,
        listening_at,
        back: waited.as_ref().ok().copied(),
        seen: after.since(&before),
        server_cpu,
        simulator_cpu,
        // The old server's CPU after the signal (its drain) is gone with it and counts here:
        // a little foreign CPU too many after SIGTERM.
        foreign_cpu: (foreign - server_cpu).max(0.0),
        wall,
        stalled,
        kube,
        apiserver_per_agent,
        handshakes,
        target: if plan.auth == Auth::Cert {
            TARGET_RECOVERY_CERT
        } else {
            TARGET_RECOVERY_TOKEN
        },
        error: waited.err().map(|e| format!("{e:#}")),
    };
    report_recovery(report, plan, signal, &recovery)?;
    match &recovery.error {
        // The next restart needs the whole fleet back.
        Some(error) => bail!("after SIG{signal}: {error}"),
        None => Ok(()),
    }
}

/// `ok 10000, stalled 3` from the server's `agent_handshakes` counter (the non-zero ones).
fn handshakes_text(server: &Server) -> String {
    const SERIES: &str = "bridgehead_server_agent_handshakes_total{result=\"";
    let Ok((200, page)) = server.get("/metrics") else {
        return "unknown".to_owned();
    };
    page.lines()
        .filter_map(|line| line.strip_prefix(SERIES))
        .filter_map(|rest| {
            let (result, value) = rest.split_once("\"} ")?;
            let n = value.trim().parse::<f64>().ok()? as u64;
            (n > 0).then(|| format!("{result} {n}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn report_recovery(
    report: &mut Report,
    plan: &Plan,
    signal: &str,
    r: &Recovery,
) -> anyhow::Result<()> {
    let n = plan.agents;
    // Linux refuses a connection only where nothing listens (a full backlog drops the SYN
    // instead): a refused attempt found the restart's gap, not the server's admission. So did
    // an attempt begun before the new server listened (after SIGKILL: connections queued on
    // the dying process's listener, reset when the kernel closed it): the new server never
    // saw it. Every other failed attempt counts.
    let refused = r.seen.failed_of("refused");
    let early = r.seen.failed_before(r.listening_at);
    let failed = r.seen.failed() - refused - early;
    let mut failures = r.seen.clone();
    failures.failures.remove("refused");
    let back = r.back.map_or_else(
        || "not all back".to_owned(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    );
    eprintln!(
        "  SIG{signal}: old server gone after {:.2} s, new one listening after {:.2} s; all back {back} later; failed attempts {failed} (all kinds: {}); begun before the new server listened {early}; refused (no server) {refused}; simulator CPU {:.1} s; the new server's handshakes: {}",
        r.exited.as_secs_f64(),
        r.listening.as_secs_f64(),
        failures.failures_text(),
        r.simulator_cpu,
        r.handshakes
    );
    report.record(
        "fleet_restart",
        json!({
            "agents": n,
            "client_delay": plan.lateness.map(|l| l.to_string()),
            "shared_cores": plan.shared_cores,
            "signal": signal,
            "exited_s": r.exited.as_secs_f64(),
            "listening_s": r.listening.as_secs_f64(),
            "back_s": r.back.map(|d| d.as_secs_f64()),
            "failed": failed,
            "failed_begun_before_listening": early,
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
            "server_handshakes": r.handshakes,
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
            "by kind (with the gap's)",
            "begun before the new server listened",
            "refused (no server)",
            "retry hints",
            "stalled handshakes opened / cut",
            "new server CPU",
            "simulator CPU",
            "other load",
        ],
        vec![
            super::fleet_text(plan),
            format!("SIG{signal}"),
            format!(
                "{:.2} s / {:.2} s",
                r.exited.as_secs_f64(),
                r.listening.as_secs_f64()
            ),
            back.clone(),
            failed.to_string(),
            failures.failures_text(),
            early.to_string(),
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
    if let Some(kube) = &r.kube {
        report_kube(report, n, signal, kube, r.apiserver_per_agent.as_deref())?;
    }
    Ok(())
}

/// The server's requests to kube-apiserver during the storm, and the target: none per agent
/// (discovery, lists and watches only), by the server's count and, when the bench runs the
/// control plane, by kube-apiserver's.
fn report_kube(
    report: &mut Report,
    n: usize,
    signal: &str,
    kube: &KubeLoad,
    apiserver: Option<&[f64]>,
) -> anyhow::Result<()> {
    let per_agent: u64 = super::cluster::PER_AGENT
        .iter()
        .map(|(resource, verb)| kube.of(verb, resource))
        .sum();
    let apiserver_text = apiserver.map_or_else(
        || "-".to_owned(),
        |counts| {
            super::cluster::PER_AGENT
                .iter()
                .zip(counts)
                .map(|((resource, verb), n)| format!("{verb} {resource} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    let apiserver_per_agent: f64 = apiserver.map_or(0.0, |counts| counts.iter().sum());
    eprintln!(
        "  SIG{signal}: the new server asked kube-apiserver {} times until every agent was back ({}), at most {} in a second; kube-apiserver counted {apiserver_text}",
        kube.total,
        kube.counts_text(),
        kube.peak_per_second
    );
    report.record(
        "fleet_kube_requests",
        json!({
            "agents": n,
            "signal": signal,
            "total": kube.total,
            "counts": kube.counts,
            "peak_per_second": kube.peak_per_second,
            "per_agent_kinds": per_agent,
            "apiserver_per_agent_kinds": apiserver,
        }),
    )?;
    report.row(
        "Fleet: the new server's requests to kube-apiserver, from its start until every agent was back",
        &[
            "agents",
            "signal",
            "requests",
            "by verb and resource",
            "peak per second",
            "kube-apiserver's count of per-agent kinds meanwhile",
        ],
        vec![
            n.to_string(),
            format!("SIG{signal}"),
            kube.total.to_string(),
            kube.counts_text(),
            kube.peak_per_second.to_string(),
            apiserver_text,
        ],
    );
    check(
        report,
        format!("fleet: requests to kube-apiserver per agent after SIG{signal}, {n} agents"),
        format!(
            "{per_agent} TokenReviews and Node GETs ({} requests in all)",
            kube.total
        ),
        "none per agent",
        per_agent == 0 && apiserver_per_agent == 0.0,
    );
    Ok(())
}

/// The targets of one restart: every agent back within 15 s (20 s with tokens), fewer than
/// one failed attempt per ten agents.
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
        &format!("≤ {} s", r.target.as_secs()),
        r.back.is_some_and(|d| d <= r.target),
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
