//! Checking that a timeout fired when its flag says: not early, and not far too late (an
//! ignored flag falls back to a default that is many times the value the test sets).

use std::time::Duration;

/// How much earlier than nominal an expiry may be seen: the process's clock starts a little
/// before the test's (at accept, at the signal).
const EARLY: Duration = Duration::from_millis(150);

/// Asserts that `elapsed`, the time until something set to take `nominal` happened, lies
/// between `nominal` and a small multiple of it: at most `3 × nominal + 1 s`.
pub fn assert_about(what: &str, elapsed: Duration, nominal: Duration) {
    let low = nominal.saturating_sub(EARLY);
    let high = nominal * 3 + Duration::from_secs(1);
    assert!(
        elapsed >= low && elapsed <= high,
        "{what} took {elapsed:?}, expected {nominal:?} (between {low:?} and {high:?})"
    );
}
