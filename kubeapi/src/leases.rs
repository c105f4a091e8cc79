//! Counting servers with Leases, with ANP's semantics so that either side can be swapped: each
//! server holds a Lease (`coordination.k8s.io/v1`) named after its id and labelled with
//! `--lease-label`, renews it well inside its duration, and deletes other servers' Leases that
//! expired; an agent counts the Leases matching `--lease-label-selector` whose `renewTime` (or
//! `acquireTime`) plus `leaseDurationSeconds` is still ahead, never fewer than 1, and keeps its
//! last good count while kube-apiserver cannot be reached.
//!
//! [`hold`] is the server's side, [`LeaseCount`] the agent's (a watch of the Leases kept in a
//! local store, counted when asked). A server that forwards to its peers also writes where
//! they reach it ([`PEER_ADDRESS_ANNOTATION`]), and may find its peers the same way
//! ([`LeaseCount::peer_addresses`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{ApiError, KubeApi};

/// Prefix of a server's Lease name; the server id follows.
pub const LEASE_NAME_PREFIX: &str = "bridgehead-server-";
/// ANP's defaults: `kube-system`, `k8s-app=konnectivity-server`, 30 s.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
pub const DEFAULT_LABEL: &str = "k8s-app=konnectivity-server";
pub const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// The field manager of the server's server-side apply.
const FIELD_MANAGER: &str = "bridgehead-server";
/// The annotation of a server's Lease that says where its peers reach it (`host:port`,
/// `--peer-advertise-address`).
pub const PEER_ADDRESS_ANNOTATION: &str = "bridgehead.io/peer-address";
/// Most expired Leases one garbage collection round deletes.
const MAX_REMOVED_PER_ROUND: usize = 50;

/// Whether `lease` is held at `now`: its last renewal (else its acquisition) plus its duration
/// is still ahead. A Lease without those fields is not.
pub fn is_valid(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let Some(last) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let Some(seconds) = spec.lease_duration_seconds else {
        return false;
    };
    last.0
        .checked_add(SignedDuration::from_secs(i64::from(seconds)))
        .is_ok_and(|until| until > now)
}

/// How many of `leases` are held at `now`.
pub fn count_valid<'a>(leases: impl IntoIterator<Item = &'a Lease>, now: Timestamp) -> usize {
    leases.into_iter().filter(|l| is_valid(l, now)).count()
}

/// The Lease name of server `server_id`, or why it cannot be one (Lease names are DNS
/// subdomains: lower case, digits, `-` and `.`).
pub fn lease_name(server_id: &str) -> Result<String, String> {
    let name = format!("{LEASE_NAME_PREFIX}{server_id}");
    if crate::labels::is_dns_subdomain(&name) {
        Ok(name)
    } else {
        Err(format!(
            "the Lease name {name:?} is not a DNS subdomain: with --enable-lease-controller, --server-id takes lower-case letters, digits, '-' and '.'"
        ))
    }
}

/// Where and how a server's Lease is kept.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// `--lease-namespace`.
    pub namespace: String,
    /// `--lease-label`, parsed.
    pub labels: BTreeMap<String, String>,
    /// The Lease's duration; it is renewed every third of it, and expired Leases are looked
    /// for every half of it.
    pub duration: Duration,
    /// Annotations written on the Lease ([`PEER_ADDRESS_ANNOTATION`]).
    pub annotations: BTreeMap<String, String>,
}

/// What [`hold`] reports, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The Lease was created or renewed.
    Renewed,
    /// Creating or renewing it failed.
    RenewFailed,
    /// An expired Lease of another server was deleted.
    Removed,
}

/// Holds server `holder`'s Lease until `stop`, then deletes it (so that agents count one
/// server fewer at once, not after its expiry). Errors are logged and reported to `observe`;
/// the loop goes on.
pub async fn hold(
    api: Arc<KubeApi>,
    settings: LeaseSettings,
    holder: String,
    name: String,
    stop: CancellationToken,
    observe: impl Fn(LeaseEvent) + Send,
) {
    let leases: Api<Lease> = Api::namespaced(api.client(), &settings.namespace);
    let acquired = Timestamp::now();
    let seconds = i32::try_from(settings.duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let mut renew = tokio::time::interval(settings.duration / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut collect = tokio::time::interval(settings.duration / 2);
    collect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let selector = crate::labels::selector(&settings.labels);
    let mut failing = false;
    info!(
        lease = %name,
        namespace = %settings.namespace,
        duration = ?settings.duration,
        "holding this server's Lease"
    );
    loop {
        tokio::select! {
            _ = renew.tick() => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(settings.namespace.clone()),
                        labels: Some(settings.labels.clone()),
                        annotations: (!settings.annotations.is_empty())
                            .then(|| settings.annotations.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(holder.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(acquired)),
                        renew_time: Some(MicroTime(Timestamp::now())),
                        ..LeaseSpec::default()
                    }),
                };
                let params = PatchParams::apply(FIELD_MANAGER).force();
                match api.call(leases.patch(&name, &params, &Patch::Apply(&lease))).await {
                    Ok(_) => {
                        if failing {
                            info!(lease = %name, "renewing the Lease works again");
                        }
                        failing = false;
                        observe(LeaseEvent::Renewed);
                    }
                    Err(error) => {
                        // Once per failing stretch: the API being away is one event.
                        if !failing {
                            warn!(lease = %name, %error, "renewing the Lease failed; retrying every renewal interval");
                        }
                        failing = true;
                        observe(LeaseEvent::RenewFailed);
                    }
                }
            }
            _ = collect.tick() => {
                let removed = remove_expired(&api, &leases, &selector, &name).await;
                for _ in 0..removed {
                    observe(LeaseEvent::Removed);
                }
            }
            () = stop.cancelled() => break,
        }
    }
    match api
        .call(leases.delete(&name, &DeleteParams::default()))
        .await
    {
        Ok(_) => info!(lease = %name, "deleted this server's Lease"),
        Err(error) => {
            warn!(lease = %name, %error, "could not delete this server's Lease; it expires by itself")
        }
    }
}

/// Deletes expired Leases matching `selector` other than `own` (at most
/// [`MAX_REMOVED_PER_ROUND`]), each only if unchanged since listed (a Lease renewed meanwhile
/// stays); returns how many went.
async fn remove_expired(api: &KubeApi, leases: &Api<Lease>, selector: &str, own: &str) -> usize {
    let listed = match api
        .call(leases.list(&ListParams::default().labels(selector)))
        .await
    {
        Ok(listed) => listed,
        Err(error) => {
            debug!(%error, "listing Leases to remove expired ones failed");
            return 0;
        }
    };
    let now = Timestamp::now();
    let mut removed = 0;
    for lease in listed.items.iter().filter(|l| !is_valid(l, now)) {
        let Some(name) = lease.metadata.name.as_deref() else {
            continue;
        };
        if name == own {
            continue;
        }
        if removed == MAX_REMOVED_PER_ROUND {
            info!("more expired Leases left for the next round");
            break;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.call(leases.delete(name, &params)).await {
            Ok(_) => {
                removed += 1;
                info!(lease = %name, "deleted an expired Lease of another server");
            }
            // Gone already, or renewed since the list: nothing to do.
            Err(ApiError::Status {
                code: 404 | 409, ..
            }) => {}
            Err(error) => debug!(lease = %name, %error, "deleting an expired Lease failed"),
        }
    }
    removed
}

/// The agent's count of valid server Leases: a watch keeps a local copy of the Leases that
/// match the selector; [`LeaseCount::count`] counts the valid ones at the time asked.
#[derive(Debug, Clone)]
pub struct LeaseCount {
    store: Store<Lease>,
    state: Arc<Mutex<CountState>>,
}

#[derive(Debug)]
struct CountState {
    /// The watch works (its last event was not an error) and has listed once.
    current: bool,
    /// The last count taken while current; 1 until then.
    last_good: usize,
}

impl LeaseCount {
    /// Starts watching the Leases in `namespace` matching `selector`, until `stop`.
    pub fn watch(
        api: &KubeApi,
        namespace: &str,
        selector: &str,
        stop: CancellationToken,
    ) -> LeaseCount {
        let leases: Api<Lease> = Api::namespaced(api.client(), namespace);
        let (store, writer) = reflector::store();
        let state = Arc::new(Mutex::new(CountState {
            current: false,
            last_good: 1,
        }));
        let config = watcher::Config::default().labels(selector);
        let events = watcher(leases, config).default_backoff().reflect(writer);
        let watching = state.clone();
        let namespace = namespace.to_owned();
        let selector = selector.to_owned();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let mut failing = false;
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    () = stop.cancelled() => return,
                };
                let Some(event) = event else { return };
                let mut state = watching.lock().unwrap_or_else(|p| p.into_inner());
                match event {
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(_) => {
                        if failing {
                            info!(%namespace, %selector, "watching server Leases works again");
                        }
                        failing = false;
                        state.current = true;
                    }
                    Err(error) => {
                        if !failing {
                            warn!(%namespace, %selector, %error, "watching server Leases failed; keeping the last count meanwhile");
                        }
                        failing = true;
                        state.current = false;
                    }
                }
            }
        });
        LeaseCount { store, state }
    }

    /// The number of valid Leases now, at least 1; the last good count while the watch is
    /// failing or has not listed yet.
    pub fn count(&self) -> usize {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.current {
            return state.last_good;
        }
        let leases = self.store.state();
        let count = count_valid(leases.iter().map(|l| &**l), Timestamp::now()).max(1);
        state.last_good = count;
        count
    }
}

impl LeaseCount {
    /// The addresses peers reach the other servers at: [`PEER_ADDRESS_ANNOTATION`] of every
    /// valid Lease but `own`'s (by name), in name order; a value that is no `host:port` is
    /// left out. Empty while the watch has not listed yet.
    pub fn peer_addresses(&self, own: &str) -> Vec<String> {
        let now = Timestamp::now();
        let mut leases: Vec<_> = self
            .store
            .state()
            .into_iter()
            .filter(|lease| lease.metadata.name.as_deref() != Some(own))
            .filter(|lease| is_valid(lease, now))
            .collect();
        leases.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        leases
            .iter()
            .filter_map(|lease| {
                lease
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(PEER_ADDRESS_ANNOTATION)
            })
            .filter(|address| {
                address
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renew: Option<i64>, acquire: Option<i64>, duration: Option<i32>) -> Lease {
        let at = |secs: i64| MicroTime(Timestamp::from_second(secs).unwrap());
        Lease {
            spec: Some(LeaseSpec {
                renew_time: renew.map(at),
                acquire_time: acquire.map(at),
                lease_duration_seconds: duration,
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn validity_is_renewal_or_acquisition_plus_duration() {
        let now = Timestamp::from_second(1_000).unwrap();
        // Renewed 10 s ago for 30 s: valid; 31 s ago: expired; exactly 30 s ago: expired
        // (ANP: renewTime + duration must be after now).
        assert!(is_valid(&lease(Some(990), None, Some(30)), now));
        assert!(!is_valid(&lease(Some(969), None, Some(30)), now));
        assert!(!is_valid(&lease(Some(970), None, Some(30)), now));
        // No renewal: the acquisition counts.
        assert!(is_valid(&lease(None, Some(990), Some(30)), now));
        // The renewal wins over an old acquisition.
        assert!(is_valid(&lease(Some(990), Some(100), Some(30)), now));
        // Missing fields: not valid (ANP dereferences a nil duration).
        assert!(!is_valid(&lease(None, None, Some(30)), now));
        assert!(!is_valid(&lease(Some(990), None, None), now));
        assert!(!is_valid(&Lease::default(), now));
        let all = [
            lease(Some(990), None, Some(30)),
            lease(Some(500), None, Some(30)),
            lease(None, Some(995), Some(10)),
        ];
        assert_eq!(count_valid(&all, now), 2);
    }

    #[test]
    fn lease_names() {
        assert_eq!(lease_name("s0").unwrap(), "bridgehead-server-s0");
        assert_eq!(
            lease_name("1b4e28ba-2fa1-41d2-883f-0016d3cca427").unwrap(),
            "bridgehead-server-1b4e28ba-2fa1-41d2-883f-0016d3cca427"
        );
        assert_eq!(
            lease_name("cp-1.example").unwrap(),
            "bridgehead-server-cp-1.example"
        );
        for bad in ["CP1", "a_b", "a:b", "x-", "a..b"] {
            let error = lease_name(bad).unwrap_err();
            assert!(error.contains("--server-id"), "{bad}: {error}");
        }
    }
}
