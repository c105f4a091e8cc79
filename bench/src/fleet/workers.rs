//! The bench's side of the simulator processes: starts them (this binary with
//! `--fleet-worker`), asks them for their counters, and ends them. A worker ends when its
//! standard input does, so dropping [`Workers`] (or the bench dying) ends them all.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::counters::Snapshot;
use super::worker::Spec;

/// Most agents one worker holds: two descriptors each at worst (a drained session and the
/// next attempt), under the 20,000 a process may have here.
pub const AGENTS_PER_WORKER: usize = 8_000;
/// How long a worker may take to start its agents, and to answer.
const ANSWER: Duration = Duration::from_secs(10);

/// The running simulator processes.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Workers {
    /// Starts `agents` agents in as few workers as [`AGENTS_PER_WORKER`] allows, each given
    /// `spec` with its own slice of the agents.
    pub fn start(agents: usize, spec: &Spec) -> anyhow::Result<Workers> {
        Workers::start_spread(agents, AGENTS_PER_WORKER, |_| spec.clone())
    }

    /// Starts `agents` agents, at most `per_worker` in a worker, worker `i` given
    /// `spec_for(i)` with its own slice of the agents.
    pub fn start_spread(
        agents: usize,
        per_worker: usize,
        spec_for: impl Fn(usize) -> Spec,
    ) -> anyhow::Result<Workers> {
        let processes = agents.div_ceil(per_worker.max(1)).max(1);
        let mut workers = Vec::with_capacity(processes);
        let mut first = 0;
        for i in 0..processes {
            // Even slices: the first `agents % processes` workers take one more.
            let count = agents / processes + usize::from(i < agents % processes);
            let spec = Spec {
                first,
                count,
                ..spec_for(i)
            };
            first += count;
            workers.push(Worker::start(&spec)?);
        }
        Ok(Workers { workers })
    }

    /// The workers' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.child.id()).collect()
    }

    /// Every worker's counters, added up.
    pub fn stats(&mut self) -> anyhow::Result<Snapshot> {
        for worker in &mut self.workers {
            worker.send("stats")?;
        }
        let mut snapshots = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            let line = worker.line()?;
            snapshots.push(
                serde_json::from_str::<Snapshot>(&line)
                    .with_context(|| format!("a worker answered {line:?}"))?,
            );
        }
        Ok(Snapshot::sum(&snapshots))
    }
}

impl Worker {
    fn start(spec: &Spec) -> anyhow::Result<Worker> {
        // /proc/self/exe still runs when a rebuild replaced the binary during the run.
        let mut child = Command::new("/proc/self/exe")
            .arg("--fleet-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a fleet worker")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::sync_channel(16);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = Worker {
            stdin: child.stdin.take(),
            child,
            lines,
        };
        worker.send(&serde_json::to_string(spec)?)?;
        let started = worker.line()?;
        if !started.starts_with("fleet worker started") {
            bail!("a fleet worker said {started:?}");
        }
        Ok(worker)
    }

    fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("worker closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .context("writing to a fleet worker (did it exit?)")
    }

    fn line(&mut self) -> anyhow::Result<String> {
        self.lines
            .recv_timeout(ANSWER)
            .map_err(|error| match error {
                mpsc::RecvTimeoutError::Timeout => {
                    anyhow::anyhow!("a fleet worker did not answer within {ANSWER:?}")
                }
                mpsc::RecvTimeoutError::Disconnected => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    anyhow::anyhow!("a fleet worker exited ({status}); its error is on stderr")
                }
            })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // End of input: the worker stops its agents and exits; killed if it does not.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + ANSWER;
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
