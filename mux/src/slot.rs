//! What the driver keeps per stream beside the protocol's state: the tasks waiting on it, the
//! dial's answer, and how the stream ended.

use std::task::{Context, Waker};

use bridgehead_proto::{ErrorCode, StreamId};
use foldhash::HashMap;

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

/// Per-stream bookkeeping, kept small: every open stream has one, idle or not.
///
/// A task waiting on the stream leaves its waker here, under the session's lock, so the
/// event that satisfies the wait cannot slip in between the check and the registration.
/// One waiter per direction: the stream's reader (or the dial's waiter) and its writer.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Woken when data, EOF, the dial's answer or the end of the stream arrives.
    reader: Option<Waker>,
    /// Woken when send credit arrives or the stream ends.
    writer: Option<Waker>,
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
    /// The agent's answer; the code and message are the stream's [`Ending::Reset`].
    Failed,
    /// The dial's deadline passed first.
    Expired,
    /// The session ended before the agent answered.
    SessionEnded,
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

/// Which of a stream's waiters to wake or register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    Reader,
    Writer,
}

/// The slots of a session's streams. Boxed, as the session's streams are: a table that
/// doubles under churn grows by a pointer per slot.
#[derive(Debug, Default)]
pub(crate) struct Slots(HashMap<StreamId, Box<Slot>>);

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

impl Slots {
    pub(crate) fn insert(&mut self, stream: StreamId) {
        self.0.insert(stream, Box::default());
    }

    pub(crate) fn remove(&mut self, stream: StreamId) {
        self.0.remove(&stream);
    }

    /// How many streams have a slot.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn get(&self, stream: StreamId) -> Option<&Slot> {
        self.0.get(&stream).map(|slot| &**slot)
    }

    /// Leaves `cx`'s waker for `waiter` of `stream`. Call it under the same lock as the check
    /// that found nothing to do, so the event it waits for cannot come in between. The waker
    /// stays until that event or the stream's end.
    pub(crate) fn park(&mut self, stream: StreamId, waiter: Waiter, cx: &Context<'_>) {
        if let Some(slot) = self.0.get_mut(&stream) {
            let waker = slot.waker(waiter);
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
    }

    /// Records the dial's answer and wakes its waiter.
    pub(crate) fn answer(&mut self, stream: StreamId, answer: Dial) {
        if let Some(slot) = self.0.get_mut(&stream) {
            slot.dial = answer;
            slot.wake(Waiter::Reader);
        }
    }

    pub(crate) fn wake(&mut self, stream: StreamId, waiter: Waiter) {
        if let Some(slot) = self.0.get_mut(&stream) {
            slot.wake(waiter);
        }
    }

    /// Records how the stream ended (the first ending stays) and wakes both its waiters.
    pub(crate) fn end(&mut self, stream: StreamId, ending: Ending) {
        if let Some(slot) = self.0.get_mut(&stream) {
            if slot.ending.is_none() {
                slot.ending = Some(Box::new(ending));
            }
            slot.wake(Waiter::Reader);
            slot.wake(Waiter::Writer);
        }
    }
}
