//! Tunnel setup: how many tunnels a second the frontends open, and how long each takes, as
//! kube-apiserver opens them (a fresh connection, and over mTLS a full handshake without
//! resumption, per tunnel). Direct is a plain TCP connect to the target.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::profile::{self, Profiler};
use crate::report::{micros, ratio, Check, Outcome, Report, SetupPoint};
use crate::rig::Rig;
use crate::route::Route;
use crate::summary::Summary;
use crate::Budget;
use bridgehead_e2e::client::tunnel::Frontend;
use bridgehead_e2e::procfs;

/// Concurrency levels measured.
pub const CONCURRENCY: [usize; 2] = [1, 16];
/// A worker gives up after this many failed opens.
const MAX_ERRORS: usize = 20;
/// Closing a tunnel (close_notify, FIN) may take this long.
const CLOSE: Duration = Duration::from_secs(5);
/// Tunnels a second at concurrency 1, at least.
const MTLS_RATE: f64 = 1000.0;
const UDS_RATE: f64 = 5000.0;

/// One setup run's outcome.
#[derive(Debug, Clone)]
pub struct SetupRun {
    pub opened: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub latency: Summary,
    /// CPU seconds the mTLS server and its agent spent during the run (mTLS runs only).
    pub cpu_seconds: Option<f64>,
}

impl SetupRun {
    /// `, first: <error>` when a setup failed, for a progress or error line.
    pub fn first_error_note(&self) -> String {
        self.first_error
            .as_ref()
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default()
    }

    /// Server + agent CPU milliseconds per tunnel opened, when measured.
    pub fn cpu_ms_per_tunnel(&self) -> Option<f64> {
        self.cpu_seconds
            .map(|cpu| cpu * 1000.0 / self.opened.max(1) as f64)
    }

    /// Tunnels opened per second.
    pub fn rate(&self) -> f64 {
        self.opened as f64 / self.seconds.max(1e-9)
    }
}

/// `concurrency` workers open and close tunnels until `max` opened or `limit` passed. The
/// latency of one is from the start of the connect to the 200; the rate counts the close too.
pub async fn setup(
    route: &Route,
    target: SocketAddr,
    concurrency: usize,
    max: usize,
    limit: Duration,
) -> SetupRun {
    let remaining = Arc::new(AtomicUsize::new(max));
    let started = Instant::now();
    let deadline = started + limit;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let route = route.clone();
        let remaining = remaining.clone();
        workers.spawn(async move {
            let mut samples = Vec::new();
            let mut errors = 0;
            let mut first_error = None;
            while Instant::now() < deadline
                && remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
            {
                let begun = Instant::now();
                match route.open(target).await {
                    Ok(mut conn) => {
                        samples.push(begun.elapsed());
                        let _ = tokio::time::timeout(CLOSE, conn.shutdown()).await;
                    }
                    Err(error) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{error:#}"));
                        if errors >= MAX_ERRORS {
                            break;
                        }
                    }
                }
            }
            (samples, errors, first_error)
        });
    }
    let mut samples = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok((s, e, f)) => {
                samples.extend(s);
                errors += e;
                first_error = first_error.or(f);
            }
            Err(error) => {
                errors += 1;
                first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    SetupRun {
        opened: samples.len(),
        errors,
        first_error,
        seconds,
        latency: Summary::of(&mut samples),
        cpu_seconds: None,
    }
}

/// Every route at every concurrency; targets at concurrency 1.
pub async fn run(
    rig: &Rig,
    target: SocketAddr,
    budget: &Budget,
    report: &mut Report,
    profiler: Option<&Profiler>,
) {
    eprintln!(
        "== tunnel setup (up to {} tunnels or {:?} per run)",
        budget.setup_count, budget.setup_time
    );
    let pids = rig.pids();
    for concurrency in CONCURRENCY {
        let mut direct_rate = None;
        for route in rig.routes() {
            let recording = match profiler {
                Some(profiler)
                    if concurrency == 1
                        && matches!(route, Route::Bridgehead(Frontend::Mtls { .. })) =>
                {
                    let processes = [("server", pids[0]), ("agent", pids[1])];
                    tokio::task::block_in_place(|| profiler.start("setup-mtls", &processes)).ok()
                }
                _ => None,
            };
            let cpu_before = procfs::cpu_sample(&pids).ok();
            let mut run = setup(
                &route,
                target,
                concurrency,
                budget.setup_count,
                budget.setup_time,
            )
            .await;
            if matches!(route, Route::Bridgehead(Frontend::Mtls { .. })) {
                let cpu_after = procfs::cpu_sample(&pids).ok();
                run.cpu_seconds = cpu_before.zip(cpu_after).map(|(b, a)| a.seconds_since(&b));
            }
            let counts = recording.and_then(|recording| {
                tokio::task::block_in_place(|| recording.stop())
                    .map_err(|error| eprintln!("  perf: {error:#}"))
                    .ok()
            });
            record(report, &route, concurrency, &run);
            if let Some(counts) = counts {
                let run_name = format!("setup {}", route.label());
                profile::report_counts(report, &run_name, &counts, run.opened as f64, "tunnel");
            }
            if matches!(route, Route::Direct) {
                direct_rate = Some(run.rate());
            }
            let floor = match route {
                Route::Bridgehead(Frontend::Mtls { .. }) => MTLS_RATE,
                Route::Bridgehead(Frontend::Uds { .. }) => UDS_RATE,
                Route::Direct | Route::Peer { .. } | Route::Bridgehead(Frontend::Tcp { .. }) => {
                    continue
                }
            };
            if concurrency != 1 {
                continue;
            }
            let what = format!("setup rate, {}, concurrency 1", route.label());
            let target_text = format!("≥ {floor} tunnels/s");
            if run.opened == 0 {
                let error = anyhow::anyhow!(run.first_error.unwrap_or_default());
                report.failed(&what, &target_text, &error);
                continue;
            }
            let _ = report.check(Check {
                what,
                bridgehead: format!(
                    "{:.0}/s (p50 {}, p99 {})",
                    run.rate(),
                    micros(run.latency.p50),
                    micros(run.latency.p99)
                ),
                direct: direct_rate.map_or("-".to_owned(), |r| format!("{r:.0}/s")),
                ratio: direct_rate.map_or("-".to_owned(), |r| ratio(run.rate() / r)),
                target: target_text,
                outcome: Outcome::of(run.errors == 0 && run.rate() >= floor),
            });
        }
    }
}

fn record(report: &mut Report, route: &Route, concurrency: usize, run: &SetupRun) {
    eprintln!(
        "  {} x{concurrency}: {:.0} tunnels/s, p50 {} p99 {} max {} ({} opened, {} errors{})",
        route.label(),
        run.rate(),
        micros(run.latency.p50),
        micros(run.latency.p99),
        micros(run.latency.max),
        run.opened,
        run.errors,
        run.first_error_note()
    );
    let _ = report.record(
        "setup",
        json!({
            "route": route.label(),
            "concurrency": concurrency,
            "opened": run.opened,
            "errors": run.errors,
            "first_error": run.first_error,
            "seconds": run.seconds,
            "tunnels_per_s": run.rate(),
            "p50_us": run.latency.p50.as_secs_f64() * 1e6,
            "p99_us": run.latency.p99.as_secs_f64() * 1e6,
            "mean_us": run.latency.mean.as_secs_f64() * 1e6,
            "max_us": run.latency.max.as_secs_f64() * 1e6,
            "server_agent_cpu_ms_per_tunnel": run.cpu_ms_per_tunnel(),
        }),
    );
    report.row(
        "Tunnel setup (fresh connection per tunnel; mTLS without resumption)",
        &[
            "route",
            "concurrency",
            "tunnels/s",
            "p50",
            "p99",
            "max",
            "opened",
            "errors",
            "server+agent CPU/tunnel",
        ],
        vec![
            route.label().to_owned(),
            concurrency.to_string(),
            format!("{:.0}", run.rate()),
            micros(run.latency.p50),
            micros(run.latency.p99),
            micros(run.latency.max),
            run.opened.to_string(),
            run.errors.to_string(),
            run.cpu_ms_per_tunnel()
                .map_or("-".to_owned(), |ms| format!("{ms:.2} ms")),
        ],
    );
    if run.opened > 0 {
        report.setup.push(SetupPoint {
            route: route.label(),
            concurrency,
            p50: run.latency.p50,
            p99: run.latency.p99,
        });
    }
}
