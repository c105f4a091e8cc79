//! Targets the tunnels reach: they run on threads of the test process, on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;

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

/// Writes `total` bytes of a repeating pattern, then closes.
pub fn source(addr: &str, total: usize) -> std::io::Result<SocketAddr> {
    serve(addr, move |mut stream| {
        let block: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        let mut left = total;
        while left > 0 {
            let n = left.min(block.len());
            if stream.write_all(&block[..n]).is_err() {
                return;
            }
            left -= n;
        }
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
