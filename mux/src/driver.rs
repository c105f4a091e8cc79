//! Drives one session's WebSocket: a reader, a writer, the keepalive and the session's one
//! timer for dial deadlines.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bridgehead_proto::session::SessionError;
use bridgehead_proto::{DecodeError, Frame};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::branches::Branches;
use crate::session_state::SessionState;
use crate::websocket::{
    close_code, Incoming, Message, Reader, WebSocket, Writer, WsError, PING, PONG,
};
use crate::Mux;

/// Largest WebSocket message either end accepts; the writer batches frames up to a quarter
/// of it.
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// The writer batches frames into messages of about this size.
const BATCH_BYTES: usize = 256 * 1024;
/// The TLS records a session's connection may hold that its socket has not taken yet
/// (`rustls::ConnectionCommon::set_buffer_limit`; rustls' default is 64 KiB): room for a whole
/// message, which then goes to the socket in one write instead of four. That took 5-8 % off
/// the server's and agent's CPU per GiB of a one-tunnel transfer (docs/benchmarks.md). It is
/// per session, not per tunnel: a session whose peer stopped reading holds at most this
/// beyond what its kernel socket holds.
pub const SESSION_TLS_BUFFER: usize = 2 * BATCH_BYTES;
/// DATA payloads this large or larger go out from where they lie instead of being copied into
/// the message (a vectored write); smaller ones cost less copied than as a slice of their own.
const SPLICE_MIN: usize = 512;
/// The writer's message buffer: frame headers and small frames of a batch. Kept for the
/// session's life and reused for every message (before, each message was carved out of a
/// fresh 256 KiB chunk, which an idle session held too); a batch of small frames that
/// outgrows it grows it.
const MESSAGE_BUFFER: usize = 16 * 1024;
/// How long a closing session may take to flush frames queued before the close, and to send
/// its close frame.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// Longest reason sent in a WebSocket close frame.
const MAX_CLOSE_REASON: usize = 100;

/// How often to ping and how long silence may last before the session is declared dead.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// Interval between pings.
    pub interval: Duration,
    /// Silence (no message, no pong) after which the session is dead.
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
        }
    }
}

/// How the peer broke the protocol.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Violation {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("a text message")]
    TextMessage,
}

/// Why a session ended. Every stream of the session fails with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionEnd {
    /// The peer broke the protocol (WebSocket close code 1002).
    #[error("protocol error: {0}")]
    Protocol(Violation),
    /// Nothing heard from the peer for the keepalive timeout.
    #[error("peer silent for {0:?}")]
    KeepaliveTimeout(Duration),
    /// Reading from the WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(Arc<WsError>),
    /// Writing to the WebSocket failed: the transport's fault, not the peer's protocol.
    #[error("writing: {0}")]
    Write(Arc<WsError>),
    /// The peer closed the WebSocket (a close frame).
    #[error("closed by peer")]
    ClosedByPeer,
    /// This end shut the session down.
    #[error("shut down")]
    Shutdown,
    /// This end closed the session ([`Mux::close`]).
    #[error("{0}")]
    Closed(String),
}

impl From<Violation> for SessionEnd {
    fn from(violation: Violation) -> SessionEnd {
        SessionEnd::Protocol(violation)
    }
}

impl SessionEnd {
    /// The close frame this end sends, if the WebSocket can still carry one.
    fn close_code(&self) -> Option<u16> {
        match self {
            SessionEnd::Protocol(_) => Some(close_code::PROTOCOL),
            SessionEnd::Shutdown | SessionEnd::Closed(_) => Some(close_code::AWAY),
            // The peer's close is answered, completing the closing handshake.
            SessionEnd::KeepaliveTimeout(_) | SessionEnd::ClosedByPeer => Some(close_code::NORMAL),
            SessionEnd::WebSocket(_) | SessionEnd::Write(_) => None,
        }
    }

    /// Whether this is how a session is expected to end (not an error).
    fn is_orderly(&self) -> bool {
        matches!(
            self,
            SessionEnd::ClosedByPeer | SessionEnd::Shutdown | SessionEnd::Closed(_)
        )
    }
}

impl Mux {
    /// Drives the session over `ws` until it ends (peer gone, protocol error, keepalive
    /// timeout, [`Mux::close`] or `shutdown`). Every stream fails when it returns. An orderly
    /// end (the peer closed, [`Mux::close`], `shutdown`) is `Ok`; [`Mux::closed`] tells which.
    pub async fn run<S>(
        &self,
        ws: WebSocket<S>,
        keepalive: Keepalive,
        shutdown: CancellationToken,
    ) -> Result<(), SessionEnd>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (read, write) = tokio::io::split(ws.io);
        let mut source = Reader::new(read, ws.role, &ws.early);
        *shared_outbox(&self.shared) = Some(Box::new(Outbox::new(Writer::new(write, ws.role))));
        // A ping's payload, for the writer to answer with a pong; the flag saves the writer
        // the lock on every turn without one.
        let pong: std::sync::Mutex<Option<Bytes>> = std::sync::Mutex::new(None);
        let pinged = AtomicBool::new(false);
        let shared = &*self.shared;
        let mut last_heard = Instant::now();
        let mut ping = tokio::time::interval(keepalive.interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.reset();

        let reader = async {
            // One timer for the session, not one per message: when it fires, the deadline is
            // recomputed from the last message heard and the timer set again if that is later.
            let silence = tokio::time::sleep(keepalive.timeout);
            tokio::pin!(silence);
            loop {
                let message = tokio::select! {
                    // Messages first: after this process was stopped (SIGSTOP, a paused VM)
                    // the timer and the peer's waiting messages are ready together, and the
                    // peer was not silent; only this end was.
                    biased;
                    message = source.next() => message,
                    () = &mut silence => {
                        let now = Instant::now();
                        let deadline = last_heard + keepalive.timeout;
                        // A timer that fires more than an interval late means this process
                        // did not run (stopped, paused, starved), not that the peer fell
                        // silent: give the peer one interval from now, in which whatever
                        // it sent meanwhile is read.
                        let late = now.saturating_duration_since(silence.deadline());
                        if now >= deadline && late > keepalive.interval {
                            last_heard = (now + keepalive.interval)
                                .checked_sub(keepalive.timeout)
                                .unwrap_or(now);
                            silence.as_mut().reset(now + keepalive.interval);
                            continue;
                        }
                        if now >= deadline {
                            return SessionEnd::KeepaliveTimeout(keepalive.timeout);
                        }
                        silence.as_mut().reset(deadline);
                        continue;
                    }
                };
                last_heard = Instant::now();
                match message {
                    Err(error) => return SessionEnd::WebSocket(Arc::new(error)),
                    Ok(Incoming::Binary(bytes)) => {
                        let handled = shared.with(|state| {
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
                        // The writer answers; a newer ping's payload replaces an unanswered one.
                        *pong
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(payload);
                        pinged.store(true, Ordering::Release);
                        shared.writer.wake();
                    }
                    // Pongs only prove liveness.
                    Ok(Incoming::Pong) => {}
                }
            }
        };

        let writer = async {
            // One wait for the whole session: made afresh in every turn of the loop, it
            // registered and unregistered with the token's list on every message.
            let mut shutdown = pin!(shutdown.cancelled());
            let end = poll_fn(|cx| {
                shared.writer.register(cx.waker());
                if let Some(end) = shared.closed_reason() {
                    return Poll::Ready(end);
                }
                if shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(SessionEnd::Shutdown);
                }
                let mut outbox = shared_outbox(shared);
                // Taken only once `run` ends, after this future: never seen here.
                let Some(outbox) = outbox.as_mut() else {
                    return Poll::Ready(SessionEnd::Shutdown);
                };
                outbox.register(cx.waker());
                if pinged.swap(false, Ordering::Acquire) {
                    let answer = pong
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take();
                    if let Some(payload) = answer {
                        outbox.control(PONG, &payload);
                    }
                }
                while ping.poll_tick(cx).is_ready() {
                    outbox.control(PING, &[]);
                }
                match outbox.poll_transmit(shared, cx, true) {
                    Poll::Ready(Err(error)) => Poll::Ready(SessionEnd::Write(error)),
                    _ => Poll::Pending,
                }
            })
            .await;
            if !matches!(end, SessionEnd::Write(_)) {
                // Frames queued before the end (a last DATA and FIN) still go out, briefly.
                let _ = tokio::time::timeout(CLOSE_FLUSH, flush(shared)).await;
            }
            end
        };

        // Each polled only when its own waker fired (`branches`), not all three on every
        // wake-up of the task as `tokio::select!` would.
        let end = {
            let mut reader = pin!(reader);
            let mut writer = pin!(writer);
            let mut deadlines = pin!(deadlines(shared));
            let branches = Branches::<3>::new();
            poll_fn(|cx| {
                branches.poll(cx, |branch, cx| match branch {
                    0 => reader.as_mut().poll(cx),
                    1 => writer.as_mut().poll(cx),
                    _ => deadlines.as_mut().poll(cx).map(|never| match never {}),
                })
            })
            .await
        };
        debug!(reason = %end, "session ending");
        shared.close(end.clone());
        if let Some(code) = end.close_code() {
            let reason: String = end.to_string().chars().take(MAX_CLOSE_REASON).collect();
            if let Some(outbox) = shared_outbox(shared).as_mut() {
                outbox.close(code, &reason);
            }
            let _ = tokio::time::timeout(CLOSE_FLUSH, flush(shared)).await;
        }
        // The writing half goes with the session, whoever still holds the session's state.
        drop(shared_outbox(shared).take());
        if end.is_orderly() {
            Ok(())
        } else {
            Err(end)
        }
    }
}

/// DATA payloads smaller than this are copied out of the message they came in: the reader
/// reads small messages several to a buffer, and a small chunk held for long (its client
/// stopped reading) would keep the buffer and its neighbours' bytes. Larger messages get a
/// buffer of their own, holding one stream's DATA ([`Outbox::poll_send`]), and their payloads are
/// handed on as they are.
const COPY_BELOW: usize = crate::websocket::READ_BUFFER;

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

/// The session's one timer: sleeps until the protocol's next dial deadline
/// ([`bridgehead_proto::session::Session::next_deadline`]), lets the protocol fail what
/// expired, and waits again. Independent of the writer, so a dial to a peer that stopped
/// reading still times out on time.
async fn deadlines(shared: &SessionState) -> std::convert::Infallible {
    loop {
        let changed = shared.deadlines.notified();
        match shared.with(|state| state.session.next_deadline()) {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(shared.instant_of(deadline)) => {
                        let now = shared.now_ms();
                        shared.with(|state| state.session.handle_timeout(now));
                    }
                    () = changed => {}
                }
            }
            None => changed.await,
        }
    }
}

/// The session's sending side, kept in [`SessionState::outbox`] while the driver runs so that
/// the task that queued frames can send them itself when no other task is sending
/// ([`SessionState::transmit_now`]); otherwise the writer's task does.
pub(crate) trait Transmit: Send {
    /// Sends the control frames and the message in flight, then, with `look` (or while the
    /// last batch left frames behind), every frame queued, and flushes; ready once all of it
    /// is written. The transport wakes `cx` when it takes more. An error stays: every later
    /// call returns it.
    fn poll_transmit(
        &mut self,
        shared: &SessionState,
        cx: &mut Context<'_>,
        look: bool,
    ) -> Poll<Result<(), Arc<WsError>>>;

    /// The writer task's waker (`waker`), for sends from other tasks.
    fn register(&mut self, waker: &Waker);

    /// What [`Transmit::register`] left.
    fn writer_waker(&self) -> Option<Waker>;

    /// A control frame (ping, pong) goes out next, between messages.
    fn control(&mut self, opcode: u8, payload: &[u8]);

    /// A close frame goes out next.
    fn close(&mut self, code: u16, reason: &str);
}

impl std::fmt::Debug for dyn Transmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transmit")
    }
}

/// [`Transmit`] over the WebSocket's writing half.
struct Outbox<W> {
    sink: Writer<W>,
    /// The message being sent or assembled ([`MESSAGE_BUFFER`]).
    message: Message,
    /// Bytes of `message` written, while it is in flight.
    in_flight: Option<usize>,
    /// The last batch left frames queued: take the next once the message is out.
    more: bool,
    /// Control frames waiting, and how much of them is written.
    control: Vec<u8>,
    control_written: usize,
    /// Bytes were written since the last flush.
    unflushed: bool,
    /// A close frame is queued: no message follows it.
    closing: bool,
    failed: Option<Arc<WsError>>,
    writer: Option<Waker>,
}

impl<W> Outbox<W> {
    fn new(sink: Writer<W>) -> Outbox<W> {
        Outbox {
            sink,
            message: Message::default(),
            in_flight: None,
            more: false,
            control: Vec::new(),
            control_written: 0,
            unflushed: false,
            closing: false,
            failed: None,
            writer: None,
        }
    }
}

impl<W: AsyncWrite + Unpin + Send> Outbox<W> {
    /// Encodes queued frames into messages of up to [`BATCH_BYTES`] and writes them. DATA
    /// payloads of [`SPLICE_MIN`] bytes or more are not copied into the message: they go out
    /// from the buffer the splice read them into. A message carries DATA of one stream
    /// ([`bridgehead_proto::session::Session::transmit_batch`]), for the receiving end's
    /// memory: there a message's payloads are handed on as slices of the buffer it was read
    /// into, and one chunk held for a client that stopped reading keeps the whole buffer,
    /// which then holds only that tunnel's bytes (small payloads are copied out,
    /// [`own_small_payload`]).
    fn poll_send(&mut self, shared: &SessionState, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(written) = &mut self.in_flight {
                ready!(self.sink.poll_write_message(cx, &self.message, written))?;
                self.in_flight = None;
                self.unflushed = true;
                continue;
            }
            // Control frames go between messages, never into one.
            if self.control_written < self.control.len() {
                ready!(self
                    .sink
                    .poll_write_bytes(cx, &self.control, &mut self.control_written))?;
                self.control.clear();
                self.control_written = 0;
                self.unflushed = true;
                continue;
            }
            if !self.more || self.closing {
                break;
            }
            let message = &mut self.message;
            message.clear(MESSAGE_BUFFER);
            let (frames, more) = shared.with(|state| {
                let frames = state
                    .session
                    .transmit_batch(BATCH_BYTES, |frame| match frame {
                        Frame::Data { ref payload, .. } if payload.len() >= SPLICE_MIN => {
                            frame.encode_header(message.bytes());
                            if let Frame::Data { payload, .. } = frame {
                                message.splice(payload);
                            }
                        }
                        frame => frame.encode(message.bytes()),
                    });
                (frames, state.session.has_transmit())
            });
            // Frames queued while this message goes out wake the writer, or are sent by
            // whoever queued them: no second look under the lock that would find the queue
            // empty.
            self.more = more;
            if frames == 0 {
                break;
            }
            self.sink.seal(&mut self.message);
            self.in_flight = Some(0);
        }
        if self.unflushed {
            ready!(self.sink.poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin + Send> Transmit for Outbox<W> {
    fn poll_transmit(
        &mut self,
        shared: &SessionState,
        cx: &mut Context<'_>,
        look: bool,
    ) -> Poll<Result<(), Arc<WsError>>> {
        if let Some(error) = &self.failed {
            return Poll::Ready(Err(error.clone()));
        }
        self.more |= look;
        match ready!(self.poll_send(shared, cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(error) => {
                let error = Arc::new(WsError::from(error));
                self.failed = Some(error.clone());
                Poll::Ready(Err(error))
            }
        }
    }

    fn register(&mut self, waker: &Waker) {
        if !self.writer.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.writer = Some(waker.clone());
        }
    }

    fn writer_waker(&self) -> Option<Waker> {
        self.writer.clone()
    }

    fn control(&mut self, opcode: u8, payload: &[u8]) {
        self.sink.control(&mut self.control, opcode, payload);
    }

    fn close(&mut self, code: u16, reason: &str) {
        self.sink.close(&mut self.control, code, reason);
        self.closing = true;
    }
}

/// The session's [`SessionState::outbox`], locked.
fn shared_outbox(shared: &SessionState) -> std::sync::MutexGuard<'_, Option<Box<dyn Transmit>>> {
    shared
        .outbox
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends everything queued and flushes, from the writer's task.
async fn flush(shared: &SessionState) {
    poll_fn(|cx| {
        let mut outbox = shared_outbox(shared);
        let Some(outbox) = outbox.as_mut() else {
            return Poll::Ready(());
        };
        outbox.register(cx.waker());
        outbox.poll_transmit(shared, cx, true).map(drop)
    })
    .await;
}
