//! kube-apiserver's quirk, kept in the frontend: it fails when any byte follows the `200` in
//! the same read, so a target that speaks first (an SSH or SMTP banner, a server greeting)
//! must not have its first bytes glued to the answer. [`Held`] wraps the client socket for the
//! splice: writes wait until the client has sent something (or closed), or until the hold time
//! has passed, whichever comes first. A client that waits for a speak-first target gets its
//! greeting after the hold.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use bridgehead_mux::splice::TunnelSocket;

/// A client socket whose writes wait for the client's first byte or the hold time.
#[derive(Debug)]
pub(super) struct Held<'a, S> {
    socket: &'a mut S,
    hold: Hold,
}

/// Where the hold stands. The timer exists only while it runs.
#[derive(Debug)]
enum Hold {
    /// Nothing held (any more).
    Off,
    /// Not started: nothing was written yet.
    Armed(Duration),
    /// Waiting for the client to speak, or for the timer.
    Waiting(Pin<Box<Sleep>>),
}

impl<'a, S> Held<'a, S> {
    /// Holds writes to `socket` for at most `hold`; `None` (or zero) holds nothing.
    pub(super) fn new(socket: &'a mut S, hold: Option<Duration>) -> Held<'a, S> {
        let hold = match hold {
            Some(hold) if !hold.is_zero() => Hold::Armed(hold),
            _ => Hold::Off,
        };
        Held { socket, hold }
    }

    /// Ready once nothing is held.
    fn poll_hold(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.hold {
                Hold::Off => return Poll::Ready(()),
                Hold::Armed(hold) => {
                    self.hold = Hold::Waiting(Box::pin(tokio::time::sleep(*hold)));
                }
                Hold::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.hold = Hold::Off;
                }
            }
        }
    }
}

impl<S: TunnelSocket> TunnelSocket for Held<'_, S> {
    fn abort_on_close(&self) {
        self.socket.abort_on_close();
    }

    fn set_receive_buffer(&self, bytes: u32) -> io::Result<()> {
        self.socket.set_receive_buffer(bytes)
    }

    fn set_send_buffer(&self, bytes: u32) -> io::Result<()> {
        self.socket.set_send_buffer(bytes)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.socket.poll_read_ready(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut *this.socket).poll_read(cx, buf));
        // The client spoke, closed or failed: nothing it could misread follows any more.
        this.hold = Hold::Off;
        Poll::Ready(result)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_hold(cx));
        Pin::new(&mut *this.socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_hold(cx));
        Pin::new(&mut *this.socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A target that closes at once still closes after the hold, not glued to the 200.
        let this = self.get_mut();
        ready!(this.poll_hold(cx));
        Pin::new(&mut *this.socket).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    use bridgehead_test_support::bounded;

    /// Polls one write of `held`; whether it went through.
    async fn try_write(held: &mut Held<'_, tokio::io::DuplexStream>) -> bool {
        poll_fn(|cx| Poll::Ready(Pin::new(&mut *held).poll_write(cx, b"banner").is_ready())).await
    }

    #[tokio::test(start_paused = true)]
    async fn writes_wait_for_the_clients_first_byte() {
        bounded(async {
            let (mut socket, mut client) = tokio::io::duplex(1024);
            let mut held = Held::new(&mut socket, Some(Duration::from_secs(60)));
            assert!(
                !try_write(&mut held).await,
                "written before the client spoke"
            );
            assert!(matches!(held.hold, Hold::Waiting(_)), "{:?}", held.hold);
            client.write_all(b"hello").await.unwrap();
            let mut buf = [0u8; 5];
            held.read_exact(&mut buf).await.unwrap();
            // The timer goes as soon as the client speaks.
            assert!(matches!(held.hold, Hold::Off), "{:?}", held.hold);
            assert!(try_write(&mut held).await);
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn writes_go_after_the_hold_time() {
        bounded(async {
            let (mut socket, mut client) = tokio::io::duplex(1024);
            let started = tokio::time::Instant::now();
            let mut held = Held::new(&mut socket, Some(Duration::from_millis(250)));
            held.write_all(b"banner").await.unwrap();
            assert_eq!(started.elapsed(), Duration::from_millis(250));
            held.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"banner");
        })
        .await
    }

    /// Vectored writes wait for the hold like any others, then reach the socket whole.
    #[tokio::test(start_paused = true)]
    async fn vectored_writes_are_held_then_written() {
        bounded(async {
            let (mut socket, mut client) = tokio::io::duplex(1024);
            let mut held = Held::new(&mut socket, Some(Duration::from_secs(60)));
            let slices = [IoSlice::new(b"ban"), IoSlice::new(b"ner")];
            let polled =
                poll_fn(|cx| Poll::Ready(Pin::new(&mut held).poll_write_vectored(cx, &slices)))
                    .await;
            assert!(polled.is_pending(), "written before the client spoke");
            client.write_all(b"hi").await.unwrap();
            let mut buf = [0u8; 2];
            held.read_exact(&mut buf).await.unwrap();
            // The pipe has room for both slices: one call takes them.
            assert_eq!(held.write_vectored(&slices).await.unwrap(), 6);
            held.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"banner");
        })
        .await
    }

    /// A socket that writes one buffer per call, as sockets without vectored writes do.
    struct OneBuffer;

    impl AsyncWrite for OneBuffer {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// The held socket says whether it writes vectored as its socket does, so the splice
    /// batches chunks only where the socket takes them in one call.
    #[test]
    fn a_held_socket_writes_vectored_as_its_socket_does() {
        let (mut duplex, _client) = tokio::io::duplex(1024);
        assert!(Held::new(&mut duplex, None).is_write_vectored());
        let mut one_buffer = OneBuffer;
        assert!(!Held::new(&mut one_buffer, None).is_write_vectored());
    }

    /// A flush reaches the socket: a buffered socket (as the TLS stream keeps records) writes
    /// out what it holds.
    #[tokio::test]
    async fn a_flush_reaches_the_socket() {
        bounded(async {
            let (socket, mut client) = tokio::io::duplex(1024);
            let mut buffered = tokio::io::BufWriter::new(socket);
            let mut held = Held::new(&mut buffered, None);
            held.write_all(b"banner").await.unwrap();
            held.flush().await.unwrap();
            assert!(buffered.buffer().is_empty());
            let mut got = [0u8; 6];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"banner");
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn no_hold_writes_at_once() {
        bounded(async {
            let (mut socket, _client) = tokio::io::duplex(1024);
            for hold in [None, Some(Duration::ZERO)] {
                let mut held = Held::new(&mut socket, hold);
                assert!(try_write(&mut held).await, "{hold:?}");
            }
        })
        .await
    }
}
