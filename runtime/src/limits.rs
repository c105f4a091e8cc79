//! Process limits a tunnel server needs raised.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go programs (kube-apiserver, ANP) do
/// at startup: every tunnel holds a descriptor in the server and one in the agent, and the
/// usual soft limit of 1024 would cap a process near a thousand tunnels. Returns the soft
/// limit in force afterwards (`None`: unlimited).
pub fn raise_nofile() -> Option<u64> {
    raise_nofile_to(None)
}

/// Raises the soft `RLIMIT_NOFILE` to `want`, and the hard limit with it where the process may
/// (CAP_SYS_RESOURCE); to the hard limit when `want` is `None` or cannot be had. Never lowers
/// it. Children started afterwards inherit it. Returns the soft limit in force afterwards
/// (`None`: unlimited).
pub fn raise_nofile_to(want: Option<u64>) -> Option<u64> {
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    let want = want.unwrap_or(hard);
    if soft >= want {
        return now.current;
    }
    if want > hard {
        let both = Rlimit {
            current: Some(want),
            maximum: Some(want),
        };
        if setrlimit(Resource::Nofile, both).is_ok() {
            return Some(want);
        }
    }
    let target = want.min(hard);
    let raised = Rlimit {
        current: Some(target),
        maximum: now.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => Some(target),
        Err(error) => {
            tracing::warn!(%error, "could not raise the open-files limit");
            now.current
        }
    }
}

/// Turns TCP keepalive on for `socket`, the first probe after `idle` of silence (and the
/// next ones a tenth of that apart, at least a second: a dead peer is found within about
/// twice `idle`).
pub fn tcp_keepalive(
    socket: &impl std::os::fd::AsFd,
    idle: std::time::Duration,
) -> std::io::Result<()> {
    use rustix::net::sockopt;
    let idle = idle.max(std::time::Duration::from_secs(1));
    sockopt::set_socket_keepalive(socket, true)?;
    sockopt::set_tcp_keepidle(socket, idle)?;
    sockopt::set_tcp_keepintvl(socket, (idle / 10).max(std::time::Duration::from_secs(1)))?;
    sockopt::set_tcp_keepcnt(socket, 9)?;
    Ok(())
}

/// Binds a TCP listener on `addr` whose accept queue holds up to `backlog` connections (the
/// kernel caps it at `net.core.somaxconn`): a listener that stops accepting while it is busy
/// leaves the rest of a burst waiting there, in order, instead of refusing it.
pub fn listen_with_backlog(
    addr: std::net::SocketAddr,
    backlog: u32,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
