//! One session's driver: it owns the session's state (the protocol's [`Session`] and a slot per
//! stream) and its sending side ([`Outbox`]), and runs the WebSocket with one reader, one
//! writer and one timer ([`Driver::drive`]).
//!
//! The state sits behind one `std::sync::Mutex`, held for the few hundred nanoseconds a
//! transition takes and never across an `.await` (quinn's design, whose pure `quinn-proto`
//! state is driven the same way). Every task that waits on the session leaves its waker in
//! the state, under the same lock as the check that found nothing to do: a stream's reader and
//! writer (`crate::slot`), the agent's accept loop, the driver's writer and timer. The sending
//! side has a lock of its own so that a stream's task that queued frames can send them itself
//! while nobody else is sending ([`Driver::with_sending`]). The loop itself, reader, writer
//! and timer, is `driver/drive.rs`.

mod drive;

pub use drive::CLOSE_FLUSH;

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bridgehead_proto::session::{Event, Keepalive, Session, SessionConfig};
use bridgehead_proto::text::Printable;
use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::end::SessionEnd;
use crate::outbox::{encode_batch, Outbox};
use crate::slot::{Dial, Ending, PendingDial, Slots, Waiter};
use crate::websocket::Message;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Driver {
    state: Mutex<State>,
    /// The sending side while the driver runs.
    outbox: Mutex<Option<Outbox>>,
    /// Wakes whoever waits for the end of the session or for the peer's DRAIN (any number
    /// of tasks: the registry, the revocation watch, the session's own).
    lifecycle: Notify,
    /// Zero of the session's clock (tokio's, so tests can pause it).
    epoch: Instant,
    /// The runtime the session's driver runs on, when it was placed on one of its own
    /// ([`crate::Mux::set_home`]): where its tunnels are best spliced.
    pub(crate) home: OnceLock<Handle>,
}

/// The session's state, under the driver's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) session: Session,
    pub(crate) slots: Slots,
    /// Agent: dials the server asked for, waiting for [`crate::Mux::accept`].
    pub(crate) dials: VecDeque<PendingDial>,
    pub(crate) closed: Option<SessionEnd>,
    /// The driver's writer: woken when frames are queued, a ping or pong is due, or the
    /// session closed.
    writer: Option<Waker>,
    /// The driver's timer: woken when a dial adds a deadline.
    timer: Option<Waker>,
    /// The agent's accept loop (one task at a time).
    acceptor: Option<Waker>,
    /// A ping's payload, for the writer to answer; a newer ping's replaces an unanswered one.
    pong: Option<Bytes>,
    /// The keepalive asked for a ping.
    ping: bool,
}

impl State {
    fn wake_writer(&self) {
        if let Some(writer) = &self.writer {
            writer.wake_by_ref();
        }
    }

    /// A dial was opened: the timer looks at the table's next deadline again.
    pub(crate) fn wake_timer(&self) {
        if let Some(timer) = &self.timer {
            timer.wake_by_ref();
        }
    }

    /// Leaves `cx`'s waker for the accept loop.
    pub(crate) fn park_acceptor(&mut self, cx: &Context<'_>) {
        register(&mut self.acceptor, cx);
    }
}

/// Leaves `cx`'s waker in `slot` unless the one there wakes the same task.
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

impl Driver {
    pub(crate) fn new(config: SessionConfig) -> Driver {
        Driver {
            state: Mutex::new(State {
                session: Session::new(config),
                slots: Slots::default(),
                dials: VecDeque::new(),
                closed: None,
                writer: None,
                timer: None,
                acceptor: None,
                pong: None,
                ping: false,
            }),
            outbox: Mutex::new(None),
            lifecycle: Notify::new(),
            epoch: Instant::now(),
            home: OnceLock::new(),
        }
    }

    /// Milliseconds on the session's monotonic clock.
    pub(crate) fn now_ms(&self) -> u64 {
        // Read for every message the peer sends: whole seconds and milliseconds, without
        // `as_millis`'s 128-bit arithmetic.
        let elapsed = self.epoch.elapsed();
        elapsed.as_secs() * 1000 + u64::from(elapsed.subsec_millis())
    }

    /// The instant `ms` on the session's clock names (at or after which [`Self::now_ms`] is
    /// `ms` or more).
    fn instant_of(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters more than losing the session; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn outbox(&self) -> MutexGuard<'_, Option<Outbox>> {
        self.outbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the state, then delivers the events it caused and wakes the writer if it
    /// queued frames. The lock is never held across an await.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        if self.dispatch(&mut state) {
            state.wake_writer();
        }
        result
    }

    /// [`Driver::with`] for a stream that queues frames (DATA, FIN): what `f` queued is sent
    /// from the calling task when the sending side is free, without waking the writer's task
    /// for it. On a round trip that is a task's turn less in each process. A socket that takes
    /// only part of it keeps the writer's waker: the writer carries on once it takes more.
    pub(crate) fn with_sending<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        let writer = match self.dispatch(&mut state) {
            true => state.writer.clone().map(|w| (w, state.closed.is_some())),
            false => None,
        };
        drop(state);
        if let Some((writer, closed)) = writer {
            if closed || !self.send_now(&writer) {
                writer.wake();
            }
        }
        result
    }

    /// Sends what is queued from the calling task, if the sending side is free (no other task
    /// sending, the driver running); `writer` is woken when the socket takes more. `false`:
    /// the writer must be woken to send it.
    fn send_now(&self, writer: &Waker) -> bool {
        let Ok(mut outbox) = self.outbox.try_lock() else {
            return false;
        };
        let Some(outbox) = outbox.as_mut() else {
            return false;
        };
        let mut cx = Context::from_waker(writer);
        !matches!(
            outbox.poll_transmit(&mut cx, true, |message| self.batch(message)),
            Poll::Ready(Err(_))
        )
    }

    /// The next batch of queued frames into `message`.
    fn batch(&self, message: &mut Message) -> (usize, bool) {
        self.with(|state| encode_batch(&mut state.session, message))
    }

    /// Delivers the events the state machine raised; whether frames wait to be sent.
    fn dispatch(&self, state: &mut State) -> bool {
        let mut lifecycle = false;
        while let Some(event) = state.session.poll_event() {
            match event {
                Event::DialRequested {
                    stream,
                    host,
                    port,
                    timeout_ms,
                    window,
                } => {
                    state.slots.insert(stream);
                    state.dials.push_back(PendingDial {
                        stream,
                        host,
                        port,
                        timeout_ms,
                        window,
                    });
                    if let Some(acceptor) = state.acceptor.take() {
                        acceptor.wake();
                    }
                }
                Event::Opened { stream } => state.slots.answer(stream, Dial::Opened),
                Event::DialFailed {
                    stream,
                    code,
                    message,
                    expired,
                } => {
                    // The session's end fails its dials while `closed` is set, and only then.
                    let answer = match (expired, &state.closed) {
                        (true, _) => Dial::Expired,
                        (false, Some(_)) => Dial::SessionEnded,
                        (false, None) => Dial::Failed,
                    };
                    state.slots.answer(stream, answer);
                    let reason = Printable::new(&message).to_string();
                    state.slots.end(stream, reset(code, reason, true));
                }
                Event::Readable { stream } => state.slots.wake(stream, Waiter::Reader),
                Event::Writable { stream } => state.slots.wake(stream, Waiter::Writer),
                Event::Reset {
                    stream,
                    code,
                    reason,
                    by_peer,
                } => {
                    // The peer's words: escaped before any log line or answer shows them.
                    let reason = Printable::new(&reason).to_string();
                    state.slots.end(stream, reset(code, reason, by_peer));
                }
                Event::Closed { stream } => state.slots.end(stream, Ending::Closed),
                Event::PeerDraining => lifecycle = true,
            }
        }
        if lifecycle {
            self.lifecycle.notify_waiters();
        }
        state.session.has_transmit()
    }

    pub(crate) fn load(&self) -> (usize, usize) {
        let state = self.lock();
        (state.session.stream_count(), state.session.dialing())
    }

    pub(crate) fn open_streams(&self) -> usize {
        self.lock().session.stream_count()
    }

    pub(crate) fn peer_draining(&self) -> bool {
        self.lock().session.peer_draining()
    }

    pub(crate) fn closed_reason(&self) -> Option<SessionEnd> {
        self.lock().closed.clone()
    }

    pub(crate) async fn closed(&self) -> SessionEnd {
        loop {
            let notified = self.lifecycle.notified();
            if let Some(reason) = self.closed_reason() {
                return reason;
            }
            notified.await;
        }
    }

    pub(crate) async fn peer_drained(&self) {
        loop {
            let notified = self.lifecycle.notified();
            if self.with(|s| s.session.peer_draining() || s.closed.is_some()) {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn drain(&self) {
        self.with(|state| state.session.drain());
    }

    /// Ends the session: every stream fails, waiters wake, the driver stops. The first end
    /// recorded is the one that stays.
    pub(crate) fn close(&self, end: SessionEnd) {
        self.with(|state| {
            if state.closed.is_none() {
                state.closed = Some(end.clone());
                state.session.abort(&end.to_string());
            }
            state.wake_writer();
            // Dials that were never accepted fail with the session.
            if let Some(acceptor) = state.acceptor.take() {
                acceptor.wake();
            }
        });
        self.lifecycle.notify_waiters();
    }
}

fn reset(code: bridgehead_proto::ErrorCode, reason: String, by_peer: bool) -> Ending {
    Ending::Reset {
        code,
        reason,
        by_peer,
    }
}
