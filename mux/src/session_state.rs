//! The state one session's tasks share: the protocol state machine and per-stream wake-ups.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bridgehead_proto::session::{Event, Session, SessionConfig};
use bridgehead_proto::text::Printable;
use bridgehead_proto::{ErrorCode, StreamId};
use foldhash::HashMap;
use futures_util::task::AtomicWaker;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::driver::Transmit;
use crate::SessionEnd;

/// How a stream ended, as its tasks learn it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Both directions finished and everything was read.
    Closed,
    /// Reset by either end (or the session ended).
    Reset {
        code: ErrorCode,
        reason: String,
        by_peer: bool,
    },
}

/// Per-stream bookkeeping next to the session, kept small: every open stream has one, idle
/// or not.
///
/// A task waiting on the stream leaves its waker here, under the session's lock, so the
/// event that satisfies the wait cannot slip in between the check and the registration.
/// One waiter per direction: the stream's reader (or the dial's waiter) and its writer.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Woken when data, EOF, the dial's answer or the end of the stream arrives.
    pub(crate) reader: Option<Waker>,
    /// Woken when send credit arrives or the stream ends.
    pub(crate) writer: Option<Waker>,
    /// Server: the dial's answer.
    pub(crate) dial: Dial,
    /// Set once the stream is gone from the session (boxed: it comes once, at the end).
    pub(crate) ending: Option<Box<Ending>>,
}

/// Server: where the agent's answer to a dial stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dial {
    #[default]
    Waiting,
    Opened,
    /// The agent's answer, or the session's end; the code and message are the stream's
    /// [`Ending::Reset`].
    Failed,
    /// The dial's deadline passed first.
    Expired,
}

/// A dial the server asked for, waiting for the agent's accept loop.
#[derive(Debug)]
pub(crate) struct PendingDial {
    pub(crate) stream: StreamId,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) timeout_ms: u32,
    pub(crate) window: u32,
}

#[derive(Debug)]
pub(crate) struct Locked {
    pub(crate) session: Session,
    /// Boxed, as the session's streams are: a table that doubles under churn grows by a
    /// pointer per slot.
    pub(crate) slots: HashMap<StreamId, Box<Slot>>,
    pub(crate) dials: VecDeque<PendingDial>,
    pub(crate) closed: Option<SessionEnd>,
}

#[derive(Debug)]
pub(crate) struct SessionState {
    state: Mutex<Locked>,
    /// The writer's task: woken when frames are queued or the session closed. (The waker a
    /// task sending in its place leaves with the transport is the outbox's,
    /// [`Transmit::writer_waker`].)
    pub(crate) writer: AtomicWaker,
    /// The session's sending side while the driver runs: the WebSocket's writing half and the
    /// message in flight. Whoever takes it carries on where the last one left off.
    pub(crate) outbox: Mutex<Option<Box<dyn Transmit>>>,
    /// Wakes the agent's accept loop.
    pub(crate) dials: Notify,
    /// Wakes whoever waits for the end of the session or for the peer's DRAIN.
    pub(crate) lifecycle: Notify,
    /// Wakes the session's timer: a dial with a deadline was opened.
    pub(crate) deadlines: Notify,
    /// Zero of the session's clock (tokio's, so tests can pause it).
    epoch: Instant,
    /// Set once `closed` is: the writer looks at it on every turn without the lock.
    ended: AtomicBool,
    /// The runtime the session's driver runs on, when it was placed on one of its own
    /// ([`crate::Mux::set_home`]): where its tunnels are best spliced.
    pub(crate) home: OnceLock<Handle>,
}

impl SessionState {
    pub(crate) fn new(config: SessionConfig) -> SessionState {
        SessionState {
            state: Mutex::new(Locked {
                session: Session::new(config),
                slots: HashMap::default(),
                dials: VecDeque::new(),
                closed: None,
            }),
            writer: AtomicWaker::new(),
            outbox: Mutex::new(None),
            dials: Notify::new(),
            lifecycle: Notify::new(),
            deadlines: Notify::new(),
            epoch: Instant::now(),
            ended: AtomicBool::new(false),
            home: OnceLock::new(),
        }
    }

    /// Milliseconds on the session's monotonic clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The instant `ms` on the session's clock names (at or after which [`Self::now_ms`] is
    /// `ms` or more).
    pub(crate) fn instant_of(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// Runs `f` on the state, then delivers the events it caused and wakes the writer if it
    /// queued frames. The lock is never held across an await.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Locked) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        if self.dispatch(&mut state) {
            self.writer.wake();
        }
        result
    }

    /// [`SessionState::with`] for a stream that queues frames (DATA, FIN): what `f` queued is
    /// sent from the calling task when the session's sending side is free
    /// ([`SessionState::transmit_now`]), without waking the writer's task for it. On a round
    /// trip that is a task's turn less in each process.
    pub(crate) fn with_sending<R>(&self, f: impl FnOnce(&mut Locked) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        let queued = self.dispatch(&mut state);
        drop(state);
        if queued && !self.transmit_now() {
            self.writer.wake();
        }
        result
    }

    /// Sends what is queued from the calling task, if the session's sending side is free (no
    /// other task sending, the driver running and not closing). A socket that takes only part
    /// of it keeps the writer's waker: the writer carries on once the socket takes more.
    /// `false`: the writer must be woken to send it.
    fn transmit_now(&self) -> bool {
        if self.ended.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut outbox) = self.outbox.try_lock() else {
            return false;
        };
        let Some(outbox) = outbox.as_mut() else {
            return false;
        };
        let Some(waker) = outbox.writer_waker() else {
            return false;
        };
        let mut cx = Context::from_waker(&waker);
        !matches!(
            outbox.poll_transmit(self, &mut cx, true),
            Poll::Ready(Err(_))
        )
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters more than losing the session; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delivers the events the state machine raised; whether frames wait to be sent.
    fn dispatch(&self, state: &mut Locked) -> bool {
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
                    state.slots.insert(stream, Box::default());
                    state.dials.push_back(PendingDial {
                        stream,
                        host,
                        port,
                        timeout_ms,
                        window,
                    });
                    self.dials.notify_one();
                }
                Event::Opened { stream } => state.answer(stream, Dial::Opened),
                Event::DialFailed {
                    stream,
                    code,
                    message,
                    expired,
                } => {
                    state.answer(stream, if expired { Dial::Expired } else { Dial::Failed });
                    state.end(
                        stream,
                        Ending::Reset {
                            code,
                            reason: Printable::new(&message).to_string(),
                            by_peer: true,
                        },
                    );
                }
                Event::Readable { stream } => state.wake(stream, Waiter::Reader),
                Event::Writable { stream } => state.wake(stream, Waiter::Writer),
                Event::Reset {
                    stream,
                    code,
                    reason,
                    by_peer,
                } => state.end(
                    stream,
                    Ending::Reset {
                        code,
                        // The peer's words: escaped before any log line or answer shows them.
                        reason: Printable::new(&reason).to_string(),
                        by_peer,
                    },
                ),
                Event::Closed { stream } => state.end(stream, Ending::Closed),
                Event::PeerDraining => lifecycle = true,
            }
        }
        if lifecycle {
            self.lifecycle.notify_waiters();
        }
        state.session.has_transmit()
    }

    pub(crate) fn open_streams(&self) -> usize {
        self.lock().session.stream_count()
    }

    pub(crate) fn load(&self) -> (usize, usize) {
        let state = self.lock();
        (state.session.stream_count(), state.session.dialing())
    }

    pub(crate) fn peer_draining(&self) -> bool {
        self.lock().session.peer_draining()
    }

    pub(crate) fn closed_reason(&self) -> Option<SessionEnd> {
        if !self.ended.load(Ordering::Acquire) {
            return None;
        }
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
                state.session.abort(&end.to_string());
                state.closed = Some(end);
                self.ended.store(true, Ordering::Release);
            }
        });
        // Dials that were never accepted fail with the session.
        self.writer.wake();
        self.dials.notify_waiters();
        self.lifecycle.notify_waiters();
    }
}

/// Which of a stream's waiters to wake or register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    Reader,
    Writer,
}

impl Slot {
    fn waker(&mut self, waiter: Waiter) -> &mut Option<Waker> {
        match waiter {
            Waiter::Reader => &mut self.reader,
            Waiter::Writer => &mut self.writer,
        }
    }

    /// Wakes `waiter`'s task, if one waits.
    fn wake(&mut self, waiter: Waiter) {
        if let Some(waker) = self.waker(waiter).take() {
            waker.wake();
        }
    }
}

impl Locked {
    /// Leaves `cx`'s waker for `waiter` of `stream`. Call it under the same lock as the check
    /// that found nothing to do, so the event it waits for cannot come in between. The waker
    /// stays until that event or the stream's end.
    pub(crate) fn park(&mut self, stream: StreamId, waiter: Waiter, cx: &Context<'_>) {
        if let Some(slot) = self.slots.get_mut(&stream) {
            let waker = slot.waker(waiter);
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
    }

    fn answer(&mut self, stream: StreamId, answer: Dial) {
        if let Some(slot) = self.slots.get_mut(&stream) {
            slot.dial = answer;
            slot.wake(Waiter::Reader);
        }
    }

    fn wake(&mut self, stream: StreamId, waiter: Waiter) {
        if let Some(slot) = self.slots.get_mut(&stream) {
            slot.wake(waiter);
        }
    }

    fn end(&mut self, stream: StreamId, ending: Ending) {
        if let Some(slot) = self.slots.get_mut(&stream) {
            if slot.ending.is_none() {
                slot.ending = Some(Box::new(ending));
            }
            slot.wake(Waiter::Reader);
            slot.wake(Waiter::Writer);
        }
    }
}
