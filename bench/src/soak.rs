//! The soak (`--only soak`, never in the default selection): 10,000 tunnels through the mTLS
//! frontend held for 10 minutes, a 64-byte echo on each every 10 s, 1 % of them closed and
//! reopened every second ([`bridgehead_e2e::soak`]); zero errors, and server and agent RSS and
//! descriptors flat (±5 %) from minute 2 to the end. `e2e/tests/soak.rs` is its shortened CI
//! version.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::report::{Check, Outcome, Report};
use crate::rig::Rig;
use crate::route::Route;
use bridgehead_e2e::soak::{self, Plan, Sample};

/// Flat: no sample from the settling time on deviates more than this from the one at it.
const FLAT: f64 = 0.05;

/// The plan for `tunnels` held `seconds`: the full soak's shape (an echo on every tunnel every
/// 10 s, each replaced every 100 s, sampled every 10 s, the first fifth of the run to settle)
/// compressed in time for runs shorter than 10 minutes.
pub fn plan(tunnels: usize, seconds: u64) -> Plan {
    let duration = Duration::from_secs(seconds);
    let scale = (seconds as f64 / 600.0).min(1.0);
    let scaled = |full: u64| Duration::from_secs(full).mul_f64(scale);
    Plan {
        tunnels,
        duration,
        trickle: scaled(10),
        lifetime: scaled(100),
        sample_every: scaled(10),
        settle: duration / 5,
    }
}

/// Runs `plan` on `rig` (fresh) to the echo target at `target`.
pub async fn run(rig: &Rig, target: SocketAddr, plan: &Plan, report: &mut Report) {
    eprintln!(
        "== soak: {} tunnels for {:?}, an echo each every {:?}, each replaced every {:?}",
        plan.tunnels, plan.duration, plan.trickle, plan.lifetime
    );
    let what = format!("soak, {} tunnels", plan.tunnels);
    let Route::Bridgehead(frontend) = &rig.mtls else {
        return report.failed(&what, "-", &anyhow::anyhow!("the rig has no mTLS frontend"));
    };
    let pids = [rig.server.process.pid(), rig.agent.process.pid()];
    // For a profiler attached during the run (`heaptrack -p PID`).
    eprintln!("  server pid {}, agent pid {}", pids[0], pids[1]);
    let outcome = match soak::run(frontend, target, &pids, plan).await {
        Ok(outcome) => outcome,
        Err(error) => return report.failed(&what, "zero errors", &error),
    };
    let steady: Vec<&Sample> = outcome
        .samples
        .iter()
        .filter(|s| s.at >= plan.settle)
        .collect();
    let (Some(first), Some(last)) = (steady.first(), steady.last()) else {
        return report.failed(&what, "-", &anyhow::anyhow!("no sample after settling"));
    };
    log(&outcome);
    record(report, plan, &outcome);
    let drift = [outcome.drift(plan.settle, 0), outcome.drift(plan.settle, 1)];
    table(report, plan, &outcome, (first, last), drift);
    check(report, plan, &outcome, drift);
}

fn log(outcome: &soak::Outcome) {
    for sample in &outcome.samples {
        eprintln!(
            "  {:>6.1} s: server {} KiB, {} fds; agent {} KiB, {} fds; {} errors, slowest echo {} µs",
            sample.at.as_secs_f64(),
            sample.rss[0] >> 10,
            sample.fds[0],
            sample.rss[1] >> 10,
            sample.fds[1],
            sample.errors,
            sample.slowest_echo_micros
        );
    }
    let (p50, p99, max) = echo_micros(outcome);
    eprintln!(
        "  opened in {:.1} s; {} echoes (p50 {p50} µs, p99 {p99} µs, max {max} µs), {} reopens, {} errors {:?}",
        outcome.open_seconds, outcome.echoes, outcome.reopens, outcome.errors, outcome.first_errors
    );
}

/// The echoes' p50, p99 and slowest, in microseconds.
fn echo_micros(outcome: &soak::Outcome) -> (u32, u32, u32) {
    (
        outcome.echo_quantile(0.5),
        outcome.echo_quantile(0.99),
        outcome.echo_quantile(1.0),
    )
}

fn record(report: &mut Report, plan: &Plan, outcome: &soak::Outcome) {
    let drift = [outcome.drift(plan.settle, 0), outcome.drift(plan.settle, 1)];
    let (p50, p99, max) = echo_micros(outcome);
    let _ = report.record(
        "soak",
        json!({
            "tunnels": plan.tunnels,
            "seconds": plan.duration.as_secs_f64(),
            "trickle_s": plan.trickle.as_secs_f64(),
            "lifetime_s": plan.lifetime.as_secs_f64(),
            "settle_s": plan.settle.as_secs_f64(),
            "open_seconds": outcome.open_seconds,
            "echoes": outcome.echoes,
            "reopens": outcome.reopens,
            "errors": outcome.errors,
            "first_errors": outcome.first_errors,
            "echo_us": { "p50": p50, "p99": p99, "max": max },
            "drift": { "server_rss": drift[0].0, "server_fds": drift[0].1,
                       "agent_rss": drift[1].0, "agent_fds": drift[1].1 },
            "samples": outcome.samples.iter().map(|s| json!({
                "at_s": s.at.as_secs_f64(), "rss": s.rss, "fds": s.fds,
                "errors": s.errors, "slowest_echo_us": s.slowest_echo_micros,
            })).collect::<Vec<_>>(),
        }),
    );
}

/// The table row: the first and last samples after settling, each process's drift.
fn table(
    report: &mut Report,
    plan: &Plan,
    outcome: &soak::Outcome,
    (first, last): (&Sample, &Sample),
    drift: [(f64, f64); 2],
) {
    let (p50, p99, _) = echo_micros(outcome);
    let span = |i: usize| {
        format!(
            "{} → {} MiB, {} → {} fds (drift {:.1} %, {:.1} %)",
            first.rss[i] >> 20,
            last.rss[i] >> 20,
            first.fds[i],
            last.fds[i],
            drift[i].0 * 100.0,
            drift[i].1 * 100.0
        )
    };
    report.row(
        "Soak (mTLS; a trickle of echoes on every tunnel, a steady share replaced every second)",
        &[
            "tunnels",
            "time",
            "echoes (p50 / p99)",
            "reopens",
            "errors",
            "server from settling to end",
            "agent from settling to end",
        ],
        vec![
            plan.tunnels.to_string(),
            format!("{} s", plan.duration.as_secs()),
            format!("{} ({p50} / {p99} µs)", outcome.echoes),
            outcome.reopens.to_string(),
            outcome.errors.to_string(),
            span(0),
            span(1),
        ],
    );
}

/// Zero errors; RSS and descriptors flat from the settling time on.
fn check(report: &mut Report, plan: &Plan, outcome: &soak::Outcome, drift: [(f64, f64); 2]) {
    let _ = report.check(Check {
        what: format!(
            "soak, {} tunnels for {} s",
            plan.tunnels,
            plan.duration.as_secs()
        ),
        bridgehead: format!(
            "{} errors in {} echoes and {} reopens",
            outcome.errors, outcome.echoes, outcome.reopens
        ),
        direct: "-".to_owned(),
        ratio: "-".to_owned(),
        target: "zero errors".to_owned(),
        outcome: Outcome::of(outcome.errors == 0 && outcome.echoes > 0),
    });
    for (i, name) in ["server", "agent"].into_iter().enumerate() {
        let (rss, fds) = drift[i];
        let _ = report.check(Check {
            what: format!(
                "soak: {name} RSS and descriptors from {} s on",
                plan.settle.as_secs()
            ),
            bridgehead: format!("drift {:.1} %, {:.1} %", rss * 100.0, fds * 100.0),
            direct: "-".to_owned(),
            ratio: "-".to_owned(),
            target: format!("each within ±{:.0} %", FLAT * 100.0),
            outcome: Outcome::of(rss <= FLAT && fds <= FLAT),
        });
    }
}
