//! The memory budget for tunnel data: one count of the DATA bytes a process holds received but
//! not yet written to its sockets, shared by every session of the process, and the window
//! policy that keeps that count under the budget.
//!
//! Only a stream whose local socket does not take the data (a client that stopped reading, a
//! target that does not read its request) holds buffered bytes for long; a stream that keeps
//! up holds at most a frame or two at any moment. So the policy sizes windows by what is
//! buffered now, the process's *pressure* (buffered / budget):
//!
//! - a new stream starts with the configured initial window while pressure is below 1/16, a
//!   window shrinking linearly to [`MIN_WINDOW`] as pressure goes to 1/4, and [`MIN_WINDOW`]
//!   beyond: many stalled streams make every later stream start small, early enough that
//!   thousands of them stay well below the 3/4 where reading streams' windows begin to
//!   shrink;
//! - a stream earns a larger window by moving data: an eighth of what it has read so far,
//!   never less than the window it has, never more than the maximum, so a stream must have
//!   read eight times a window's worth before it holds that much (a client whose kernel
//!   buffers absorbed a few hundred KiB before it stalled earns little more than it started
//!   with);
//! - what a stream may be granted is capped by pressure too: the maximum window below 3/4,
//!   shrinking linearly to [`MIN_WINDOW`] as pressure goes to 1. A stalled stream cannot be
//!   granted more (it reads nothing, so it is granted nothing) and a reading stream keeps its
//!   window until the stalled ones fill three quarters of the budget;
//! - a stream is always granted [`MIN_WINDOW`]: no stream waits for credit that only another
//!   stream's progress would free;
//! - once the buffered bytes reach the budget, no new stream is admitted (the server answers
//!   CONNECT with 503, the agent answers DIAL with `overloaded`).
//!
//! The bound this gives: buffered bytes stay under the budget plus what streams admitted just
//! before it filled had been granted, at most [`MIN_WINDOW`] each once pressure passed 1/4.
//! Every window travels in today's frames (DIAL, DIAL_OK, WINDOW): a peer that does not
//! adapt its own windows still works against one that does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The smallest window a stream is ever given (unless the configured windows are smaller): a
/// stream always gets at least this much credit back once it read it.
pub const MIN_WINDOW: u32 = 16 * 1024;
/// A stream's earned window is its bytes read so far divided by this.
pub const EARN_DIVISOR: u64 = 8;

/// Pressure is kept in 1/1024ths of the budget.
const ONE: u64 = 1024;

/// A process's budget of buffered tunnel bytes. Clones share the count.
#[derive(Debug, Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: u64,
    buffered: AtomicU64,
    refused: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes (at least one).
    pub fn new(limit: u64) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                limit: limit.max(1),
                buffered: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// A budget that never presses: windows never shrink, every stream is admitted.
    pub fn unlimited() -> Budget {
        Budget::new(u64::MAX)
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// DATA bytes received and not yet read out, all sessions together.
    pub fn buffered(&self) -> u64 {
        self.inner.buffered.load(Ordering::Relaxed)
    }

    /// New streams refused because the budget was spent.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Whether a new stream may be admitted now; counts the refusal when not.
    pub fn admit(&self) -> bool {
        if self.buffered() < self.inner.limit {
            return true;
        }
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Buffered bytes in 1/1024ths of the budget.
    fn pressure(&self) -> u64 {
        let per_unit = (self.inner.limit / ONE).max(1);
        self.buffered() / per_unit
    }

    /// Counts `bytes` more of tunnel data held: a session's received DATA, or what a socket's
    /// own layer keeps for a peer that has not taken it (a TLS stream's encrypted records).
    pub fn hold(&self, bytes: u64) {
        self.inner.buffered.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of what [`Budget::hold`] counted are no longer held.
    pub fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.inner.buffered.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// The window a new stream starts with, for a configured `initial` window.
    pub fn initial_window(&self, initial: u32) -> u32 {
        shrink(initial, self.pressure(), ONE / 16, ONE / 4)
    }

    /// The window a stream whose window is `current` and that has read `read` bytes so far
    /// may hold now, `max` the configured maximum.
    pub fn window(&self, current: u32, max: u32, read: u64) -> u32 {
        let max = max.max(current);
        let earned = (read / EARN_DIVISOR).clamp(u64::from(current), u64::from(max)) as u32;
        earned.min(shrink(max, self.pressure(), ONE * 3 / 4, ONE))
    }
}

/// `full` while `pressure` is at most `from`, down linearly to [`MIN_WINDOW`] at `to`, and
/// [`MIN_WINDOW`] beyond; a `full` below [`MIN_WINDOW`] stays as it is.
fn shrink(full: u32, pressure: u64, from: u64, to: u64) -> u32 {
    if full <= MIN_WINDOW || pressure <= from {
        return full;
    }
    if pressure >= to {
        return MIN_WINDOW;
    }
    let span = u64::from(full - MIN_WINDOW);
    let cut = span * (pressure - from) / (to - from);
    full - cut as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u32 = 1024;

    fn at(limit: u64, buffered: u64) -> Budget {
        let budget = Budget::new(limit);
        budget.hold(buffered);
        budget
    }

    #[test]
    fn new_streams_start_small_once_a_sixteenth_is_buffered() {
        let limit = 1024 * 1024;
        assert_eq!(at(limit, 0).initial_window(64 * KIB), 64 * KIB);
        assert_eq!(at(limit, limit / 16).initial_window(64 * KIB), 64 * KIB);
        // Half way between 1/16 and 1/4: half way between 64 and 16 KiB.
        assert_eq!(at(limit, limit * 5 / 32).initial_window(64 * KIB), 40 * KIB);
        assert_eq!(at(limit, limit / 4).initial_window(64 * KIB), MIN_WINDOW);
        assert_eq!(at(limit, limit * 2).initial_window(64 * KIB), MIN_WINDOW);
        // Windows configured below the floor are never raised to it.
        assert_eq!(at(limit, limit).initial_window(1000), 1000);
    }

    #[test]
    fn windows_are_earned_by_reading_and_capped_by_pressure() {
        let limit = 1024 * 1024;
        let calm = at(limit, 0);
        assert_eq!(calm.window(64 * KIB, 256 * KIB, 0), 64 * KIB);
        assert_eq!(calm.window(64 * KIB, 256 * KIB, 1024 * 1024), 128 * KIB);
        // A window once earned is kept while nothing presses...
        assert_eq!(calm.window(128 * KIB, 256 * KIB, 0), 128 * KIB);
        assert_eq!(calm.window(64 * KIB, 256 * KIB, 1 << 30), 256 * KIB);
        // A window fixed by configuration (max = initial) stays fixed.
        assert_eq!(calm.window(1000, 1000, 1 << 30), 1000);
        // Up to three quarters of the budget buffered, a reading stream keeps its window...
        assert_eq!(
            at(limit, limit * 3 / 4).window(64 * KIB, 256 * KIB, 1 << 30),
            256 * KIB
        );
        // ...then it shrinks towards the floor, reached when the budget is spent.
        let seven_eighths = at(limit, limit * 7 / 8).window(64 * KIB, 256 * KIB, 1 << 30);
        assert_eq!(seven_eighths, 136 * KIB);
        assert_eq!(
            at(limit, limit).window(64 * KIB, 256 * KIB, 1 << 30),
            MIN_WINDOW
        );
    }

    #[test]
    fn admission_stops_at_the_budget_and_counts_refusals() {
        let budget = Budget::new(100);
        budget.hold(99);
        assert!(budget.admit());
        budget.hold(1);
        assert!(!budget.admit());
        assert_eq!(budget.refused(), 1);
        budget.release(50);
        assert!(budget.admit());
        assert_eq!(budget.buffered(), 50);
        assert!(Budget::unlimited().admit());
        assert_eq!(Budget::unlimited().initial_window(64 * KIB), 64 * KIB);
    }
}
