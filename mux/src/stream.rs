//! One tunnel's end of the session: [`MuxStream`], and the agent's [`DialRequest`].

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bridgehead_proto::session::{OpenError, ReadOutcome, SendWait, StreamError};
use bridgehead_proto::{ErrorCode, StreamId};
use bytes::{Buf, Bytes};

use crate::driver::{Driver, State};
use crate::end::SessionEnd;
use crate::slot::{Dial, Ending, Waiter};

/// Why [`crate::Mux::open`] produced no stream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpenFailure {
    /// The agent answered DIAL_ERR (or reset the dialing stream).
    #[error("agent could not dial: {code}: {message}")]
    Dial { code: ErrorCode, message: String },
    /// No answer before the deadline.
    #[error("agent did not answer the dial within {0:?}")]
    TimedOut(Duration),
    /// The session refused to open a stream (draining, stream limit).
    #[error("{0}")]
    Refused(OpenError),
    /// The session ended before the agent answered.
    #[error("agent session ended: {0}")]
    SessionClosed(SessionEnd),
}

impl From<OpenError> for OpenFailure {
    fn from(error: OpenError) -> OpenFailure {
        OpenFailure::Refused(error)
    }
}

/// How a stream ended abnormally, as seen by a read or write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream reset ({code}{}): {reason}", if *.by_peer { " by peer" } else { "" })]
pub struct StreamEnd {
    /// The reset's code.
    pub code: ErrorCode,
    /// The reset's reason text.
    pub reason: String,
    /// Whether the other end (or its target/client) reset it.
    pub by_peer: bool,
}

/// One tunnel over the session. Dropping it without [`MuxStream::finish`]ing both ways resets
/// the stream, so nothing outlives its owner.
pub struct MuxStream {
    shared: Arc<Driver>,
    id: StreamId,
}

impl fmt::Debug for MuxStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MuxStream").field("id", &self.id).finish()
    }
}

impl MuxStream {
    fn new(shared: Arc<Driver>, id: StreamId) -> MuxStream {
        MuxStream { shared, id }
    }

    /// The stream id on the wire.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The runtime its session's driver runs on, if the session was given one
    /// ([`crate::Mux::set_home`]).
    pub fn home(&self) -> Option<&tokio::runtime::Handle> {
        self.shared.home.get()
    }

    /// The next chunk the peer sent, in order; `Ok(None)` once the peer finished its direction
    /// and every byte was read.
    pub async fn read(&self) -> Result<Option<Bytes>, StreamEnd> {
        poll_fn(|cx| self.poll_read(cx)).await
    }

    /// [`MuxStream::read`] as a poll: when nothing is buffered, `cx` is woken once something
    /// arrives (data, EOF, the end of the stream).
    pub(crate) fn poll_read(&self, cx: &Context<'_>) -> Poll<Result<Option<Bytes>, StreamEnd>> {
        self.poll_read_as(cx, false)
    }

    /// [`MuxStream::poll_read`] of a chunk the caller holds until [`MuxStream::release`]
    /// says its bytes left: until then they count against the window and the budget.
    pub(crate) fn poll_read_held(
        &self,
        cx: &Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamEnd>> {
        self.poll_read_as(cx, true)
    }

    fn poll_read_as(&self, cx: &Context<'_>, held: bool) -> Poll<Result<Option<Bytes>, StreamEnd>> {
        self.shared.with(|state| {
            let read = if held {
                state.session.read_held(self.id)
            } else {
                state.session.read(self.id)
            };
            // Data that arrived before a reset of the session is still delivered first.
            let outcome = match read {
                ReadOutcome::Data(chunk) => Ok(Some(chunk)),
                ReadOutcome::Eof => Ok(None),
                outcome @ (ReadOutcome::Pending | ReadOutcome::Gone) => {
                    match (self.reset_of(state), outcome) {
                        (Some(end), _) => Err(end),
                        (None, ReadOutcome::Gone) => Ok(None),
                        (None, _) => {
                            state.slots.park(self.id, Waiter::Reader, cx);
                            return Poll::Pending;
                        }
                    }
                }
            };
            Poll::Ready(outcome)
        })
    }

    /// The next chunk if one is buffered right now; `None` otherwise (also at EOF or after a
    /// reset, which the next [`MuxStream::read`] reports).
    pub fn try_read(&self) -> Option<Bytes> {
        self.shared.with(|state| match state.session.read(self.id) {
            ReadOutcome::Data(chunk) => Some(chunk),
            _ => None,
        })
    }

    /// [`MuxStream::try_read`] of a chunk held until [`MuxStream::release`].
    pub(crate) fn try_read_held(&self) -> Option<Bytes> {
        self.shared
            .with(|state| match state.session.read_held(self.id) {
                ReadOutcome::Data(chunk) => Some(chunk),
                _ => None,
            })
    }

    /// `len` bytes of held chunks left this end (the socket took them).
    pub(crate) fn release(&self, len: usize) {
        if len > 0 {
            self.shared
                .with(|state| state.session.release(self.id, len));
        }
    }

    /// Waits until the stream may send, and returns how many bytes it may send now.
    pub async fn writable(&self) -> Result<usize, StreamEnd> {
        poll_fn(|cx| self.poll_writable(cx)).await
    }

    /// [`MuxStream::writable`] as a poll: without credit, `cx` is woken once credit arrives or
    /// the stream ends.
    pub(crate) fn poll_writable(&self, cx: &Context<'_>) -> Poll<Result<usize, StreamEnd>> {
        self.shared.with(|state| match self.credit(state) {
            Ok(0) => {
                state.slots.park(self.id, Waiter::Writer, cx);
                Poll::Pending
            }
            credit => Poll::Ready(credit),
        })
    }

    /// What holds the stream back while [`MuxStream::poll_writable`] waits.
    pub(crate) fn send_wait(&self) -> Option<SendWait> {
        self.shared.with(|state| state.session.send_wait(self.id))
    }

    /// Sends all of `data`, waiting for credit as needed.
    pub async fn write(&self, mut data: Bytes) -> Result<(), StreamEnd> {
        while !data.is_empty() {
            self.writable().await?;
            self.send(&mut data, true)?;
        }
        Ok(())
    }

    /// Queues as much of `data` as the credit allows right now, and advances `data` past it.
    /// Once all of it is taken, `data` no longer refers to the buffer it was cut from.
    ///
    /// `now`: nothing more is coming soon (the socket had no more), so the frames go out from
    /// this task if the session's sending side is free
    /// (`Driver::with_sending`);
    /// otherwise the writer's task sends them once this task yields, with whatever else was
    /// queued by then, in as few messages as it can.
    pub(crate) fn send(&self, data: &mut Bytes, now: bool) -> Result<(), StreamEnd> {
        let queue = |state: &mut State| {
            self.credit(state)?;
            state
                .session
                .send(self.id, data.clone())
                .map_err(|error| self.local_end(error))
        };
        let taken = if now {
            self.shared.with_sending(queue)
        } else {
            self.shared.with(queue)
        }?;
        if taken == data.len() {
            *data = Bytes::new();
        } else {
            data.advance(taken);
        }
        Ok(())
    }

    /// The send credit, or how the stream ended.
    fn credit(&self, state: &mut State) -> Result<usize, StreamEnd> {
        if let Some(end) = self.reset_of(state) {
            return Err(end);
        }
        state
            .session
            .send_credit(self.id)
            .map_err(|error| self.local_end(error))
    }

    /// Ends this direction (FIN); the peer's direction stays open.
    pub fn finish(&self) -> Result<(), StreamEnd> {
        self.shared.with_sending(|state| {
            if let Some(end) = self.reset_of(state) {
                return Err(end);
            }
            state
                .session
                .finish(self.id)
                .map_err(|error| self.local_end(error))
        })
    }

    /// Aborts both directions with `code` and `reason`.
    pub fn reset(&self, code: ErrorCode, reason: &str) {
        self.shared
            .with(|state| state.session.reset(self.id, code, reason));
    }

    fn reset_of(&self, state: &State) -> Option<StreamEnd> {
        match state.slots.get(self.id)?.ending.as_deref()? {
            Ending::Reset {
                code,
                reason,
                by_peer,
            } => Some(StreamEnd {
                code: *code,
                reason: reason.clone(),
                by_peer: *by_peer,
            }),
            Ending::Closed => None,
        }
    }

    fn local_end(&self, error: StreamError) -> StreamEnd {
        StreamEnd {
            code: ErrorCode::StreamState,
            reason: error.to_string(),
            by_peer: false,
        }
    }
}

impl Drop for MuxStream {
    fn drop(&mut self) {
        self.shared.with(|state| {
            if state.session.contains(self.id) {
                state
                    .session
                    .reset(self.id, ErrorCode::Cancelled, "stream dropped");
            }
            state.slots.remove(self.id);
        });
    }
}

/// Server side of [`crate::Mux::open`]. The deadline is the session's: its timer fails the
/// dial when it passes (and the agent hears RESET `cancelled`).
pub(crate) async fn open(
    shared: &Arc<Driver>,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<MuxStream, OpenFailure> {
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let now = shared.now_ms();
    let id = shared.with(|state| {
        if let Some(end) = &state.closed {
            return Err(OpenFailure::SessionClosed(end.clone()));
        }
        let id = state
            .session
            .open(host, port, timeout_ms, now)
            .map_err(OpenFailure::Refused)?;
        state.slots.insert(id);
        // A deadline the timer may not be set for yet.
        state.wake_timer();
        Ok(id)
    })?;
    // From here the handle owns the slot: dropping it (client gone) resets the stream.
    let stream = MuxStream::new(shared.clone(), id);
    poll_fn(|cx| {
        shared.with(|state| {
            let slot = state.slots.get(id);
            let answer = slot.map_or(Dial::Waiting, |slot| slot.dial);
            match (answer, &state.closed) {
                (Dial::Opened, _) => Poll::Ready(Ok(())),
                (Dial::Expired, _) => Poll::Ready(Err(OpenFailure::TimedOut(timeout))),
                (Dial::Failed, _) => {
                    let (code, message) = match slot.and_then(|slot| slot.ending.as_deref()) {
                        Some(Ending::Reset { code, reason, .. }) => (*code, reason.clone()),
                        _ => (ErrorCode::Other, "dial failed".to_owned()),
                    };
                    Poll::Ready(Err(OpenFailure::Dial { code, message }))
                }
                (Dial::SessionEnded | Dial::Waiting, Some(end)) => {
                    Poll::Ready(Err(OpenFailure::SessionClosed(end.clone())))
                }
                (Dial::SessionEnded | Dial::Waiting, None) => {
                    state.slots.park(id, Waiter::Reader, cx);
                    Poll::Pending
                }
            }
        })
    })
    .await?;
    Ok(stream)
}

/// Agent side of [`crate::Mux::accept`].
pub(crate) async fn accept(shared: &Arc<Driver>) -> Option<DialRequest> {
    let dial = poll_fn(|cx| {
        shared.with(|state| {
            if state.closed.is_some() {
                return Poll::Ready(None);
            }
            match state.dials.pop_front() {
                Some(dial) => Poll::Ready(Some(dial)),
                None => {
                    state.park_acceptor(cx);
                    Poll::Pending
                }
            }
        })
    })
    .await?;
    Some(DialRequest {
        stream: MuxStream::new(shared.clone(), dial.stream),
        host: dial.host,
        port: dial.port,
        timeout: Duration::from_millis(u64::from(dial.timeout_ms)),
        window: dial.window,
    })
}

/// Agent: the server asks for a dial. Answer with [`DialRequest::accept`] once connected or
/// [`DialRequest::reject`]; dropping it rejects it.
#[derive(Debug)]
pub struct DialRequest {
    stream: MuxStream,
    /// Target host: an IPv4 or IPv6 literal (no brackets) or a name to resolve.
    pub host: String,
    /// Target port.
    pub port: u16,
    /// How long the server waits for the answer.
    pub timeout: Duration,
    /// The window the server granted for the stream: below the window it starts streams
    /// with ([`bridgehead_proto::session::DEFAULT_INITIAL_WINDOW`]) while its tunnel memory
    /// budget is under pressure.
    pub window: u32,
}

impl DialRequest {
    /// The stream id on the wire.
    pub fn id(&self) -> StreamId {
        self.stream.id
    }

    /// Resolves when the server gave up on this dial (reset or session end) — race it with
    /// the connect.
    pub async fn cancelled(&self) {
        let MuxStream { shared, id } = &self.stream;
        poll_fn(|cx| {
            shared.with(|state| {
                if state.closed.is_some() || !state.session.contains(*id) {
                    return Poll::Ready(());
                }
                state.slots.park(*id, Waiter::Reader, cx);
                Poll::Pending
            })
        })
        .await;
    }

    /// The dial succeeded: tell the server and get the stream. Fails when the server gave up
    /// meanwhile; close the new connection then.
    pub fn accept(self) -> Result<MuxStream, StreamEnd> {
        let id = self.stream.id;
        self.stream.shared.with(|state| {
            state.session.dial_succeeded(id).map_err(|error| StreamEnd {
                code: ErrorCode::Cancelled,
                reason: error.to_string(),
                by_peer: true,
            })
        })?;
        Ok(self.stream)
    }

    /// The dial failed with `code`.
    pub fn reject(self, code: ErrorCode, message: &str) {
        let id = self.stream.id;
        self.stream
            .shared
            .with(|state| state.session.dial_failed(id, code, message));
    }
}
