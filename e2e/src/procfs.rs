//! What `/proc` says about a process: resident memory, CPU time, descriptors and limits.

use anyhow::{bail, Context};

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

/// The CPU time a set of processes used so far, to take twice and subtract
/// ([`CpuSample::seconds_since`]). `/proc/PID/stat` counts in clock ticks (10 ms): a slice of
/// 2,000 round trips used about 15 of them, so the figure per round trip moved by a tenth
/// with where the ticks fell. Each thread's scheduler statistics
/// (`/proc/PID/task/TID/schedstat`) count the same time in nanoseconds.
#[derive(Debug, Clone)]
pub struct CpuSample {
    processes: Vec<ProcessCpu>,
}

#[derive(Debug, Clone)]
struct ProcessCpu {
    pid: u32,
    /// [`cpu_seconds`]: counts the threads that already ended too.
    seconds: f64,
    /// Nanoseconds on a CPU of each live thread, by thread id.
    threads: std::collections::BTreeMap<u32, u64>,
}

/// The CPU time `pids` used so far.
pub fn cpu_sample(pids: &[u32]) -> anyhow::Result<CpuSample> {
    let processes = pids
        .iter()
        .map(|&pid| {
            // `stat` first: summing a process's time brings the count of each of its threads
            // that is on a CPU right now up to date, where that thread's `schedstat` alone
            // lags by up to a scheduler tick (4 ms here).
            let seconds = cpu_seconds(pid)?;
            Ok(ProcessCpu {
                pid,
                seconds,
                threads: thread_nanos(pid),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(CpuSample { processes })
}

impl CpuSample {
    /// CPU seconds used between `earlier` (a sample of the same processes) and this sample.
    /// A process's threads count to the nanosecond, threads that started meanwhile whole; a
    /// process that lost a thread meanwhile took that thread's nanoseconds with it, and counts
    /// in clock ticks.
    pub fn seconds_since(&self, earlier: &CpuSample) -> f64 {
        self.processes
            .iter()
            .map(|now| {
                let Some(then) = earlier.processes.iter().find(|then| then.pid == now.pid) else {
                    return now.seconds;
                };
                if then.threads.is_empty()
                    || !then.threads.keys().all(|tid| now.threads.contains_key(tid))
                {
                    return now.seconds - then.seconds;
                }
                let nanos: u64 = now
                    .threads
                    .iter()
                    .map(|(tid, &ns)| {
                        ns.saturating_sub(then.threads.get(tid).copied().unwrap_or(0))
                    })
                    .sum();
                nanos as f64 / 1e9
            })
            .sum()
    }
}

/// Nanoseconds on a CPU of each live thread of `pid` (empty when `/proc` does not say).
fn thread_nanos(pid: u32) -> std::collections::BTreeMap<u32, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            // Gone since the listing: it ended, which the next sample notices.
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let ns = stat.split_whitespace().next()?.parse().ok()?;
            Some((tid, ns))
        })
        .collect()
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

/// Open file descriptors of `pid` (0 when it is gone).
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// The TCP addresses `pid` listens on (IPv4, from `/proc/net/tcp` and its socket inodes):
/// for programs that do not say which ephemeral ports they bound.
pub fn listening_v4(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes = socket_inodes(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            if *state != "0A" || !inodes.contains(*inode) {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            // The kernel prints the network-order address as a native integer.
            let ip = std::net::Ipv4Addr::from(ip.to_ne_bytes());
            Some(std::net::SocketAddr::new(ip.into(), port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_this_processes_listeners() {
        let listener = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let found = super::listening_v4(std::process::id());
        assert!(found.contains(&addr), "{addr} not in {found:?}");
    }

    /// Busy on a CPU until `wall` passed.
    fn spin(wall: std::time::Duration) {
        let started = std::time::Instant::now();
        while started.elapsed() < wall {
            std::hint::black_box(started);
        }
    }

    #[test]
    fn a_sample_counts_less_than_a_clock_tick() {
        let pid = [std::process::id()];
        // The harness's threads for other tests end when they do, and a sample across an
        // ended thread counts in ticks: a span none ended in is what this test is about.
        for _ in 0..100 {
            let before = super::cpu_sample(&pid).unwrap();
            // A quarter of a 10 ms tick: in ticks, most such spans read as nothing.
            spin(std::time::Duration::from_micros(2_500));
            let after = super::cpu_sample(&pid).unwrap();
            let threads = |sample: &super::CpuSample| sample.processes[0].threads.clone();
            if threads(&before)
                .keys()
                .all(|tid| threads(&after).contains_key(tid))
            {
                let used = after.seconds_since(&before);
                assert!(used > 0.0 && used < 1.0, "{used} s");
                return;
            }
        }
        panic!("threads kept ending around every sample");
    }

    #[test]
    fn a_thread_that_ended_between_samples_falls_back_to_ticks() {
        let pid = [std::process::id()];
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            wait.recv().unwrap();
            spin(std::time::Duration::from_millis(30));
        });
        let before = super::cpu_sample(&pid).unwrap();
        go.send(()).unwrap();
        thread.join().unwrap();
        let after = super::cpu_sample(&pid).unwrap();
        let used = after.seconds_since(&before);
        let ticks = after.processes[0].seconds - before.processes[0].seconds;
        assert_eq!(used, ticks);
        assert!(used >= 0.0, "{used} s");
    }
}

/// The inodes of the sockets `pid` holds open.
fn socket_inodes(pid: u32) -> std::collections::HashSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            link.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect()
}

/// Bytes queued in the kernel on the IPv4 TCP sockets `pid` holds: received and not read
/// yet, and written and not yet acknowledged (`rx_queue` and `tx_queue` of `/proc/net/tcp`;
/// payload bytes, without the kernel's per-buffer overhead).
pub fn tcp_queued(pid: u32) -> (u64, u64) {
    tcp_queues(pid, |_| true)
        .into_iter()
        .fold((0, 0), |(rx, tx), q| (rx + q.0, tx + q.1))
}

/// [`tcp_queued`] per socket, for the IPv4 TCP sockets of `pid` connected to a remote
/// `port`.
pub fn tcp_queued_to(pid: u32, port: u16) -> Vec<(u64, u64)> {
    let remote = format!(":{port:04X}");
    tcp_queues(pid, |remote_address| remote_address.ends_with(&remote))
}

/// (received unread, unacknowledged) of each IPv4 TCP socket of `pid` whose remote address
/// (`/proc/net/tcp`'s hex `ADDR:PORT`) `remote` accepts.
fn tcp_queues(pid: u32, remote: impl Fn(&str) -> bool) -> Vec<(u64, u64)> {
    let inodes = socket_inodes(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut queues = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(address), Some(queued), Some(inode)) =
            (fields.get(2), fields.get(4), fields.get(9))
        else {
            continue;
        };
        if !inodes.contains(*inode) || !remote(address) {
            continue;
        }
        if let Some((tx, rx)) = queued.split_once(':') {
            queues.push((
                u64::from_str_radix(rx, 16).unwrap_or(0),
                u64::from_str_radix(tx, 16).unwrap_or(0),
            ));
        }
    }
    queues
}

/// The machine's TCP memory in pages (`mem` of the `TCP:` line of `/proc/net/sockstat`): every
/// TCP socket's buffers, whoever owns them.
pub fn tcp_memory_pages() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/net/sockstat")?;
    sockstat_tcp_mem(&text).ok_or_else(|| anyhow::anyhow!("no TCP mem in /proc/net/sockstat"))
}

fn sockstat_tcp_mem(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with("TCP:"))?;
    let mut fields = line.split_whitespace();
    fields.find(|&field| field == "mem")?;
    fields.next()?.parse().ok()
}

/// `net.ipv4.tcp_mem`: the pages below which TCP is under no memory pressure, above which it
/// is, and its hard limit.
pub fn tcp_mem_limits() -> anyhow::Result<[u64; 3]> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem")?;
    let values: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    values
        .try_into()
        .map_err(|_| anyhow::anyhow!("tcp_mem is not three numbers: {text:?}"))
}

#[cfg(test)]
mod sockstat_tests {
    #[test]
    fn the_tcp_lines_mem_field() {
        let text = "sockets: used 301\nTCP: inuse 12 orphan 0 tw 3 alloc 15 mem 4242\nUDP: inuse 1 mem 2\n";
        assert_eq!(super::sockstat_tcp_mem(text), Some(4242));
        assert_eq!(super::sockstat_tcp_mem("UDP: inuse 1 mem 2\n"), None);
        assert!(super::tcp_memory_pages().is_ok());
        let [low, pressure, high] = super::tcp_mem_limits().unwrap();
        assert!(low <= pressure && pressure <= high);
    }
}
