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

/// Sum of [`cpu_seconds`] over `pids`.
pub fn total_cpu(pids: &[u32]) -> anyhow::Result<f64> {
    pids.iter().map(|&pid| cpu_seconds(pid)).sum()
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
