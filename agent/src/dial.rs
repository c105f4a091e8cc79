//! Dialing a target the server asked for, within the dial's deadline, and mapping the failure
//! to the [`ErrorCode`] the server turns into an HTTP status.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bridgehead_mux::memory::{EarnedBuffer, SocketTuning};
use bridgehead_proto::ErrorCode;

use bridgehead_runtime::destinations::{Denied, Policy};
use tokio::net::TcpStream;

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The name did not resolve.
    #[error("resolving {host}: {source}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's error.
        source: io::Error,
    },
    /// The name resolved to no address.
    #[error("{0} resolved to no address")]
    NoAddress(String),
    /// Every address failed; this is the last one's error.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The last address tried.
        addr: SocketAddr,
        /// Its error.
        source: io::Error,
    },
    /// The deadline passed first.
    #[error("no connection within {0:?}")]
    TimedOut(Duration),
    /// The destination policy refused every address the target resolved to.
    #[error("{0}")]
    Denied(Denied),
}

impl DialError {
    /// The code the server sees in DIAL_ERR.
    pub fn code(&self) -> ErrorCode {
        match self {
            DialError::Resolve { .. } | DialError::NoAddress(_) => ErrorCode::NameNotResolved,
            DialError::Connect { source, .. } => code_of(source),
            DialError::TimedOut(_) => ErrorCode::TimedOut,
            DialError::Denied(_) => ErrorCode::NotPermitted,
        }
    }
}

/// The [`ErrorCode`] for a failed `connect(2)`.
pub fn code_of(error: &io::Error) -> ErrorCode {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => ErrorCode::Refused,
        io::ErrorKind::HostUnreachable
        | io::ErrorKind::NetworkUnreachable
        | io::ErrorKind::NetworkDown => ErrorCode::Unreachable,
        io::ErrorKind::TimedOut => ErrorCode::TimedOut,
        io::ErrorKind::PermissionDenied => ErrorCode::NotPermitted,
        _ => ErrorCode::Other,
    }
}

/// Resolves `host` (an IP literal, IPv6 without brackets, or a name) and connects to each
/// address `policy` permits in turn until one answers, all within `deadline`, the socket's
/// kernel buffers as `tuning` says, its receive buffer starting at `receive`'s start.
pub async fn dial(
    host: &str,
    port: u16,
    deadline: Duration,
    policy: &Policy,
    tuning: &SocketTuning,
    receive: Option<EarnedBuffer>,
) -> Result<TcpStream, DialError> {
    let tuning = *tuning;
    let socket = dial_with(host, port, deadline, policy, |addr| {
        connect(addr, tuning, receive)
    })
    .await?;
    // Interactive protocols (kubectl exec) must not wait for Nagle.
    let _ = socket.set_nodelay(true);
    Ok(socket)
}

/// Connects to `addr`, the socket's kernel buffer options set first (so the window announced
/// in the handshake is bounded too). A kernel that refuses them costs the bound, not the dial.
async fn connect(
    addr: SocketAddr,
    tuning: SocketTuning,
    receive: Option<EarnedBuffer>,
) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Err(error) = tuning.apply_dial(&socket, receive) {
        tracing::debug!(%error, "setting the target socket's buffer options");
    }
    socket.connect(addr).await
}

/// [`dial`] with the connect step supplied: tests pass one that never finishes.
pub async fn dial_with<C, F, S>(
    host: &str,
    port: u16,
    deadline: Duration,
    policy: &Policy,
    mut connect: C,
) -> Result<S, DialError>
where
    C: FnMut(SocketAddr) -> F,
    F: Future<Output = io::Result<S>>,
{
    let attempt = async {
        let addrs = tokio::net::lookup_host((host, port))
            .await
            .map_err(|source| DialError::Resolve {
                host: host.to_owned(),
                source,
            })?;
        let mut last = None;
        for addr in addrs {
            if let Err(denied) = policy.check(addr) {
                // A refused connect says more than a policy refusal: keep it if there is one.
                if !matches!(last, Some(DialError::Connect { .. })) {
                    last = Some(DialError::Denied(denied));
                }
                continue;
            }
            match connect(addr).await {
                Ok(socket) => return Ok(socket),
                Err(source) => last = Some(DialError::Connect { addr, source }),
            }
        }
        Err(last.unwrap_or_else(|| DialError::NoAddress(host.to_owned())))
    };
    tokio::time::timeout(deadline, attempt)
        .await
        .unwrap_or(Err(DialError::TimedOut(deadline)))
}
