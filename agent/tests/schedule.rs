//! The search schedule: ×1.5 steps up to the cap, the jitter bounds, and each event's delay.

use std::time::Duration;

use bridgehead_agent::schedule::{jitter, spread, Schedule, FACTOR, JITTER};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn within(delay: Duration, base: Duration) -> bool {
    let lo = base.mul_f64(1.0 - JITTER);
    let hi = base.mul_f64(1.0 + JITTER);
    delay >= lo && delay <= hi
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn failures_grow_by_half_up_to_the_cap_with_jitter() {
    let mut rng = StdRng::seed_from_u64(7);
    let cap = Duration::from_secs(10);
    let mut schedule = Schedule::new(SECOND, cap);
    let mut expected = SECOND;
    for i in 0..12 {
        assert_eq!(schedule.base(), expected, "attempt {i}");
        let delay = schedule.after_failure(&mut rng);
        assert!(
            within(delay, expected),
            "attempt {i}: {delay:?} around {expected:?}"
        );
        assert!(delay <= cap, "attempt {i}: {delay:?} above the cap");
        expected = expected.mul_f64(FACTOR).min(cap);
    }
    assert_eq!(schedule.base(), cap);
    // 1, 1.5, 2.25, 3.375, 5.06, 7.59, then the cap.
    let mut steps = Schedule::new(SECOND, cap);
    let bases: Vec<u128> = (0..8)
        .map(|_| {
            let base = steps.base().as_millis();
            steps.after_failure(&mut rng);
            base
        })
        .collect();
    assert_eq!(bases, [1000, 1500, 2250, 3375, 5062, 7593, 10000, 10000]);
}

#[test]
fn never_above_the_cap() {
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut schedule = Schedule::new(Duration::from_millis(100), SECOND);
        for _ in 0..10 {
            assert!(schedule.after_failure(&mut rng) <= SECOND);
        }
        // At the cap the jitter only goes down.
        let at_cap = schedule.after_failure(&mut rng);
        assert!(at_cap >= Duration::from_millis(800), "{at_cap:?}");
    }
}

#[test]
fn a_success_starts_over() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut schedule = Schedule::new(SECOND, Duration::from_secs(30));
    for _ in 0..5 {
        schedule.after_failure(&mut rng);
    }
    assert!(schedule.base() > SECOND);
    let delay = schedule.after_success(&mut rng);
    assert!(within(delay, SECOND), "{delay:?}");
    assert_eq!(schedule.base(), SECOND);
}

#[test]
fn a_lost_session_is_looked_for_within_one_interval_from_the_first_step() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut schedule = Schedule::new(SECOND, Duration::from_secs(30));
    for _ in 0..5 {
        schedule.after_failure(&mut rng);
    }
    let delays: Vec<Duration> = (0..1000).map(|_| schedule.after_loss(&mut rng)).collect();
    assert!(delays.iter().all(|d| *d <= SECOND));
    // Spread over the whole interval, not bunched around one point.
    assert!(delays.iter().any(|d| *d < Duration::from_millis(100)));
    assert!(delays.iter().any(|d| *d > Duration::from_millis(900)));
    assert_eq!(schedule.base(), SECOND);
}

#[test]
fn a_drain_is_answered_within_a_quarter_interval_and_retried_fast() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut schedule = Schedule::new(SECOND, Duration::from_secs(30));
    let quarter = Duration::from_millis(250);
    for _ in 0..100 {
        assert!(schedule.after_drain(&mut rng) <= quarter);
    }
    assert_eq!(schedule.base(), quarter);
    let retry = schedule.after_failure(&mut rng);
    assert!(within(retry, quarter), "{retry:?}");
}

#[test]
fn cap_below_interval_is_raised() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut schedule = Schedule::new(Duration::from_secs(5), SECOND);
    for _ in 0..3 {
        assert!(schedule.after_failure(&mut rng) <= Duration::from_secs(5));
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
    assert!(spread(base, &mut again) <= base);
}
