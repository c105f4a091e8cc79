//! A soak: many tunnels held open for a long time, each with a trickle of traffic (a 64-byte
//! echo every [`Plan::trickle`]) and each closed and reopened every [`Plan::lifetime`], staggered
//! so the same share of them turns over every second; the processes' resident memory and
//! descriptors sampled throughout. The bench runs it at scale (`bench --only soak`: 10,000
//! tunnels for 10 minutes, 1 % reopened every second), `e2e/tests/soak.rs` a shortened version.
//!
//! The target is the load target's echo mode ([`crate::target::bulk`]); every reply is checked
//! byte for byte (each echo sends different bytes), and every failure counts as an error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::tunnel::{AsyncConn, Frontend};
use crate::procfs;
use crate::target::bulk as target;

/// Tunnels being opened at once, at the start and when they turn over.
const OPENERS: usize = 16;
/// One echo (or one open) must finish within this, or it counts as an error.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Error messages kept (the count is exact).
const KEPT_ERRORS: usize = 8;
const MESSAGE: usize = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub tunnels: usize,
    /// How long the tunnels are held after they all opened.
    pub duration: Duration,
    /// Each tunnel echoes [`MESSAGE`] bytes this often.
    pub trickle: Duration,
    /// Each tunnel is closed and a new one opened this often (100 s: 1 % every second).
    pub lifetime: Duration,
    /// The processes are sampled this often.
    pub sample_every: Duration,
    /// Samples from this point on are compared with the one taken at it (the steady state:
    /// minute 2 of 10).
    pub settle: Duration,
}

/// The processes at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Since the soak started (after every tunnel opened).
    pub at: Duration,
    /// `VmRSS` of each process, in the order given.
    pub rss: Vec<u64>,
    /// Open descriptors of each process.
    pub fds: Vec<usize>,
    /// Errors so far.
    pub errors: u64,
    /// The slowest echo since the sample before, in microseconds (a machine that stalls the
    /// processes shows here, and so does the memory a backlog of work leaves behind).
    pub slowest_echo_micros: u64,
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub samples: Vec<Sample>,
    /// Seconds the first [`Plan::tunnels`] took to open.
    pub open_seconds: f64,
    pub echoes: u64,
    /// Tunnels closed and opened again while the soak ran.
    pub reopens: u64,
    /// Failed opens, echoes and wrong replies.
    pub errors: u64,
    /// The first few errors.
    pub first_errors: Vec<String>,
    /// Echo round trips, sorted, in microseconds.
    pub echo_micros: Vec<u32>,
}

impl Outcome {
    /// The largest deviation, as a share of the sample at [`Plan::settle`], of process
    /// `index`'s RSS and descriptors in the samples from then on: (rss, fds).
    pub fn drift(&self, settle: Duration, index: usize) -> (f64, f64) {
        let steady: Vec<&Sample> = self.samples.iter().filter(|s| s.at >= settle).collect();
        let Some(first) = steady.first() else {
            return (f64::NAN, f64::NAN);
        };
        let worst = |value: &dyn Fn(&Sample) -> f64| {
            let base = value(first).max(1.0);
            steady
                .iter()
                .map(|s| (value(s) - base).abs() / base)
                .fold(0.0, f64::max)
        };
        (
            worst(&|s| s.rss[index] as f64),
            worst(&|s| s.fds[index] as f64),
        )
    }

    /// The echo round trip at quantile `q` (0..=1), in microseconds.
    pub fn echo_quantile(&self, q: f64) -> u32 {
        if self.echo_micros.is_empty() {
            return 0;
        }
        let last = self.echo_micros.len() - 1;
        self.echo_micros[((last as f64) * q).round() as usize]
    }
}

/// Errors, counted, the first few kept.
#[derive(Default)]
struct Errors {
    count: u64,
    kept: Vec<String>,
}

impl Errors {
    fn add(&mut self, slot: usize, error: &anyhow::Error) {
        self.count += 1;
        if self.kept.len() < KEPT_ERRORS {
            self.kept.push(format!("tunnel {slot}: {error:#}"));
        }
    }
}

struct Shared {
    frontend: Frontend,
    target: String,
    openers: Semaphore,
    errors: Mutex<Errors>,
    /// The slowest echo since the last sample.
    slowest: AtomicU64,
}

impl Shared {
    /// A tunnel to the target in echo mode, within [`STEP_TIMEOUT`].
    async fn open(&self) -> anyhow::Result<AsyncConn> {
        let _permit = self.openers.acquire().await?;
        tokio::time::timeout(STEP_TIMEOUT, async {
            let mut conn = self.frontend.open(&self.target).await?;
            target::start_echo(&mut conn).await?;
            anyhow::Ok(conn)
        })
        .await
        .context("opening a tunnel timed out")?
    }

    fn error(&self, slot: usize, error: &anyhow::Error) {
        if let Ok(mut errors) = self.errors.lock() {
            errors.add(slot, error);
        }
    }
}

/// What one tunnel's slot did.
#[derive(Default)]
struct SlotLog {
    echoes: u64,
    reopens: u64,
    micros: Vec<u32>,
}

/// Runs `plan` through `frontend` to the echo target at `target`, sampling the processes
/// `pids`. Every tunnel is closed when it returns.
pub async fn run(
    frontend: &Frontend,
    target: SocketAddr,
    pids: &[u32],
    plan: &Plan,
) -> anyhow::Result<Outcome> {
    let shared = Arc::new(Shared {
        frontend: frontend.clone(),
        target: target.to_string(),
        openers: Semaphore::new(OPENERS),
        errors: Mutex::new(Errors::default()),
        slowest: AtomicU64::new(0),
    });
    let opening = Instant::now();
    let mut opens = JoinSet::new();
    for slot in 0..plan.tunnels {
        let shared = shared.clone();
        opens.spawn(async move { (slot, shared.open().await) });
    }
    let mut conns: Vec<Option<AsyncConn>> = (0..plan.tunnels).map(|_| None).collect();
    while let Some(joined) = opens.join_next().await {
        let (slot, opened) = joined?;
        // The soak is of open tunnels: one that does not even open ends it.
        conns[slot] = Some(opened.with_context(|| format!("opening tunnel {slot}"))?);
    }
    let open_seconds = opening.elapsed().as_secs_f64();

    let start = Instant::now();
    let end = start + plan.duration;
    let mut slots = JoinSet::new();
    for (slot, conn) in conns.into_iter().enumerate() {
        let shared = shared.clone();
        let plan = plan.clone();
        slots.spawn(run_slot(slot, conn, shared, plan, start, end));
    }
    let mut samples = Vec::new();
    let mut next = start;
    // The last sample comes well before the slots end and close their tunnels.
    while next + plan.sample_every / 2 <= end {
        tokio::time::sleep_until(next).await;
        samples.push(Sample {
            at: next - start,
            rss: pids
                .iter()
                .map(|&pid| procfs::rss_bytes(pid).unwrap_or(0))
                .collect(),
            fds: pids.iter().map(|&pid| procfs::fd_count(pid)).collect(),
            errors: shared.errors.lock().map_or(0, |e| e.count),
            slowest_echo_micros: shared.slowest.swap(0, Ordering::Relaxed),
        });
        next += plan.sample_every;
    }
    let mut outcome = Outcome {
        samples,
        open_seconds,
        ..Outcome::default()
    };
    while let Some(joined) = slots.join_next().await {
        let log = joined?;
        outcome.echoes += log.echoes;
        outcome.reopens += log.reopens;
        outcome.echo_micros.extend(log.micros);
    }
    outcome.echo_micros.sort_unstable();
    let errors = std::mem::take(&mut *shared.errors.lock().unwrap_or_else(|p| p.into_inner()));
    outcome.errors = errors.count;
    outcome.first_errors = errors.kept;
    Ok(outcome)
}

/// One tunnel's life until `end`: an echo every [`Plan::trickle`] and a new tunnel every
/// [`Plan::lifetime`], each at an offset in its period proportional to `slot`, so the load is
/// spread evenly over every second. A failed step is counted and the tunnel replaced.
async fn run_slot(
    slot: usize,
    conn: Option<AsyncConn>,
    shared: Arc<Shared>,
    plan: Plan,
    start: Instant,
    end: Instant,
) -> SlotLog {
    let mut conn = conn;
    let mut log = SlotLog::default();
    let share = slot as f64 / plan.tunnels.max(1) as f64;
    let mut next_echo = start + plan.trickle.mul_f64(share);
    // The first turnover comes one lifetime in, at the slot's offset.
    let mut next_reopen = start + plan.lifetime.mul_f64(share.max(1e-9));
    let mut message = [0u8; MESSAGE];
    let mut reply = [0u8; MESSAGE];
    loop {
        let reopen = next_reopen <= next_echo;
        let at = next_reopen.min(next_echo);
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at).await;
        if reopen {
            next_reopen += plan.lifetime;
            drop(conn.take());
            match shared.open().await {
                Ok(fresh) => {
                    conn = Some(fresh);
                    log.reopens += 1;
                }
                Err(error) => shared.error(slot, &error),
            }
            continue;
        }
        next_echo += plan.trickle;
        let Some(open) = conn.as_mut() else {
            // Its last open failed (counted): try again now.
            match shared.open().await {
                Ok(fresh) => conn = Some(fresh),
                Err(error) => shared.error(slot, &error),
            }
            continue;
        };
        // Different bytes every time: a stale or misrouted reply cannot pass.
        let tag = (slot as u64) << 20 | log.echoes;
        for (i, byte) in message.iter_mut().enumerate() {
            *byte = (tag >> ((i % 8) * 8)) as u8 ^ i as u8;
        }
        let sent = Instant::now();
        let echoed = tokio::time::timeout(STEP_TIMEOUT, target::echo(open, &message, &mut reply))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no echo within {STEP_TIMEOUT:?}")))
            .and_then(|()| {
                if reply == message {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the echo came back with other bytes"))
                }
            });
        match echoed {
            Ok(()) => {
                log.echoes += 1;
                let micros = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
                log.micros.push(micros);
                shared
                    .slowest
                    .fetch_max(u64::from(micros), Ordering::Relaxed);
            }
            Err(error) => {
                shared.error(slot, &error);
                conn = None;
            }
        }
    }
    log
}
