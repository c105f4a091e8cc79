//! A slow agent's socket: it answers every step of its handshake late, as an agent on a busy
//! node or at the end of a long, lossy link does. Each flight written through [`Late`] — the
//! ClientHello, the answer to the server's flight (certificate, signature, Finished), the
//! upgrade request — leaves a delay drawn from a [`Lateness`] after it was due. Once the
//! session is up, [`Late::release`] makes the socket a plain pass-through: only the handshake
//! is slow. The bench's slow fleet (`--fleet-client-delay`) and the tests of the agent
//! endpoint's handshake bounds use it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How late each flight is: a delay drawn uniformly from `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lateness {
    pub min: Duration,
    pub max: Duration,
}

impl Lateness {
    /// Always `delay`.
    pub fn fixed(delay: Duration) -> Lateness {
        Lateness {
            min: delay,
            max: delay,
        }
    }

    fn draw(&self) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        rand::rng().random_range(self.min..=self.max)
    }
}

impl std::fmt::Display for Lateness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}..{:?}", self.min, self.max)
    }
}

impl FromStr for Lateness {
    type Err = String;

    /// `1s..4s`, or one duration for a fixed delay (`1500ms`).
    fn from_str(text: &str) -> Result<Lateness, String> {
        let parse = |part: &str| {
            bridgehead_runtime::duration::parse(part.trim())
                .map_err(|error| format!("{part:?}: {error}"))
        };
        let (min, max) = match text.split_once("..") {
            Some((min, max)) => (parse(min)?, parse(max)?),
            None => {
                let fixed = parse(text)?;
                (fixed, fixed)
            }
        };
        if max < min {
            return Err(format!("{text:?}: the upper bound is below the lower"));
        }
        Ok(Lateness { min, max })
    }
}

/// A socket whose writes come late: the first write of each flight waits a delay first. A
/// flight begins at the start, after the peer's bytes arrived, and where [`Late::arm`] says.
#[derive(Debug)]
pub struct Late<S> {
    io: S,
    lateness: Option<Lateness>,
    /// The next write begins a flight.
    armed: bool,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S> Late<S> {
    /// `io`, its flights delayed by `lateness` (none: a pass-through).
    pub fn new(io: S, lateness: Option<Lateness>) -> Late<S> {
        Late {
            io,
            lateness,
            armed: true,
            wait: None,
        }
    }

    /// The next write begins a flight (one the peer's bytes did not prompt: the upgrade
    /// request, after the agent's own TLS Finished).
    pub fn arm(&mut self) {
        self.armed = true;
    }

    /// The handshake is over: no more delays.
    pub fn release(&mut self) {
        self.lateness = None;
        self.wait = None;
    }

    /// Ready once this flight's delay has passed.
    fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(lateness) = self.lateness else {
            return Poll::Ready(());
        };
        if !self.armed {
            return Poll::Ready(());
        }
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(lateness.draw())));
        match wait.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.wait = None;
                self.armed = false;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Late<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            // The peer spoke: what is written next answers it.
            this.armed = true;
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Late<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_due(cx));
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_due(cx));
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    #[test]
    fn lateness_takes_a_range_or_one_duration() {
        let range: Lateness = "1s..4s".parse().unwrap();
        assert_eq!(range.min, Duration::from_secs(1));
        assert_eq!(range.max, Duration::from_secs(4));
        let fixed: Lateness = "1500ms".parse().unwrap();
        assert_eq!(
            (fixed.min, fixed.max),
            (Duration::from_millis(1500), fixed.min)
        );
        assert!("4s..1s".parse::<Lateness>().is_err());
        assert!("soon".parse::<Lateness>().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn each_flight_waits_and_writes_within_one_go_on() {
        const DELAY: Duration = Duration::from_secs(2);
        let (ours, mut peer) = tokio::io::duplex(1024);
        let lateness = Lateness {
            min: DELAY,
            max: DELAY,
        };
        let mut late = Late::new(ours, Some(lateness));
        let started = Instant::now();
        late.write_all(b"hello").await.unwrap();
        late.write_all(b" again").await.unwrap();
        assert_eq!(started.elapsed(), DELAY, "one flight, one delay");
        // The peer answers: the next write is a new flight.
        peer.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        late.read_exact(&mut byte).await.unwrap();
        late.write_all(b"answer").await.unwrap();
        assert_eq!(started.elapsed(), DELAY * 2);
        late.arm();
        late.release();
        late.write_all(b"fast").await.unwrap();
        assert_eq!(started.elapsed(), DELAY * 2, "released: no delay");
        let mut got = vec![0u8; 21];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello againanswerfast");
    }
}
