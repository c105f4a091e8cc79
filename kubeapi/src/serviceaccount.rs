//! Local verification of the agents' projected ServiceAccount tokens, as kube-apiserver itself
//! verifies them, so that an agent's connection costs kube-apiserver nothing: the signature
//! against the issuer's keys (issuer discovery, refetched every few minutes and, paced, on a
//! key id not seen), the claims (`iss`, `aud`, `exp`/`nbf`/`iat`, the account), and that the
//! pod the token is bound to and the service account still exist with the UIDs it names, from
//! watches.
//!
//! [`TokenVerifier`] is the whole of it: [`TokenVerifier::start`] fetches the keys and starts
//! the watches; [`TokenVerifier::verify`] answers an [`Outcome`]. A token that fails a check
//! is refused with no API call, whether or not its key is known (a refusal needs no
//! signature: kube-apiserver would refuse the token for the same claim). What cannot be settled
//! here ([`Fallback`]) is for TokenReview: before the watches list or the keys are fetched,
//! while a watch is failing past [`VerifierSettings::max_staleness`], for tokens not bound to
//! a pod, and for a key id not listed even after a refetch — that last only for a token whose
//! claims are a live agent pod's, so that made-up tokens cost nothing.
//!
//! Left out: the node claim is not checked against the nodes (kube-apiserver does not check
//! it for pod-bound tokens either); legacy Secret tokens and node-bound tokens are TokenReview's.
//!
//! - `jwt`: the token taken apart; `keys`: the JWKS and the signature check; `discovery`:
//!   fetching them; `json`: the strict JSON both read (no member named twice).
//! - `claims`: the claim rules; `liveness`: the watched objects and their rules; `watches`: the
//!   kube-rs watches that feed them.
//! - `outcome`: the verdicts; `verifier`: [`TokenVerifier`], the async side.
//! - [`parsers`]: the token and JWKS parsers as public functions, for the fuzz targets
//!   (`kubeapi/fuzz`).

mod claims;
mod discovery;
mod json;
mod jwt;
mod keys;
mod liveness;
mod outcome;
pub mod parsers;
mod verifier;
mod watches;

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

pub use claims::LEEWAY_SECS;
pub use jwt::Malformed;
pub use keys::MIN_REFETCH_INTERVAL;
pub use liveness::NOT_SEEN_GRACE_SECS;
pub use outcome::{BoundObject, Fallback, Freshness, Outcome, Refusal, Verified};
pub use verifier::TokenVerifier;

use claims::{Bound, Expected, Signed, Verdict};
use jwt::Token;
use keys::{Issuer, SignatureCheck};
use liveness::{Objects, Presence, Table};

/// How long a failing watch's last state still decides: no longer than kube-apiserver's own
/// leeway for a deleted object, so a deletion missed meanwhile is honoured about as late as
/// kube-apiserver honours one.
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(60);
/// How often the issuer's keys are fetched again (kube-apiserver publishes a new key before
/// it signs with it).
pub const DEFAULT_KEY_REFRESH: Duration = Duration::from_secs(300);
/// How old the issuer's keys may be and still verify a token: two refresh periods, so that
/// one failed refresh (retried every 30 s) costs nothing, and a key the issuer dropped is
/// trusted at most this long after the last fetch that listed it, however long discovery
/// fails. Past it, tokens go to TokenReview until a fetch works again.
pub const DEFAULT_MAX_KEY_AGE: Duration = Duration::from_secs(600);

/// What the server verifies tokens for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierSettings {
    /// `--agent-namespace`.
    pub namespace: String,
    /// `--agent-service-account`.
    pub service_account: String,
    /// `--authentication-audience`.
    pub audience: String,
    /// Issuers accepted beside the one discovery names (kube-apiserver's further
    /// `--service-account-issuer` values). Empty: discovery's alone.
    pub issuers: Vec<String>,
    /// Watch the nodes' addresses (for `--bind-agent-identifiers`).
    pub watch_nodes: bool,
    /// How long a failing watch's last state still decides; past it, [`Fallback::Stale`].
    pub max_staleness: Duration,
    /// How often the keys are fetched again.
    pub key_refresh: Duration,
    /// How old the keys may be and still decide; past it, [`Fallback::KeysStale`].
    pub max_key_age: Duration,
}

impl VerifierSettings {
    /// Tokens of `namespace`/`service_account` for `audience`, with the defaults.
    pub fn new(namespace: &str, service_account: &str, audience: &str) -> VerifierSettings {
        VerifierSettings {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            audience: audience.to_owned(),
            issuers: Vec::new(),
            watch_nodes: false,
            max_staleness: DEFAULT_MAX_STALENESS,
            key_refresh: DEFAULT_KEY_REFRESH,
            max_key_age: DEFAULT_MAX_KEY_AGE,
        }
    }

    fn expected(&self) -> Expected {
        Expected {
            audience: self.audience.clone(),
            username: format!(
                "system:serviceaccount:{}:{}",
                self.namespace, self.service_account
            ),
        }
    }
}

/// What the watches hold.
#[derive(Debug)]
struct Live {
    pods: Objects,
    account: Objects,
    /// Node name → its name and addresses; `None` when nodes are not watched.
    nodes: Option<Table<Vec<String>>>,
}

impl Live {
    fn new(watch_nodes: bool) -> Live {
        Live {
            pods: Objects::default(),
            account: Objects::default(),
            nodes: watch_nodes.then(Table::default),
        }
    }

    /// Whether `bound`'s service account and pod stand, at `now_unix` and `now`.
    fn judge(
        &self,
        settings: &VerifierSettings,
        bound: &Bound,
        now_unix: i64,
        now: Instant,
    ) -> Result<(), Verdict> {
        for age in [self.account.age(now), self.pods.age(now)] {
            match age {
                None => return Err(Verdict::Fallback(Fallback::NotSynced)),
                Some(age) if age > settings.max_staleness => {
                    return Err(Verdict::Fallback(Fallback::Stale))
                }
                Some(_) => {}
            }
        }
        let checks = [
            (
                &self.account,
                settings.service_account.as_str(),
                bound.account_uid.as_str(),
                Refusal::AccountGone,
            ),
            (
                &self.pods,
                bound.pod.name.as_str(),
                bound.pod.uid.as_str(),
                Refusal::PodGone,
            ),
        ];
        for (objects, name, uid, gone) in checks {
            match objects.presence(name, uid, bound.issued_at, now_unix, now) {
                Presence::Live => {}
                Presence::Gone => return Err(Verdict::Refused(gone)),
                Presence::NotSeen => return Err(Verdict::Fallback(Fallback::NotSeenYet)),
            }
        }
        Ok(())
    }

    /// What `bound` is verified as at `now`, with its node's addresses from the nodes' watch
    /// while that is current: a watch failing for longer than `max_staleness` says nothing,
    /// and the caller reads the Node live, as a review's answer would be.
    fn verified(&self, settings: &VerifierSettings, bound: Bound, now: Instant) -> Verified {
        let node_addresses = match (&self.nodes, &bound.node) {
            (Some(nodes), Some(node))
                if nodes
                    .age(now)
                    .is_some_and(|age| age <= settings.max_staleness) =>
            {
                nodes.get(&node.name).cloned()
            }
            _ => None,
        };
        let seconds = u64::try_from(bound.expires_at).unwrap_or(0);
        Verified {
            username: bound.username,
            service_account_uid: bound.account_uid,
            pod: BoundObject {
                name: bound.pod.name,
                uid: bound.pod.uid,
            },
            node: bound.node.map(|node| BoundObject {
                name: node.name,
                uid: node.uid,
            }),
            node_addresses,
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_secs(seconds),
            issued_at: bound.issued_at,
        }
    }
}

/// Where [`decide`] got to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Done(Outcome),
    /// Everything but the signature holds, and the keys may be missing the token's: fetch
    /// them again if allowed, else fall back for this reason.
    NeedKeys(Fallback),
}

/// A moment in both clocks: the tokens' (seconds since the epoch) and the watches'.
#[derive(Debug, Clone, Copy)]
struct At {
    unix: i64,
    instant: Instant,
}

impl At {
    fn now() -> At {
        let unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
            });
        At {
            unix,
            instant: Instant::now(),
        }
    }
}

/// The verdict on `token`, whose signature `issuer`'s keys judged as `signature` (or why there
/// are no keys to judge it with), with what `live` holds, at `at`.
fn decide(
    settings: &VerifierSettings,
    expected: &Expected,
    token: &Token,
    issuer: Result<&Issuer, Fallback>,
    signature: SignatureCheck,
    live: &Live,
    at: At,
) -> Step {
    let (now_unix, now) = (at.unix, at.instant);
    let (signed, unverified) = match (issuer, signature) {
        (_, SignatureCheck::Invalid) => return Step::Done(Outcome::Refused(Refusal::BadSignature)),
        // No keys (discovery forbidden, not served, not fetched yet, or failing for longer
        // than keys may be trusted): no signature can be judged, so nothing is refused for
        // its key; what the claims cannot settle goes to TokenReview, as it did before there
        // was a verifier.
        (Err(missing), _) => (Signed::Yes, Some(missing)),
        (Ok(_), SignatureCheck::Valid) => (Signed::Yes, None),
        (Ok(_), SignatureCheck::UnknownKey) => (Signed::No, Some(Fallback::UnknownKey)),
        (Ok(_), SignatureCheck::Unsupported) => (Signed::No, Some(Fallback::UnsupportedKey)),
    };
    let mut issuers: Vec<&str> = settings.issuers.iter().map(String::as_str).collect();
    issuers.extend(issuer.ok().map(|issuer| issuer.issuer.as_str()));
    let verdict = claims::check(&token.claims, expected, &issuers, now_unix, signed)
        .and_then(|bound| live.judge(settings, &bound, now_unix, now).map(|()| bound));
    match (verdict, unverified) {
        (Err(Verdict::Refused(refusal)), _) => Step::Done(Outcome::Refused(refusal)),
        // A key the issuer does not list, on a token whose pod the watches cannot vouch for
        // (not listed, stale, not seen): what a forger would send, so it costs no review.
        (Err(Verdict::Fallback(_)), Some(Fallback::UnknownKey)) => {
            Step::Done(Outcome::Refused(Refusal::UnknownKey))
        }
        // Unsigned, what cannot be settled is the key's doing.
        (Err(Verdict::Fallback(_)), Some(reason)) | (Ok(_), Some(reason)) => {
            if reason == Fallback::UnsupportedKey {
                Step::Done(Outcome::Fallback(reason))
            } else {
                Step::NeedKeys(reason)
            }
        }
        (Err(Verdict::Fallback(reason)), None) => Step::Done(Outcome::Fallback(reason)),
        (Ok(bound), None) => Step::Done(Outcome::Verified(live.verified(settings, bound, now))),
    }
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
