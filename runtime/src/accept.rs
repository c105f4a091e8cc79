//! Accept loops that survive a flood: an accept error (out of descriptors, EMFILE) backs off
//! instead of spinning, and what a flood makes the server log is rate-limited.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an accept loop pauses after an error.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// Logs `error` (rate-limited by `limit`) and pauses [`BACKOFF`].
pub async fn failed(what: &str, error: &io::Error, limit: &RateLimit) {
    if let Some(suppressed) = limit.admit() {
        tracing::warn!(%error, suppressed, "{what}: accept failed");
    }
    tokio::time::sleep(BACKOFF).await;
}

/// At most `per_second` events a second get through; the rest are counted, and the count is
/// handed to the next event that gets through.
#[derive(Debug)]
pub struct RateLimit {
    per_second: u32,
    state: Mutex<(Instant, u32, u64)>,
}

impl RateLimit {
    pub fn new(per_second: u32) -> RateLimit {
        RateLimit {
            per_second,
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// `Some(suppressed since the last one)` when this event may be logged, `None` otherwise.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (window, count, suppressed) = &mut *state;
        if now.saturating_duration_since(*window) >= Duration::from_secs(1) {
            *window = now;
            *count = 0;
        }
        if *count < self.per_second {
            *count += 1;
            Some(std::mem::take(suppressed))
        } else {
            *suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_to_the_rate_and_the_rest_counted() {
        let limit = RateLimit::new(2);
        let start = Instant::now();
        assert_eq!(limit.admit_at(start), Some(0));
        assert_eq!(limit.admit_at(start), Some(0));
        for _ in 0..5 {
            assert_eq!(limit.admit_at(start), None);
        }
        assert_eq!(limit.admit_at(start + Duration::from_secs(1)), Some(5));
    }
}
