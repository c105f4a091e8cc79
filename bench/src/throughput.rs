//! Bulk throughput through one tunnel and many at once, each way, side by side with direct
//! loopback TCP, and the CPU the server and agent spend per GiB moved.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::floor::{self, Crypto};
use crate::profile::{self, Profiler};
use crate::report::{rate, ratio, Check, Outcome, Report, ThroughputPoint};
use crate::rig::Rig;
use crate::route::{Conn, Route};
use crate::Budget;
use bridgehead_e2e::procfs;
use bridgehead_e2e::target::bulk as target;

/// Tunnel counts of the throughput sweep.
pub const TUNNELS: [usize; 4] = [1, 4, 16, 64];
/// Server + agent CPU per GiB on the mTLS path, at most this multiple of the path's floor
/// ([`floor`]: its AES-GCM passes and socket copies at this machine's own rates).
const TIMES_FLOOR: f64 = 1.25;
/// Direct runs per row. The table shows the median one (by rate); the floor prices a socket
/// copy from the cheapest, since a floor is a best case and one direct run's CPU per GiB moved
/// by half either way between runs here (pacing, which core each end woke on).
const DIRECT_RUNS: usize = 3;
/// A transfer may run this much past its time bound before it counts as hung.
const GRACE: Duration = Duration::from_secs(30);
const GIB: f64 = (1u64 << 30) as f64;

/// Which way the bulk data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to target.
    Upload,
    /// Target to client.
    Download,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// One bulk run's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Bulk {
    pub bytes: u64,
    pub seconds: f64,
    /// CPU seconds the watched processes spent during the transfer.
    pub cpu_seconds: Option<f64>,
    /// CPU seconds this process spent during the transfer: the client's and the target's
    /// ends of every tunnel (the proxy's own CPU is [`Bulk::cpu_seconds`]).
    pub ends_cpu_seconds: Option<f64>,
}

impl Bulk {
    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }

    /// CPU seconds per GiB moved.
    pub fn cpu_per_gib(&self) -> Option<f64> {
        self.cpu_seconds
            .map(|cpu| cpu / (self.bytes as f64 / GIB).max(1e-12))
    }

    /// CPU seconds per GiB of the whole path: the watched processes and the client and
    /// target in this one. A proxy's CPU alone leaves out what it makes its peers pay: a
    /// TCP sender whose queue waits for the receiver's window has its segments sent, and
    /// their receipt processed, in the receiver's process when its reads open the window.
    /// When the watched process is this one (direct), its CPU is the whole path's.
    pub fn whole_cpu_per_gib(&self, watched_is_self: bool) -> Option<f64> {
        let cpu = if watched_is_self {
            self.cpu_seconds?
        } else {
            self.cpu_seconds? + self.ends_cpu_seconds?
        };
        Some(cpu / (self.bytes as f64 / GIB).max(1e-12))
    }
}

/// Opens `tunnels` connections, then moves `total` bytes split between them in `direction`,
/// all at once, stopping after `limit`. CPU is sampled on `pids` around the transfer.
pub async fn bulk(
    route: &Route,
    target: SocketAddr,
    direction: Direction,
    tunnels: usize,
    total: u64,
    limit: Duration,
    pids: &[u32],
) -> anyhow::Result<Bulk> {
    let conns = open(route, target, tunnels).await?;
    transfer(conns, direction, total, limit, pids).await
}

/// Opens `tunnels` connections to `target` at once.
pub async fn open(route: &Route, target: SocketAddr, tunnels: usize) -> anyhow::Result<Vec<Conn>> {
    let mut opening = JoinSet::new();
    for _ in 0..tunnels {
        let route = route.clone();
        opening.spawn(async move { route.open(target).await });
    }
    let mut conns = Vec::with_capacity(tunnels);
    while let Some(opened) = opening.join_next().await {
        conns.push(opened??);
    }
    Ok(conns)
}

/// Moves `total` bytes split between the open `conns` in `direction`, all at once, stopping
/// after `limit`; closes them. CPU is sampled on `pids` around the transfer.
pub async fn transfer(
    conns: Vec<Conn>,
    direction: Direction,
    total: u64,
    limit: Duration,
    pids: &[u32],
) -> anyhow::Result<Bulk> {
    let each = (total / conns.len().max(1) as u64).max(1);
    let cpu_before = (!pids.is_empty())
        .then(|| procfs::cpu_sample(pids))
        .transpose()?;
    let own = [std::process::id()];
    let ends_before = procfs::cpu_sample(&own).ok();
    let started = Instant::now();
    let deadline = started + limit;
    let mut transfers = JoinSet::new();
    for mut conn in conns {
        transfers.spawn(async move {
            match direction {
                Direction::Upload => target::upload(&mut conn, each, deadline).await,
                Direction::Download => target::download(&mut conn, each, limit).await,
            }
        });
    }
    let mut bytes = 0u64;
    let all = async {
        while let Some(moved) = transfers.join_next().await {
            bytes += moved??;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(limit + GRACE, all)
        .await
        .context("bulk transfer hung")??;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = (!pids.is_empty())
        .then(|| procfs::cpu_sample(pids))
        .transpose()?;
    let ends_after = procfs::cpu_sample(&own).ok();
    Ok(Bulk {
        bytes,
        seconds,
        cpu_seconds: cpu_before.zip(cpu_after).map(|(b, a)| a.seconds_since(&b)),
        ends_cpu_seconds: ends_before
            .zip(ends_after)
            .map(|(b, a)| a.seconds_since(&b)),
    })
}

/// The sweep over [`TUNNELS`] (or `--tunnels`), both directions, direct then Bridgehead (mTLS)
/// each time, each Bridgehead figure against its floor at `crypto`'s rate.
pub async fn run(
    rig: &Rig,
    frontend: crate::Frontend,
    target: SocketAddr,
    budget: &Budget,
    crypto: Crypto,
    report: &mut Report,
    profiler: Option<&Profiler>,
) {
    let (route, pids) = match (frontend, rig.uds()) {
        (crate::Frontend::Uds, Some((route, pids))) => (route, pids.to_vec()),
        _ => (&rig.mtls, rig.pids()),
    };
    eprintln!(
        "== bulk throughput over {} (up to {} MiB or {:?} per run)",
        route.label(),
        budget.bulk_bytes >> 20,
        budget.bulk_time
    );
    // Warm up the path (allocator, TLS, windows) before the first timed run.
    let _ = bulk(
        route,
        target,
        Direction::Upload,
        1,
        16 << 20,
        budget.bulk_time,
        &[],
    )
    .await;
    let sweep = Sweep {
        route,
        pids,
        target,
        budget,
        crypto,
        profiler,
    };
    for tunnels in budget.tunnel_counts(&TUNNELS) {
        for direction in [Direction::Upload, Direction::Download] {
            sweep.point(report, tunnels, direction).await;
        }
    }
}

/// What every point of the sweep shares.
struct Sweep<'a> {
    route: &'a Route,
    pids: Vec<u32>,
    target: SocketAddr,
    budget: &'a Budget,
    crypto: Crypto,
    profiler: Option<&'a Profiler>,
}

impl Sweep<'_> {
    /// `tunnels` in `direction`: direct [`DIRECT_RUNS`] times, then through Bridgehead
    /// (profiled at one tunnel with `--perf`), recorded against the direct median and the floor.
    async fn point(&self, report: &mut Report, tunnels: usize, direction: Direction) {
        let (route, budget) = (self.route, self.budget);
        let what = format!("throughput, {tunnels} tunnel(s), {}", direction.label());
        let run = |route, pids| {
            bulk(
                route,
                self.target,
                direction,
                tunnels,
                budget.bulk_bytes,
                budget.bulk_time,
                pids,
            )
        };
        // The bench process is the client and the target: its CPU in a direct run is the
        // cost of one loopback TCP hop, the yardstick for the server's and agent's.
        let (direct_route, bench) = (Route::Direct, [std::process::id()]);
        let mut directs = Vec::with_capacity(DIRECT_RUNS);
        for _ in 0..DIRECT_RUNS {
            directs.push(run(&direct_route, &bench).await);
        }
        let directs: anyhow::Result<Vec<Bulk>> = directs.into_iter().collect();
        let recording = match self.profiler {
            Some(profiler) if tunnels == 1 => {
                let label = format!("bulk-{}", direction.label());
                let processes = [("server", self.pids[0]), ("agent", self.pids[1])];
                tokio::task::block_in_place(|| profiler.start(&label, &processes)).ok()
            }
            _ => None,
        };
        let bridged = run(route, &self.pids).await;
        let counts = recording.and_then(|recording| {
            tokio::task::block_in_place(|| recording.stop())
                .map_err(|error| eprintln!("  perf: {error:#}"))
                .ok()
        });
        let (directs, bridged) = match (directs, bridged) {
            (Ok(directs), Ok(bridged)) => (directs, bridged),
            (Err(error), _) | (_, Err(error)) => return report.failed(&what, "the run", &error),
        };
        let Some(direct) = median_by_rate(&directs) else {
            return;
        };
        let floor = cheapest_cpu_per_gib(&directs)
            .and_then(|direct| floor::floor(self.crypto, route, direct));
        record(report, route, tunnels, direction, &direct, &bridged, floor);
        if let Some(counts) = counts {
            let mib = bridged.bytes as f64 / (1024.0 * 1024.0);
            let run = format!("bulk {}", direction.label());
            profile::report_counts(report, &run, &counts, mib, "MiB");
        }
        if let (true, Some(cpu), Some(floor)) =
            (tunnels == 1 || tunnels == 64, bridged.cpu_per_gib(), floor)
        {
            let _ = report.check(Check {
                what: format!(
                    "server+agent CPU, {tunnels} tunnel(s), {}",
                    direction.label()
                ),
                bridgehead: format!("{cpu:.2} CPU s/GiB"),
                direct: format!("floor {floor:.2}"),
                ratio: format!("{:.2} × floor", cpu / floor),
                target: format!("≤ {TIMES_FLOOR} × floor"),
                outcome: Outcome::of(cpu <= TIMES_FLOOR * floor),
            });
        }
    }
}

/// The run of median rate (of an even count, the slower of the middle two).
fn median_by_rate(runs: &[Bulk]) -> Option<Bulk> {
    let mut runs = runs.to_vec();
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    runs.get(runs.len().saturating_sub(1) / 2).copied()
}

/// The lowest CPU per GiB of `runs`.
fn cheapest_cpu_per_gib(runs: &[Bulk]) -> Option<f64> {
    runs.iter()
        .filter_map(Bulk::cpu_per_gib)
        .min_by(f64::total_cmp)
}

fn record(
    report: &mut Report,
    route: &Route,
    tunnels: usize,
    direction: Direction,
    direct: &Bulk,
    bridged: &Bulk,
    floor: Option<f64>,
) {
    for (route, bulk, whose) in [
        ("direct", direct, "client+target"),
        (route.label(), bridged, "server+agent"),
    ] {
        eprintln!(
            "  {route}: {tunnels} tunnel(s) {}: {} ({} MiB in {:.2} s){}",
            direction.label(),
            rate(bulk.rate()),
            bulk.bytes >> 20,
            bulk.seconds,
            bulk.cpu_per_gib()
                .map(|c| format!(", {whose} {c:.2} CPU s/GiB"))
                .unwrap_or_default()
        );
        let _ = report.record(
            "throughput",
            json!({
                "route": route,
                "direction": direction.label(),
                "tunnels": tunnels,
                "bytes": bulk.bytes,
                "seconds": bulk.seconds,
                "bytes_per_s": bulk.rate(),
                "cpu_of": whose,
                "cpu_s": bulk.cpu_seconds,
                "cpu_s_per_gib": bulk.cpu_per_gib(),
                "ends_cpu_s": bulk.ends_cpu_seconds,
                "floor_s_per_gib": (route != "direct").then_some(floor).flatten(),
            }),
        );
        report.throughput.push(ThroughputPoint {
            route,
            direction: direction.label(),
            tunnels,
            mib_per_s: bulk.rate() / (1024.0 * 1024.0),
        });
    }
    report.row(
        "Bulk throughput (aggregate over all tunnels)",
        &[
            "tunnels",
            "direction",
            "bridgehead",
            "direct",
            "ratio",
            "CPU s/GiB: server+agent",
            "floor",
            "× floor",
            "direct: client+target",
            "moved (bridgehead)",
        ],
        vec![
            tunnels.to_string(),
            direction.label().to_owned(),
            rate(bridged.rate()),
            rate(direct.rate()),
            ratio(bridged.rate() / direct.rate()),
            bridged
                .cpu_per_gib()
                .map_or("-".to_owned(), |c| format!("{c:.2}")),
            floor.map_or("-".to_owned(), |f| format!("{f:.2}")),
            bridged
                .cpu_per_gib()
                .zip(floor)
                .map_or("-".to_owned(), |(c, f)| format!("{:.2}", c / f)),
            direct
                .cpu_per_gib()
                .map_or("-".to_owned(), |c| format!("{c:.2}")),
            format!("{} MiB in {:.2} s", bridged.bytes >> 20, bridged.seconds),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seconds: f64, cpu: Option<f64>) -> Bulk {
        Bulk {
            bytes: 1 << 30,
            seconds,
            cpu_seconds: cpu,
            ends_cpu_seconds: None,
        }
    }

    #[test]
    fn direct_runs_give_the_median_rate_and_the_cheapest_cpu() {
        let runs = [
            run(0.5, Some(0.45)),
            run(0.3, Some(0.60)),
            run(0.4, Some(0.30)),
        ];
        let median = median_by_rate(&runs).map(|run| run.seconds);
        assert_eq!(median, Some(0.4));
        assert_eq!(cheapest_cpu_per_gib(&runs), Some(0.30));
        // Of two, the slower; a run without CPU figures does not price the floor.
        let two = [run(0.3, None), run(0.5, Some(0.5))];
        assert_eq!(median_by_rate(&two).map(|run| run.seconds), Some(0.5));
        assert_eq!(cheapest_cpu_per_gib(&two), Some(0.5));
        assert!(median_by_rate(&[]).is_none());
    }
}
