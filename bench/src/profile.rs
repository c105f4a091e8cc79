//! Optional `perf record` of the server and the agent while a measurement runs
//! (`--perf DIR`): one `DIR/<label>-<process>.data` per process, for `perf report -i`, its
//! flame graph (`.svg`, see [`crate::flamegraph`]), and a `perf stat` count of syscalls and
//! context switches beside it (`.stat`, CSV).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Sampling frequency (Hz) of the software `cpu-clock` event (no hardware counters in VMs).
const FREQUENCY: &str = "499";
/// How long `perf` gets to attach before the measurement starts.
const ATTACH: Duration = Duration::from_millis(700);
/// How long `perf` may take to write its file after SIGINT.
const FINISH: Duration = Duration::from_secs(60);
/// What `perf stat` counts: the syscalls of the data path, and scheduling.
const COUNTERS: &str = "syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,\
    syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,\
    syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,context-switches,task-clock";

/// Where recordings go.
#[derive(Debug, Clone)]
pub struct Profiler {
    dir: PathBuf,
}

/// Running `perf record`s and `perf stat`s; [`Recording::stop`] ends them.
#[derive(Debug)]
pub struct Recording {
    children: Vec<(Child, PathBuf)>,
    stats: Vec<(String, PathBuf)>,
    /// Flame graph title and `perf record` output of each process.
    records: Vec<(String, PathBuf)>,
}

/// Counts `perf stat` made for one process.
#[derive(Debug, Clone)]
pub struct Counts {
    pub process: String,
    /// `(event, count)`; task-clock in milliseconds.
    pub events: Vec<(String, f64)>,
}

impl Profiler {
    /// Recordings go to `dir`; fails when `perf` is missing.
    pub fn new(dir: PathBuf) -> anyhow::Result<Profiler> {
        std::fs::create_dir_all(&dir)?;
        let ok = Command::new("perf")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            bail!("`perf` not found (apt-get install -y linux-perf)");
        }
        Ok(Profiler { dir })
    }

    /// Starts recording each `(name, pid)` with call graphs (DWARF unwinding: the release
    /// build has debug info but no frame pointers).
    pub fn start(&self, label: &str, processes: &[(&str, u32)]) -> anyhow::Result<Recording> {
        let mut children = Vec::new();
        let mut stats = Vec::new();
        let mut records = Vec::new();
        for (name, pid) in processes {
            let stat = self.dir.join(format!("{label}-{name}.stat"));
            let child = Command::new("perf")
                .args([
                    "stat",
                    "-x",
                    ",",
                    "-e",
                    COUNTERS,
                    "-p",
                    &pid.to_string(),
                    "-o",
                ])
                .arg(&stat)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting perf stat")?;
            children.push((child, stat.clone()));
            stats.push(((*name).to_owned(), stat));
            let output = self.dir.join(format!("{label}-{name}.data"));
            let log = std::fs::File::create(self.dir.join(format!("{label}-{name}.log")))?;
            let child = Command::new("perf")
                .args(["record", "-e", "cpu-clock", "-F", FREQUENCY])
                .args(["--call-graph", "dwarf,16384", "-p", &pid.to_string(), "-o"])
                .arg(&output)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("starting perf record")?;
            children.push((child, output.clone()));
            let title = format!("bridgehead {name}, {label} (perf cpu-clock at {FREQUENCY} Hz)");
            records.push((title, output));
        }
        std::thread::sleep(ATTACH);
        eprintln!("  (perf recording {label})");
        Ok(Recording {
            children,
            stats,
            records,
        })
    }
}

impl Recording {
    /// Stops every `perf` (SIGINT, so it writes its file), waits for them, draws each
    /// recording's flame graph next to it (`.svg`), and returns the `perf stat` counts.
    pub fn stop(mut self) -> anyhow::Result<Vec<Counts>> {
        for (child, output) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + FINISH;
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    bail!("perf did not finish writing {}", output.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("  (perf wrote {})", output.display());
        }
        for (title, data) in &self.records {
            let svg = data.with_extension("svg");
            match crate::flamegraph::render(data, &svg, title) {
                Ok(()) => eprintln!("  (flame graph {})", svg.display()),
                Err(error) => eprintln!("  flame graph of {}: {error:#}", data.display()),
            }
        }
        let mut counts = Vec::new();
        for (process, path) in &self.stats {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let events = text
                .lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split(',').collect();
                    let count = fields.first()?.parse::<f64>().ok()?;
                    Some(((*fields.get(2)?).to_owned(), count))
                })
                .collect();
            counts.push(Counts {
                process: process.clone(),
                events,
            });
        }
        Ok(counts)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        for (child, _) in &mut self.children {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Adds the `perf stat` counts of a profiled run to the report, divided by `per` (MiB moved,
/// or tunnels opened), as `unit`.
pub fn report_counts(
    report: &mut crate::report::Report,
    run: &str,
    counts: &[Counts],
    per: f64,
    unit: &str,
) {
    for counts in counts {
        let sum = |names: &[&str]| -> f64 {
            counts
                .events
                .iter()
                .filter(|(event, _)| names.iter().any(|n| event.ends_with(n)))
                .map(|(_, count)| count)
                .sum::<f64>()
                / per.max(1e-9)
        };
        let reads = sum(&["sys_enter_read", "sys_enter_recvfrom"]);
        let writes = sum(&["sys_enter_write", "sys_enter_writev", "sys_enter_sendto"]);
        let epoll = sum(&["sys_enter_epoll_wait"]);
        let futex = sum(&["sys_enter_futex"]);
        let switches = sum(&["context-switches"]);
        let cpu_ms = sum(&["task-clock"]);
        eprintln!(
            "  {run} {}: per {unit}: {reads:.1} reads, {writes:.1} writes, {epoll:.1} epoll_wait, {futex:.1} futex, {switches:.1} context switches, {cpu_ms:.2} CPU ms",
            counts.process
        );
        let _ = report.record(
            "perf_stat",
            serde_json::json!({
                "run": run,
                "process": counts.process,
                "unit": unit,
                "reads": reads,
                "writes": writes,
                "epoll_wait": epoll,
                "futex": futex,
                "context_switches": switches,
                "cpu_ms": cpu_ms,
            }),
        );
        report.row(
            "perf stat counters of the profiled runs (with perf attached)",
            &[
                "run",
                "process",
                "per",
                "read+recvfrom",
                "write+writev+sendto",
                "epoll_wait",
                "futex",
                "context switches",
                "CPU ms",
            ],
            vec![
                run.to_owned(),
                counts.process.clone(),
                unit.to_owned(),
                format!("{reads:.1}"),
                format!("{writes:.1}"),
                format!("{epoll:.1}"),
                format!("{futex:.1}"),
                format!("{switches:.1}"),
                format!("{cpu_ms:.2}"),
            ],
        );
    }
}
