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
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
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
        .collect();
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
