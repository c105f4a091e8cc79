//! The driver's loop: [`Driver::drive`] and its reader, writer and timer.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bridgehead_proto::Frame;
use bytes::Bytes;
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::debug;

use super::{register, Driver, Keepalive};
use crate::branches::Branches;
use crate::end::{SessionEnd, Violation};
use crate::outbox::Outbox;
use crate::websocket::{Incoming, Reader, WebSocket, Writer, READ_BUFFER};

/// How long a closing session may take to flush frames queued before the close, and to send
/// its close frame: a second is many round trips, and a peer that takes longer is not reading
/// (listed in `bridgehead_runtime::timeouts::DEADLINES`; it lives here, below the runtime).
pub const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// Longest reason sent in a WebSocket close frame.
const MAX_CLOSE_REASON: usize = 100;
/// DATA payloads smaller than this are copied out of the message they came in: the reader
/// reads small messages several to a buffer, and a small chunk held for long (its client
/// stopped reading) would keep the buffer and its neighbours' bytes. Larger messages get a
/// buffer of their own, holding one stream's DATA (`crate::outbox::encode_batch`), and their
/// payloads are handed on as they are.
const COPY_BELOW: usize = READ_BUFFER;

impl Driver {
    /// Runs the session over `ws` until it ends (the peer gone, a protocol error, keepalive,
    /// [`Driver::close`] or `shutdown`), with `on_peer_drain` run once the peer announces
    /// DRAIN and `beside` run alongside; returns why it ended. Every stream fails when it
    /// returns.
    ///
    /// Five futures on one task, each polled only when its own waker fired (`Branches`): most
    /// wake-ups are for one of them (the transport became readable, a stream queued frames).
    pub(crate) async fn drive<S>(
        &self,
        ws: WebSocket<S>,
        keepalive: Keepalive,
        shutdown: &CancellationToken,
        on_peer_drain: impl Future<Output = ()>,
        beside: impl Future<Output = ()>,
    ) -> SessionEnd
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (read, write) = tokio::io::split(ws.io);
        let mut source = Reader::new(read, ws.role, &ws.early);
        *self.outbox() = Some(Outbox::new(Writer::new(Box::new(write), ws.role)));
        let now = self.now_ms();
        self.lock().session.start_keepalive(keepalive, now);

        let end = {
            let mut reader = pin!(self.read(&mut source));
            let mut writer = pin!(self.write(shutdown));
            let mut timer = pin!(self.timer(Duration::from_millis(keepalive.timeout_ms)));
            let mut drain = pin!(async {
                self.peer_drained().await;
                if self.peer_draining() {
                    on_peer_drain.await;
                }
            }
            .fuse());
            let mut beside = pin!(beside.fuse());
            let branches = Branches::<5>::new();
            poll_fn(|cx| {
                branches.poll(cx, |branch, cx| match branch {
                    0 => reader.as_mut().poll(cx),
                    1 => writer.as_mut().poll(cx),
                    2 => timer.as_mut().poll(cx),
                    // Work beside the session never ends it; done, it stays pending (fused).
                    3 => {
                        let _ = drain.as_mut().poll(cx);
                        Poll::Pending
                    }
                    _ => {
                        let _ = beside.as_mut().poll(cx);
                        Poll::Pending
                    }
                })
            })
            .await
        };
        self.finish(end).await
    }

    /// After the end: fail everything, send the close frame the end calls for, let the
    /// transport go.
    async fn finish(&self, end: SessionEnd) -> SessionEnd {
        debug!(reason = %end, "session ending");
        self.close(end.clone());
        if let Some(code) = end.close_code() {
            let reason: String = end.to_string().chars().take(MAX_CLOSE_REASON).collect();
            if let Some(outbox) = self.outbox().as_mut() {
                outbox.close(code, &reason);
            }
            let _ = tokio::time::timeout(CLOSE_FLUSH, self.flush()).await;
        }
        // The writing half goes with the session, whoever still holds the session's state.
        drop(self.outbox().take());
        end
    }

    /// The reader: every message from the peer, until one ends the session.
    async fn read<R: AsyncRead + Unpin>(&self, source: &mut Reader<R>) -> SessionEnd {
        loop {
            let message = source.next().await;
            let now = self.now_ms();
            match message {
                Err(error) => return SessionEnd::WebSocket(Arc::new(error)),
                Ok(Incoming::Binary(bytes)) => {
                    let handled = self.with(|state| {
                        state.session.heard(now);
                        for frame in Frame::decode_all(bytes) {
                            state.session.handle_frame(own_small_payload(frame?))?;
                        }
                        Ok::<(), Violation>(())
                    });
                    if let Err(violation) = handled {
                        return violation.into();
                    }
                }
                Ok(Incoming::Close) => return SessionEnd::ClosedByPeer,
                Ok(Incoming::Text) => return Violation::TextMessage.into(),
                Ok(Incoming::Ping(payload)) => {
                    let mut state = self.lock();
                    state.session.heard(now);
                    state.pong = Some(payload);
                    state.wake_writer();
                }
                // Pongs only prove liveness.
                Ok(Incoming::Pong) => self.lock().session.heard(now),
            }
        }
    }

    /// The writer: sends what the session queued, the keepalive's pings and the answers to
    /// the peer's, until the session closes or `shutdown` fires; then, unless writing failed,
    /// flushes what was queued before the end (a last DATA and FIN), briefly.
    async fn write(&self, shutdown: &CancellationToken) -> SessionEnd {
        // One wait for the whole session: made afresh on every turn, it would register with
        // the token's list on every message.
        let mut shutdown = pin!(shutdown.cancelled());
        let end = poll_fn(|cx| self.poll_write(cx, shutdown.as_mut())).await;
        if !matches!(end, SessionEnd::Write(_)) {
            let _ = tokio::time::timeout(CLOSE_FLUSH, self.flush()).await;
        }
        end
    }

    fn poll_write(
        &self,
        cx: &mut Context<'_>,
        shutdown: Pin<&mut WaitForCancellationFuture<'_>>,
    ) -> Poll<SessionEnd> {
        let (pong, ping) = {
            let mut state = self.lock();
            register(&mut state.writer, cx);
            if let Some(end) = &state.closed {
                return Poll::Ready(end.clone());
            }
            (state.pong.take(), std::mem::take(&mut state.ping))
        };
        if shutdown.poll(cx).is_ready() {
            return Poll::Ready(SessionEnd::Shutdown);
        }
        let mut outbox = self.outbox();
        // Taken only once the driver ends, after this future: never seen here.
        let Some(outbox) = outbox.as_mut() else {
            return Poll::Ready(SessionEnd::Shutdown);
        };
        if let Some(payload) = pong {
            outbox.pong(&payload);
        }
        if ping {
            outbox.ping();
        }
        match outbox.poll_transmit(cx, true, |message| self.batch(message)) {
            Poll::Ready(Err(error)) => Poll::Ready(SessionEnd::Write(error)),
            _ => Poll::Pending,
        }
    }

    /// The session's one timer: sleeps until the timer table's next deadline, lets the
    /// protocol act on it, and ends the session once the peer stayed silent too long.
    /// Independent of the writer, so a dial to a peer that stopped reading still times out on
    /// time.
    async fn timer(&self, timeout: Duration) -> SessionEnd {
        let mut sleep = pin!(tokio::time::sleep_until(self.epoch));
        poll_fn(|cx| self.poll_timer(cx, sleep.as_mut(), timeout)).await
    }

    fn poll_timer(
        &self,
        cx: &mut Context<'_>,
        mut sleep: Pin<&mut Sleep>,
        timeout: Duration,
    ) -> Poll<SessionEnd> {
        loop {
            let next = {
                let mut state = self.lock();
                register(&mut state.timer, cx);
                state.session.poll_timeout()
            };
            let Some(next) = next else {
                return Poll::Pending;
            };
            let at = self.instant_of(next);
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            ready!(sleep.as_mut().poll(cx));
            let now = self.now_ms();
            let silent = self.with(|state| {
                state.session.handle_timeout(now);
                if state.session.poll_ping() {
                    state.ping = true;
                    state.wake_writer();
                }
                state.session.peer_silent().is_some()
            });
            if silent {
                return Poll::Ready(SessionEnd::KeepaliveTimeout(timeout));
            }
        }
    }

    /// Sends everything queued and flushes, from the driver's task.
    async fn flush(&self) {
        poll_fn(|cx| {
            let mut outbox = self.outbox();
            let Some(outbox) = outbox.as_mut() else {
                return Poll::Ready(());
            };
            register(&mut self.lock().writer, cx);
            outbox
                .poll_transmit(cx, true, |message| self.batch(message))
                .map(drop)
        })
        .await;
    }
}

/// `frame`, its payload copied out of the message's buffer if it is a small DATA payload.
fn own_small_payload(frame: Frame) -> Frame {
    match frame {
        Frame::Data { stream, payload } if payload.len() < COPY_BELOW => Frame::Data {
            stream,
            payload: Bytes::copy_from_slice(&payload),
        },
        frame => frame,
    }
}
