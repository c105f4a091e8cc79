//! A CONNECT burst against a slow agent (`--only burst`, never in the default selection):
//! kube-apiserver-style clients on the Unix-socket frontend open tunnels at a paced 2,000 per
//! second for a minute while the server's one agent runs only one second in five (SIGSTOP for
//! 4 s, SIGCONT for 1 s: a node agent starved of CPU). Its keepalive survives (three 5 s
//! intervals), so the server keeps routing to it, and what is measured is the bound: the dials
//! the server lets wait on that agent (`--max-pending-dials-per-agent`), each ended by the
//! agent's answer in its next second awake (200) or by `--dial-timeout` (504); the 503s for
//! everything beyond, each counted in `dials_total{result="no_agent"}`; how fast a refusal
//! comes; the server's descriptors and memory after the burst against before it.
//!
//! The pacing is open loop: a CONNECT starts every 1/rate seconds whether or not earlier ones
//! were answered, as independent clients would; the bench's own in-flight cap is reported if
//! it was ever reached.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio::time::{Instant, MissedTickBehavior};

use crate::report::{Check, Outcome, Report};
use crate::rig::ExtraArgs;
use bridgehead_e2e::client::kube;
use bridgehead_e2e::{procfs, Agent, AgentOptions, Pki, Server, ServerOptions};

/// The server's defaults the checks hold it to: `--max-pending-dials-per-agent` and
/// `--dial-timeout`.
const PENDING_PER_AGENT: u64 = 256;
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The gauge `dials_pending` also counts CONNECTs admitted but not yet routed (microseconds
/// each): allowed beyond the per-agent bound at one sample.
const ROUTING_SLACK: u64 = 64;
/// CONNECTs the bench keeps in flight at most.
const IN_FLIGHT: usize = 4096;
/// One CONNECT must be answered within this (a 504 takes the dial timeout).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// The server's memory after the burst may exceed its memory before by this share (and
/// [`RSS_SLACK`]): allocator arenas do not shrink at once.
const RSS_GROWTH: f64 = 0.05;
const RSS_SLACK: u64 = 1 << 20;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const WARM_UP: Duration = Duration::from_secs(1);
/// The slow agent's cycle: stopped this long, then running [`AWAKE`].
const ASLEEP: Duration = Duration::from_secs(4);
const AWAKE: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// CONNECTs per second.
    pub rate: u32,
    pub duration: Duration,
}

/// A server on a Unix socket with its one agent.
#[derive(Debug)]
pub struct Pair {
    server: Server,
    agent: Agent,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pair {
    /// Starts the pair with the bench's extra flags and waits for the agent.
    pub fn start(extra: &ExtraArgs) -> anyhow::Result<Pair> {
        let pki = Pki::new()?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bridgehead.sock");
        let server = Server::start(
            &pki,
            ServerOptions {
                uds: Some(path.clone()),
                args: extra.server.clone(),
                ..Default::default()
            },
        )?;
        let agent = Agent::start(
            &pki,
            &server,
            AgentOptions {
                args: extra.agent.clone(),
                ..Default::default()
            },
        )?;
        server.wait_agents(1)?;
        Ok(Pair {
            server,
            agent,
            path,
            _dir: dir,
        })
    }

    /// The process ids: server, agent.
    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.process.pid(), self.agent.process.pid()]
    }
}

/// What a paced burst got back.
#[derive(Debug, Default)]
struct Answers {
    /// Status → count; 0 for a CONNECT that failed without a status.
    statuses: BTreeMap<u16, u64>,
    /// Microseconds to each 503, sorted.
    refusal_micros: Vec<u32>,
    /// CONNECTs not started because [`IN_FLIGHT`] were already open.
    skipped: u64,
    started: u64,
    first_error: Option<String>,
}

/// What the server showed while the burst ran.
#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    pending: u64,
    rss: u64,
    fds: usize,
}

/// Runs `plan` on `pair` (fresh) to the echo target at `target`, which the slow agent dials
/// while it is awake.
pub async fn run(pair: &Pair, target: std::net::SocketAddr, plan: Plan, report: &mut Report) {
    eprintln!(
        "== CONNECT burst: {} per second for {:?} on the Unix socket, the agent awake {AWAKE:?} in every {:?}",
        plan.rate,
        plan.duration,
        ASLEEP + AWAKE
    );
    let what = format!(
        "CONNECT burst, {}/s for {} s",
        plan.rate,
        plan.duration.as_secs()
    );
    let outcome = {
        let _slow = Starver::start(pair.agent.process.pid());
        measure(pair, target, plan).await
    };
    let (answers, peak, before, after, counted) = match outcome {
        Ok(measured) => measured,
        Err(error) => return report.failed(&what, "bounded, counted, nothing left", &error),
    };
    // Running again, the agent serves at once.
    let reopened = open_after_thaw(&pair.path, target).await;
    let burst = Burst {
        plan,
        what,
        answers,
        peak,
        before,
        after,
        counted,
        reopened,
    };
    burst.log();
    burst.record(report);
    burst.check(report);
}

/// What one burst showed, and what the agent did after it.
struct Burst {
    plan: Plan,
    what: String,
    answers: Answers,
    /// The server during the burst, before it, and once every dial of it ended.
    peak: Peak,
    before: Peak,
    after: Peak,
    /// The server's `no_agent` refusals counted during the burst.
    counted: u64,
    reopened: anyhow::Result<()>,
}

impl Burst {
    fn count(&self, status: u16) -> u64 {
        self.answers.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Answers other than 200, 503 and 504.
    fn others(&self) -> u64 {
        let statuses = &self.answers.statuses;
        let others = statuses
            .iter()
            .filter(|(s, _)| ![200, 503, 504].contains(*s));
        others.map(|(_, n)| n).sum()
    }

    /// The 503s' p50, p99 and most, in microseconds.
    fn refusal_micros(&self) -> (u32, u32, u32) {
        let micros = &self.answers.refusal_micros;
        let quantile = |q: f64| {
            let at = ((micros.len().max(1) - 1) as f64 * q).round() as usize;
            micros.get(at).copied().unwrap_or(0)
        };
        (quantile(0.5), quantile(0.99), quantile(1.0))
    }

    fn rate(&self) -> f64 {
        self.answers.started as f64 / self.plan.duration.as_secs_f64()
    }

    fn log(&self) {
        let (answers, peak, before, after) = (&self.answers, &self.peak, &self.before, &self.after);
        let (p50, p99, max) = self.refusal_micros();
        eprintln!(
            "  {} CONNECTs started ({:.0}/s, {} skipped at the in-flight cap): {:?}; 503 in p50 {p50} µs, p99 {p99} µs, max {max} µs; {} counted as no_agent",
            answers.started, self.rate(), answers.skipped, answers.statuses, self.counted
        );
        eprintln!(
            "  server during: at most {} dials pending, RSS {} KiB, {} fds; before {} KiB, {} fds; after {} KiB, {} fds",
            peak.pending,
            peak.rss >> 10,
            peak.fds,
            before.rss >> 10,
            before.fds,
            after.rss >> 10,
            after.fds
        );
        if let Some(error) = &answers.first_error {
            eprintln!("  first failed CONNECT: {error}");
        }
    }

    /// The JSON line and the table row.
    fn record(&self, report: &mut Report) {
        let (answers, peak, before, after) = (&self.answers, &self.peak, &self.before, &self.after);
        let (p50, p99, max) = self.refusal_micros();
        let _ = report.record(
            "burst",
            json!({
                "rate": self.plan.rate,
                "seconds": self.plan.duration.as_secs_f64(),
                "started": answers.started,
                "skipped": answers.skipped,
                "statuses": answers.statuses.iter().map(|(s, n)| (s.to_string(), n)).collect::<BTreeMap<_, _>>(),
                "refusal_us": { "p50": p50, "p99": p99, "max": max },
                "counted_no_agent": self.counted,
                "most_pending": peak.pending,
                "peak_rss": peak.rss,
                "peak_fds": peak.fds,
                "before": { "rss": before.rss, "fds": before.fds },
                "after": { "rss": after.rss, "fds": after.fds },
                "first_error": answers.first_error,
                "agent_cycle_s": { "asleep": ASLEEP.as_secs_f64(), "awake": AWAKE.as_secs_f64() },
                "reopened": self.reopened.as_ref().err().map(|e| format!("{e:#}")),
            }),
        );
        report.row(
            "CONNECT burst against a slow agent (Unix socket, paced open loop; the agent runs 1 s in 5)",
            &[
                "CONNECTs",
                "200 (dialed while awake)",
                "503 (p50 / p99)",
                "504",
                "other",
                "most dials pending",
                "server before → peak → after",
            ],
            vec![
                format!("{} in {} s ({:.0}/s)", answers.started, self.plan.duration.as_secs(), self.rate()),
                self.count(200).to_string(),
                format!("{} ({p50} / {p99} µs)", self.count(503)),
                self.count(504).to_string(),
                self.others().to_string(),
                peak.pending.to_string(),
                format!(
                    "{} → {} → {} KiB, {} → {} → {} fds",
                    before.rss >> 10,
                    peak.rss >> 10,
                    after.rss >> 10,
                    before.fds,
                    peak.fds,
                    after.fds
                ),
            ],
        );
    }

    /// Paced as planned, dials bounded by the slow agent's cap, every refusal a counted 503,
    /// nothing left on the server, and the agent serving once it runs again.
    fn check(&self, report: &mut Report) {
        let (what, answers, peak, before, after) = (
            &self.what,
            &self.answers,
            &self.peak,
            &self.before,
            &self.after,
        );
        let (opened, refused, timed_out, others) = (
            self.count(200),
            self.count(503),
            self.count(504),
            self.others(),
        );
        let wanted = (self.plan.rate as f64 * self.plan.duration.as_secs_f64()) as u64;
        let seconds = self.plan.duration.as_secs_f64() / DIAL_TIMEOUT.as_secs_f64();
        let most_timed_out = PENDING_PER_AGENT * (seconds.ceil() as u64 + 1);
        let counted = self.counted;
        let checks = [
            (
                format!("{what}: paced"),
                format!("{} started, {} skipped", answers.started, answers.skipped),
                format!("≥ 0.95 × {wanted}"),
                answers.started as f64 >= 0.95 * wanted as f64 && answers.skipped == 0,
            ),
            (
                format!("{what}: dials held by the slow agent"),
                format!("{} pending at most; {opened} answered, {timed_out} timed out", peak.pending),
                format!("≤ {PENDING_PER_AGENT} (+{ROUTING_SLACK} being routed) at once, ≤ {most_timed_out} 504s"),
                peak.pending <= PENDING_PER_AGENT + ROUTING_SLACK && timed_out <= most_timed_out,
            ),
            (
                format!("{what}: every refusal a counted 503"),
                format!("{refused} 503s, {counted} counted; {others} other"),
                "all counted, nothing but 200, 503, 504".to_owned(),
                refused > 0 && counted == refused && others == 0,
            ),
            (
                format!("{what}: server after it"),
                format!("{} → {} fds, {} → {} KiB", before.fds, after.fds, before.rss >> 10, after.rss >> 10),
                format!("fds ≤ before, RSS ≤ before + {:.0} % + 1 MiB", RSS_GROWTH * 100.0),
                after.fds <= before.fds
                    && after.rss as f64 <= before.rss as f64 * (1.0 + RSS_GROWTH) + RSS_SLACK as f64,
            ),
            (
                format!("{what}: the agent serves once it runs again"),
                match &self.reopened {
                    Ok(()) => "tunnel opened".to_owned(),
                    Err(error) => format!("{error:#}"),
                },
                "a tunnel opens".to_owned(),
                self.reopened.is_ok(),
            ),
        ];
        for (what, bridgehead, target, ok) in checks {
            let _ = report.check(Check {
                what,
                bridgehead,
                direct: "-".to_owned(),
                ratio: "-".to_owned(),
                target,
                outcome: Outcome::of(ok),
            });
        }
    }
}

type Measured = (Answers, Peak, Peak, Peak, u64);

/// A warm-up burst, the baseline, the burst itself with the server sampled, and the server
/// once every dial of it ended.
async fn measure(
    pair: &Pair,
    target: std::net::SocketAddr,
    plan: Plan,
) -> anyhow::Result<Measured> {
    let target = target.to_string();
    // The first burst settles the server's allocations; the second is measured against it.
    burst(&pair.path, &target, plan.rate, WARM_UP).await;
    let settled = drained(pair).await?;
    let refused_before = no_agent(&pair.server)?;
    let server = Arc::new(Mutex::new(Peak::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pid, health) = (pair.server.process.pid(), pair.server.health);
        let (server, stop) = (server.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let pending = bridgehead_e2e::client::http_get(health, "/metrics")
                    .ok()
                    .and_then(|(_, body)| {
                        bridgehead_e2e::client::metric_in(&body, "bridgehead_server_dials_pending")
                    })
                    .unwrap_or(0.0) as u64;
                let rss = procfs::rss_bytes(pid).unwrap_or(0);
                let fds = procfs::fd_count(pid);
                if let Ok(mut peak) = server.lock() {
                    peak.pending = peak.pending.max(pending);
                    peak.rss = peak.rss.max(rss);
                    peak.fds = peak.fds.max(fds);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        })
    };
    let answers = burst(&pair.path, &target, plan.rate, plan.duration).await;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let peak = *server.lock().unwrap_or_else(|p| p.into_inner());
    let after = drained(pair).await?;
    let counted = (no_agent(&pair.server)? - refused_before) as u64;
    Ok((answers, peak, settled, after, counted))
}

/// `dials_total{result="no_agent"}`.
fn no_agent(server: &Server) -> anyhow::Result<f64> {
    server.metric("bridgehead_server_dials_total{result=\"no_agent\"}")
}

/// Waits until no dial is pending and the descriptor count stopped falling (bounded by the
/// dial timeout and some), then returns the server's state.
async fn drained(pair: &Pair) -> anyhow::Result<Peak> {
    let deadline = Instant::now() + DIAL_TIMEOUT * 2;
    let pid = pair.server.process.pid();
    let mut last = usize::MAX;
    loop {
        let pending = pair
            .server
            .metric("bridgehead_server_dials_pending")
            .unwrap_or(f64::MAX);
        let fds = procfs::fd_count(pid);
        if pending == 0.0 && fds >= last {
            return Ok(Peak {
                pending: 0,
                rss: procfs::rss_bytes(pid)?,
                fds,
            });
        }
        if Instant::now() > deadline {
            bail!(
                "{pending} dials still pending {:?} after the burst",
                DIAL_TIMEOUT * 2
            );
        }
        last = fds;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// CONNECTs to `target` at `rate` per second for `length`, each on a fresh connection, and
/// every answer collected.
async fn burst(path: &Path, target: &str, rate: u32, length: Duration) -> Answers {
    let answers = Arc::new(Mutex::new(Answers::default()));
    let skipped = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    // Late ticks are made up at once: the rate is kept on average.
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let total = (f64::from(rate) * length.as_secs_f64()) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..total {
        tick.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let (path, target, answers) = (path.to_owned(), target.to_owned(), answers.clone());
        tasks.spawn(async move {
            let started = Instant::now();
            let answer = tokio::time::timeout(ANSWER_TIMEOUT, connect_status(&path, &target))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {ANSWER_TIMEOUT:?}")));
            let micros = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
            drop(permit);
            let Ok(mut answers) = answers.lock() else {
                return;
            };
            answers.started += 1;
            match answer {
                Ok(status) => {
                    *answers.statuses.entry(status).or_default() += 1;
                    if status == 503 {
                        answers.refusal_micros.push(micros);
                    }
                }
                Err(error) => {
                    *answers.statuses.entry(0).or_default() += 1;
                    answers.first_error.get_or_insert(format!("{error:#}"));
                }
            }
        });
        // Reap what finished, so the set does not grow with the whole burst.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let mut answers = std::mem::take(&mut *answers.lock().unwrap_or_else(|p| p.into_inner()));
    answers.skipped = skipped.load(Ordering::Relaxed);
    answers.started += answers.skipped;
    answers.refusal_micros.sort_unstable();
    answers
}

/// One CONNECT as kube-apiserver sends it on the Unix socket; the answer's status.
async fn connect_status(path: &Path, target: &str) -> anyhow::Result<u16> {
    let mut conn = UnixStream::connect(path)
        .await
        .with_context(|| format!("connecting to {}", path.display()))?;
    conn.write_all(kube::connect_head(target).as_bytes())
        .await?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if let Some(end) = kube::head_len(&buf) {
            return kube::status(&String::from_utf8_lossy(&buf[..end]));
        }
        let n = conn.read(&mut chunk).await.context("reading the answer")?;
        if n == 0 {
            bail!("closed before an answer");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A tunnel through the agent once it runs again, within the dial timeout (its link first
/// catches up on the burst's dials).
async fn open_after_thaw(path: &Path, target: std::net::SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + DIAL_TIMEOUT * 2;
    loop {
        let status = connect_status(path, &target.to_string()).await;
        match status {
            Ok(200) => return Ok(()),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(status) => bail!("CONNECT answered {status} once the agent ran again"),
            Err(error) => return Err(error.context("CONNECT once the agent ran again")),
        }
    }
}

/// Starves a process of CPU while it lives: SIGSTOP for [`ASLEEP`], SIGCONT for [`AWAKE`], over
/// and over; dropped, it leaves the process running.
struct Starver {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Starver {
    fn start(pid: u32) -> Starver {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                use rustix::process::{kill_process, Pid, Signal};
                let signal = |signal: Signal| {
                    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                        let _ = kill_process(pid, signal);
                    }
                };
                // Sleeps in short steps, so a drop ends the cycle at once.
                let nap = |length: Duration| {
                    let until = std::time::Instant::now() + length;
                    while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    signal(Signal::STOP);
                    nap(ASLEEP);
                    signal(Signal::CONT);
                    nap(AWAKE);
                }
                signal(Signal::CONT);
            })
        };
        Starver {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Starver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
