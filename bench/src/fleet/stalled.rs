//! Stalled handshakes on the agent endpoint (a slowloris) during the restarts, with
//! `--fleet-stalled N`: N connections that each send the first bytes of a TLS record and then
//! nothing, held open; one the server closes is opened again a second later, so the server
//! keeps facing about N for as long as the storm lasts. Nothing they do is honest work, so
//! none of it counts as an agent's attempt.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A TLS handshake record's header, promising 512 bytes of ClientHello that never come.
const PARTIAL_HELLO: [u8; 5] = [0x16, 0x03, 0x01, 0x02, 0x00];
/// How long a stalled connection waits for the next one after the server closed it: an
/// attacker that holds its places rather than floods (with a server that cuts the oldest to
/// make room, each new one cuts another, and a shorter pause turns the slowloris into a
/// connection flood).
const AFTER_CUT: Duration = Duration::from_secs(1);
/// How long it waits when nothing listens (the restart's gap).
const RETRY: Duration = Duration::from_millis(100);

/// The stalled connections, until [`Stalled::stop`].
#[derive(Debug)]
pub struct Stalled {
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Connections opened, and of those the server closed.
    opened: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
}

impl Stalled {
    /// Holds `n` stalled handshakes on `addr`.
    pub fn start(runtime: &tokio::runtime::Handle, addr: SocketAddr, n: usize) -> Stalled {
        let stalled = Stalled {
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            opened: Arc::default(),
            closed: Arc::default(),
        };
        for _ in 0..n {
            let (stop, opened, closed) = (
                stalled.stop.clone(),
                stalled.opened.clone(),
                stalled.closed.clone(),
            );
            let hold = async move {
                tokio::select! {
                    () = hold(addr, &opened, &closed) => {}
                    () = stop.cancelled() => {}
                }
            };
            drop(runtime.spawn(stalled.tasks.track_future(hold)));
        }
        stalled.tasks.close();
        stalled
    }

    /// (opened, closed by the server) so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.opened.load(Ordering::Relaxed),
            self.closed.load(Ordering::Relaxed),
        )
    }

    /// Closes every stalled connection.
    pub async fn stop(self) -> (u64, u64) {
        self.stop.cancel();
        self.tasks.wait().await;
        self.counts()
    }
}

/// One stalled handshake after another, until cancelled.
async fn hold(addr: SocketAddr, opened: &AtomicU64, closed: &AtomicU64) {
    loop {
        let Ok(mut tcp) = TcpStream::connect(addr).await else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        if tcp.write_all(&PARTIAL_HELLO).await.is_ok() {
            // Whatever the server sends (an alert) until it closes.
            let mut sink = [0u8; 512];
            while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        closed.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(AFTER_CUT).await;
    }
}
