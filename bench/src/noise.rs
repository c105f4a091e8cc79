//! How much CPU other work on the machine took while a measurement ran.

use anyhow::Context;

use bridgehead_e2e::procfs::{cpu_sample, CpuSample};

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
    own: Option<CpuSample>,
}

impl Noise {
    /// Starts watching; `pids` are the processes under test (the bench itself is added).
    pub fn start(pids: &[u32]) -> Noise {
        let mut pids = pids.to_vec();
        pids.push(std::process::id());
        Noise {
            own: cpu_sample(&pids).ok(),
            machine: machine_cpu().unwrap_or((0.0, 0.0)),
            started: std::time::Instant::now(),
            pids,
        }
    }

    /// `(wall seconds, foreign CPU seconds, stolen CPU seconds)` since [`Noise::start`].
    pub fn finish(&self) -> (f64, f64, f64) {
        let wall = self.started.elapsed().as_secs_f64();
        let own = match (&self.own, cpu_sample(&self.pids)) {
            (Some(then), Ok(now)) => now.seconds_since(then),
            _ => 0.0,
        };
        let (busy, steal) = machine_cpu().unwrap_or(self.machine);
        let foreign = (busy - self.machine.0 - own).max(0.0);
        (wall, foreign, steal - self.machine.1)
    }
}

/// Above this share of the machine's CPU time taken by the hypervisor during a measurement,
/// its rates are not comparable with another run's: a side-by-side run that lost 26 s of its
/// 292 on two CPUs (4.5 %) read every one-tunnel row at half speed, for every path alike,
/// where runs that lost 1-2 % read as usual (docs/benchmark-history.md).
pub const STOLEN_SHARE_NOISY: f64 = 0.03;
/// Below this many stolen seconds a measurement is not called noisy whatever its share: the
/// kernel counts steal in clock ticks, and a one-second smoke run (`--quick`) reads 4 % from
/// ten of them.
pub const STOLEN_SECONDS_NOISY: f64 = 1.0;

/// The share of the machine's CPU time (`cpus` CPUs for `wall` seconds) that `stolen` seconds
/// are.
pub fn stolen_share(stolen: f64, wall: f64, cpus: usize) -> f64 {
    stolen / (wall * cpus.max(1) as f64).max(1e-9)
}

/// Whether the hypervisor took enough of the machine during a measurement that its rates are
/// not comparable with another run's.
pub fn stolen_is_noisy(stolen: f64, wall: f64, cpus: usize) -> bool {
    stolen >= STOLEN_SECONDS_NOISY && stolen_share(stolen, wall, cpus) > STOLEN_SHARE_NOISY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stolen_share_is_of_every_cpu() {
        // 11.7 s stolen in a 38.5 s run on two CPUs: 15 % of the machine.
        let share = stolen_share(11.7, 38.5, 2);
        assert!((share - 0.152).abs() < 0.001, "{share}");
        assert!(share > STOLEN_SHARE_NOISY);
        assert!(stolen_share(26.0, 292.0, 2) > STOLEN_SHARE_NOISY);
        // 8 s of 236 s: 1.7 %, a measurement.
        assert!(stolen_share(8.0, 236.0, 2) < STOLEN_SHARE_NOISY);
        // No time, no CPUs: noisy, not a division by zero.
        assert!(stolen_share(1.0, 0.0, 0) > STOLEN_SHARE_NOISY);
        assert!(stolen_is_noisy(11.7, 38.5, 2));
        assert!(!stolen_is_noisy(8.0, 236.0, 2));
        // A tenth of a second of a 1.2 s smoke run: 4 %, but ten clock ticks.
        assert!(!stolen_is_noisy(0.1, 1.2, 2));
    }
}
