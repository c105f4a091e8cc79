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
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

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

    /// The counts so far.
    pub fn counts(&self) -> BTreeMap<Kind, Counts> {
        self.shared.lock().counts.clone()
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
            Kind::Exec => exec(shared, pod, attempt),
            Kind::Logs => logs(shared, pod),
            Kind::PortForward => port_forward(shared, pod),
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

/// `kubectl exec -i POD -- cat`: a payload naming this request, echoed back exactly.
fn exec(shared: &Shared, pod: &str, attempt: u64) -> anyhow::Result<()> {
    let payload: Vec<u8> = format!("{pod} request {attempt}\n")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(16 << 10)
        .collect();
    let mut command = shared.kubectl(&["exec", "-i", pod, "--", "cat"]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().context("running kubectl")?;
    let mut stdin = child.stdin.take().context("kubectl's stdin")?;
    let feed = {
        let payload = payload.clone();
        // Dropping stdin at the end is cat's EOF.
        std::thread::spawn(move || stdin.write_all(&payload))
    };
    let (status, stdout, stderr) = wait_within(child, REQUEST_TIMEOUT)?;
    let _ = feed.join();
    if !status || stdout != payload {
        bail!(
            "{} bytes back of {}, success {status}: {}",
            stdout.len(),
            payload.len(),
            String::from_utf8_lossy(&stderr)
        );
    }
    Ok(())
}

/// `kubectl logs --tail=3 POD`: three consecutive ticks.
fn logs(shared: &Shared, pod: &str) -> anyhow::Result<()> {
    let child = shared
        .kubectl(&["logs", "--tail=3", pod])
        .spawn()
        .context("running kubectl")?;
    let (status, stdout, stderr) = wait_within(child, REQUEST_TIMEOUT)?;
    let text = String::from_utf8_lossy(&stdout);
    let ticks: Vec<u64> = text.lines().filter_map(tick).collect();
    let consecutive = ticks.len() == 3 && ticks[1] == ticks[0] + 1 && ticks[2] == ticks[1] + 1;
    if !status || !consecutive {
        bail!(
            "success {status}, {text:?}: {}",
            String::from_utf8_lossy(&stderr)
        );
    }
    Ok(())
}

/// `kubectl port-forward POD :8080` and a GET of `/bulk` through the local port it reports:
/// every byte as the pod wrote it.
fn port_forward(shared: &Shared, pod: &str) -> anyhow::Result<()> {
    let mut child = shared
        .kubectl(&[
            "port-forward",
            "--address=127.0.0.1",
            pod,
            &format!(":{HTTP_PORT}"),
        ])
        .spawn()
        .context("running kubectl")?;
    let result = (|| {
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let port = forwarded_port(stdout)?;
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.write_all(b"GET /bulk HTTP/1.0\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let body = response
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .map(|at| &response[at + 4..])
            .context("no HTTP response")?;
        let expected = b"0123456789abcdef\n".iter().cycle().take(BULK_SIZE);
        if body.len() != BULK_SIZE || !body.iter().eq(expected) {
            bail!(
                "{} bytes of {BULK_SIZE}, or not the pod's: {:?}",
                body.len(),
                String::from_utf8_lossy(&response[..response.len().min(200)])
            );
        }
        Ok(())
    })();
    let _ = child.kill();
    let stderr = child
        .wait_with_output()
        .map(|out| out.stderr)
        .unwrap_or_default();
    result.with_context(|| String::from_utf8_lossy(&stderr).into_owned())
}

/// The local port of kubectl port-forward's `Forwarding from 127.0.0.1:PORT -> 8080`, read
/// within [`REQUEST_TIMEOUT`] (kubectl exits, closing its output, when it fails).
fn forwarded_port(stdout: std::process::ChildStdout) -> anyhow::Result<u16> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        let _ = sender.send(read.map(|_| line));
        // Read on to kubectl's end: it prints a line per connection, and a Go program whose
        // stdout is a closed pipe dies of SIGPIPE on its next write.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let line = receiver
        .recv_timeout(REQUEST_TIMEOUT)
        .context("kubectl port-forward said nothing")??;
    line.strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|port| port.parse().ok())
        .with_context(|| format!("kubectl port-forward: {line:?}"))
}

/// Follows `pod`'s logs until the loop stops, starting again each time the stream ends; each
/// end counted, loud or silent.
fn follow_until_stopped(shared: &Shared, pod: &str) {
    while !shared.stopping() {
        let since = Instant::now();
        let end = follow(shared, pod);
        match end {
            Ok(()) => shared.counts(Kind::Follow, |counts| counts.ok += 1),
            Err(FollowEnd::Failed(message)) => {
                shared.counts(Kind::Follow, |counts| counts.failed += 1);
                shared.fail(Kind::Follow, pod, since, false, message);
            }
            Err(FollowEnd::Loud(message)) => {
                shared.counts(Kind::Follow, |counts| counts.ended_loudly += 1);
                shared.fail(Kind::Follow, pod, since, false, message);
            }
            Err(FollowEnd::Silent(message)) => {
                shared.counts(Kind::Follow, |counts| counts.ended_silently += 1);
                shared.fail(Kind::Follow, pod, since, true, message);
            }
        }
        std::thread::sleep(PACE);
    }
}

/// How a followed stream ended before the loop stopped.
#[derive(Debug)]
enum FollowEnd {
    /// It never started, or delivered ticks out of order.
    Failed(String),
    /// kubectl exited non-zero, saying why.
    Loud(String),
    /// kubectl exited 0, or no tick came for [`FOLLOW_STALL`].
    Silent(String),
}

/// One `kubectl logs -f --tail=1 POD`, its ticks checked in order, until the loop stops (Ok)
/// or the stream ends.
fn follow(shared: &Shared, pod: &str) -> Result<(), FollowEnd> {
    let mut child = shared
        .kubectl(&["logs", "-f", "--tail=1", pod])
        .spawn()
        .map_err(|error| FollowEnd::Failed(format!("running kubectl: {error}")))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(FollowEnd::Failed("no stdout".into()));
    };
    // Lines arrive on a channel, so that a stall is seen while kubectl runs.
    let (sender, receiver) = std::sync::mpsc::sync_channel(64);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let mut last: Option<u64> = None;
    let mut lines = 0u64;
    let mut last_line_at = Instant::now();
    let ended = loop {
        if shared.stopping() {
            break None;
        }
        match receiver.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(line)) => {
                let Some(n) = tick(&line) else {
                    break Some(FollowEnd::Failed(format!("not a tick: {line:?}")));
                };
                if let Some(previous) = last {
                    if n != previous + 1 {
                        break Some(FollowEnd::Failed(format!("tick {n} after tick {previous}")));
                    }
                }
                last = Some(n);
                lines += 1;
                last_line_at = Instant::now();
            }
            Ok(Err(error)) => break Some(FollowEnd::Loud(format!("reading: {error}"))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            // kubectl closed its output: it is exiting.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Some(FollowEnd::Silent(String::new()))
            }
        }
        // Once kubectl exited, its last lines may still be in the pipe: the reader drains
        // them, then Disconnected ends the loop.
        let running = matches!(child.try_wait(), Ok(None));
        if running && last_line_at.elapsed() > FOLLOW_STALL {
            break Some(FollowEnd::Silent(format!(
                "no tick for {FOLLOW_STALL:?} after tick {last:?} while kubectl ran"
            )));
        }
    };
    let _ = child.kill();
    let output = child.wait_with_output();
    let _ = reader.join();
    let Some(end) = ended else {
        return Ok(());
    };
    match (end, output) {
        (FollowEnd::Silent(message), Ok(output)) if message.is_empty() => {
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if output.status.success() {
                Err(FollowEnd::Silent(format!(
                    "kubectl exited 0 after {lines} ticks (last {last:?}): {stderr}"
                )))
            } else {
                Err(FollowEnd::Loud(format!(
                    "kubectl exited {:?} after {lines} ticks: {stderr}",
                    output.status.code()
                )))
            }
        }
        (end, _) => Err(end),
    }
}

/// `tick N`'s N.
fn tick(line: &str) -> Option<u64> {
    line.strip_prefix("tick ")?.parse().ok()
}

/// Waits for `child` at most `timeout` (killed after), reading its output meanwhile: whether
/// it succeeded, its stdout and its stderr.
fn wait_within(mut child: Child, timeout: Duration) -> anyhow::Result<(bool, Vec<u8>, Vec<u8>)> {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut data = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut data);
            }
            data
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    match status {
        Some(status) => Ok((status.success(), stdout, stderr)),
        None => bail!(
            "no answer within {timeout:?}: {}",
            String::from_utf8_lossy(&stderr)
        ),
    }
}
