//! The TLS handshake's bound, counted from the server's first answer.
//!
//! A server under a reconnect storm holds new connections in its listen backlog while every
//! handshake place is busy (its admission): the kernel completes the TCP handshake, the
//! ClientHello waits in the socket, and the server's clock for the handshake starts only when
//! it accepts. A bound on the whole TLS handshake counted from connect would count that wait
//! too, and an agent that gave up there would throw away its place in the queue and go to the
//! back of it after its backoff. So the wait for the server's first byte has its own, longer
//! bound ([`AGENT_FIRST_ANSWER`]), and the rest of the handshake the usual one.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

pub use bridgehead_runtime::timeouts::AGENT_FIRST_ANSWER;

/// A socket that tells when the peer first sent a byte.
#[derive(Debug)]
pub struct Heard<S> {
    io: S,
    /// Notified at the first byte read, then dropped.
    first: Option<Arc<Notify>>,
}

impl<S> Heard<S> {
    /// `io`, and what its first byte from the peer notifies.
    pub fn new(io: S) -> (Heard<S>, Arc<Notify>) {
        let first = Arc::new(Notify::new());
        let heard = Heard {
            io,
            first: Some(first.clone()),
        };
        (heard, first)
    }
}

/// The output of `handshake` (a TLS handshake over a [`Heard`] socket whose first byte
/// notifies `answered`), or `None` when the server did not answer within `first` or the rest
/// took longer than `rest`, with the bound that ran out.
pub async fn within<T>(
    answered: &Notify,
    first: Duration,
    rest: Duration,
    handshake: impl std::future::Future<Output = T>,
) -> Result<T, Duration> {
    tokio::pin!(handshake);
    tokio::select! {
        done = &mut handshake => return Ok(done),
        () = answered.notified() => {}
        () = tokio::time::sleep(first) => return Err(first),
    }
    tokio::time::timeout(rest, handshake)
        .await
        .map_err(|_| rest)
}

impl<S: AsyncRead + Unpin> AsyncRead for Heard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            if let Some(first) = this.first.take() {
                first.notify_one();
            }
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Heard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const FIRST: Duration = AGENT_FIRST_ANSWER;
    const REST: Duration = Duration::from_secs(10);

    /// A handshake's shape: the server's first flight, then `steps` more bytes to read.
    async fn handshake(mut io: Heard<DuplexStream>, steps: usize) -> io::Result<()> {
        let mut byte = [0u8; 1];
        for _ in 0..=steps {
            io.read_exact(&mut byte).await?;
        }
        Ok(())
    }

    /// A server that answers `after`, then sends a byte every `step`, `steps` times.
    fn server(mut io: DuplexStream, after: Duration, step: Duration, steps: usize) {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            io.write_all(b"h").await.unwrap();
            for _ in 0..steps {
                tokio::time::sleep(step).await;
                io.write_all(b"x").await.unwrap();
            }
            std::future::pending::<()>().await;
        });
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_in_the_servers_backlog_does_not_count_against_the_handshake() {
        let (ours, theirs) = tokio::io::duplex(64);
        let (io, answered) = Heard::new(ours);
        // Queued for 15 s, past the handshake's own 10 s, then an ordinary handshake.
        server(theirs, Duration::from_secs(15), Duration::from_secs(3), 2);
        let done = within(&answered, FIRST, REST, handshake(io, 2)).await;
        assert!(matches!(done, Ok(Ok(()))), "{done:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_is_given_up_on() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let (io, answered) = Heard::new(ours);
        let started = tokio::time::Instant::now();
        let done = within(&answered, FIRST, REST, handshake(io, 2)).await;
        assert_eq!(done.unwrap_err(), FIRST);
        assert_eq!(started.elapsed(), FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn once_the_server_answered_the_rest_has_the_handshakes_bound() {
        let (ours, theirs) = tokio::io::duplex(64);
        let (io, answered) = Heard::new(ours);
        server(theirs, Duration::from_secs(1), Duration::from_secs(6), 2);
        let started = tokio::time::Instant::now();
        let done = within(&answered, FIRST, REST, handshake(io, 2)).await;
        assert_eq!(done.unwrap_err(), REST);
        assert_eq!(started.elapsed(), Duration::from_secs(1) + REST);
    }
}
