//! Reconnect delays: exponential backoff with jitter, so a fleet of agents that lost their
//! server does not come back in lockstep.

use std::time::Duration;

use rand::Rng;

/// Each delay is the current base, moved at random by up to this fraction either way.
pub const JITTER: f64 = 0.2;

/// Exponential backoff: the base starts at `initial`, doubles after every delay handed out, and
/// stops growing at `cap`. Delays are the base ± [`JITTER`], never above `cap`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    base: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and growing up to `cap` (`cap` is raised to `initial` if
    /// below it).
    pub fn new(initial: Duration, cap: Duration) -> Backoff {
        Backoff {
            initial,
            cap: cap.max(initial),
            base: initial,
        }
    }

    /// The delay before the next attempt; the base doubles for the one after.
    pub fn next_delay<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let delay = jitter(self.base, rng).min(self.cap);
        self.base = self.base.saturating_mul(2).min(self.cap);
        delay
    }

    /// Back to `initial`: the last session was healthy.
    pub fn reset(&mut self) {
        self.base = self.initial;
    }

    /// The base the next delay is drawn around.
    pub fn base(&self) -> Duration {
        self.base
    }
}

/// `base` scaled by a uniform factor in `[1 - JITTER, 1 + JITTER]`.
pub fn jitter<R: Rng + ?Sized>(base: Duration, rng: &mut R) -> Duration {
    let factor = rng.random_range((1.0 - JITTER)..=(1.0 + JITTER));
    base.mul_f64(factor)
}
