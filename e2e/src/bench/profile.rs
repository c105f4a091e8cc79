//! Optional `perf record` of the server and the agent while a measurement runs
//! (`--perf DIR`): one `DIR/<label>-<process>.data` per process, for `perf report -i`.

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

/// Where recordings go.
#[derive(Debug, Clone)]
pub struct Profiler {
    dir: PathBuf,
}

/// Running `perf record`s; [`Recording::stop`] ends them.
#[derive(Debug)]
pub struct Recording {
    children: Vec<(Child, PathBuf)>,
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
        for (name, pid) in processes {
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
            children.push((child, output));
        }
        std::thread::sleep(ATTACH);
        eprintln!("  (perf recording {label})");
        Ok(Recording { children })
    }
}

impl Recording {
    /// Stops every `perf record` (SIGINT, so it writes its file) and waits for them.
    pub fn stop(mut self) -> anyhow::Result<Vec<PathBuf>> {
        let mut outputs = Vec::new();
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
            outputs.push(output.clone());
        }
        Ok(outputs)
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
