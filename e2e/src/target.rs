//! Targets the tunnels reach: they run on threads of the test process, on loopback; [`bulk`]
//! is the async load target for many connections at once.

pub mod bulk;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Binds `addr` (port 0) and echoes every connection until EOF, then closes its write side.
pub fn echo(addr: &str) -> std::io::Result<SocketAddr> {
    serve(addr, |mut stream| {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
    })
}

/// Answers every connection with `name` and a newline and ends its direction, then reads
/// whatever the client sends until it closes (so closing never resets the connection): proves
/// which host (and so which agent) carried a tunnel.
pub fn who_am_i(addr: &str, name: &str) -> std::io::Result<SocketAddr> {
    let name = name.to_owned();
    serve(addr, move |mut stream| {
        let _ = stream.write_all(format!("{name}\n").as_bytes());
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut sink = [0u8; 4096];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    })
}

/// Reads everything until EOF, then answers `got <n>` and closes: checks half-close.
pub fn counter(addr: &str) -> std::io::Result<SocketAddr> {
    serve(addr, |mut stream| {
        let mut n = 0usize;
        let mut buf = [0u8; 64 * 1024];
        while let Ok(k) = stream.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        let _ = stream.write_all(format!("got {n}").as_bytes());
    })
}

/// The byte [`source`] sends at `offset` of its stream.
pub fn pattern_byte(offset: usize) -> u8 {
    ((offset % PATTERN_BLOCK) % 251) as u8
}

/// The first offset at which `data`, found at `offset` of a [`source`] stream, differs from
/// the pattern.
pub fn pattern_mismatch(offset: usize, data: &[u8]) -> Option<usize> {
    data.iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern_byte(offset + i))
        .map(|(i, _)| offset + i)
}

const PATTERN_BLOCK: usize = 64 * 1024;

/// Writes `total` bytes of the [`source`] pattern and ends its direction, then reads what the
/// client sends until the client ends its own; what it read arrives on the receiver. Checks
/// that the client can still write after the target's EOF reached it.
pub fn source_then_sink(
    addr: &str,
    total: usize,
) -> std::io::Result<(SocketAddr, mpsc::Receiver<Vec<u8>>)> {
    let (tx, rx) = mpsc::sync_channel(16);
    let local = serve(addr, move |mut stream| {
        if write_pattern(&mut stream, total).is_err() {
            return;
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut got = Vec::new();
        let _ = stream.read_to_end(&mut got);
        let _ = tx.send(got);
    })?;
    Ok((local, rx))
}

/// A loopback port that refuses connections: a socket bound to it that never listens, held
/// for as long as this lives, so no other test can take the port meanwhile. Keep it in a
/// binding: `closed_port()?.to_string()` drops it at the end of the statement, and a parallel
/// test's listener may then take the port (a CI run once got 200 instead of 502 that way).
#[derive(Debug)]
#[must_use = "the port refuses connections only while this lives"]
pub struct ClosedPort {
    pub addr: SocketAddr,
    _socket: tokio::net::TcpSocket,
}

impl std::fmt::Display for ClosedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

/// Binds a [`ClosedPort`] on 127.0.0.1.
pub fn closed_port() -> std::io::Result<ClosedPort> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    Ok(ClosedPort {
        addr: socket.local_addr()?,
        _socket: socket,
    })
}

/// A loopback listener whose connects never complete: its accept queue (backlog 0) is full
/// and never drained, so Linux drops every further SYN and `connect` hangs until its own
/// timeout. Dropping it closes everything.
#[derive(Debug)]
pub struct BlackHole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

/// Makes a [`BlackHole`] and checks that a connect to it does hang (for `probe`).
pub fn black_hole(probe: Duration) -> std::io::Result<BlackHole> {
    // listen(2) with an explicit backlog is only reachable safely through tokio's TcpSocket;
    // the listener leaves the runtime at once.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let listener = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind("127.0.0.1:0".parse().expect("literal address"))?;
        socket.listen(0)?.into_std()
    })?;
    listener.set_nonblocking(false)?;
    let addr = listener.local_addr()?;
    let mut queued = Vec::new();
    // Fill the queue; the first connect that times out proves it is full.
    for _ in 0..8 {
        match TcpStream::connect_timeout(&addr, probe) {
            Ok(stream) => queued.push(stream),
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {
                return Ok(BlackHole {
                    addr,
                    _listener: listener,
                    _queued: queued,
                })
            }
            Err(error) => return Err(error),
        }
    }
    Err(std::io::Error::other(
        "connects to a full accept queue still complete",
    ))
}

/// Writes the first `total` bytes of the pattern ([`pattern_byte`]).
fn write_pattern(stream: &mut impl Write, total: usize) -> std::io::Result<()> {
    let block: Vec<u8> = (0..PATTERN_BLOCK).map(pattern_byte).collect();
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len());
        stream.write_all(&block[..n])?;
        left -= n;
    }
    Ok(())
}

/// Writes `total` bytes of a repeating pattern, then closes.
pub fn source(addr: &str, total: usize) -> std::io::Result<SocketAddr> {
    serve(addr, move |mut stream| {
        // A client that leaves early ends the write; nothing to do then.
        let _ = write_pattern(&mut stream, total);
    })
}

fn serve(
    addr: &str,
    handle: impl Fn(TcpStream) + Send + Sync + Clone + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handle = handle.clone();
            thread::spawn(move || handle(stream));
        }
    });
    Ok(local)
}

/// Reads exactly `total` bytes of the source pattern (`early` being its start), checking every
/// byte, then EOF.
pub fn read_pattern_to_eof(conn: &mut impl std::io::Read, early: &[u8], total: usize) {
    assert_eq!(pattern_mismatch(0, early), None);
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = early.len();
    loop {
        let n = conn
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read failed after {offset} of {total} bytes: {e}"));
        if n == 0 {
            break;
        }
        if let Some(at) = pattern_mismatch(offset, &buf[..n]) {
            panic!("byte {at} differs from the pattern");
        }
        offset += n;
        assert!(offset <= total, "more than {total} bytes");
    }
    assert_eq!(offset, total, "EOF after {offset} of {total} bytes");
}
