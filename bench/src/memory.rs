//! Memory per idle tunnel: the resident memory of a fresh server and agent before and with
//! N open, idle tunnels (each moved one 64-byte round trip, then went quiet).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::report::{Check, Outcome, Report};
use crate::rig::Rig;
use crate::route::{Conn, Route};
use bridgehead_e2e::procfs;
use bridgehead_e2e::target::bulk as target;

/// Workers opening the idle tunnels.
const OPENERS: usize = 16;
/// Server + agent bytes per idle tunnel, at most.
const PER_TUNNEL: u64 = 10 * 1024;
/// RSS counts as settled when it moved less than this between two samples.
const SETTLED: u64 = 256 * 1024;
const SETTLE_INTERVAL: Duration = Duration::from_millis(250);
const SETTLE_MAX: Duration = Duration::from_secs(5);
/// Descriptors each process (bench client, target, server, agent) needs beyond one per idle
/// tunnel.
pub const FD_SLACK: u64 = 1024;

/// Opens idle tunnels on a fresh mTLS pair up to each of `counts` (ascending) and samples
/// server + agent RSS at each.
/// With `hold`, the tunnels stay open that long at the baseline and at each count, so the
/// processes can be inspected (heaptrack, `/proc/PID/smaps`).
pub async fn run(
    rig: &Rig,
    target: SocketAddr,
    counts: &[usize],
    hold: Duration,
    report: &mut Report,
) {
    eprintln!("== memory with idle tunnels: {counts:?}");
    let pids = rig.pids();
    let (server_pid, agent_pid) = (pids[0], pids[1]);
    let pause = |what: String| async move {
        if !hold.is_zero() {
            eprintln!(
                "  holding {what} for {hold:?}: server pid {server_pid}, agent pid {agent_pid}"
            );
            tokio::time::sleep(hold).await;
        }
    };
    for (name, pid) in [("server", pids[0]), ("agent", pids[1])] {
        if let Ok((soft, hard)) = procfs::nofile_of(pid) {
            eprintln!("  {name} RLIMIT_NOFILE soft {soft} hard {hard}");
        }
    }
    if let Err(error) = warm_up(&rig.mtls, target).await {
        report.failed("idle tunnels: warm-up", "-", &error);
        return;
    }
    let base = settle(&pids).await;
    let (Ok(base_server), Ok(base_agent)) =
        (procfs::rss_bytes(pids[0]), procfs::rss_bytes(pids[1]))
    else {
        report.failed("idle tunnels", "-", &anyhow::anyhow!("cannot read RSS"));
        return;
    };
    eprintln!(
        "  baseline: server {} KiB, agent {} KiB",
        base_server >> 10,
        base_agent >> 10
    );
    pause("the baseline".to_owned()).await;
    let held = Arc::new(Mutex::new(Vec::new()));
    for &count in counts {
        let started = Instant::now();
        let opened = open_idle(&rig.mtls, target, count, &held).await;
        let open_seconds = started.elapsed().as_secs_f64();
        let total = settle(&pids).await;
        let have = held.lock().map_or(0, |h| h.len());
        let step = Step {
            count,
            have,
            rss: [
                procfs::rss_bytes(pids[0]).unwrap_or(0),
                procfs::rss_bytes(pids[1]).unwrap_or(0),
            ],
            base: [base_server, base_agent],
            per_tunnel: total.saturating_sub(base) / have.max(1) as u64,
            fds: [rig.server.process.fd_count(), rig.agent.process.fd_count()],
            open_seconds,
            checked: match &opened {
                Ok(()) => verify_sample(&held).await,
                Err(error) => Err(anyhow::anyhow!("{error:#}")),
            },
        };
        step.report(report);
        if step.checked.is_err() {
            break;
        }
        pause(format!("{have} idle tunnels")).await;
    }
    let conns = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
    eprintln!("  closing {} idle tunnels", conns.len());
    drop(conns);
}

/// One count of idle tunnels: what the server and the agent hold with them.
struct Step {
    count: usize,
    have: usize,
    /// Server's and agent's RSS, now and at the baseline.
    rss: [u64; 2],
    base: [u64; 2],
    /// Both processes' growth over the baseline, per tunnel.
    per_tunnel: u64,
    fds: [usize; 2],
    open_seconds: f64,
    /// A sample of the tunnels echoes.
    checked: anyhow::Result<()>,
}

impl Step {
    /// The log line, the JSON line, the table row and the checks.
    fn report(&self, report: &mut Report) {
        let (have, count, open_seconds) = (self.have, self.count, self.open_seconds);
        let ([server, agent], [base_server, base_agent]) = (self.rss, self.base);
        let per = self.per_tunnel;
        let per_kib = format!("{:.1} KiB", per as f64 / 1024.0);
        eprintln!(
            "  {have} idle tunnels (in {open_seconds:.1} s): server {} KiB, agent {} KiB, {per_kib}/tunnel, fds server {} agent {}",
            server >> 10,
            agent >> 10,
            self.fds[0],
            self.fds[1]
        );
        let _ = report.record(
            "memory",
            json!({
                "tunnels": have,
                "wanted": count,
                "server_rss": server,
                "agent_rss": agent,
                "baseline_server_rss": base_server,
                "baseline_agent_rss": base_agent,
                "bytes_per_tunnel": per,
                "server_fds": self.fds[0],
                "agent_fds": self.fds[1],
                "open_seconds": open_seconds,
                "error": self.checked.as_ref().err().map(|e| format!("{e:#}")),
            }),
        );
        report.row(
            "Memory with idle tunnels (server + agent RSS over a fresh baseline)",
            &[
                "tunnels",
                "server RSS",
                "agent RSS",
                "per tunnel",
                "server fds",
                "agent fds",
                "open time",
            ],
            vec![
                have.to_string(),
                format!("{} KiB (base {})", server >> 10, base_server >> 10),
                format!("{} KiB (base {})", agent >> 10, base_agent >> 10),
                per_kib.clone(),
                self.fds[0].to_string(),
                self.fds[1].to_string(),
                format!("{open_seconds:.1} s"),
            ],
        );
        let _ = report.check(Check {
            what: format!("memory per idle tunnel, {count} tunnels"),
            bridgehead: per_kib,
            direct: "-".to_owned(),
            ratio: "-".to_owned(),
            target: "≤ 10 KiB".to_owned(),
            outcome: Outcome::of(have > 0 && per <= PER_TUNNEL),
        });
        let _ = report.check(Check {
            what: format!("{count} idle tunnels on one agent"),
            bridgehead: match &self.checked {
                Ok(()) => format!("{have} open, sample echoes fine"),
                Err(error) => format!("{have} open; {error:#}"),
            },
            direct: "-".to_owned(),
            ratio: "-".to_owned(),
            target: "all open, no error".to_owned(),
            outcome: Outcome::of(self.checked.is_ok() && have == count),
        });
    }
}

/// A few tunnels opened, used and closed, so the baseline has the runtime's steady state.
async fn warm_up(route: &Route, target: SocketAddr) -> anyhow::Result<()> {
    let held = Arc::new(Mutex::new(Vec::new()));
    open_idle(route, target, OPENERS, &held).await?;
    let conns = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
    drop(conns);
    // Let the server and agent see the closes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// What each tunnel [`open_held`] opens does before it is held.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Use {
    /// One 64-byte echo round trip, then quiet.
    Idle,
    /// Asks its target for an endless download (for this long) and never reads it.
    Stalled(Duration),
}

/// Opens tunnels until `held` has `count`, each with one echo round trip.
async fn open_idle(
    route: &Route,
    target: SocketAddr,
    count: usize,
    held: &Arc<Mutex<Vec<Conn>>>,
) -> anyhow::Result<()> {
    open_held(route, target, count, held, Use::Idle).await
}

/// Opens tunnels from [`OPENERS`] tasks until `held` has `count`, each used as `then` says;
/// the first failure stops them all.
pub(crate) async fn open_held(
    route: &Route,
    target: SocketAddr,
    count: usize,
    held: &Arc<Mutex<Vec<Conn>>>,
    then: Use,
) -> anyhow::Result<()> {
    let have = held.lock().map_or(0, |h| h.len());
    let remaining = Arc::new(AtomicUsize::new(count.saturating_sub(have)));
    let mut openers = JoinSet::new();
    for _ in 0..OPENERS {
        let route = route.clone();
        let remaining = remaining.clone();
        let held = held.clone();
        openers.spawn(async move {
            while remaining
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let receive_buffer = match then {
                    Use::Idle => None,
                    Use::Stalled(_) => Some(crate::stalled::CLIENT_RECEIVE_BUFFER),
                };
                let mut conn = route.open_with(target, receive_buffer).await?;
                match then {
                    Use::Idle => {
                        target::start_echo(&mut conn).await?;
                        let mut reply = [0u8; 64];
                        target::echo(&mut conn, &[7u8; 64], &mut reply).await?;
                    }
                    Use::Stalled(limit) => {
                        target::request_download(&mut conn, u64::MAX, limit).await?;
                    }
                }
                if let Ok(mut held) = held.lock() {
                    held.push(conn);
                }
            }
            anyhow::Ok(())
        });
    }
    let mut first_error = None;
    while let Some(joined) = openers.join_next().await {
        let error = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error,
            Err(error) => error.into(),
        };
        // Stop the others: the first failure is the finding.
        remaining.store(0, Ordering::Relaxed);
        first_error.get_or_insert(error);
    }
    match first_error {
        None => Ok(()),
        Some(error) => {
            let have = held.lock().map_or(0, |h| h.len());
            let kind = match then {
                Use::Idle => "idle",
                Use::Stalled(_) => "stalled",
            };
            Err(error.context(format!("opening {kind} tunnel {} of {count}", have + 1)))
        }
    }
}

/// A round trip on every 100th held tunnel (and the last): they still work.
async fn verify_sample(held: &Arc<Mutex<Vec<Conn>>>) -> anyhow::Result<()> {
    let mut conns = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
    let mut result = Ok(());
    let last = conns.len().saturating_sub(1);
    for (i, conn) in conns.iter_mut().enumerate() {
        if i % 100 != 0 && i != last {
            continue;
        }
        let mut reply = [0u8; 64];
        let echoed = tokio::time::timeout(
            Duration::from_secs(10),
            target::echo(conn, &[9u8; 64], &mut reply),
        )
        .await;
        match echoed {
            Ok(Ok(())) if reply == [9u8; 64] => {}
            Ok(Ok(())) => result = Err(anyhow::anyhow!("idle tunnel {i} echoed wrong bytes")),
            Ok(Err(error)) => result = Err(error.context(format!("idle tunnel {i}"))),
            Err(_) => result = Err(anyhow::anyhow!("idle tunnel {i} did not echo within 10 s")),
        }
        if result.is_err() {
            break;
        }
    }
    if let Ok(mut held) = held.lock() {
        held.append(&mut conns);
    }
    result
}

/// Server + agent bytes per idle tunnel on `route` with `count` of them open (each with one
/// 64-byte round trip), over the RSS of `pids` just before; the tunnels are closed after.
pub(crate) async fn idle_cost(
    route: &Route,
    target: SocketAddr,
    count: usize,
    pids: &[u32],
) -> anyhow::Result<u64> {
    warm_up(route, target).await?;
    let base = settle(pids).await;
    let held = Arc::new(Mutex::new(Vec::new()));
    open_idle(route, target, count, &held).await?;
    let total = settle(pids).await;
    verify_sample(&held).await?;
    let have = held.lock().map_or(0, |h| h.len());
    Ok(total.saturating_sub(base) / have.max(1) as u64)
}

/// Waits until server + agent RSS stops moving (bounded), returns it.
async fn settle(pids: &[u32]) -> u64 {
    let deadline = Instant::now() + SETTLE_MAX;
    let mut last = procfs::total_rss(pids).unwrap_or(0);
    loop {
        tokio::time::sleep(SETTLE_INTERVAL).await;
        let now = procfs::total_rss(pids).unwrap_or(0);
        if now.abs_diff(last) < SETTLED || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Fails unless a process with descriptor limit `limit` (the bench's, which the server, agent
/// and target inherit) may hold one descriptor per idle tunnel.
pub fn check_fds(limit: u64, count: usize) -> anyhow::Result<()> {
    let need = count as u64 + FD_SLACK;
    if limit < need {
        bail!("RLIMIT_NOFILE {limit} is below the {need} descriptors {count} idle tunnels need");
    }
    Ok(())
}
