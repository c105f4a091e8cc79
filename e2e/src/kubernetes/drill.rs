//! The client loop every drill of an HA cluster runs under (issue 50): workers that each repeat
//! one kind of request through the load balancer's kubeconfig, into a pod on each worker node,
//! and count what came back, by kind.
//!
//! - [`Kind::Exec`]: `kubectl exec -i POD -- cat`, a payload naming the request echoed back
//!   byte for byte;
//! - [`Kind::Logs`]: `kubectl logs --tail=3`, three consecutive ticks of the pod's ticker;
//! - [`Kind::Follow`]: one long `kubectl logs -f` per pod, its ticks checked in order; when it
//!   ends the end is counted as loud (kubectl exited non-zero, saying why) or silent (it exited
//!   0, or stopped receiving while running, as if the pod had stopped logging), and it starts
//!   again;
//! - [`Kind::PortForward`]: `kubectl port-forward` to the pod's httpd and a GET of a 1 MiB file
//!   through it, compared with what the pod wrote.
//!
//! [`Loop::stop`] returns a [`Report`]. Failures are kept with their message and when they
//! happened, never retried away: a drill decides which it allows. The webhook-guarded write and
//! the aggregated API list of the issue are not here yet.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::bail;

mod follow;
mod requests;
use follow::follow_until_stopped;

/// What each drill pod runs: an httpd on 8080 serving [`BULK_SIZE`] bytes of a known pattern as
/// `/bulk`, and a ticker (`tick N` every 100 ms) on its standard output.
pub const POD_SCRIPT: &str = "mkdir -p /www && yes 0123456789abcdef | head -c 1048576 > /www/bulk && httpd -p 8080 -h /www && i=0; while true; do echo tick $i; i=$((i+1)); usleep 100000; done";
/// The size of `/bulk` ([`POD_SCRIPT`]).
const BULK_SIZE: usize = 1 << 20;
/// The port the pods' httpd listens on.
const HTTP_PORT: u16 = 8080;
/// Each worker's pause between two requests: the loop's rate, kept low enough that a 2-core
/// machine running the whole cluster still answers each request in well under a second.
const PACE: Duration = Duration::from_millis(250);
/// How long one exec, logs or port-forward request may take before it counts as failed (hung).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A followed stream that delivers no tick for this long (ticks come every 100 ms) has ended
/// silently, though kubectl still runs: longer than a cut link takes to end it loudly (the
/// server's keepalive gives up on a silent agent after 15 s).
const FOLLOW_STALL: Duration = Duration::from_secs(45);

/// A kind of request of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Exec,
    Logs,
    Follow,
    PortForward,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Exec => "exec -i",
            Kind::Logs => "logs",
            Kind::Follow => "logs -f",
            Kind::PortForward => "port-forward",
        })
    }
}

/// What the requests of one kind came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests that did what they should (a followed stream: stopped by the loop's end).
    pub ok: u64,
    /// Requests that failed (an error, wrong bytes, a timeout).
    pub failed: u64,
    /// Followed streams that ended while the loop ran, kubectl saying why.
    pub ended_loudly: u64,
    /// Followed streams that ended while the loop ran with no error: exit 0, or stalled.
    pub ended_silently: u64,
}

/// One failed request, or one followed stream's end.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: Kind,
    pub pod: String,
    /// When the request (the followed stream) started, since the loop started.
    pub started: Duration,
    /// When it failed (ended), since the loop started.
    pub at: Duration,
    /// Whether it was a followed stream's silent end.
    pub silent: bool,
    pub message: String,
}

/// What a loop counted from its start to its stop.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub counts: BTreeMap<Kind, Counts>,
    pub failures: Vec<Failure>,
    pub elapsed: Duration,
}

impl Report {
    /// The counts of `kind` (zeros if it never ran).
    pub fn of(&self, kind: Kind) -> Counts {
        self.counts.get(&kind).copied().unwrap_or_default()
    }

    /// Requests of every kind that failed (followed streams' ends not counted).
    pub fn failed(&self) -> u64 {
        self.counts.values().map(|counts| counts.failed).sum()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} s:", self.elapsed.as_secs_f64())?;
        for (kind, counts) in &self.counts {
            write!(f, " {kind} {} ok {} failed", counts.ok, counts.failed)?;
            if *kind == Kind::Follow {
                write!(
                    f,
                    " ({} ended loudly, {} silently)",
                    counts.ended_loudly, counts.ended_silently
                )?;
            }
            f.write_str(";")?;
        }
        for failure in &self.failures {
            write!(
                f,
                "\n  {:>7.2} s {} {} {}: {}",
                failure.at.as_secs_f64(),
                failure.kind,
                failure.pod,
                if failure.silent { "(silent)" } else { "" },
                failure.message.trim()
            )?;
        }
        Ok(())
    }
}

/// What the workers share.
#[derive(Debug, Default)]
struct State {
    counts: BTreeMap<Kind, Counts>,
    failures: Vec<Failure>,
    /// Short requests running now, by id: when each started.
    in_flight: HashMap<u64, Instant>,
    next: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a request ends.
    ended: Condvar,
    stop: AtomicBool,
    started: Instant,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn counts(&self, kind: Kind, change: impl FnOnce(&mut Counts)) {
        change(self.lock().counts.entry(kind).or_default());
    }

    fn fail(&self, kind: Kind, pod: &str, since: Instant, silent: bool, message: String) {
        let failure = Failure {
            kind,
            pod: pod.to_owned(),
            started: since.saturating_duration_since(self.started),
            at: self.started.elapsed(),
            silent,
            message,
        };
        let _ = writeln!(
            std::io::stderr(),
            "drill: {:.2} s {kind} {pod}{}: {}",
            failure.at.as_secs_f64(),
            if silent { " (silent)" } else { "" },
            failure.message.trim()
        );
        self.lock().failures.push(failure);
    }

    /// kubectl with the loop's kubeconfig.
    fn kubectl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.kubectl);
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

/// A running client loop; stop it with [`Loop::stop`] (dropped, it stops and forgets).
#[derive(Debug)]
pub struct Loop {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Loop {
    /// Starts a worker of each kind for each of `pods` (made from [`POD_SCRIPT`]), with
    /// `kubectl` and `kubeconfig` (the load balancer's).
    pub fn start(kubectl: &Path, kubeconfig: &Path, pods: &[String]) -> Loop {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            ended: Condvar::new(),
            stop: AtomicBool::new(false),
            started: Instant::now(),
            kubectl: kubectl.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
        });
        let mut workers = Vec::new();
        for pod in pods {
            for kind in [Kind::Exec, Kind::Logs, Kind::Follow, Kind::PortForward] {
                let (shared, pod) = (shared.clone(), pod.clone());
                workers.push(std::thread::spawn(move || match kind {
                    Kind::Follow => follow_until_stopped(&shared, &pod),
                    _ => repeat(&shared, kind, &pod),
                }));
            }
        }
        Loop { shared, workers }
    }

    /// Waits until every short request (not a followed stream) that started before `since`
    /// has ended, at most `within`: after a backend is drained, what may still be on it.
    pub fn wait_started_before(&self, since: Instant, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let mut state = self.shared.lock();
        loop {
            let older = state.in_flight.values().filter(|&&at| at < since).count();
            if older == 0 {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{older} requests started before the drain still run after {within:?}");
            }
            state = self
                .shared
                .ended
                .wait_timeout(state, left)
                .map(|(state, _)| state)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }

    /// Now, as the loop's [`Failure`] times count it (since the loop started).
    pub fn now(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Stops every worker (a request running ends first; a followed stream is cut) and returns
    /// what they counted.
    pub fn stop(mut self) -> Report {
        self.halt();
        let state = self.shared.lock();
        Report {
            counts: state.counts.clone(),
            failures: state.failures.clone(),
            elapsed: self.shared.started.elapsed(),
        }
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Repeats requests of `kind` into `pod` until the loop stops, counting each.
fn repeat(shared: &Shared, kind: Kind, pod: &str) {
    let mut attempt = 0u64;
    while !shared.stopping() {
        attempt += 1;
        let since = Instant::now();
        let id = {
            let mut state = shared.lock();
            state.next += 1;
            let id = state.next;
            state.in_flight.insert(id, since);
            id
        };
        let result = match kind {
            Kind::Exec => requests::exec(shared, pod, attempt),
            Kind::Logs => requests::logs(shared, pod),
            Kind::PortForward => requests::port_forward(shared, pod),
            Kind::Follow => Ok(()),
        };
        match result {
            Ok(()) => shared.counts(kind, |counts| counts.ok += 1),
            Err(error) => {
                shared.counts(kind, |counts| counts.failed += 1);
                shared.fail(kind, pod, since, false, format!("{error:#}"));
            }
        }
        shared.lock().in_flight.remove(&id);
        shared.ended.notify_all();
        std::thread::sleep(PACE);
    }
}
