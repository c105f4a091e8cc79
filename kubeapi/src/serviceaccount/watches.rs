//! The watches behind the liveness rules, with kube-rs's watcher: the agent service account's
//! pods in its namespace (metadata only, field selector `spec.serviceAccountName`), the service
//! account itself (metadata only), and, for identity binding, the nodes trimmed to their names
//! and addresses. Each runs until stopped; a failed watch is started again from a fresh list
//! after a backoff, so that "in sync" is always a list that completed (a resumed watch that
//! sees no change says nothing), and what it lists replaces the table at once.
//!
//! The list is a streaming list (one watch request with `sendInitialEvents`, kube-apiserver's
//! WatchList, on by default since 1.34) where kube-apiserver serves them: a paged list costs a
//! request per 500 objects, so a restarted server in a 10,000-node cluster would ask 20 times
//! for the nodes alone. A kube-apiserver that refuses `sendInitialEvents` (older, or the
//! feature gate off) gets paged lists from then on, at once and without counting a failure.

use std::future::Future;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::liveness::{Change, Entry};
use crate::KubeApi;

const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// How long kube-apiserver keeps one watch request open before the watcher makes the next
/// (resuming, no list). kube-rs gives up on a watch silent for this plus a few seconds, so a
/// connection that died without a word is noticed within about this long rather than the
/// default five minutes, in which the state would look in sync and be old.
const WATCH_TIMEOUT_SECS: u32 = 60;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How a watch's first attempt ended, for the startup line.
#[derive(Debug, Clone)]
pub(crate) enum FirstList {
    Listed,
    Forbidden,
    Failed(String),
}

/// The pods of `account` in `namespace`.
pub(crate) fn pods(
    api: &KubeApi,
    namespace: &str,
    account: &str,
) -> impl Fn(Listing) -> WatchStream<PartialObjectMeta<Pod>> {
    // Metadata only: an `Api` of `PartialObjectMeta` asks for it.
    let pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(api.client(), namespace);
    let config = watcher::Config::default()
        .fields(&format!("spec.serviceAccountName={account}"))
        .timeout(WATCH_TIMEOUT_SECS)
        .any_semantic();
    move |listing| Box::pin(watcher::watcher(pods.clone(), listing.apply(&config)))
}

/// Service account `account` in `namespace`.
pub(crate) fn account(
    api: &KubeApi,
    namespace: &str,
    account: &str,
) -> impl Fn(Listing) -> WatchStream<PartialObjectMeta<ServiceAccount>> {
    let accounts: Api<PartialObjectMeta<ServiceAccount>> = Api::namespaced(api.client(), namespace);
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={account}"))
        .timeout(WATCH_TIMEOUT_SECS)
        .any_semantic();
    move |listing| Box::pin(watcher::watcher(accounts.clone(), listing.apply(&config)))
}

/// Every node.
pub(crate) fn nodes(api: &KubeApi) -> impl Fn(Listing) -> WatchStream<Node> {
    let nodes: Api<Node> = Api::all(api.client());
    let config = watcher::Config::default()
        .timeout(WATCH_TIMEOUT_SECS)
        .any_semantic();
    move |listing| Box::pin(watcher::watcher(nodes.clone(), listing.apply(&config)))
}

/// How a watch gets its first state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    /// A streaming list: one watch request whose first events are the current objects.
    Streaming,
    /// A list in pages, then a watch.
    Paged,
}

impl Listing {
    fn apply(self, config: &watcher::Config) -> watcher::Config {
        match self {
            Listing::Streaming => config.clone().streaming_lists(),
            Listing::Paged => config.clone(),
        }
    }
}

pub(crate) type WatchStream<K> =
    std::pin::Pin<Box<dyn Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

/// A pod's or service account's name and UID, and when its deletion was asked.
pub(crate) fn entry(metadata: &ObjectMeta) -> Option<(String, Entry)> {
    Some((
        metadata.name.clone()?,
        Entry {
            uid: metadata.uid.clone()?,
            deleting_since: metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
        },
    ))
}

/// A node's name, then every address in its status (as the server binds identities).
pub(crate) fn node_addresses(node: &Node) -> Option<(String, Vec<String>)> {
    let name = node.metadata.name.clone()?;
    let mut addresses = vec![name.clone()];
    let listed = node
        .status
        .as_ref()
        .and_then(|status| status.addresses.as_ref());
    addresses.extend(listed.into_iter().flatten().map(|a| a.address.clone()));
    Some((name, addresses))
}

/// Follows the watch `start` makes until `stop`: each event, turned into a [`Change`] by
/// `convert`, goes to `apply`; the first attempt's end goes to `first`.
pub(crate) async fn follow<K, V, F>(
    what: &'static str,
    start: impl Fn(Listing) -> WatchStream<K>,
    convert: impl Fn(&K) -> Option<(String, V)>,
    apply: impl Fn(Change<V>),
    first: impl FnOnce(FirstList) -> F,
    stop: CancellationToken,
) where
    F: Future<Output = ()>,
{
    let mut first = Some(first);
    let mut backoff = MIN_BACKOFF;
    let mut failing = false;
    let mut listing = Listing::Streaming;
    'watch: loop {
        let mut events = start(listing);
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = stop.cancelled() => return,
            };
            let error = match event {
                Some(Ok(Event::Init)) => {
                    apply(Change::Relist);
                    continue;
                }
                Some(Ok(Event::InitApply(object))) => {
                    if let Some((name, value)) = convert(&object) {
                        apply(Change::Listing(name, value));
                    }
                    continue;
                }
                Some(Ok(Event::InitDone)) => {
                    apply(Change::Listed);
                    backoff = MIN_BACKOFF;
                    if let Some(first) = first.take() {
                        first(FirstList::Listed).await;
                    } else if failing {
                        info!(watch = what, "watching for token verification works again");
                    }
                    failing = false;
                    continue;
                }
                Some(Ok(Event::Apply(object))) => {
                    if let Some((name, value)) = convert(&object) {
                        apply(Change::Applied(name, value));
                    }
                    continue;
                }
                Some(Ok(Event::Delete(object))) => {
                    if let Some((name, _)) = convert(&object) {
                        apply(Change::Deleted(name));
                    }
                    continue;
                }
                Some(Err(error)) if listing == Listing::Streaming && refuses_streaming(&error) => {
                    info!(watch = what, %error, "kube-apiserver serves no streaming lists (WatchList): listing in pages");
                    listing = Listing::Paged;
                    continue 'watch;
                }
                Some(Err(error)) => error,
                None => {
                    apply(Change::Failed);
                    break;
                }
            };
            apply(Change::Failed);
            if let Some(first) = first.take() {
                let outcome = if is_forbidden(&error) {
                    FirstList::Forbidden
                } else {
                    FirstList::Failed(error.to_string())
                };
                first(outcome).await;
            } else if !failing {
                warn!(watch = what, %error, "watching for token verification failed; listing again after a backoff");
            } else {
                debug!(watch = what, %error, "watching for token verification failed again");
            }
            failing = true;
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Whether kube-apiserver refused a streaming list's request itself (`sendInitialEvents` is
/// invalid without its WatchList feature: 422; older ones: 400), rather than failing it.
fn refuses_streaming(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) if matches!(status.code, 400 | 422)
    )
}

fn is_forbidden(error: &watcher::Error) -> bool {
    let api = match error {
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => match error {
            kube::Error::Api(status) => status.code,
            _ => 0,
        },
        watcher::Error::WatchError(status) => status.code,
        watcher::Error::NoResourceVersion => 0,
    };
    matches!(api, 401 | 403)
}
