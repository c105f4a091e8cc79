//! Memory under stalled readers: many tunnels whose target streams as fast as it can and
//! whose client never reads (a `kubectl logs -f` into a terminal that stopped), on a fresh
//! mTLS pair. Measured: server and agent RSS over their baseline, their buffered-bytes gauges
//! against `--tunnel-memory-budget`, the machine's TCP memory (`/proc/net/sockstat`) against
//! `net.ipv4.tcp_mem`, and a bulk download's speed beside the stalled tunnels against its
//! speed alone.
//!
//! The target's sockets get a small send buffer: a remote target's unsent bytes stay on its
//! own machine, and on this one they would swamp what Bridgehead's own sockets hold.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::memory::{open_held, Use};
use crate::report::{rate, Check, Outcome, Report};
use crate::rig::Pair;
use crate::route::Route;
use crate::throughput::{bulk, Bulk, Direction};
use crate::Budget;
use bridgehead_e2e::procfs;

/// The firehose target's send buffer (the kernel doubles it).
pub const TARGET_SEND_BUFFER: u32 = 8 * 1024;
/// The stalled clients' receive buffer (the kernel doubles it). A client's kernel buffers are
/// its own, on its own machine (kube-apiserver's, or kubectl's far away); on this one they
/// would outweigh everything else, as the target's send buffers would. With the kernel's
/// default (net.ipv4.tcp_rmem[1], 128 KiB here) each stalled client holds about 130 KiB.
pub const CLIENT_RECEIVE_BUFFER: u32 = 8 * 1024;
/// The stated overhead per stalled tunnel beyond the budget, server and agent each: an idle
/// tunnel's cost (under 10 KiB, the idle measurement), the TLS connection's state and the
/// allocator's slack around the chunks a stalled tunnel holds. (The TLS records a stalled
/// client has not taken count in the budget, and a held chunk keeps only its own stream's
/// message.)
const PER_TUNNEL_OVERHEAD: u64 = 24 * 1024;
/// Bytes the server's and agent's own TCP sockets queue in the kernel per stalled tunnel, at
/// most: the agent's target socket holds its receive buffer (`--tunnel-receive-buffer`, about
/// 240 KiB; 12 KiB for tunnels asked for under memory pressure), the server's client socket
/// its unsent limit.
const KERNEL_PER_TUNNEL: u64 = 272 * 1024;
/// A bulk download beside the stalled tunnels keeps at least this share of its speed alone.
const MIN_SHARE: f64 = 0.9;
/// TCP memory counts as far from pressure below this share of `tcp_mem`'s first threshold.
const FAR_FROM_PRESSURE: f64 = 0.25;
/// How long a stalled tunnel's target keeps writing.
const STALL_FOR: Duration = Duration::from_secs(600);
const SETTLE_INTERVAL: Duration = Duration::from_millis(500);
const SETTLE_MAX: Duration = Duration::from_secs(60);
/// Bulk rounds alone and beside the stalled tunnels.
const ROUNDS: usize = 2;

/// What the two processes hold.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    server_rss: u64,
    agent_rss: u64,
    server_buffered: u64,
    agent_buffered: u64,
    tcp_pages: u64,
    /// Received-unread and unsent bytes in the kernel on the server's and the agent's TCP
    /// sockets, both processes together.
    kernel_queued: (u64, u64),
}

fn held(rig: Pair<'_>) -> Held {
    let [server, agent] = [rig.server.process.pid(), rig.agent.process.pid()];
    Held {
        server_rss: procfs::rss_bytes(server).unwrap_or(0),
        agent_rss: procfs::rss_bytes(agent).unwrap_or(0),
        server_buffered: rig
            .server
            .metric("bridgehead_server_tunnel_buffered_bytes")
            .unwrap_or(0.0) as u64,
        agent_buffered: rig
            .agent
            .metric("bridgehead_agent_tunnel_buffered_bytes")
            .unwrap_or(0.0) as u64,
        tcp_pages: procfs::tcp_memory_pages().unwrap_or(0),
        kernel_queued: {
            let (a, b) = (procfs::tcp_queued(server), procfs::tcp_queued(agent));
            (a.0 + b.0, a.1 + b.1)
        },
    }
}

/// Runs the measurement with `count` stalled tunnels on `rig` (fresh) to `firehose` (a target
/// serving with [`TARGET_SEND_BUFFER`]), the bulk downloads from `target`.
pub async fn run(
    rig: Pair<'_>,
    firehose: SocketAddr,
    target: SocketAddr,
    count: usize,
    budget: &Budget,
    report: &mut Report,
) {
    // The budget the pair runs with, as the server reports it (`--server-arg` may set it).
    let memory_budget = rig
        .server
        .metric("bridgehead_server_tunnel_memory_budget_bytes")
        .unwrap_or(0.0) as u64;
    let label = rig.route.label();
    eprintln!(
        "== memory under {count} stalled readers, {label} (--tunnel-memory-budget {} MiB)",
        memory_budget >> 20
    );
    let what = format!("{count} stalled readers, {label}");
    let alone = match downloads(rig.route, target, budget).await {
        Ok(alone) => alone,
        Err(error) => return report.failed(&what, "-", &error),
    };
    let base = settle(rig).await;
    let conns = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    if let Err(error) = open_held(rig.route, firehose, count, &conns, Use::Stalled(STALL_FOR)).await
    {
        return report.failed(&what, "all open", &error);
    }
    let open_seconds = started.elapsed().as_secs_f64();
    let stalled = settle(rig).await;
    eprintln!(
        "  {count} stalled after {:.1} s: buffered server {} MiB, agent {} MiB; RSS server {} MiB, agent {} MiB; TCP memory {} pages",
        started.elapsed().as_secs_f64(),
        stalled.server_buffered >> 20,
        stalled.agent_buffered >> 20,
        stalled.server_rss >> 20,
        stalled.agent_rss >> 20,
        stalled.tcp_pages
    );
    let beside = downloads(rig.route, target, budget).await;
    let after = held(rig);
    let have = conns.lock().map_or(0, |c| c.len());
    let beside = match beside {
        Ok(beside) => beside,
        Err(error) => return report.failed(&what, "bulk beside them", &error),
    };
    let [low, pressure, _] = procfs::tcp_mem_limits().unwrap_or([0; 3]);
    let measured = Measured {
        label,
        count,
        have,
        memory_budget,
        base,
        stalled,
        after,
        alone,
        beside,
        open_seconds,
        tcp_mem: (low, pressure),
        page: rustix::param::page_size() as u64,
    };
    measured.log();
    measured.record(report);
    measured.check(report);
    let conns = std::mem::take(&mut *conns.lock().unwrap_or_else(|p| p.into_inner()));
    eprintln!("  closing {} stalled tunnels", conns.len());
    drop(conns);
}

/// What one stalled-readers run measured.
struct Measured<'a> {
    label: &'a str,
    count: usize,
    have: usize,
    memory_budget: u64,
    /// Before the stalled tunnels, with them, and after the bulk download beside them.
    base: Held,
    stalled: Held,
    after: Held,
    /// The bulk download's rate alone and beside the stalled tunnels.
    alone: f64,
    beside: f64,
    open_seconds: f64,
    /// `tcp_mem`'s low and pressure thresholds, in pages.
    tcp_mem: (u64, u64),
    page: u64,
}

impl Measured<'_> {
    fn share(&self) -> f64 {
        self.beside / self.alone.max(1e-9)
    }

    fn server_growth(&self) -> u64 {
        self.stalled.server_rss.saturating_sub(self.base.server_rss)
    }

    fn agent_growth(&self) -> u64 {
        self.stalled.agent_rss.saturating_sub(self.base.agent_rss)
    }

    /// The stalled tunnels' kernel queues (received unread and unsent) per tunnel.
    fn kernel_per_tunnel(&self) -> u64 {
        let (rx, tx) = self.stalled.kernel_queued;
        (rx + tx) / self.count.max(1) as u64
    }

    fn log(&self) {
        let (rx, tx) = self.stalled.kernel_queued;
        let (low, pressure) = self.tcp_mem;
        let stalled = &self.stalled;
        eprintln!(
            "  their kernel queues: {} MiB received unread, {} MiB unsent ({} KiB per tunnel)",
            rx >> 20,
            tx >> 20,
            self.kernel_per_tunnel() >> 10
        );
        eprintln!(
            "  {} stalled tunnels (opened in {:.1} s): server RSS +{} MiB (buffered {} MiB), agent RSS +{} MiB (buffered {} MiB); TCP memory {} pages (+{}; tcp_mem {low} {pressure}); bulk download alone {}, beside them {} ({:.2})",
            self.have,
            self.open_seconds,
            self.server_growth() >> 20,
            stalled.server_buffered >> 20,
            self.agent_growth() >> 20,
            stalled.agent_buffered >> 20,
            stalled.tcp_pages,
            stalled.tcp_pages.saturating_sub(self.base.tcp_pages),
            rate(self.alone),
            rate(self.beside),
            self.share()
        );
    }

    /// The JSON line and the table row.
    fn record(&self, report: &mut Report) {
        let (stalled, base) = (&self.stalled, &self.base);
        let (rx, tx) = stalled.kernel_queued;
        let (low, pressure) = self.tcp_mem;
        let _ = report.record(
            "stalled_readers",
            json!({
                "route": self.label,
                "tunnels": self.have,
                "wanted": self.count,
                "memory_budget": self.memory_budget,
                "target_send_buffer": TARGET_SEND_BUFFER,
                "baseline_server_rss": base.server_rss,
                "baseline_agent_rss": base.agent_rss,
                "server_rss": stalled.server_rss,
                "agent_rss": stalled.agent_rss,
                "server_buffered": stalled.server_buffered,
                "agent_buffered": stalled.agent_buffered,
                "after_bulk_server_rss": self.after.server_rss,
                "after_bulk_agent_rss": self.after.agent_rss,
                "baseline_tcp_pages": base.tcp_pages,
                "tcp_pages": stalled.tcp_pages,
                "kernel_received_unread": rx,
                "kernel_unsent": tx,
                "tcp_mem": [low, pressure],
                "page_size": self.page,
                "alone_bytes_per_s": self.alone,
                "beside_bytes_per_s": self.beside,
                "open_seconds": self.open_seconds,
            }),
        );
        let mib =
            |growth: u64, buffered: u64| format!("{} MiB ({} MiB)", growth >> 20, buffered >> 20);
        report.row(
            "Memory under stalled readers (each target streams into a client that never reads)",
            &[
                "frontend",
                "tunnels",
                "server RSS growth (buffered)",
                "agent RSS growth (buffered)",
                "their kernel queues per tunnel",
                "machine TCP memory (tcp_mem)",
                "bulk alone",
                "bulk beside",
            ],
            vec![
                self.label.to_owned(),
                self.have.to_string(),
                mib(self.server_growth(), stalled.server_buffered),
                mib(self.agent_growth(), stalled.agent_buffered),
                format!("{} KiB", self.kernel_per_tunnel() >> 10),
                format!(
                    "{} MiB, {} pages ({low}, {pressure})",
                    (stalled.tcp_pages * self.page) >> 20,
                    stalled.tcp_pages
                ),
                rate(self.alone),
                format!("{} ({:.2})", rate(self.beside), self.share()),
            ],
        );
    }

    /// The targets: RSS growth within the budget, small kernel queues, the machine's TCP
    /// memory far from pressure, a bulk download beside them at full speed.
    fn check(&self, report: &mut Report) {
        let (count, label, have) = (self.count, self.label, self.have);
        let (server_growth, agent_growth) = (self.server_growth(), self.agent_growth());
        let bound = self.memory_budget + count as u64 * PER_TUNNEL_OVERHEAD;
        let kernel_per = self.kernel_per_tunnel();
        let (low, tcp_pages) = (self.tcp_mem.0, self.stalled.tcp_pages);
        let far = (low as f64 * FAR_FROM_PRESSURE) as u64;
        let checks = [
            Check {
                what: format!("server and agent RSS growth, {count} stalled readers, {label}"),
                bridgehead: format!(
                    "server +{} MiB, agent +{} MiB",
                    server_growth >> 20,
                    agent_growth >> 20
                ),
                direct: "-".to_owned(),
                ratio: "-".to_owned(),
                target: format!(
                    "each ≤ budget + {} KiB/tunnel = {} MiB",
                    PER_TUNNEL_OVERHEAD >> 10,
                    bound >> 20
                ),
                outcome: Outcome::of(
                    have == count && server_growth <= bound && agent_growth <= bound,
                ),
            },
            Check {
                what: format!(
                    "server and agent kernel queues per tunnel, {count} stalled readers, {label}"
                ),
                bridgehead: format!("{} KiB", kernel_per >> 10),
                direct: "-".to_owned(),
                ratio: "-".to_owned(),
                target: format!("≤ {} KiB", KERNEL_PER_TUNNEL >> 10),
                outcome: Outcome::of(have == count && kernel_per <= KERNEL_PER_TUNNEL),
            },
            Check {
                what: format!("machine TCP memory, {count} stalled readers, {label}"),
                bridgehead: format!("{tcp_pages} pages"),
                direct: "-".to_owned(),
                ratio: format!("{:.2} of tcp_mem[0]", tcp_pages as f64 / low.max(1) as f64),
                target: format!("≤ {FAR_FROM_PRESSURE} × tcp_mem[0] = {far} pages"),
                outcome: Outcome::of(low > 0 && tcp_pages <= far),
            },
            Check {
                what: format!("bulk download beside {count} stalled readers, {label}"),
                bridgehead: rate(self.beside),
                direct: format!("{} alone", rate(self.alone)),
                ratio: format!("{:.2}", self.share()),
                target: format!("≥ {MIN_SHARE} × alone"),
                outcome: Outcome::of(self.share() >= MIN_SHARE),
            },
        ];
        for check in checks {
            let _ = report.check(check);
        }
    }
}

/// The same stalled readers on another proxy (konnectivity's mTLS pair: `route`, its
/// processes `pids`): how many it holds, its processes' RSS growth, and a bulk download beside
/// them. It has no buffered-bytes gauge; a proxy that blocks every tunnel behind a stalled one
/// shows it as tunnels that never open or a download that never finishes.
pub async fn peer(
    route: &Route,
    pids: &[u32],
    firehose: SocketAddr,
    target: SocketAddr,
    count: usize,
    budget: &Budget,
    report: &mut Report,
) {
    let label = route.label();
    eprintln!("== memory under {count} stalled readers: {label}");
    let rss = || {
        pids.iter()
            .map(|&p| procfs::rss_bytes(p).unwrap_or(0))
            .sum::<u64>()
    };
    let alone = match downloads(route, target, budget).await {
        Ok(alone) => alone,
        Err(error) => return report.failed(&format!("{label}: stalled readers"), "-", &error),
    };
    let base = rss();
    let conns = Arc::new(Mutex::new(Vec::new()));
    let opened = open_held(route, firehose, count, &conns, Use::Stalled(STALL_FOR)).await;
    let have = conns.lock().map_or(0, |c| c.len());
    // Let the firehoses fill whatever they can, as for Bridgehead.
    tokio::time::sleep(SETTLE_INTERVAL * 4).await;
    let grown = rss().saturating_sub(base);
    let beside = downloads(route, target, budget).await;
    let beside_text = match &beside {
        Ok(rate_beside) => format!(
            "{} ({:.2})",
            rate(*rate_beside),
            rate_beside / alone.max(1e-9)
        ),
        Err(error) => format!("failed: {error:#}"),
    };
    let opened_text = match &opened {
        Ok(()) => format!("{have}"),
        Err(error) => format!("{have} ({error:#})"),
    };
    eprintln!(
        "  {label}: {opened_text} stalled tunnels open; RSS +{} MiB; bulk alone {}, beside {beside_text}",
        grown >> 20,
        rate(alone)
    );
    let _ = report.record(
        "stalled_readers_peer",
        json!({
            "route": label,
            "wanted": count,
            "tunnels": have,
            "open_error": opened.as_ref().err().map(|e| format!("{e:#}")),
            "rss_growth": grown,
            "alone_bytes_per_s": alone,
            "beside_bytes_per_s": beside.as_ref().ok(),
            "beside_error": beside.as_ref().err().map(|e| format!("{e:#}")),
        }),
    );
    report.row(
        "Memory under stalled readers, another proxy (same firehose target, its mTLS frontend)",
        &[
            "proxy",
            "stalled tunnels open",
            "server+agent RSS growth",
            "bulk alone",
            "bulk beside",
        ],
        vec![
            label.to_owned(),
            opened_text,
            format!("{} MiB", grown >> 20),
            rate(alone),
            beside_text,
        ],
    );
    let conns = std::mem::take(&mut *conns.lock().unwrap_or_else(|p| p.into_inner()));
    drop(conns);
}

/// [`ROUNDS`] one-tunnel bulk downloads; their bytes over their seconds.
async fn downloads(route: &Route, target: SocketAddr, budget: &Budget) -> anyhow::Result<f64> {
    let mut runs: Vec<Bulk> = Vec::new();
    for _ in 0..ROUNDS {
        runs.push(
            bulk(
                route,
                target,
                Direction::Download,
                1,
                budget.bulk_bytes,
                budget.bulk_time,
                &[],
            )
            .await?,
        );
    }
    let bytes: u64 = runs.iter().map(|r| r.bytes).sum();
    let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
    Ok(bytes as f64 / seconds.max(1e-9))
}

/// Waits until the processes' RSS and buffered bytes stopped moving (less than 1 % between two
/// samples), at most [`SETTLE_MAX`]; returns the last sample.
async fn settle(rig: Pair<'_>) -> Held {
    let deadline = Instant::now() + SETTLE_MAX;
    let mut last = held(rig);
    loop {
        tokio::time::sleep(SETTLE_INTERVAL).await;
        let now = held(rig);
        let moved = |a: u64, b: u64| a.abs_diff(b) > b / 100 + 64 * 1024;
        let still = !moved(now.server_rss, last.server_rss)
            && !moved(now.agent_rss, last.agent_rss)
            && !moved(now.server_buffered, last.server_buffered)
            && !moved(now.agent_buffered, last.agent_buffered);
        last = now;
        if still || Instant::now() > deadline {
            return last;
        }
    }
}
