//! When the agent next looks for a server: ANP's steps (the base grows ×1.5 after each failed
//! attempt, up to `--sync-interval-cap`, back to `--sync-interval` after a success), with
//! jitter so that a fleet of agents hit by the same event does not come back in lockstep.
//!
//! Each event has its delay: a failed attempt waits the base ± [`JITTER`]; a success (a new
//! session, or the server said the agent holds it already) waits about one sync interval; a
//! lost session is looked for again anywhere within one sync interval; a server that drains
//! (it is being restarted or scaled down) is replaced fast, within a quarter of one, and the
//! attempts after it start from that quarter.

use std::time::Duration;

use rand::Rng;

/// Each jittered delay is its base moved at random by up to this fraction either way.
pub const JITTER: f64 = 0.2;
/// The base grows by this factor after each failed attempt (ANP's).
pub const FACTOR: f64 = 1.5;
/// After a drain, the first attempts come this much sooner than the sync interval.
pub const DRAIN_SPEEDUP: u32 = 4;

/// The delays between attempts to reach a server.
#[derive(Debug, Clone)]
pub struct Schedule {
    interval: Duration,
    cap: Duration,
    base: Duration,
}

impl Schedule {
    /// A schedule starting at `interval` (`--sync-interval`) and growing up to `cap`
    /// (`--sync-interval-cap`, raised to `interval` if below it).
    pub fn new(interval: Duration, cap: Duration) -> Schedule {
        Schedule {
            interval,
            cap: cap.max(interval),
            base: interval,
        }
    }

    /// An attempt failed: wait the base ± jitter (never above the cap); the next base is ×1.5.
    pub fn after_failure<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let delay = jitter(self.base, rng).min(self.cap);
        self.base = self.base.mul_f64(FACTOR).min(self.cap);
        delay
    }

    /// An attempt succeeded, or nothing needed doing: back to the first step, and look again
    /// after about one sync interval.
    pub fn after_success<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        self.base = self.interval;
        jitter(self.interval, rng)
    }

    /// A healthy session was lost: back to the first step, and the first attempt anywhere in
    /// one sync interval (a server's crash reaches all its agents at once; this spreads them).
    pub fn after_loss<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        self.base = self.interval;
        spread(self.interval, rng)
    }

    /// A server drains: its replacement may be listening already. The first attempt within a
    /// quarter of the sync interval, and failed attempts after it growing from there.
    pub fn after_drain<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        self.base = self.interval / DRAIN_SPEEDUP;
        spread(self.base, rng)
    }

    /// The base the next failure's delay is drawn around.
    pub fn base(&self) -> Duration {
        self.base
    }
}

/// `base` scaled by a uniform factor in `[1 - JITTER, 1 + JITTER]`.
pub fn jitter<R: Rng + ?Sized>(base: Duration, rng: &mut R) -> Duration {
    let factor = rng.random_range((1.0 - JITTER)..=(1.0 + JITTER));
    base.mul_f64(factor)
}

/// Uniform in `[0, up_to]`.
pub fn spread<R: Rng + ?Sized>(up_to: Duration, rng: &mut R) -> Duration {
    up_to.mul_f64(rng.random_range(0.0..=1.0))
}
