//! A tunnel's memory, with one owner: this module. Three things bound what tunnels hold:
//!
//! - the budget every session's buffered data counts against (`bridgehead_proto::budget`,
//!   which the session enforces: windows shrink under pressure, new streams are refused past
//!   it);
//! - the kernel buffers of every tunnel socket ([`SocketTuning`]): where they start, what a
//!   tunnel earns by reading ([`EarnedBuffer`]), and what all tunnels together may earn
//!   ([`EarnedTotal`]);
//! - the largest window one tunnel earns.
//!
//! [`TunnelMemory`] holds the three for a process; each binary builds it once from its flags
//! (`bridgehead_runtime::memory::MemoryArgs::tunnel_memory`) and hands it to what opens
//! tunnels: the server's connection tasks, the agent's sessions and dials.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bridgehead_proto::budget::Budget;

/// A process's tunnel memory: its budget, its sockets' buffers, and the largest window.
#[derive(Debug, Clone)]
pub struct TunnelMemory {
    /// Every session's buffered data counts against it (`--tunnel-memory-budget`).
    pub budget: Budget,
    /// The kernel buffers of every tunnel socket.
    pub sockets: SocketTuning,
    /// What tunnel sockets earn beyond their starting buffers, all tunnels together.
    pub earned: Arc<EarnedTotal>,
    /// The largest receive window a tunnel earns (`--tunnel-max-window`).
    pub max_window: u32,
}

impl TunnelMemory {
    /// No budget, the kernel's socket buffers, the protocol's largest window: for tests.
    pub fn unbounded() -> TunnelMemory {
        TunnelMemory {
            budget: Budget::unlimited(),
            sockets: SocketTuning::default(),
            earned: Arc::new(EarnedTotal::new(0)),
            max_window: bridgehead_proto::session::DEFAULT_MAX_WINDOW,
        }
    }
}

/// The buffer a tunnel socket starts with when it starts small, before its tunnel earns more
/// ([`EarnedBuffer::start`]): a dialed TCP socket's receive buffer while the server's memory
/// budget is under pressure, every Unix-socket client's send buffer. The kernel doubles it:
/// 16 KiB, of which a TCP socket whose reader stopped holds about 12 KiB. Smaller starts
/// stop growing on Linux (a TCP socket that starts at 4 KiB keeps 4 KiB windows whatever
/// buffer it is given later).
pub const START_BUFFER: u32 = 8 * 1024;
/// A receive buffer below this at the handshake gives a TCP socket window scale 0: its window
/// can never pass 64 KiB, whatever buffer it earns later.
const SCALED_BUFFER: u32 = 64 * 1024;
/// The largest segment a socket dialed with a receive buffer below [`SCALED_BUFFER`] asks
/// its peer for (`TCP_MAXSEG`, announced in the handshake): an eighth of the 64 KiB its
/// window is capped at. Loopback's segments are 64 KiB, so without it such a window holds one
/// segment and the sender waits for each to be read and acknowledged before it sends the
/// next (stop and wait); on other links the path's own segment (1,448 bytes on Ethernet) is
/// smaller and this changes nothing. On loopback with every target socket started small,
/// smaller segments win back part of what the small start costs a download
/// (docs/benchmark-history.md, "Smaller segments for a small window", has how much).
pub const SMALL_WINDOW_SEGMENT: u32 = 8 * 1024;
/// The most a Unix-socket client's send buffer earns: Linux's default for Unix sockets
/// (net.core.wmem_default, 208 KiB once doubled), which a bulk download needs to keep its
/// speed (half of it costs a third).
pub const UNIX_SEND_BUFFER: u32 = 104 * 1024;

/// How a tunnel's socket earns one of its kernel buffers: the one that holds the tunnel's
/// bytes when the far end stops taking them (a TCP socket's receive buffer, which fills when
/// this end stops reading it; a Unix socket's send buffer, which fills when its client stops
/// reading). It starts at `start` (set before the connection was made, so that a TCP window
/// announced in the handshake is that small too) and doubles whenever the tunnel has moved
/// eight times the buffer it has that way, up to `max`. A socket whose tunnel stalls before
/// moving much (a client that never reads a firehose) keeps the small buffer, and with it
/// what the kernel holds for it; one that keeps moving soon has the largest. Growing is always
/// safe; shrinking is not (a TCP sender that saw a large window stops sending into a small
/// one), so a buffer never shrinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarnedBuffer {
    /// The buffer every tunnel socket starts with.
    pub start: u32,
    /// The largest buffer a moving tunnel earns.
    pub max: u32,
}

/// A tunnel earns its next buffer after moving this many times the one it has.
pub const EARN_FACTOR: u64 = 8;

impl EarnedBuffer {
    /// The buffer of a tunnel that has moved `moved` bytes: `start` doubled as often as
    /// earned, at most `max`.
    pub fn size(&self, moved: u64) -> u32 {
        let mut size = self.start.max(1);
        while size < self.max && moved >= u64::from(size) * 2 * EARN_FACTOR {
            size = size.saturating_mul(2);
        }
        size.min(self.max.max(self.start))
    }
}

/// What the sockets of all of a process's tunnels together may earn beyond the buffers they
/// started with ([`EarnedBuffer`]). A buffer a tunnel earned is what it holds in the kernel
/// if its far end stops taking its bytes later, and buffers never shrink (see
/// [`EarnedBuffer`]), so the sum of what was earned is bounded here: once it is spent, a
/// socket keeps the buffer it has until another tunnel ends and gives its share back.
#[derive(Debug)]
pub struct EarnedTotal {
    limit: u64,
    earned: AtomicU64,
}

impl EarnedTotal {
    /// A total of `limit` bytes beyond the starting buffers.
    pub fn new(limit: u64) -> EarnedTotal {
        EarnedTotal {
            limit,
            earned: AtomicU64::new(0),
        }
    }

    /// Bytes earned beyond the starting buffers now, all tunnels together.
    pub fn earned(&self) -> u64 {
        self.earned.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the total, if that many are left.
    pub(crate) fn take(&self, bytes: u64) -> bool {
        self.earned
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |earned| {
                earned.checked_add(bytes).filter(|&sum| sum <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `bytes` that [`EarnedTotal::take`] took.
    pub(crate) fn give(&self, bytes: u64) {
        if bytes > 0 {
            self.earned.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// The kernel buffer options of a tunnel's socket; `None` leaves the kernel's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketTuning {
    /// A TCP socket's `SO_RCVBUF`: the most a tunnel's socket has.
    pub receive_buffer: Option<u32>,
    /// A Unix socket's `SO_SNDBUF` (CONNECT clients on the Unix-socket frontend): where every
    /// client starts and the most its tunnel earns.
    pub unix_send_buffer: Option<EarnedBuffer>,
    /// A TCP socket's `TCP_NOTSENT_LOWAT`.
    pub unsent_limit: Option<u32>,
    /// The largest `SO_RCVBUF` a TCP tunnel socket (a dialed target, an accepted client)
    /// earns by reading.
    pub receive_buffer_max: Option<u32>,
}

impl SocketTuning {
    /// The receive buffer of a target socket the agent dials: the receive buffer to start
    /// with and up to [`SocketTuning::receive_buffer_max`] earned by reading, or, when the
    /// server asked while under memory pressure (`pressed`), [`START_BUFFER`] to start with
    /// and up to the receive buffer earned (what such a socket earns beyond that is of no
    /// use: its window scale, fixed by the small start, caps its window at 64 KiB).
    ///
    /// Why not always start small: a TCP socket's window scale is fixed in its handshake by
    /// the buffer it then has, and one that starts below 64 KiB can never announce a window
    /// of more than 64 KiB. On loopback, where a segment is 64 KiB, that makes a bulk tunnel
    /// stop and wait for each segment, which costs CPU per byte (less once it asks for
    /// smaller segments, [`SMALL_WINDOW_SEGMENT`]; the figures are in docs/benchmark-history.md).
    /// Under pressure, what stalled tunnels hold in the kernel matters more than that.
    pub fn dial_receive(&self, pressed: bool) -> Option<EarnedBuffer> {
        let buffer = self.receive_buffer?;
        Some(if pressed {
            EarnedBuffer {
                start: START_BUFFER.min(buffer),
                max: buffer,
            }
        } else {
            EarnedBuffer {
                start: buffer,
                max: self.receive_buffer_max.unwrap_or(buffer).max(buffer),
            }
        })
    }

    /// Sets the options on a TCP socket about to connect, its receive buffer at
    /// `receive.start`. Set before `connect`, the receive buffer also bounds the window
    /// announced in the handshake, and only then: a buffer made smaller than a window already
    /// announced stalls the sender. A start too small for a window scale also asks for
    /// segments of at most [`SMALL_WINDOW_SEGMENT`].
    pub fn apply_dial(
        &self,
        socket: &impl AsFd,
        receive: Option<EarnedBuffer>,
    ) -> std::io::Result<()> {
        let sock = socket2::SockRef::from(socket);
        self.apply(&sock, receive)?;
        // Last: a kernel that refuses it has the buffer options all the same.
        if receive.is_some_and(|receive| receive.start < SCALED_BUFFER) {
            sock.set_tcp_mss(SMALL_WINDOW_SEGMENT)?;
        }
        Ok(())
    }

    /// The receive buffer of an accepted TCP socket (a CONNECT client): the receive buffer to
    /// start with ([`SocketTuning::apply_accepted`]) and up to
    /// [`SocketTuning::receive_buffer_max`] earned by reading. Set after the handshake, the
    /// start does not bound the window scale, which the listener's buffer fixed.
    pub fn accepted_receive(&self) -> Option<EarnedBuffer> {
        self.dial_receive(false)
    }

    /// Sets the options on an accepted TCP socket (a CONNECT client): the receive buffer to
    /// start with and the unsent limit.
    pub fn apply_accepted(&self, socket: &impl AsFd) -> std::io::Result<()> {
        self.apply(&socket2::SockRef::from(socket), self.accepted_receive())
    }

    fn apply(
        &self,
        sock: &socket2::SockRef<'_>,
        receive: Option<EarnedBuffer>,
    ) -> std::io::Result<()> {
        if let Some(receive) = receive {
            sock.set_recv_buffer_size(receive.start as usize)?;
        }
        if let Some(limit) = self.unsent_limit {
            sock.set_tcp_notsent_lowat(limit)?;
        }
        Ok(())
    }

    /// Sets the starting send buffer on an accepted Unix socket.
    pub fn apply_unix(&self, socket: &impl AsFd) -> std::io::Result<()> {
        if let Some(earned) = self.unix_send_buffer {
            socket2::SockRef::from(socket).set_send_buffer_size(earned.start as usize)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned(receive: u32, max: u32) -> SocketTuning {
        SocketTuning {
            receive_buffer: Some(receive),
            unix_send_buffer: Some(EarnedBuffer {
                start: START_BUFFER,
                max: UNIX_SEND_BUFFER,
            }),
            unsent_limit: Some(16 * 1024),
            receive_buffer_max: Some(max),
        }
    }

    /// A dialed socket starts at the receive buffer and earns up to the largest; under
    /// pressure it starts at 8 KiB and earns up to the receive buffer. An accepted client
    /// starts as an unpressed dial. Without a receive buffer the kernel's default stays.
    #[test]
    fn a_dials_buffer_starts_small_only_under_pressure() {
        let tuning = tuned(96 * 1024, 192 * 1024);
        let calm = EarnedBuffer {
            start: 96 * 1024,
            max: 192 * 1024,
        };
        assert_eq!(tuning.dial_receive(false), Some(calm));
        assert_eq!(tuning.accepted_receive(), Some(calm));
        let pressed = EarnedBuffer {
            start: 8 * 1024,
            max: 96 * 1024,
        };
        assert_eq!(tuning.dial_receive(true), Some(pressed));
        let default = SocketTuning {
            receive_buffer: None,
            ..tuning
        };
        assert_eq!(default.dial_receive(true), None);
        assert_eq!(default.accepted_receive(), None);
    }

    /// On real sockets (the kernel reports twice the buffer it was given): a dial started
    /// below 64 KiB asks for 8 KiB segments, one started above does not; an accepted socket
    /// gets its start; a Unix socket its send buffer.
    #[tokio::test]
    async fn the_options_reach_the_sockets() {
        let tuning = tuned(96 * 1024, 192 * 1024);
        let small = tokio::net::TcpSocket::new_v4().unwrap();
        tuning
            .apply_dial(&small, tuning.dial_receive(true))
            .unwrap();
        let sock = socket2::SockRef::from(&small);
        assert_eq!(sock.recv_buffer_size().unwrap(), 2 * 8 * 1024);
        assert_eq!(sock.tcp_mss().unwrap(), 8 * 1024);
        let large = tokio::net::TcpSocket::new_v4().unwrap();
        tuning
            .apply_dial(&large, tuning.dial_receive(false))
            .unwrap();
        let sock = socket2::SockRef::from(&large);
        assert_eq!(sock.recv_buffer_size().unwrap(), 2 * 96 * 1024);
        assert_ne!(sock.tcp_mss().unwrap(), 8 * 1024);
        // 64 KiB exactly already has a window scale.
        let edge = tuned(64 * 1024, 64 * 1024);
        let scaled = tokio::net::TcpSocket::new_v4().unwrap();
        edge.apply_dial(&scaled, edge.dial_receive(false)).unwrap();
        assert_ne!(socket2::SockRef::from(&scaled).tcp_mss().unwrap(), 8 * 1024);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let (accepted, _) = accepted.unwrap();
        tuning.apply_accepted(&accepted).unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert_eq!(sock.recv_buffer_size().unwrap(), 2 * 96 * 1024);
        drop(client);

        let (unix, _other) = tokio::net::UnixStream::pair().unwrap();
        tuning.apply_unix(&unix).unwrap();
        let sock = socket2::SockRef::from(&unix);
        assert_eq!(sock.send_buffer_size().unwrap(), 2 * 8 * 1024);
    }
}
