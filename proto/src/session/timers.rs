//! The session's timer table: every deadline the session keeps, on the caller's clock.
//!
//! Three kinds of deadline live here: each dialing stream's (server), when the next ping is
//! due, and when the peer's silence ends the session. The I/O layer keeps one timer for all of
//! them: it sleeps until [`Session::poll_timeout`], calls [`Session::handle_timeout`] with the
//! time it woke, then sends the ping [`Session::poll_ping`] asks for, or ends the session when
//! [`Session::peer_silent`] says so (quinn-proto's `poll_timeout` / `handle_timeout`).

use std::collections::BTreeSet;

use crate::frame::StreamId;

use super::Session;

/// How often to ping the peer and how long it may stay silent, in the session's milliseconds:
/// the one keepalive type, from the flag to the timer table (`bridgehead_mux` re-exports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Between pings.
    pub interval_ms: u64,
    /// Silence (nothing heard, not even a pong) after which the peer is dead.
    pub timeout_ms: u64,
}

impl Default for Keepalive {
    /// What tests and tools run with: a ping every 5 s, dead after 15 s of silence. The
    /// binaries build theirs from `--keepalive-time` (`bridgehead_runtime::timeouts`).
    fn default() -> Keepalive {
        Keepalive {
            interval_ms: 5_000,
            timeout_ms: 15_000,
        }
    }
}

/// The deadlines of one session.
#[derive(Debug, Default)]
pub(super) struct Timers {
    /// Dialing streams by deadline (server only).
    pub(super) dials: BTreeSet<(u64, StreamId)>,
    keepalive: Option<KeepaliveTimers>,
}

#[derive(Debug)]
struct KeepaliveTimers {
    config: Keepalive,
    /// When the next ping is due.
    ping_at: u64,
    /// A ping fell due and has not been taken ([`Session::poll_ping`]).
    ping_due: bool,
    /// The peer is silent from this time on, unless it is heard before.
    silent_from: u64,
    /// When the silence is next checked. Not moved every time the peer is heard (that would
    /// reset the caller's timer for every message): once it passes, the check finds the later
    /// `silent_from` and sets it again.
    check_at: u64,
    /// The peer was declared silent.
    silent: bool,
}

impl Timers {
    /// The earliest deadline of all.
    fn next(&self) -> Option<u64> {
        let dial = self.dials.first().map(|(deadline, _)| *deadline);
        let keepalive = self
            .keepalive
            .as_ref()
            .filter(|k| !k.silent)
            .map(|k| k.ping_at.min(k.check_at));
        match (dial, keepalive) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl KeepaliveTimers {
    fn handle_timeout(&mut self, now_ms: u64) {
        let interval_ms = self.config.interval_ms;
        if !self.silent && self.check_at <= now_ms {
            // A check that comes more than an interval late means this end did not run
            // (stopped, paused, starved), not that the peer fell silent: whatever the peer
            // sent meanwhile waits unread. The peer gets one interval from now.
            let late = now_ms - self.check_at;
            if now_ms >= self.silent_from && late > interval_ms {
                self.silent_from = now_ms.saturating_add(interval_ms);
                self.check_at = self.silent_from;
            } else if now_ms >= self.silent_from {
                self.silent = true;
            } else {
                self.check_at = self.silent_from;
            }
        }
        if self.ping_at <= now_ms {
            self.ping_due = true;
            // The next one an interval from now, however late this one was: no burst of pings
            // to catch up. (At least a millisecond on: a zero interval must not spin.)
            self.ping_at = now_ms.saturating_add(interval_ms.max(1));
        }
    }
}

impl Session {
    /// Starts the keepalive at `now_ms`: a ping every `interval_ms`, the peer silent once
    /// nothing was heard from it for `timeout_ms` ([`Session::heard`]).
    pub fn start_keepalive(&mut self, keepalive: Keepalive, now_ms: u64) {
        let silent_from = now_ms.saturating_add(keepalive.timeout_ms);
        self.timers.keepalive = Some(KeepaliveTimers {
            config: keepalive,
            ping_at: now_ms.saturating_add(keepalive.interval_ms),
            ping_due: false,
            silent_from,
            check_at: silent_from,
            silent: false,
        });
    }

    /// Something arrived from the peer at `now_ms` (a message, a ping, a pong): it is alive.
    #[inline]
    pub fn heard(&mut self, now_ms: u64) {
        if let Some(keepalive) = &mut self.timers.keepalive {
            keepalive.silent_from = now_ms.saturating_add(keepalive.config.timeout_ms);
        }
    }

    /// The earliest deadline in the timer table (a dial's, the next ping, the silence check),
    /// for the caller's one timer; `None` when nothing is due ever.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.next()
    }

    /// Server: the earliest dial deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timers.dials.first().map(|(deadline, _)| *deadline)
    }

    /// Acts on every deadline at or before `now_ms`: fails the dials whose deadline passed
    /// (RESET `cancelled` to the agent, [`super::Event::DialFailed`] with `expired` locally),
    /// marks a ping due ([`Session::poll_ping`]) and checks the peer's silence
    /// ([`Session::peer_silent`]).
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.expire_dials(now_ms);
        if let Some(keepalive) = &mut self.timers.keepalive {
            keepalive.handle_timeout(now_ms);
        }
    }

    /// Whether a ping is due (once per ping): the caller sends one.
    pub fn poll_ping(&mut self) -> bool {
        self.timers
            .keepalive
            .as_mut()
            .is_some_and(|keepalive| std::mem::take(&mut keepalive.ping_due))
    }

    /// The keepalive timeout, once the peer stayed silent that long: the session is dead.
    pub fn peer_silent(&self) -> Option<u64> {
        self.timers
            .keepalive
            .as_ref()
            .filter(|keepalive| keepalive.silent)
            .map(|keepalive| keepalive.config.timeout_ms)
    }
}
