//! Reconnect backoff: doubling, the cap, the jitter bounds, reset.

use std::time::Duration;

use bridgehead_agent::backoff::{jitter, Backoff, JITTER};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn within(delay: Duration, base: Duration) -> bool {
    let lo = base.mul_f64(1.0 - JITTER);
    let hi = base.mul_f64(1.0 + JITTER);
    delay >= lo && delay <= hi
}

#[test]
fn doubles_up_to_the_cap_with_jitter() {
    let mut rng = StdRng::seed_from_u64(7);
    let cap = Duration::from_secs(30);
    let mut backoff = Backoff::new(Duration::from_secs(1), cap);
    let bases = [1, 2, 4, 8, 16, 30, 30, 30, 30];
    for (i, base) in bases.into_iter().enumerate() {
        let base = Duration::from_secs(base);
        assert_eq!(backoff.base(), base, "attempt {i}");
        let delay = backoff.next_delay(&mut rng);
        assert!(
            within(delay, base),
            "attempt {i}: {delay:?} around {base:?}"
        );
        assert!(delay <= cap, "attempt {i}: {delay:?} above the cap");
    }
}

#[test]
fn never_above_the_cap() {
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..10 {
            assert!(backoff.next_delay(&mut rng) <= Duration::from_secs(1));
        }
        // At the cap the jitter only goes down.
        let at_cap = backoff.next_delay(&mut rng);
        assert!(at_cap >= Duration::from_millis(800), "{at_cap:?}");
    }
}

#[test]
fn reset_starts_over() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    for _ in 0..5 {
        backoff.next_delay(&mut rng);
    }
    assert_eq!(backoff.base(), Duration::from_secs(30));
    backoff.reset();
    assert_eq!(backoff.base(), Duration::from_secs(1));
    assert!(within(backoff.next_delay(&mut rng), Duration::from_secs(1)));
}

#[test]
fn cap_below_initial_is_raised() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
    for _ in 0..3 {
        assert!(backoff.next_delay(&mut rng) <= Duration::from_secs(5));
    }
}

#[test]
fn jitter_spreads_both_ways() {
    let mut rng = StdRng::seed_from_u64(42);
    let base = Duration::from_secs(10);
    let delays: Vec<Duration> = (0..1000).map(|_| jitter(base, &mut rng)).collect();
    assert!(delays.iter().all(|d| within(*d, base)));
    assert!(delays.iter().any(|d| *d < Duration::from_secs(9)));
    assert!(delays.iter().any(|d| *d > Duration::from_secs(11)));
    // Deterministic for a seed.
    let mut again = StdRng::seed_from_u64(42);
    assert_eq!(jitter(base, &mut again), delays[0]);
}
