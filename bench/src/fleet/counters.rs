//! What a simulator process counts, and the snapshot it reports: attempts, sessions, failed
//! attempts by kind, dials and tunnels. Snapshots of several processes add up; two snapshots
//! of the same processes subtract into what happened between them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The live counters of one simulator process, shared by its agents.
#[derive(Debug, Default)]
pub struct Counters {
    attempts: AtomicU64,
    connected: AtomicU64,
    up: AtomicU64,
    drained: AtomicU64,
    lost: AtomicU64,
    hints: AtomicU64,
    duplicates: AtomicU64,
    dials: AtomicU64,
    misrouted: AtomicU64,
    echoed: AtomicU64,
    /// Failed attempts by kind ([`super::connect::Failure::kind`]); a failure is the slow
    /// path, so a lock is fine here.
    failures: Mutex<BTreeMap<String, u64>>,
    /// Failed attempts other than refused ones by when they began ([`STARTS_BUCKET_MS`]).
    failed_starts: Mutex<BTreeMap<u64, u64>>,
}

/// The width of [`Snapshot::failed_starts`]'s buckets, in milliseconds.
pub const STARTS_BUCKET_MS: u64 = 10;

/// The bucket of `at` in [`Snapshot::failed_starts`].
pub fn starts_bucket(at: std::time::SystemTime) -> u64 {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms / STARTS_BUCKET_MS
}

/// A point-in-time copy of one or more processes' [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Connection attempts started.
    pub attempts: u64,
    /// Attempts that ended in an upgraded session.
    pub connected: u64,
    /// Sessions live now and not draining (a gauge: it does not subtract).
    pub up: u64,
    /// Sessions whose server announced DRAIN.
    pub drained: u64,
    /// Sessions that ended without a DRAIN first (the server died or cut them).
    pub lost: u64,
    /// Retry hints (`Retry-After`) honoured.
    pub hints: u64,
    /// Attempts answered 409: a server the agent holds already (several servers behind one
    /// address; not a failure).
    pub duplicates: u64,
    /// Dials the server asked for.
    pub dials: u64,
    /// Dials for a host that is not the agent's own: a routing error.
    pub misrouted: u64,
    /// Bytes echoed back through tunnels.
    pub echoed: u64,
    /// Failed attempts by kind (`refused`, `reset:tls`, `timeout:tls`, `http:503`, ...).
    pub failures: BTreeMap<String, u64>,
    /// Failed attempts but refused ones, by the wall-clock bucket ([`starts_bucket`]) in which
    /// they began: the processes share the clock, so a restart can tell the attempts begun
    /// before its new server listened.
    pub failed_starts: BTreeMap<u64, u64>,
}

impl Counters {
    pub fn attempt(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// A session is up: counted until [`UpGuard`] drops.
    pub fn connected(&self) -> UpGuard<'_> {
        self.connected.fetch_add(1, Ordering::Relaxed);
        self.up.fetch_add(1, Ordering::Relaxed);
        UpGuard(self)
    }

    pub fn drained(&self) {
        self.drained.fetch_add(1, Ordering::Relaxed);
    }

    pub fn lost(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
    }

    pub fn hint(&self) {
        self.hints.fetch_add(1, Ordering::Relaxed);
    }

    pub fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dial(&self) {
        self.dials.fetch_add(1, Ordering::Relaxed);
    }

    pub fn misrouted(&self) {
        self.misrouted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn echoed(&self, bytes: usize) {
        self.echoed.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// One failed attempt of `kind`.
    pub fn failed(&self, kind: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        *failures.entry(kind.to_owned()).or_default() += 1;
    }

    /// One failed attempt of `kind` that began at `began`.
    pub fn failed_began(&self, kind: &str, began: std::time::SystemTime) {
        self.failed(kind);
        if kind != "refused" {
            let mut starts = self.failed_starts.lock().unwrap_or_else(|p| p.into_inner());
            *starts.entry(starts_bucket(began)).or_default() += 1;
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            attempts: self.attempts.load(Ordering::Relaxed),
            connected: self.connected.load(Ordering::Relaxed),
            up: self.up.load(Ordering::Relaxed),
            drained: self.drained.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            hints: self.hints.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            dials: self.dials.load(Ordering::Relaxed),
            misrouted: self.misrouted.load(Ordering::Relaxed),
            echoed: self.echoed.load(Ordering::Relaxed),
            failures: self
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            failed_starts: self
                .failed_starts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// Keeps a session counted in [`Snapshot::up`] while it lives and is not draining.
#[derive(Debug)]
pub struct UpGuard<'a>(&'a Counters);

impl Drop for UpGuard<'_> {
    fn drop(&mut self) {
        self.0.up.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Snapshot {
    /// The sum of several processes' snapshots.
    pub fn sum<'a>(snapshots: impl IntoIterator<Item = &'a Snapshot>) -> Snapshot {
        let mut total = Snapshot::default();
        for s in snapshots {
            total.attempts += s.attempts;
            total.connected += s.connected;
            total.up += s.up;
            total.drained += s.drained;
            total.lost += s.lost;
            total.hints += s.hints;
            total.duplicates += s.duplicates;
            total.dials += s.dials;
            total.misrouted += s.misrouted;
            total.echoed += s.echoed;
            for (kind, n) in &s.failures {
                *total.failures.entry(kind.clone()).or_default() += n;
            }
            for (bucket, n) in &s.failed_starts {
                *total.failed_starts.entry(*bucket).or_default() += n;
            }
        }
        total
    }

    /// What happened since `earlier` (counters subtract; `up` is this snapshot's).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let mut failures = self.failures.clone();
        for (kind, n) in failures.iter_mut() {
            *n -= earlier.failures.get(kind).copied().unwrap_or(0).min(*n);
        }
        failures.retain(|_, n| *n > 0);
        let mut failed_starts = self.failed_starts.clone();
        for (bucket, n) in failed_starts.iter_mut() {
            *n -= earlier
                .failed_starts
                .get(bucket)
                .copied()
                .unwrap_or(0)
                .min(*n);
        }
        failed_starts.retain(|_, n| *n > 0);
        Snapshot {
            attempts: self.attempts.saturating_sub(earlier.attempts),
            connected: self.connected.saturating_sub(earlier.connected),
            up: self.up,
            drained: self.drained.saturating_sub(earlier.drained),
            lost: self.lost.saturating_sub(earlier.lost),
            hints: self.hints.saturating_sub(earlier.hints),
            duplicates: self.duplicates.saturating_sub(earlier.duplicates),
            dials: self.dials.saturating_sub(earlier.dials),
            misrouted: self.misrouted.saturating_sub(earlier.misrouted),
            echoed: self.echoed.saturating_sub(earlier.echoed),
            failures,
            failed_starts,
        }
    }

    /// Failed attempts (refused ones aside) that began before `at`.
    pub fn failed_before(&self, at: std::time::SystemTime) -> u64 {
        self.failed_starts
            .range(..starts_bucket(at))
            .map(|(_, n)| n)
            .sum()
    }

    /// Failed attempts of every kind.
    pub fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    /// Failed attempts of `kind`.
    pub fn failed_of(&self, kind: &str) -> u64 {
        self.failures.get(kind).copied().unwrap_or(0)
    }

    /// `reset 12, timeout:tls 3` (most first), or `none`.
    pub fn failures_text(&self) -> String {
        super::probe::outcomes_text(&self.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_add_up_and_subtract() {
        let counters = Counters::default();
        counters.attempt();
        counters.failed("refused");
        let before = counters.snapshot();
        counters.attempt();
        counters.attempt();
        counters.failed("reset");
        counters.failed("refused");
        let guard = counters.connected();
        let after = counters.snapshot();
        let delta = after.since(&before);
        assert_eq!(delta.attempts, 2);
        assert_eq!(delta.connected, 1);
        assert_eq!(delta.up, 1);
        assert_eq!(delta.failed(), 2);
        assert_eq!(delta.failures_text(), "refused 1, reset 1");
        drop(guard);
        assert_eq!(counters.snapshot().up, 0);
        let total = Snapshot::sum([&after, &after]);
        assert_eq!(total.attempts, 6);
        assert_eq!(total.failed_of("refused"), 4);
        assert_eq!(Snapshot::default().failures_text(), "none");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        counters.failed_began("reset:tls", t);
        counters.failed_began("refused", t);
        let later = counters.snapshot().since(&after);
        assert_eq!(later.failed(), 2);
        assert_eq!(later.failed_before(t), 0);
        assert_eq!(
            later.failed_before(t + std::time::Duration::from_millis(10)),
            1
        );
    }
}
