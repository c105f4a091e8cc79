//! The machine a run measured on: CPU, kernel, TCP's congestion control, load, written beside
//! every result.

/// What the results depend on.
#[derive(Debug, Clone)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub kernel: String,
    /// New TCP sockets' congestion control and the default queueing discipline, which decide
    /// whether TCP paces its sends itself: BBR without `fq` paces every socket with a timer
    /// of its own, loopback included, which costs bulk transfers on this kind of machine
    /// (docs/benchmark-history.md, "Congestion control").
    pub tcp: String,
    pub load: String,
}

impl Machine {
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or("unknown CPU".to_owned(), |(_, model)| {
                model.trim().to_owned()
            });
        let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let sysctl = |path: &str| {
            std::fs::read_to_string(path)
                .map_or("unknown".to_owned(), |value| value.trim().to_owned())
        };
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            tcp: format!(
                "{}, qdisc {}",
                sysctl("/proc/sys/net/ipv4/tcp_congestion_control"),
                sysctl("/proc/sys/net/core/default_qdisc")
            ),
            load: loadavg
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}
