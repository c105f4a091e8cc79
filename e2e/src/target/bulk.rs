//! The load target: an async server for many connections at once (the benchmark's, on
//! loopback in the bench process), and the client side of its little protocol. The client's first byte picks what a connection does:
//!
//! - `U` (upload): the target reads until the end marker (a zero byte; the data are never
//!   zero), then answers the byte count before it (u64 BE) and closes. A marker rather than the
//!   client's half-close: proxies that end a tunnel at the client's FIN (konnectivity's and
//!   wstunnel's HTTP CONNECT frontends) get measured too. The client sends nothing after the
//!   marker until the count came, so the marker is always the last byte of a read.
//! - `D` + bytes (u64 BE) + milliseconds (u64 BE) (download): the target writes until either
//!   bound is reached, then ends its direction and reads until the client closes.
//! - `E` (echo): the target echoes until EOF.
//!
//! A connection closed before its first byte (the setup measurement) is simply dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::tunnel::AsyncConn as Conn;

const UPLOAD: u8 = b'U';
const DOWNLOAD: u8 = b'D';
const ECHO: u8 = b'E';
/// The end of an upload's data.
const END_OF_UPLOAD: u8 = 0;

/// Bulk data is written in blocks of this size, on both ends.
pub const BLOCK: usize = 64 * 1024;
static PATTERN: [u8; BLOCK] = [0x5a; BLOCK];

/// Accept queue of the target's listener (Linux caps it at `net.core.somaxconn`).
const ACCEPT_BACKLOG: u32 = 4096;

/// Buffer of an echo connection: small, since 10,000 idle ones stay open at once.
const ECHO_BUFFER: usize = 4096;

/// The running target. Dropping it stops accepting; open connections run to their end.
#[derive(Debug)]
pub struct Target {
    /// Where it listens.
    pub addr: SocketAddr,
    written: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Target {
    /// Binds `127.0.0.1:0` and serves on the current runtime.
    pub async fn start() -> anyhow::Result<Target> {
        Target::start_with_send_buffer(None).await
    }

    /// [`Target::start`], every connection's kernel send buffer set to `send_buffer` bytes
    /// when given: a firehose whose unsent bytes mostly stay in the target, as a remote
    /// target's would stay on its own machine, not this one.
    pub async fn start_with_send_buffer(send_buffer: Option<u32>) -> anyhow::Result<Target> {
        // A deep accept queue: at tens of thousands of connects a second, a short scheduling
        // delay of the accept loop must not overflow it (a dropped SYN costs the client a
        // 1 s retransmit, which would show up as a setup outlier that is the bench's own).
        let socket = TcpSocket::new_v4()?;
        if let Some(size) = send_buffer {
            // Accepted connections inherit it.
            socket.set_send_buffer_size(size)?;
        }
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let listener = socket.listen(ACCEPT_BACKLOG)?;
        let addr = listener.local_addr()?;
        let written = Arc::new(AtomicU64::new(0));
        let counter = written.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    // Out of descriptors: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                tokio::spawn(serve(socket, counter.clone()));
            }
        });
        Ok(Target {
            addr,
            written,
            accept,
        })
    }

    /// Runs a target until killed, announcing `bench target listening on ADDR` on stdout: for
    /// a target in a process of its own, whose descriptors then do not count against the
    /// client's limit (the benchmark's memory measurement holds 10,000 idle tunnels).
    pub fn serve_standalone(send_buffer: Option<u32>) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let target = Target::start_with_send_buffer(send_buffer).await?;
            println!("bench target listening on {}", target.addr);
            std::io::Write::flush(&mut std::io::stdout())?;
            std::future::pending::<()>().await;
            anyhow::Ok(())
        })
    }

    /// Bytes written by download connections so far.
    pub fn download_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut socket: TcpStream, written: Arc<AtomicU64>) {
    let _ = socket.set_nodelay(true);
    let _ = serve_io(&mut socket, &written).await;
}

async fn serve_io(socket: &mut TcpStream, written: &AtomicU64) -> std::io::Result<()> {
    let mut command = [0u8; 1];
    if socket.read(&mut command).await? == 0 {
        return Ok(());
    }
    match command[0] {
        UPLOAD => {
            let mut buf = vec![0u8; BLOCK];
            let mut total = 0u64;
            loop {
                let n = socket.read(&mut buf).await?;
                if n == 0 {
                    // The client left without its marker: no count to give.
                    return Ok(());
                }
                if buf[n - 1] == END_OF_UPLOAD {
                    total += n as u64 - 1;
                    break;
                }
                total += n as u64;
            }
            socket.write_all(&total.to_be_bytes()).await?;
            socket.shutdown().await
        }
        DOWNLOAD => {
            let mut request = [0u8; 16];
            socket.read_exact(&mut request).await?;
            let (bytes, millis) = request.split_at(8);
            let mut left = u64::from_be_bytes(bytes.try_into().unwrap_or_default());
            let limit =
                Duration::from_millis(u64::from_be_bytes(millis.try_into().unwrap_or_default()));
            let deadline = Instant::now() + limit;
            while left > 0 && Instant::now() < deadline {
                let n = left.min(BLOCK as u64) as usize;
                socket.write_all(&PATTERN[..n]).await?;
                written.fetch_add(n as u64, Ordering::Relaxed);
                left -= n as u64;
            }
            socket.shutdown().await?;
            let mut sink = [0u8; 512];
            while socket.read(&mut sink).await? > 0 {}
            Ok(())
        }
        ECHO => {
            let mut buf = [0u8; ECHO_BUFFER];
            loop {
                let n = socket.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                socket.write_all(&buf[..n]).await?;
            }
            socket.shutdown().await
        }
        _ => Ok(()),
    }
}

/// Sends up to `bytes` (stopping at `deadline`), then the end marker, and waits for the
/// target's count; returns the bytes sent.
pub async fn upload(conn: &mut Conn, bytes: u64, deadline: Instant) -> anyhow::Result<u64> {
    conn.write_all(&[UPLOAD]).await?;
    let mut sent = 0u64;
    while sent < bytes && Instant::now() < deadline {
        let n = (bytes - sent).min(BLOCK as u64) as usize;
        conn.write_all(&PATTERN[..n]).await.context("uploading")?;
        sent += n as u64;
    }
    conn.write_all(&[END_OF_UPLOAD])
        .await
        .context("ending the upload")?;
    conn.flush().await.context("ending the upload")?;
    let mut count = [0u8; 8];
    conn.read_exact(&mut count)
        .await
        .context("reading the target's count")?;
    let counted = u64::from_be_bytes(count);
    if counted != sent {
        bail!("sent {sent} bytes, the target counted {counted}");
    }
    Ok(sent)
}

/// Asks for `bytes` (the target stops after `limit`) and reads to EOF; returns the bytes
/// received.
pub async fn download(conn: &mut Conn, bytes: u64, limit: Duration) -> anyhow::Result<u64> {
    request_download(conn, bytes, limit).await?;
    let mut buf = vec![0u8; BLOCK];
    let mut got = 0u64;
    loop {
        let n = conn.read(&mut buf).await.context("downloading")?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let _ = conn.shutdown().await;
    Ok(got)
}

/// Sends the download request only: a tunnel that is then never read stalls.
pub async fn request_download(conn: &mut Conn, bytes: u64, limit: Duration) -> anyhow::Result<()> {
    let mut request = [0u8; 17];
    request[0] = DOWNLOAD;
    request[1..9].copy_from_slice(&bytes.to_be_bytes());
    let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    request[9..].copy_from_slice(&millis.to_be_bytes());
    conn.write_all(&request).await?;
    conn.flush().await?;
    Ok(())
}

/// Switches the connection to echo mode.
pub async fn start_echo(conn: &mut Conn) -> anyhow::Result<()> {
    conn.write_all(&[ECHO]).await?;
    Ok(())
}

/// One request/response of `message.len()` bytes on an echo connection; `reply` must be as
/// long.
pub async fn echo(conn: &mut Conn, message: &[u8], reply: &mut [u8]) -> anyhow::Result<()> {
    conn.write_all(message).await?;
    conn.flush().await?;
    conn.read_exact(reply).await.context("reading the echo")?;
    Ok(())
}
