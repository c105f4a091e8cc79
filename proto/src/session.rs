//! The per-session stream state machine: every stream's phase, send credit and receive window.
//!
//! A [`Session`] is one end of one WebSocket. It never does I/O: the caller feeds it frames it
//! received ([`Session::handle_frame`]) and local events (bytes to send, bytes read, local EOF,
//! abort, time passed in), then carries out what it asks for: frames to transmit
//! ([`Session::poll_transmit`]) and [`Event`]s that wake the tasks serving each stream.
//! Its deadlines (dials, pings, the peer's silence) are one timer table the caller drives with
//! one timer ([`Session::poll_timeout`], [`Session::handle_timeout`]).
//!
//! Received DATA is buffered here, bounded by the receive window this end granted, until
//! [`Session::read`] takes it; reading is what grants the peer more credit. A protocol violation
//! on one stream resets that stream; only a frame that breaks the session's own rules (a frame
//! for a stream never opened, a DIAL sent to the server) is a [`SessionError`].

mod error;
mod incoming;
mod stream;
mod timers;

pub use error::{OpenError, SessionError, StreamError};
pub use timers::Keepalive;

use std::collections::{BTreeSet, VecDeque};

use bytes::{Bytes, BytesMut};
use foldhash::HashMap;

use crate::budget::Budget;
use crate::frame::{Frame, StreamId, HEADER_LEN, MAX_DATA_PAYLOAD};
use crate::ErrorCode;
use stream::{Phase, Stream};
use timers::Timers;

/// Default receive window a stream starts with, per direction (before the budget's pressure
/// shrinks it; see [`crate::budget`]).
pub const DEFAULT_INITIAL_WINDOW: u32 = 64 * 1024;
/// Default largest receive window a reading stream earns: the credit limit, 16 MiB (the
/// ceiling gRPC's BDP estimator gives konnectivity's streams too). On loopback the grants'
/// round trip through both processes and the scheduler outlasts a smaller window at a
/// gigabyte a second (docs/benchmarks.md, optimisation log); over a link with latency one
/// stream moves about half a window per round trip. Only a stream that keeps reading earns
/// it (an eighth of what it read), and the memory budget bounds all streams together.
pub const DEFAULT_MAX_WINDOW: u32 = MAX_CREDIT as u32;
/// Largest credit a peer may hold out on one stream at any time (16 MiB): a DIAL or DIAL_OK
/// window, or a WINDOW that would take the credit above it, resets the stream
/// (`flow_control`). A peer granting more would only make this end read its client faster
/// than the WebSocket drains.
pub const MAX_CREDIT: u64 = 16 * 1024 * 1024;
/// Default bound on DATA bytes queued for the WebSocket across all streams of a session:
/// past it no stream may send until the writer drained some (backpressure to the sockets).
pub const DEFAULT_MAX_QUEUED: usize = 1024 * 1024;
/// Default limit of concurrent streams on one session.
pub const DEFAULT_MAX_STREAMS: usize = 10_000;

/// Which end of the session this is. Only the server opens streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Opens streams (DIAL), answers CONNECT clients.
    Server,
    /// Dials targets when asked.
    Agent,
}

/// Tunables of one session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// This end's role.
    pub role: Role,
    /// Receive window a stream starts with while the budget is not pressed (bytes the peer
    /// may send before a grant).
    pub initial_window: u32,
    /// Largest receive window a stream earns by reading; equal to `initial_window` for fixed
    /// windows.
    pub max_window: u32,
    /// The process's budget of buffered bytes, shared by its sessions.
    pub budget: Budget,
    /// Most streams open at once; beyond it the agent answers `too_many_streams` and the
    /// server refuses to open.
    pub max_streams: usize,
    /// Most DATA bytes queued for transmission at once, all streams together.
    pub max_queued: usize,
}

impl SessionConfig {
    /// The defaults for `role`.
    pub fn new(role: Role) -> SessionConfig {
        SessionConfig {
            role,
            initial_window: DEFAULT_INITIAL_WINDOW,
            max_window: DEFAULT_MAX_WINDOW,
            budget: Budget::unlimited(),
            max_streams: DEFAULT_MAX_STREAMS,
            max_queued: DEFAULT_MAX_QUEUED,
        }
    }
}

/// Why a stream with bytes to send can send none now ([`Session::send_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendWait {
    /// The peer's window is used up: it has not read enough to be granted more yet, or its
    /// grant is still on its way (a window smaller than what the link holds in one round
    /// trip: `--tunnel-max-window`).
    Window,
    /// The session's transmit queue is full: the WebSocket takes bytes slower than the streams
    /// bring them.
    Queue,
}

/// Something the I/O layer must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Agent: the server asks for a dial. Answer with [`Session::dial_succeeded`] or
    /// [`Session::dial_failed`] within `timeout_ms`.
    DialRequested {
        stream: StreamId,
        host: String,
        port: u16,
        timeout_ms: u32,
        /// The window the server granted in its DIAL: smaller than it starts streams with
        /// when its memory budget is under pressure.
        window: u32,
    },
    /// Server: the agent's dial succeeded; the stream is open.
    Opened { stream: StreamId },
    /// Server: the dial failed (agent's answer, or the deadline passed: `expired`). The
    /// stream is gone.
    DialFailed {
        stream: StreamId,
        code: ErrorCode,
        message: String,
        expired: bool,
    },
    /// Data or the peer's EOF is ready for [`Session::read`].
    Readable { stream: StreamId },
    /// The stream may send again ([`Session::send_credit`] grew from zero).
    Writable { stream: StreamId },
    /// The stream was reset; buffered data is discarded and the stream is gone. `by_peer` is
    /// false when this end reset it (locally, or because the peer broke the protocol).
    Reset {
        stream: StreamId,
        code: ErrorCode,
        reason: String,
        by_peer: bool,
    },
    /// Both directions ended cleanly and every byte was read; the stream is gone.
    Closed { stream: StreamId },
    /// The peer announced that it drains.
    PeerDraining,
}

/// What [`Session::read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The next chunk of the peer's data, in order.
    Data(Bytes),
    /// Nothing buffered yet; an [`Event::Readable`] will follow.
    Pending,
    /// The peer finished its direction and every byte was read.
    Eof,
    /// The stream no longer exists (closed or reset; the event said which).
    Gone,
}

/// One end of a multiplexed session. See the module documentation.
#[derive(Debug)]
pub struct Session {
    config: SessionConfig,
    /// Boxed: the table holds a pointer per stream, so when churn makes it double (hashbrown
    /// resizes once tombstones use up its room) it grows by kilobytes, not megabytes.
    streams: HashMap<StreamId, Box<Stream>>,
    /// Server: the last id it opened. Agent: the highest id the server opened.
    last_id: StreamId,
    /// Dial deadlines and keepalive ([`Session::poll_timeout`]).
    timers: Timers,
    /// Frames that steer the session (DIAL, answers, WINDOW, RESET, DRAIN); sent first.
    control: VecDeque<Frame>,
    /// DATA and FIN frames, in the order the streams sent them.
    data: VecDeque<Frame>,
    /// DATA payload bytes in `data`.
    queued: usize,
    /// DATA bytes received and not read yet, all streams together (held in the budget).
    buffered: u64,
    /// Streams that had credit but found the queue full: woken (Writable) when it drains.
    queue_waiters: BTreeSet<StreamId>,
    events: VecDeque<Event>,
    draining: bool,
    peer_draining: bool,
}

impl Session {
    /// A session with no streams.
    pub fn new(config: SessionConfig) -> Session {
        Session {
            config,
            streams: HashMap::default(),
            last_id: 0,
            timers: Timers::default(),
            control: VecDeque::new(),
            data: VecDeque::new(),
            queued: 0,
            buffered: 0,
            queue_waiters: BTreeSet::new(),
            events: VecDeque::new(),
            draining: false,
            peer_draining: false,
        }
    }

    /// Streams that exist (dialing, open or half-closed).
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Server: streams waiting for the agent's answer to their DIAL.
    pub fn dialing(&self) -> usize {
        self.timers.dials.len()
    }

    /// Whether `stream` still exists.
    pub fn contains(&self, stream: StreamId) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Whether the peer announced DRAIN.
    pub fn peer_draining(&self) -> bool {
        self.peer_draining
    }

    /// Server: asks the agent to dial `host:port`, failing the dial if no answer came by
    /// `now_ms + timeout_ms`.
    pub fn open(
        &mut self,
        host: &str,
        port: u16,
        timeout_ms: u32,
        now_ms: u64,
    ) -> Result<StreamId, OpenError> {
        if self.config.role != Role::Server {
            return Err(OpenError::NotServer);
        }
        if self.peer_draining || self.draining {
            return Err(OpenError::Draining);
        }
        if self.streams.len() >= self.config.max_streams {
            return Err(OpenError::TooManyStreams(self.config.max_streams));
        }
        let id = self.last_id.checked_add(1).ok_or(OpenError::IdsExhausted)?;
        self.last_id = id;
        let deadline = now_ms.saturating_add(u64::from(timeout_ms));
        let window = self
            .config
            .budget
            .initial_window(self.config.initial_window);
        self.streams.insert(
            id,
            Box::new(Stream::new(Phase::Dialing { deadline }, window)),
        );
        self.timers.dials.insert((deadline, id));
        self.control.push_back(Frame::Dial {
            stream: id,
            timeout_ms,
            window,
            port,
            host: host.to_owned(),
        });
        Ok(id)
    }

    /// Agent: the dial for `stream` succeeded. Fails with [`StreamError::Gone`] when the server
    /// reset the stream meanwhile: close the new connection.
    pub fn dial_succeeded(&mut self, stream: StreamId) -> Result<(), StreamError> {
        let state = self
            .streams
            .get_mut(&stream)
            .ok_or(StreamError::Gone(stream))?;
        if !matches!(state.phase, Phase::Dialing { .. }) {
            return Err(StreamError::Gone(stream));
        }
        state.phase = Phase::Open;
        let window = state.window;
        self.control.push_back(Frame::DialOk { stream, window });
        Ok(())
    }

    /// Agent: the dial for `stream` failed; the stream is gone.
    pub fn dial_failed(&mut self, stream: StreamId, code: ErrorCode, message: &str) {
        if self.discard(stream).is_some() {
            self.control.push_back(Frame::DialErr {
                stream,
                code,
                message: message.to_owned(),
            });
        }
    }

    /// Bytes `stream` may send now: its credit, within the room left in the session's
    /// transmit queue. A stream that has credit but finds no room is woken with
    /// [`Event::Writable`] once the queue drains.
    pub fn send_credit(&mut self, stream: StreamId) -> Result<usize, StreamError> {
        let state = self.streams.get(&stream).ok_or(StreamError::Gone(stream))?;
        state.check_sendable(stream)?;
        let room = self.config.max_queued.saturating_sub(self.queued);
        let credit = usize::try_from(state.send_credit).unwrap_or(usize::MAX);
        if room == 0 && credit > 0 {
            self.queue_waiters.insert(stream);
        }
        Ok(credit.min(room))
    }

    /// What holds `stream` back when [`Session::send_credit`] is 0: the peer's window, or the
    /// session's full transmit queue. `None` when it may send (or is gone).
    pub fn send_wait(&self, stream: StreamId) -> Option<SendWait> {
        let state = self.streams.get(&stream)?;
        if state.send_credit == 0 {
            Some(SendWait::Window)
        } else if self.queued >= self.config.max_queued {
            Some(SendWait::Queue)
        } else {
            None
        }
    }

    /// Queues as much of `data` as the stream's credit allows, split into DATA frames, and
    /// returns how many bytes were taken (the caller keeps the rest until [`Event::Writable`]).
    pub fn send(&mut self, stream: StreamId, mut data: Bytes) -> Result<usize, StreamError> {
        let state = self
            .streams
            .get_mut(&stream)
            .ok_or(StreamError::Gone(stream))?;
        state.check_sendable(stream)?;
        let room = self.config.max_queued.saturating_sub(self.queued);
        let take = data.len().min(state.send_credit as usize).min(room);
        state.send_credit -= take as u64;
        self.queued += take;
        let mut taken = data.split_to(take);
        while !taken.is_empty() {
            let payload = taken.split_to(taken.len().min(MAX_DATA_PAYLOAD));
            self.data.push_back(Frame::Data { stream, payload });
        }
        Ok(take)
    }

    /// This end will send no more on `stream` (TCP EOF from the local socket): queues FIN.
    pub fn finish(&mut self, stream: StreamId) -> Result<(), StreamError> {
        let state = self
            .streams
            .get_mut(&stream)
            .ok_or(StreamError::Gone(stream))?;
        state.check_sendable(stream)?;
        state.send_closed = true;
        // FIN travels behind the stream's queued DATA, never ahead of it.
        self.data.push_back(Frame::Fin { stream });
        self.maybe_close(stream);
        Ok(())
    }

    /// Takes the next chunk of received data. Reading grants the peer credit again.
    pub fn read(&mut self, stream: StreamId) -> ReadOutcome {
        let outcome = self.read_held(stream);
        if let ReadOutcome::Data(chunk) = &outcome {
            self.release(stream, chunk.len());
        }
        outcome
    }

    /// [`Session::read`] for a caller that holds on to the chunk after taking it (a socket
    /// write that may not finish at once): its bytes stay in the stream's window and in the
    /// budget, and earn the peer no credit, until [`Session::release`] says they left.
    pub fn read_held(&mut self, stream: StreamId) -> ReadOutcome {
        let Some(state) = self.streams.get_mut(&stream) else {
            return ReadOutcome::Gone;
        };
        if let Some(chunk) = state.recv_buf.pop_front() {
            state.held += chunk.len() as u64;
            // What arrived before the session ended is still delivered, then the stream goes.
            if !state.aborted {
                self.maybe_close(stream);
            }
            return ReadOutcome::Data(chunk);
        }
        if state.recv_closed {
            // An aborted stream's EOF stays readable (a peek must not consume it); it goes
            // when its owner resets it, as every dropped stream handle does.
            if !state.aborted {
                self.maybe_close(stream);
            }
            return ReadOutcome::Eof;
        }
        if state.aborted {
            self.discard(stream);
            return ReadOutcome::Gone;
        }
        ReadOutcome::Pending
    }

    /// `len` bytes taken with [`Session::read_held`] left this end (the socket took them):
    /// they leave the budget, and the peer is granted credit again once enough of its
    /// window was read.
    pub fn release(&mut self, stream: StreamId, len: usize) {
        let Some(state) = self.streams.get_mut(&stream) else {
            // A stream that is gone gave its bytes back when it went.
            return;
        };
        let len = (len as u64).min(state.held);
        state.held -= len;
        if !state.aborted {
            state.consumed(len as usize);
            let config = &self.config;
            let target = config
                .budget
                .window(state.window, config.max_window, state.read_total);
            if let Some(increment) = state.grant_due(target) {
                self.control.push_back(Frame::Window { stream, increment });
            }
        }
        self.unbuffer(len as usize);
    }

    /// Aborts `stream` in both directions: queues RESET and emits [`Event::Reset`] so every
    /// task serving the stream learns of it. Does nothing if the stream is already gone.
    pub fn reset(&mut self, stream: StreamId, code: ErrorCode, reason: &str) {
        self.reset_stream(stream, code, reason, false);
    }

    /// Announces that this end drains: the server stops routing new streams here (agent), or
    /// the agent should reconnect elsewhere once its streams end (server).
    pub fn drain(&mut self) {
        if !self.draining {
            self.draining = true;
            self.control.push_back(Frame::Drain);
        }
    }

    /// Server: fails every dial whose deadline is at or before `now_ms` (RESET `cancelled` to
    /// the agent, [`Event::DialFailed`] with `expired` locally).
    fn expire_dials(&mut self, now_ms: u64) {
        while let Some(&(deadline, stream)) = self.timers.dials.first() {
            if deadline > now_ms {
                break;
            }
            self.timers.dials.pop_first();
            if self.discard(stream).is_some() {
                self.control.push_back(Frame::Reset {
                    stream,
                    code: ErrorCode::Cancelled,
                    reason: "dial deadline passed".to_owned(),
                });
                self.events.push_back(Event::DialFailed {
                    stream,
                    code: ErrorCode::TimedOut,
                    message: "the agent did not answer the dial in time".to_owned(),
                    expired: true,
                });
            }
        }
    }

    /// The session is over (the WebSocket closed or failed): every stream fails at once.
    /// Dialing streams get [`Event::DialFailed`], the others [`Event::Reset`]. Data a stream
    /// received before the end stays readable ([`Session::read`] returns it, then `Eof` if the
    /// peer had finished, else `Gone`); nothing can be sent any more. Frames queued before
    /// stay queued, so the I/O layer may still flush them (a last DATA and FIN).
    pub fn abort(&mut self, reason: &str) {
        let mut ids: Vec<StreamId> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for stream in ids {
            if let Some(state) = self.streams.get_mut(&stream) {
                // Received data, or a FIN not yet read as EOF, is still delivered.
                if matches!(state.phase, Phase::Open)
                    && (!state.recv_buf.is_empty() || state.recv_closed)
                {
                    state.aborted = true;
                    state.send_closed = true;
                    self.events.push_back(Event::Reset {
                        stream,
                        code: ErrorCode::ConnectionReset,
                        reason: reason.to_owned(),
                        by_peer: false,
                    });
                    continue;
                }
            }
            let Some(state) = self.discard(stream) else {
                continue;
            };
            if let Phase::Dialing { deadline } = state.phase {
                self.timers.dials.remove(&(deadline, stream));
                if self.config.role == Role::Server {
                    self.events.push_back(Event::DialFailed {
                        stream,
                        code: ErrorCode::ConnectionReset,
                        message: reason.to_owned(),
                        expired: false,
                    });
                    continue;
                }
            }
            self.events.push_back(Event::Reset {
                stream,
                code: ErrorCode::ConnectionReset,
                reason: reason.to_owned(),
                by_peer: false,
            });
        }
    }

    /// The next event for the I/O layer.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next frame to transmit: control frames first, then DATA in order.
    pub fn poll_transmit(&mut self) -> Option<Frame> {
        if let Some(frame) = self.control.pop_front() {
            return Some(frame);
        }
        let frame = self.data.pop_front()?;
        if let Frame::Data { payload, .. } = &frame {
            self.dequeued(payload.len());
        }
        Some(frame)
    }

    /// `len` DATA bytes left the transmit queue: streams that waited for room may send again.
    fn dequeued(&mut self, len: usize) {
        self.queued -= len;
        if self.queued < self.config.max_queued {
            for stream in std::mem::take(&mut self.queue_waiters) {
                if self.streams.contains_key(&stream) {
                    self.events.push_back(Event::Writable { stream });
                }
            }
        }
    }

    /// Whether frames are waiting for [`Session::poll_transmit`].
    pub fn has_transmit(&self) -> bool {
        !self.control.is_empty() || !self.data.is_empty()
    }

    /// Encodes queued frames into `dst` (one WebSocket message) until it holds at least
    /// `max_bytes` or the queue is empty; returns the number of frames encoded.
    pub fn encode_transmit(&mut self, dst: &mut BytesMut, max_bytes: usize) -> usize {
        let room = max_bytes.saturating_sub(dst.len());
        self.transmit_batch(room, |frame| frame.encode(dst))
    }

    /// Hands queued frames to `put`, in order, until they encode to at least `max_bytes`, the
    /// queue is empty, or the next frame is DATA of another stream than the batch's; returns
    /// how many. [`Session::encode_transmit`] encodes each into a buffer; a writer that sends
    /// DATA payloads from where they lie encodes only their headers
    /// ([`Frame::encode_header`]).
    ///
    /// One stream's DATA to a batch is for the receiving end's memory: a receiver that hands
    /// payloads on as slices of the message they came in keeps the whole message alive while
    /// any of them is held (for a client that stopped reading, say), and then it holds only
    /// that stream's bytes, not other tunnels' too. A single busy stream still fills batches.
    pub fn transmit_batch(&mut self, max_bytes: usize, mut put: impl FnMut(Frame)) -> usize {
        let (mut frames, mut bytes) = (0, 0);
        let mut data_of = None;
        while bytes + HEADER_LEN < max_bytes {
            if let (true, Some(Frame::Data { stream, .. }), Some(batch)) =
                (self.control.is_empty(), self.data.front(), data_of)
            {
                if *stream != batch {
                    break;
                }
            }
            let Some(frame) = self.poll_transmit() else {
                break;
            };
            if let Frame::Data { stream, .. } = &frame {
                data_of = Some(*stream);
            }
            bytes += frame.encoded_len();
            put(frame);
            frames += 1;
        }
        frames
    }

    fn reset_stream(&mut self, stream: StreamId, code: ErrorCode, reason: &str, by_peer: bool) {
        if self.remove(stream).is_none() {
            return;
        }
        self.control.push_back(Frame::Reset {
            stream,
            code,
            reason: reason.to_owned(),
        });
        self.events.push_back(Event::Reset {
            stream,
            code,
            reason: reason.to_owned(),
            by_peer,
        });
    }

    /// `len` received bytes left the buffers (read, or discarded with their stream).
    fn unbuffer(&mut self, len: usize) {
        self.buffered -= len as u64;
        self.config.budget.release(len as u64);
    }

    /// DATA received for `stream`: it waits in the stream's buffer, held in the budget.
    fn buffer(&mut self, len: usize) {
        self.buffered += len as u64;
        self.config.budget.hold(len as u64);
    }

    /// Forgets `stream`; the bytes it held leave the budget.
    fn discard(&mut self, stream: StreamId) -> Option<Box<Stream>> {
        let state = self.streams.remove(&stream)?;
        self.unbuffer(state.recv_buf.len() + state.held as usize);
        Some(state)
    }

    fn remove(&mut self, stream: StreamId) -> Option<Box<Stream>> {
        let state = self.discard(stream)?;
        if let Phase::Dialing { deadline } = state.phase {
            self.timers.dials.remove(&(deadline, stream));
        }
        // DATA and FIN queued for a reset stream would be ignored by the peer; drop them now.
        let mut dropped = 0;
        self.data.retain(|frame| match frame {
            Frame::Data { stream: s, payload } if *s == stream => {
                dropped += payload.len();
                false
            }
            other => other.stream() != stream,
        });
        if dropped > 0 {
            self.dequeued(dropped);
        }
        self.queue_waiters.remove(&stream);
        Some(state)
    }

    /// DATA bytes received and not read yet, all streams together.
    pub fn buffered(&self) -> u64 {
        self.buffered
    }

    /// Frees `stream` once both directions ended and every received byte was read.
    fn maybe_close(&mut self, stream: StreamId) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|state| state.finished())
        {
            self.discard(stream);
            self.events.push_back(Event::Closed { stream });
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Data nobody will read any more leaves the process's budget with the session.
        self.config.budget.release(self.buffered);
    }
}
