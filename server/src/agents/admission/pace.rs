//! How long handshaking peers have lately kept the server waiting *and then answered*: the
//! evidence the stall rule uses to tell a slow fleet from a slowloris.
//!
//! Every wait a peer ends by moving bytes is a sample. A peer that never answers never ends
//! its wait, so a flood of silent connections adds nothing; a fleet of slow agents (busy
//! nodes, long lossy links) fills the estimate with its own step times within the first
//! seconds of a storm. The estimate is a high quantile, so one agent on a terrible link does
//! not raise it for everyone, over the last one to two [`WINDOW`]s, so it follows the fleet
//! as it is now and falls back once the storm is over.
//!
//! Samples go into buckets a quarter of an octave wide (a quantile within 19 %), which keeps
//! recording and reading a few array operations under a lock taken once per answered wait.

use std::time::Duration;

use tokio::time::Instant;

/// How long one window of samples lasts; the estimate reads the current and the previous one.
pub(super) const WINDOW: Duration = Duration::from_secs(5);

/// The share of answered waits the estimate covers: the slowest 1 % is ignored.
const QUANTILE: f64 = 0.99;

/// Buckets per octave of milliseconds.
const PER_OCTAVE: f64 = 4.0;

/// Quarter-octaves from 1 ms: the last bucket holds everything from 2^15.75 ms (about 55 s) on,
/// past any backstop.
const BUCKETS: usize = 64;

/// Answered waits of the current and the previous window, by bucket.
#[derive(Debug)]
pub(super) struct Pace {
    windows: [[u32; BUCKETS]; 2],
    /// When the current window began.
    began: Instant,
}

impl Pace {
    pub(super) fn new(now: Instant) -> Pace {
        Pace {
            windows: [[0; BUCKETS]; 2],
            began: now,
        }
    }

    /// A peer answered after the server had waited `waited` for it.
    pub(super) fn record(&mut self, now: Instant, waited: Duration) {
        self.rotate(now);
        let bucket = &mut self.windows[0][bucket(waited)];
        *bucket = bucket.saturating_add(1);
    }

    /// The wait that [`QUANTILE`] of the recent answered waits stayed within (rounded up to
    /// its bucket's edge); `None` without any.
    pub(super) fn quantile(&mut self, now: Instant) -> Option<Duration> {
        self.rotate(now);
        let count = |i: usize| u64::from(self.windows[0][i]) + u64::from(self.windows[1][i]);
        let total: u64 = (0..BUCKETS).map(count).sum();
        // How many of the slowest may lie above the answer.
        let beyond = (total as f64 * (1.0 - QUANTILE)) as u64;
        let mut above = 0;
        for i in (0..BUCKETS).rev() {
            above += count(i);
            if above > beyond {
                return Some(upper_edge(i));
            }
        }
        None
    }

    /// Starts a new window when the current one is over; after two, nothing is left.
    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.began);
        if age < WINDOW {
            return;
        }
        self.windows[1] = if age < WINDOW * 2 {
            self.windows[0]
        } else {
            [0; BUCKETS]
        };
        self.windows[0] = [0; BUCKETS];
        self.began = now;
    }
}

fn bucket(waited: Duration) -> usize {
    let ms = waited.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        return 0;
    }
    ((ms.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1)
}

/// The longest wait bucket `i` holds.
fn upper_edge(i: usize) -> Duration {
    Duration::from_secs_f64(2f64.powf((i + 1) as f64 / PER_OCTAVE) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn buckets_cover_every_wait_and_their_edges_hold_them() {
        for ms in [
            0, 1, 2, 3, 500, 999, 1000, 2047, 2048, 4000, 30_000, 10_000_000,
        ] {
            let waited = MS * ms;
            let i = bucket(waited);
            assert!(i < BUCKETS);
            if i < BUCKETS - 1 {
                assert!(upper_edge(i) >= waited, "{waited:?} above bucket {i}");
                // Within a quarter octave of the truth.
                assert!(upper_edge(i) <= (waited.max(MS)).mul_f64(1.19) + MS);
            }
        }
    }

    #[test]
    fn nothing_answered_no_estimate() {
        let now = Instant::now();
        assert_eq!(Pace::new(now).quantile(now), None);
    }

    #[test]
    fn the_estimate_is_a_high_quantile_not_the_outlier() {
        let now = Instant::now();
        let mut pace = Pace::new(now);
        for i in 0..1000u32 {
            pace.record(now, MS * (1000 + i * 3));
        }
        // The slowest 1 % (one agent on a terrible link) does not count.
        for _ in 0..5 {
            pace.record(now, Duration::from_secs(40));
        }
        let estimate = pace.quantile(now).unwrap();
        assert!(
            estimate >= MS * 3970 && estimate <= MS * 4750,
            "estimate {estimate:?}"
        );
    }

    #[test]
    fn a_few_samples_give_their_slowest() {
        let now = Instant::now();
        let mut pace = Pace::new(now);
        pace.record(now, MS * 100);
        pace.record(now, MS * 3000);
        let estimate = pace.quantile(now).unwrap();
        assert!(estimate >= MS * 3000 && estimate <= MS * 3570);
    }

    #[test]
    fn samples_are_forgotten_after_two_windows() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        pace.record(start, Duration::from_secs(4));
        let later = start + WINDOW + MS;
        pace.record(later, MS * 10);
        // The previous window still counts.
        assert!(pace.quantile(later).unwrap() >= Duration::from_secs(4));
        let after = later + WINDOW + MS;
        // Only the 10 ms sample's window is left, now the previous one.
        assert!(pace.quantile(after).unwrap() < MS * 20);
        assert_eq!(pace.quantile(after + WINDOW * 2), None);
    }
}
