//! What the watches saw, kept as kube-apiserver's own informers keep it for its token checks:
//! objects by name with their UID and deletion time, the UIDs seen deleted lately, and how
//! current each watch is. Pure: changes and times come in as values, so every rule is tested
//! at its boundary.
//!
//! The rules (k8s.io/kubernetes `pkg/serviceaccount/claims.go`): the token's pod and service
//! account must exist with the UIDs the token names; one marked for deletion (a
//! `deletionTimestamp`) more than [`LEEWAY_SECS`] ago counts as gone. A watch can lag the
//! token it judges (the pod made, its token issued, and the token presented before the watch
//! delivered the pod), so an object that is missing counts as gone only when seen deleted, or
//! when the token was issued well before the watch was last known in sync
//! ([`NOT_SEEN_GRACE_SECS`]); otherwise the token goes to TokenReview.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::claims::LEEWAY_SECS;

/// How long after its issue a token's object may still be missing from a watch in sync
/// without counting as gone: the watch's delivery lag, with room.
pub const NOT_SEEN_GRACE_SECS: i64 = 10;
/// How long a deleted object's UID is remembered: past [`NOT_SEEN_GRACE_SECS`], a missing
/// object's tokens count as gone by their age anyway.
const TOMBSTONE_TTL: Duration = Duration::from_secs(60);
/// Most deleted UIDs remembered (a mass deletion beyond it leaves the youngest tokens to
/// TokenReview, never lets one in).
const MAX_TOMBSTONES: usize = 16 * 1024;

/// One change a watch reports, free of the API types.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change<V> {
    /// A (re)list starts: what follows replaces the table at [`Change::Listed`].
    Relist,
    /// An object of the (re)list.
    Listing(String, V),
    /// The (re)list is complete: the watch is in sync.
    Listed,
    /// An object was added or changed.
    Applied(String, V),
    /// An object was deleted.
    Deleted(String),
    /// The watch failed; the table stays as it was until the next [`Change::Listed`].
    Failed,
}

/// A table of watched objects by name, and the watch's health.
#[derive(Debug)]
pub(crate) struct Table<V> {
    by_name: HashMap<String, V>,
    listing: Option<HashMap<String, V>>,
    /// `None` until the first list completes.
    health: Option<Health>,
}

#[derive(Debug, Clone, Copy)]
enum Health {
    InSync,
    /// Failed at this instant and not listed since.
    FailingSince(Instant),
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            by_name: HashMap::new(),
            listing: None,
            health: None,
        }
    }
}

impl<V: Clone> Table<V> {
    /// Applies `change` at `now`; returns the values it removed or replaced.
    pub(crate) fn apply(&mut self, change: Change<V>, now: Instant) -> Vec<V> {
        match change {
            Change::Relist => {
                self.listing = Some(HashMap::new());
                Vec::new()
            }
            Change::Listing(name, value) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(name, value);
                }
                Vec::new()
            }
            Change::Listed => {
                let Some(listing) = self.listing.take() else {
                    return Vec::new();
                };
                let old = std::mem::replace(&mut self.by_name, listing);
                self.health = Some(Health::InSync);
                old.into_values().collect()
            }
            Change::Applied(name, value) => self.by_name.insert(name, value).into_iter().collect(),
            Change::Deleted(name) => self.by_name.remove(&name).into_iter().collect(),
            Change::Failed => {
                self.listing = None;
                if let Some(Health::InSync) = self.health {
                    self.health = Some(Health::FailingSince(now));
                }
                Vec::new()
            }
        }
    }

    /// How long ago the watch was last known in sync: zero while it is, `None` before its
    /// first list.
    pub(crate) fn age(&self, now: Instant) -> Option<Duration> {
        match self.health? {
            Health::InSync => Some(Duration::ZERO),
            Health::FailingSince(at) => Some(now.saturating_duration_since(at)),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&V> {
        self.by_name.get(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }
}

/// A watched object with a UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) uid: String,
    /// Its `deletionTimestamp`, in seconds since the epoch.
    pub(crate) deleting_since: Option<i64>,
}

/// Whether a token's object still stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    Live,
    Gone,
    /// Missing, but the token is young enough that the watch may not have delivered it.
    NotSeen,
}

/// Objects with UIDs (pods, service accounts), and the UIDs seen deleted.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    table: Table<Entry>,
    tombstones: HashMap<String, Instant>,
}

impl Objects {
    /// Applies `change` at `now`; whether it may have revoked tokens (an object deleted, or
    /// marked for deletion), for callers that recheck what they let in.
    pub(crate) fn apply(&mut self, change: Change<Entry>, now: Instant) -> bool {
        // A replaced entry whose UID is still the same is no deletion; one newly marked for
        // deletion may become one with time.
        let (kept, marked) = match &change {
            Change::Applied(name, entry) => {
                let old = self.table.get(name).filter(|old| old.uid == entry.uid);
                (
                    old.map(|old| old.uid.clone()),
                    entry.deleting_since.is_some()
                        && old.is_some_and(|old| old.deleting_since.is_none()),
                )
            }
            _ => (None, false),
        };
        let listed = matches!(change, Change::Listed);
        let removed = self.table.apply(change, now);
        let mut gone: Vec<String> = removed
            .into_iter()
            .map(|entry| entry.uid)
            .filter(|uid| kept.as_ref() != Some(uid))
            .collect();
        if listed {
            // After a relist, only UIDs no longer listed are gone.
            let standing: std::collections::HashSet<&str> = self
                .table
                .by_name
                .values()
                .map(|entry| entry.uid.as_str())
                .collect();
            gone.retain(|uid| !standing.contains(uid.as_str()));
        }
        if gone.is_empty() {
            return marked;
        }
        if self.tombstones.len() + gone.len() > MAX_TOMBSTONES {
            self.tombstones
                .retain(|_, at| now.saturating_duration_since(*at) < TOMBSTONE_TTL);
        }
        for uid in gone {
            if self.tombstones.len() < MAX_TOMBSTONES {
                self.tombstones.insert(uid, now);
            }
        }
        true
    }

    pub(crate) fn age(&self, now: Instant) -> Option<Duration> {
        self.table.age(now)
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether object `name` with `uid` stands at `now_unix`, for a token issued at
    /// `issued_at`. The watch must have listed: `now` gives its age.
    pub(crate) fn presence(
        &self,
        name: &str,
        uid: &str,
        issued_at: Option<i64>,
        now_unix: i64,
        now: Instant,
    ) -> Presence {
        if let Some(entry) = self.table.get(name).filter(|entry| entry.uid == uid) {
            return match entry.deleting_since {
                Some(since) if since < now_unix - LEEWAY_SECS => Presence::Gone,
                _ => Presence::Live,
            };
        }
        let seen_deleted = self
            .tombstones
            .get(uid)
            .is_some_and(|at| now.saturating_duration_since(*at) < TOMBSTONE_TTL);
        if seen_deleted {
            return Presence::Gone;
        }
        // When the watch was last in sync, in the tokens' clock.
        let age = self.table.age(now).unwrap_or(Duration::MAX);
        let in_sync_at = now_unix.saturating_sub(i64::try_from(age.as_secs()).unwrap_or(i64::MAX));
        match issued_at {
            Some(issued) if issued + NOT_SEEN_GRACE_SECS < in_sync_at => Presence::Gone,
            _ => Presence::NotSeen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn entry(uid: &str, deleting_since: Option<i64>) -> Entry {
        Entry {
            uid: uid.into(),
            deleting_since,
        }
    }

    fn listed(objects: &mut Objects, entries: &[(&str, Entry)], now: Instant) {
        objects.apply(Change::Relist, now);
        for (name, entry) in entries {
            objects.apply(Change::Listing((*name).into(), entry.clone()), now);
        }
        objects.apply(Change::Listed, now);
    }

    #[test]
    fn an_object_stands_until_a_minute_past_its_deletion() {
        let now = Instant::now();
        let mut pods = Objects::default();
        listed(&mut pods, &[("p", entry("u1", None))], now);
        let presence = |pods: &Objects| pods.presence("p", "u1", Some(NOW - 3600), NOW, now);
        assert_eq!(presence(&pods), Presence::Live);
        // Marked for deletion exactly a minute ago: still counts (kube-apiserver: "before").
        pods.apply(
            Change::Applied("p".into(), entry("u1", Some(NOW - 60))),
            now,
        );
        assert_eq!(presence(&pods), Presence::Live);
        pods.apply(
            Change::Applied("p".into(), entry("u1", Some(NOW - 61))),
            now,
        );
        assert_eq!(presence(&pods), Presence::Gone);
        // A deletion in the future (a grace period) counts as standing.
        pods.apply(
            Change::Applied("p".into(), entry("u1", Some(NOW + 30))),
            now,
        );
        assert_eq!(presence(&pods), Presence::Live);
        // Another UID under the same name: the token's pod is gone (its token is old).
        pods.apply(Change::Applied("p".into(), entry("u2", None)), now);
        assert_eq!(presence(&pods), Presence::Gone);
        assert_eq!(
            pods.presence("p", "u2", Some(NOW - 3600), NOW, now),
            Presence::Live
        );
    }

    #[test]
    fn a_missing_object_is_gone_when_seen_deleted_or_its_token_is_old_enough() {
        let now = Instant::now();
        let mut pods = Objects::default();
        listed(&mut pods, &[("p", entry("u1", None))], now);
        // Never seen, issued just now: the watch may lag; issued long before: gone.
        let fresh = Some(NOW - NOT_SEEN_GRACE_SECS);
        let old = Some(NOW - NOT_SEEN_GRACE_SECS - 1);
        assert_eq!(pods.presence("q", "u9", fresh, NOW, now), Presence::NotSeen);
        assert_eq!(pods.presence("q", "u9", old, NOW, now), Presence::Gone);
        assert_eq!(pods.presence("q", "u9", None, NOW, now), Presence::NotSeen);
        // Seen deleted: gone at once, however young the token.
        pods.apply(Change::Deleted("p".into()), now);
        assert_eq!(
            pods.presence("p", "u1", Some(NOW), NOW, now),
            Presence::Gone
        );
        // The memory of it fades; then its age decides.
        let later = now + TOMBSTONE_TTL;
        assert_eq!(
            pods.presence("p", "u1", Some(NOW), NOW, later),
            Presence::NotSeen
        );
    }

    #[test]
    fn a_failing_watch_judges_by_when_it_was_last_in_sync() {
        let start = Instant::now();
        let mut pods = Objects::default();
        assert_eq!(pods.age(start), None);
        listed(&mut pods, &[], start);
        assert_eq!(pods.age(start), Some(Duration::ZERO));
        pods.apply(Change::Failed, start);
        let now = start + Duration::from_secs(30);
        assert_eq!(pods.age(now), Some(Duration::from_secs(30)));
        // A pod made while the watch was down may be missing: a token issued 20 s ago is
        // younger than what the watch last saw, so it is not judged gone.
        assert_eq!(
            pods.presence("new", "u", Some(NOW - 20), NOW, now),
            Presence::NotSeen
        );
        assert_eq!(
            pods.presence("new", "u", Some(NOW - 41), NOW, now),
            Presence::Gone
        );
        // A failed relist leaves the table as it was; a complete one brings it in sync.
        pods.apply(Change::Relist, now);
        pods.apply(Change::Listing("new".into(), entry("u", None)), now);
        pods.apply(Change::Failed, now);
        assert_eq!(pods.len(), 0);
        assert_eq!(pods.age(now), Some(Duration::from_secs(30)));
        listed(&mut pods, &[("new", entry("u", None))], now);
        assert_eq!(pods.age(now), Some(Duration::ZERO));
        assert_eq!(
            pods.presence("new", "u", Some(NOW - 41), NOW, now),
            Presence::Live
        );
    }

    #[test]
    fn a_relist_tombstones_only_what_it_no_longer_lists() {
        let now = Instant::now();
        let mut pods = Objects::default();
        listed(
            &mut pods,
            &[("a", entry("ua", None)), ("b", entry("ub", None))],
            now,
        );
        // b was deleted while the watch was away; a is still there.
        pods.apply(Change::Relist, now);
        pods.apply(Change::Listing("a".into(), entry("ua", None)), now);
        assert!(pods.apply(Change::Listed, now), "the relist revoked b");
        assert_eq!(
            pods.presence("b", "ub", Some(NOW), NOW, now),
            Presence::Gone
        );
        assert_eq!(
            pods.presence("a", "ua", Some(NOW), NOW, now),
            Presence::Live
        );
        assert!(!pods.tombstones.contains_key("ua"));
        // A change to a standing pod is no deletion; its first deletion mark may revoke with
        // time, so it is reported, once.
        assert!(!pods.apply(Change::Applied("a".into(), entry("ua", None)), now));
        assert!(pods.apply(Change::Applied("a".into(), entry("ua", Some(NOW))), now));
        assert!(!pods.apply(Change::Applied("a".into(), entry("ua", Some(NOW))), now));
        assert!(!pods.tombstones.contains_key("ua"));
        assert!(pods.apply(Change::Deleted("a".into()), now));
        assert!(!pods.apply(Change::Deleted("a".into()), now));
    }

    #[test]
    fn tombstones_stay_bounded() {
        let now = Instant::now();
        let mut pods = Objects::default();
        listed(&mut pods, &[], now);
        for i in 0..MAX_TOMBSTONES + 100 {
            let name = format!("p{i}");
            pods.apply(
                Change::Applied(name.clone(), entry(&format!("u{i}"), None)),
                now,
            );
            pods.apply(Change::Deleted(name), now);
        }
        assert_eq!(pods.tombstones.len(), MAX_TOMBSTONES);
        // Old ones make room once they have faded.
        let later = now + TOMBSTONE_TTL;
        pods.apply(Change::Applied("x".into(), entry("ux", None)), later);
        pods.apply(Change::Deleted("x".into()), later);
        assert_eq!(pods.tombstones.len(), 1);
    }
}
