//! [`TokenVerifier`]: the keys and the watches kept current in the background, and the
//! verdict on a token from them, with one paced refetch of the keys when a token names a key
//! not seen.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::claims::Expected;
use super::discovery::{self, DiscoveryError};
use super::jwt::Token;
use super::keys::{KeyRing, SignatureCheck};
use super::liveness::Change;
use super::watches::{self, FirstList};
use super::{
    decide, At, Fallback, Freshness, Live, Outcome, Presence, Refusal, Step, Verified,
    VerifierSettings,
};
use crate::KubeApi;

/// How soon keys that could not be fetched are tried again.
const KEY_RETRY: Duration = Duration::from_secs(30);
/// How long the startup line waits for every part's first answer.
const STARTUP_REPORT: Duration = Duration::from_secs(30);

/// Verifies agents' tokens locally. Cheap to clone; the background work stops with the
/// token given to [`TokenVerifier::start`].
#[derive(Debug, Clone)]
pub struct TokenVerifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    api: Arc<KubeApi>,
    settings: VerifierSettings,
    expected: Expected,
    keys: Mutex<KeyRing>,
    /// One fetch of the keys at a time.
    fetching: tokio::sync::Mutex<()>,
    live: Mutex<Live>,
    /// Bumped on every change of the keys or the watched state.
    changed: tokio::sync::watch::Sender<u64>,
    /// Bumped when a watched pod or service account is deleted or marked for deletion.
    revoked: tokio::sync::watch::Sender<u64>,
    /// Every part gave its first answer (listed, fetched, forbidden or failed), or the startup
    /// report stopped waiting for them.
    settled: tokio::sync::watch::Sender<bool>,
}

/// A part's first answer, for the startup line.
struct FirstAnswer {
    part: Part,
    missing: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Keys,
    Pods,
    Account,
    Nodes,
}

impl TokenVerifier {
    /// Starts fetching the issuer's keys and watching, through `api`, until `stop`. Logs one
    /// line once every part answered (or after a while): that verification is local, or what
    /// the server's identity may not do that local verification needs.
    pub fn start(
        api: Arc<KubeApi>,
        settings: VerifierSettings,
        stop: CancellationToken,
    ) -> TokenVerifier {
        let (changed, _) = tokio::sync::watch::channel(0);
        let (revoked, _) = tokio::sync::watch::channel(0);
        let (settled, _) = tokio::sync::watch::channel(false);
        let inner = Arc::new(Inner {
            revoked,
            settled,
            expected: settings.expected(),
            live: Mutex::new(Live::new(settings.watch_nodes)),
            settings,
            api,
            keys: Mutex::new(KeyRing::default()),
            fetching: tokio::sync::Mutex::new(()),
            changed,
        });
        let parts = if inner.settings.watch_nodes { 4 } else { 3 };
        let (first_tx, first_rx) = mpsc::channel(parts);
        tokio::spawn(report_startup(inner.clone(), first_rx, parts));
        tokio::spawn(refresh_keys(inner.clone(), first_tx.clone(), stop.clone()));

        let (namespace, account) = (&inner.settings.namespace, &inner.settings.service_account);
        let first = |part: Part, tx: mpsc::Sender<FirstAnswer>, lacking: String| {
            move |outcome: FirstList| async move {
                let missing = match outcome {
                    FirstList::Listed => None,
                    FirstList::Forbidden => Some(lacking),
                    FirstList::Failed(error) => Some(format!("{lacking} (failed: {error})")),
                };
                let _ = tx.send(FirstAnswer { part, missing }).await;
            }
        };
        let pods = watches::pods(&inner.api, namespace, account);
        let on_pods = inner.clone();
        tokio::spawn(watches::follow(
            "pods",
            pods,
            |pod| watches::entry(&pod.metadata),
            move |change| on_pods.change(|live, now| live.pods.apply(change, now)),
            first(
                Part::Pods,
                first_tx.clone(),
                format!("list and watch pods in {namespace}"),
            ),
            stop.clone(),
        ));
        let accounts = watches::account(&inner.api, namespace, account);
        let on_account = inner.clone();
        tokio::spawn(watches::follow(
            "service account",
            accounts,
            |account| watches::entry(&account.metadata),
            move |change| on_account.change(|live, now| live.account.apply(change, now)),
            first(
                Part::Account,
                first_tx.clone(),
                format!("list and watch serviceaccounts in {namespace}"),
            ),
            stop.clone(),
        ));
        if inner.settings.watch_nodes {
            let nodes = watches::nodes(&inner.api);
            let on_nodes = inner.clone();
            tokio::spawn(watches::follow(
                "nodes",
                nodes,
                watches::node_addresses,
                move |change: Change<Vec<String>>| {
                    on_nodes.change(|live, now| {
                        if let Some(nodes) = &mut live.nodes {
                            nodes.apply(change, now);
                        }
                        false
                    })
                },
                first(Part::Nodes, first_tx, "list and watch nodes".to_owned()),
                stop,
            ));
        }
        TokenVerifier { inner }
    }

    /// The verdict on `token`. Costs no API call, but for one paced refetch of the keys when a
    /// token that is otherwise a live agent pod's names a key not seen.
    pub async fn verify(&self, token: &str) -> Outcome {
        let token = match Token::parse(token) {
            Ok(token) => token,
            Err(malformed) => return Outcome::Refused(Refusal::Malformed(malformed)),
        };
        let mut refetched = false;
        loop {
            let (generation, issuer) = {
                let keys = self.inner.keys();
                let usable = keys.usable(Instant::now(), self.inner.settings.max_key_age);
                (keys.generation(), usable)
            };
            let signature = issuer
                .as_ref()
                .map_or(SignatureCheck::UnknownKey, |issuer| {
                    issuer.keys.check(&token)
                });
            let step = decide(
                &self.inner.settings,
                &self.inner.expected,
                &token,
                issuer.as_deref().map_err(|missing| *missing),
                signature,
                &self.inner.live(),
                At::now(),
            );
            match step {
                Step::Done(outcome) => return outcome,
                Step::NeedKeys(reason) => {
                    if refetched || !self.inner.refetch(generation).await {
                        return Outcome::Fallback(reason);
                    }
                    refetched = true;
                }
            }
        }
    }

    /// [`TokenVerifier::verify`], but a token that falls back only because the verifier is
    /// still starting (keys not fetched, watches not listed, and no part has failed or been
    /// forbidden yet) waits for the start, at most `wait`, and is judged again: a server
    /// restarted under a reconnecting fleet then verifies the fleet locally rather than
    /// sending it to TokenReview in its first second. Once the start is settled, either way,
    /// this waits for nothing.
    pub async fn verify_after_startup(&self, token: &str, wait: Duration) -> Outcome {
        let outcome = self.verify(token).await;
        let starting = matches!(
            outcome,
            Outcome::Fallback(Fallback::NotSynced | Fallback::KeysUnavailable)
        );
        if !starting || *self.inner.settled.borrow() {
            return outcome;
        }
        let mut changed = self.inner.changed.subscribe();
        let mut settled = self.inner.settled.subscribe();
        let started = async {
            while !self.can_verify() && !*settled.borrow_and_update() {
                tokio::select! {
                    result = changed.changed() => if result.is_err() { return },
                    result = settled.changed() => if result.is_err() { return },
                }
            }
        };
        if tokio::time::timeout(wait, started).await.is_err() {
            return outcome;
        }
        self.verify(token).await
    }

    /// Whether a token verified earlier has lost its pod or service account since (for
    /// closing its session): `Some` only when the watched state says so; a watch that is not
    /// current says nothing.
    pub fn recheck(&self, verified: &Verified) -> Option<Refusal> {
        let live = self.inner.live();
        let now = Instant::now();
        let current = [live.account.age(now), live.pods.age(now)]
            .iter()
            .all(|age| age.is_some_and(|age| age <= self.inner.settings.max_staleness));
        if !current {
            return None;
        }
        let now_unix = At::now().unix;
        let checks = [
            (
                &live.account,
                self.inner.settings.service_account.as_str(),
                verified.service_account_uid.as_str(),
                Refusal::AccountGone,
            ),
            (
                &live.pods,
                verified.pod.name.as_str(),
                verified.pod.uid.as_str(),
                Refusal::PodGone,
            ),
        ];
        for (objects, name, uid, gone) in checks {
            if objects.presence(name, uid, verified.issued_at, now_unix, now) == Presence::Gone {
                return Some(gone);
            }
        }
        None
    }

    /// How old the keys and the watched state are.
    pub fn freshness(&self) -> Freshness {
        let now = Instant::now();
        let keys = self.inner.keys().age(now);
        let live = self.inner.live();
        Freshness {
            keys,
            pods: live.pods.age(now),
            service_account: live.account.age(now),
            nodes: live.nodes.as_ref().and_then(|nodes| nodes.age(now)),
        }
    }

    /// Whether the keys are fetched and every watch has listed.
    pub fn is_ready(&self) -> bool {
        let freshness = self.freshness();
        freshness.keys.is_some()
            && freshness.watches().is_some()
            && (!self.inner.settings.watch_nodes || freshness.nodes.is_some())
    }

    /// Whether the keys are fetched and the watches verification needs have listed (the
    /// nodes' may still be listing).
    fn can_verify(&self) -> bool {
        let freshness = self.freshness();
        freshness.keys.is_some() && freshness.watches().is_some()
    }

    /// Waits, at most `wait`, until every part of the start (the nodes' watch included) has
    /// given its first answer, listed or refused; at once when it has. A server restarted under
    /// its returning fleet waits here for the nodes rather than read one Node per agent.
    pub async fn settled(&self, wait: Duration) {
        let mut settled = self.inner.settled.subscribe();
        let start = async {
            while !*settled.borrow_and_update() {
                if settled.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(wait, start).await;
    }

    /// Waits until [`TokenVerifier::is_ready`] (for tests and startup; it may never be, when
    /// forbidden: bound it with a timeout).
    pub async fn ready(&self) {
        let mut changed = self.inner.changed.subscribe();
        while !self.is_ready() {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// A future that resolves at the next deletion, or mark for deletion, of a watched pod or
    /// service account after this call: the moment to [`TokenVerifier::recheck`] the sessions
    /// let in. A deletion mark turns into a refusal only a minute past its time, with no event
    /// then, so a periodic recheck is needed as well.
    pub fn revoked(&self) -> impl std::future::Future<Output = ()> {
        let mut revoked = self.inner.revoked.subscribe();
        async move {
            let _ = revoked.changed().await;
        }
    }

    /// A future that resolves at the next change of the keys or the watched state after this
    /// call (for tests).
    pub fn changed(&self) -> impl std::future::Future<Output = ()> {
        let mut changed = self.inner.changed.subscribe();
        async move {
            let _ = changed.changed().await;
        }
    }
}

impl Inner {
    fn keys(&self) -> MutexGuard<'_, KeyRing> {
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies a change to the watched state; `apply` says whether it may have revoked tokens.
    fn change(&self, apply: impl FnOnce(&mut Live, Instant) -> bool) {
        let revoked = apply(&mut self.live(), Instant::now());
        self.changed.send_modify(|n| *n += 1);
        if revoked {
            self.revoked.send_modify(|n| *n += 1);
        }
    }

    /// Fetches the keys again for a token that found none of its own in generation
    /// `seen`; whether there are newer keys to try (fetched now, or by another caller
    /// meanwhile). At most one fetch per [`super::MIN_REFETCH_INTERVAL`].
    async fn refetch(&self, seen: u64) -> bool {
        let _one = self.fetching.lock().await;
        if self.keys().generation() != seen {
            return true;
        }
        if !self.keys().may_fetch(Instant::now()) {
            return false;
        }
        self.fetch().await.is_ok()
    }

    /// One fetch of the issuer and its keys (the caller holds `fetching`).
    async fn fetch(&self) -> Result<(), DiscoveryError> {
        self.keys().attempt(Instant::now());
        let issuer = discovery::discover(&self.api).await?;
        self.keys().replace(issuer, Instant::now());
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// Fetches the keys whenever the last fetch is [`VerifierSettings::key_refresh`] old (every
/// [`KEY_RETRY`] while they cannot be had), until `stop`.
async fn refresh_keys(
    inner: Arc<Inner>,
    first: mpsc::Sender<FirstAnswer>,
    stop: CancellationToken,
) {
    let mut first = Some(first);
    let mut failing = false;
    loop {
        let refresh = inner.settings.key_refresh;
        let result = {
            let _one = inner.fetching.lock().await;
            // A token's refetch may have brought fresh keys meanwhile: the schedule runs from
            // the last fetch, whoever made it.
            let age = inner.keys().age(Instant::now());
            match age {
                Some(age) if age < refresh => Ok(()),
                _ => inner.fetch().await,
            }
        };
        if let Some(first) = first.take() {
            let missing = result.as_ref().err().map(|error| match error {
                DiscoveryError::Forbidden => "get /.well-known/openid-configuration and /openid/v1/jwks (ClusterRole system:service-account-issuer-discovery)".to_owned(),
                DiscoveryError::NotServed => "issuer discovery, which kube-apiserver serves only when its --service-account-issuer is an https URL".to_owned(),
                error => format!("the issuer's keys (failed: {error})"),
            });
            let _ = first
                .send(FirstAnswer {
                    part: Part::Keys,
                    missing,
                })
                .await;
        } else {
            match &result {
                Ok(()) if failing => {
                    info!("fetching the service-account issuer's keys works again")
                }
                Err(error) if !failing => {
                    warn!(%error, "fetching the service-account issuer's keys failed; keeping the last ones")
                }
                _ => {}
            }
        }
        failing = result.is_err();
        let wait = if failing {
            KEY_RETRY
        } else {
            let age = inner.keys().age(Instant::now()).unwrap_or_default();
            refresh.saturating_sub(age).max(super::MIN_REFETCH_INTERVAL)
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Logs the startup line once every part gave its first answer, or after
/// [`STARTUP_REPORT`].
async fn report_startup(inner: Arc<Inner>, mut answers: mpsc::Receiver<FirstAnswer>, parts: usize) {
    let deadline = Instant::now() + STARTUP_REPORT;
    let mut heard = Vec::new();
    let mut missing = Vec::new();
    let mut nodes_missing = None;
    while heard.len() < parts {
        match tokio::time::timeout_at(deadline, answers.recv()).await {
            Ok(Some(answer)) => {
                heard.push(answer.part);
                if answer.part == Part::Nodes {
                    nodes_missing = answer.missing;
                } else {
                    missing.extend(answer.missing);
                }
            }
            Ok(None) => {
                inner.settled.send_replace(true);
                return;
            }
            Err(_) => break,
        }
    }
    inner.settled.send_replace(true);
    if heard.len() < parts {
        missing.push(format!(
            "answers from kube-apiserver (no first answer within {STARTUP_REPORT:?})"
        ));
    }
    let settings = &inner.settings;
    if missing.is_empty() {
        let issuer = inner.keys().current();
        let (issuer, keys) = issuer.as_ref().map_or(("", 0), |issuer| {
            (issuer.issuer.as_str(), issuer.keys.len())
        });
        let pods = inner.live().pods.len();
        info!(
            issuer,
            keys,
            pods,
            namespace = %settings.namespace,
            service_account = %settings.service_account,
            "agent tokens are verified locally (issuer keys and watches ready)"
        );
        if let Some(nodes) = nodes_missing {
            warn!(
                missing = %nodes,
                "nodes' addresses are read once per agent until the server's identity may do this (deploy/rbac grants it)"
            );
        }
    } else {
        warn!(
            missing = %missing.join("; "),
            "agent tokens go to TokenReview until the server's identity may do what local verification needs (deploy/rbac grants it)"
        );
    }
}

#[cfg(test)]
mod tests;
