//! What `/proc` says about the server and agent processes, and the bench's own descriptor
//! limit (which the children inherit).

use anyhow::{bail, Context};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Resident memory of `pid` in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

/// Sum of [`rss_bytes`] over `pids`.
pub fn total_rss(pids: &[u32]) -> anyhow::Result<u64> {
    pids.iter().map(|&pid| rss_bytes(pid)).sum()
}

/// CPU time (user + system) `pid` used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; utime is field 14, stime field 15.
    let ticks = |i: usize| -> anyhow::Result<u64> {
        Ok(fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse::<u64>()?)
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(total as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// Sum of [`cpu_seconds`] over `pids`.
pub fn total_cpu(pids: &[u32]) -> anyhow::Result<f64> {
    pids.iter().map(|&pid| cpu_seconds(pid)).sum()
}

/// Raises this process's `RLIMIT_NOFILE` to at least `want` (soft and, if needed and
/// allowed, hard); children started afterwards inherit it. Returns the soft limit now in
/// force, which may be lower than `want` when the hard limit cannot be raised.
pub fn raise_nofile(want: u64) -> anyhow::Result<u64> {
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    if soft >= want {
        return Ok(soft);
    }
    if hard < want {
        // Needs CAP_SYS_RESOURCE; fall back to the hard limit.
        let raised = Rlimit {
            current: Some(want),
            maximum: Some(want),
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return Ok(want);
        }
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        )?;
        return Ok(hard);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum: Some(hard),
        },
    )?;
    Ok(want)
}

/// The soft and hard `RLIMIT_NOFILE` of `pid`, from `/proc/PID/limits`.
pub fn nofile_of(pid: u32) -> anyhow::Result<(String, String)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    for line in limits.lines() {
        if let Some(rest) = line.strip_prefix("Max open files") {
            let mut words = rest.split_whitespace();
            if let (Some(soft), Some(hard)) = (words.next(), words.next()) {
                return Ok((soft.to_owned(), hard.to_owned()));
            }
        }
    }
    bail!("no 'Max open files' in /proc/{pid}/limits")
}

/// CPU seconds the whole machine spent busy (user, nice, system, irq, softirq) and stolen by
/// the hypervisor, from the `cpu` line of `/proc/stat`.
pub fn machine_cpu() -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
    let hz = rustix::param::clock_ticks_per_second() as f64;
    // user nice system idle iowait irq softirq steal
    let busy = tick(0) + tick(1) + tick(2) + tick(5) + tick(6);
    Ok((busy as f64 / hz, tick(7) as f64 / hz))
}

/// How much CPU other work on the machine took while a measurement ran: the machine's busy
/// time minus that of the bench and the processes under test.
#[derive(Debug, Clone)]
pub struct Noise {
    pids: Vec<u32>,
    started: std::time::Instant,
    machine: (f64, f64),
    own: f64,
}

impl Noise {
    /// Starts watching; `pids` are the processes under test (the bench itself is added).
    pub fn start(pids: &[u32]) -> Noise {
        let mut pids = pids.to_vec();
        pids.push(std::process::id());
        Noise {
            own: total_cpu(&pids).unwrap_or(0.0),
            machine: machine_cpu().unwrap_or((0.0, 0.0)),
            started: std::time::Instant::now(),
            pids,
        }
    }

    /// `(wall seconds, foreign CPU seconds, stolen CPU seconds)` since [`Noise::start`].
    pub fn finish(&self) -> (f64, f64, f64) {
        let wall = self.started.elapsed().as_secs_f64();
        let own = total_cpu(&self.pids).unwrap_or(self.own) - self.own;
        let (busy, steal) = machine_cpu().unwrap_or(self.machine);
        let foreign = (busy - self.machine.0 - own).max(0.0);
        (wall, foreign, steal - self.machine.1)
    }
}
