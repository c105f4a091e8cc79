//! Who an agent is, and what it may announce.
//!
//! An agent proves itself with a client certificate from `--cluster-ca-cert` (checked by the
//! TLS handshake), a ServiceAccount token in `Authorization: Bearer` (checked here with a
//! TokenReview: the audience `--authentication-audience`, then the user
//! `system:serviceaccount:<--agent-namespace>:<--agent-service-account>`), or both, when both
//! are configured. Recent answers are cached for a short time (`--token-review-cache-ttl`),
//! keyed by the token's SHA-256, never the token itself.
//!
//! Reviews are paced by the client's rate limit, so under a reconnect storm they queue. A
//! review is its own task, one per token however many connections present it: an agent that
//! stops waiting does not throw the review away, and its answer waits in the cache (for
//! [`UNCLAIMED_TTL`] until first used) for the agent's next attempt. A connection waits at most
//! [`TOKEN_REVIEW_PATIENCE`] for it, then is answered `503` with a `Retry-After` that says when the
//! answer is due; past [`MAX_REVIEWS_IN_FLIGHT`] queued reviews new tokens get that answer at
//! once. With `--bind-agent-identifiers`, the node's addresses are read by the same task and
//! cached with the review.
//!
//! With `--bind-agent-identifiers`, an agent may announce only the `host`/`ipv4`/`ipv6` values
//! that belong to it: its certificate's DNS and IP SANs, and for a token bound to a pod, the
//! name and addresses of that pod's node (TokenReview's `authentication.kubernetes.io/node-name`
//! and that Node's `status.addresses`). An agent that claims anything else is refused with the
//! claim named. `cidr` and `default-route` are not bound: they say what an agent can reach, not
//! who it is.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_proto::text::Printable;
use http::StatusCode;
use rustls::pki_types::CertificateDer;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use crate::process::certificate::certificate_names;
use crate::process::kubernetes::{ApiError, KubeApi, Review, ServerQuestions};
use crate::process::metrics::{Agents, TokenReviews};
use crate::routing::router::HostKey;
use bridgehead_kubeapi::serviceaccount::{Outcome, TokenVerifier, Verified};
use bridgehead_runtime::timeouts::{TOKEN_REVIEW_PATIENCE, VERIFIER_STARTUP_WAIT};

/// Most token reviews remembered.
const CACHE_ENTRIES: usize = 4096;
/// Most reviews queued or running at once; tokens past it are told to come back later.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 4096;
/// How long an answer nobody has used yet is kept: its agent gave up waiting and comes back
/// after its backoff or the `Retry-After` it was given.
pub const UNCLAIMED_TTL: Duration = Duration::from_secs(120);
/// Longest `Retry-After` given.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What a connecting agent showed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    /// The bearer token of `Authorization: Bearer`, if any.
    pub bearer: Option<&'a str>,
    /// The client certificate the TLS handshake verified, if any.
    pub certificate: Option<&'a CertificateDer<'static>>,
}

/// An authenticated agent.
#[derive(Debug, Clone)]
pub struct AgentIdentity {
    /// Who it is, for logs: the service account (and node), or the certificate.
    pub subject: String,
    /// The locally verified token it presented, to close its session if its pod or account
    /// goes ([`crate::agents::revocation`]).
    pub verified: Option<Box<Verified>>,
}

/// Why an agent is refused. [`AuthRefusal::status`] is the answer's status.
#[derive(Debug, thiserror::Error)]
pub enum AuthRefusal {
    #[error("no bearer token: send a ServiceAccount token in Authorization: Bearer")]
    NoToken,
    #[error("no client certificate")]
    NoCertificate,
    #[error("token rejected by kube-apiserver: {0}")]
    Rejected(String),
    /// Refused by local verification, as kube-apiserver would refuse it.
    #[error("token rejected: {0}")]
    Refused(String),
    #[error("token is for {got}, not {want}")]
    WrongAccount { got: String, want: String },
    #[error("token is not valid for audience {0}")]
    WrongAudience(String),
    #[error("cannot review the token: {0}")]
    Unavailable(ApiError),
    /// The review is queued behind others; its answer is due after `retry_after`.
    #[error("token review queued behind others: retry after {}s", retry_after.as_secs())]
    Queued { retry_after: Duration },
    #[error("identifier {key}={value} does not belong to {owner}")]
    NotYours {
        key: &'static str,
        value: String,
        owner: String,
    },
}

impl AuthRefusal {
    /// When the agent should come back, for the answer's `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AuthRefusal::Queued { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// 401 for a missing credential, 503 when kube-apiserver could not be asked, 403 else.
    pub fn status(&self) -> StatusCode {
        match self {
            AuthRefusal::NoToken | AuthRefusal::NoCertificate => StatusCode::UNAUTHORIZED,
            AuthRefusal::Unavailable(_) | AuthRefusal::Queued { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            AuthRefusal::Rejected(_)
            | AuthRefusal::Refused(_)
            | AuthRefusal::WrongAccount { .. }
            | AuthRefusal::WrongAudience(_)
            | AuthRefusal::NotYours { .. } => StatusCode::FORBIDDEN,
        }
    }
}

/// How tokens are checked.
#[derive(Debug)]
pub struct TokenPolicy {
    pub api: std::sync::Arc<KubeApi>,
    pub namespace: String,
    pub service_account: String,
    pub audience: String,
    pub cache_ttl: Duration,
    /// `--token-verification=local`: tokens verified here first; TokenReview gets only what
    /// this cannot decide.
    pub verifier: Option<TokenVerifier>,
}

/// The agent endpoint's authentication.
#[derive(Debug)]
pub struct AgentAuth {
    /// Whether the TLS handshake requires a client certificate (`--cluster-ca-cert`).
    certificates: bool,
    tokens: Option<Tokens>,
    bind_identifiers: bool,
}

#[derive(Debug)]
struct Tokens {
    policy: Arc<TokenPolicy>,
    username: String,
    /// Whether a review also reads the token's node's addresses.
    bind_identifiers: bool,
    reviews: Arc<Mutex<Reviews>>,
}

/// Answers kept, and reviews under way.
#[derive(Debug)]
struct Reviews {
    cache: ReviewCache,
    /// By token digest: when the answer is due, and where it will be sent.
    in_flight: HashMap<[u8; 32], (Instant, AnswerWatch)>,
}

/// Where a review under way sends its answer.
type AnswerWatch = watch::Receiver<Option<Result<Answer, ApiError>>>;

/// What one review found: the TokenReview, and with binding the node's addresses.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    review: Review,
    node_addresses: Option<Vec<String>>,
    /// What local verification found, when it decided: kept to recheck the session.
    local: Option<Box<Verified>>,
}

impl AgentAuth {
    /// Certificates when `certificates`, tokens when `tokens`, both when both.
    pub fn new(
        certificates: bool,
        tokens: Option<TokenPolicy>,
        bind_identifiers: bool,
    ) -> AgentAuth {
        AgentAuth {
            certificates,
            tokens: tokens.map(|policy| Tokens {
                username: format!(
                    "system:serviceaccount:{}:{}",
                    policy.namespace, policy.service_account
                ),
                bind_identifiers,
                reviews: Arc::new(Mutex::new(Reviews {
                    cache: ReviewCache::new(policy.cache_ttl),
                    in_flight: HashMap::new(),
                })),
                policy: Arc::new(policy),
            }),
            bind_identifiers,
        }
    }

    /// Checks what the agent `presented`, and with `--bind-agent-identifiers` that
    /// `identifiers` are its own.
    pub async fn check(
        &self,
        presented: Presented<'_>,
        identifiers: &AgentIdentifiers,
        metrics: &Agents,
    ) -> Result<AgentIdentity, AuthRefusal> {
        let mut subject = Vec::new();
        let mut owned = Owned::default();
        let mut verified = None;
        if self.certificates {
            let certificate = presented.certificate.ok_or(AuthRefusal::NoCertificate)?;
            let names = certificate_names(certificate);
            subject.push(format!("certificate {}", names.subject));
            owned.add(&names.sans, format!("the certificate {}", names.subject));
        }
        if let Some(tokens) = &self.tokens {
            let token = presented.bearer.ok_or(AuthRefusal::NoToken)?;
            let Answer {
                review,
                node_addresses,
                local,
            } = tokens.review(token, metrics).await?;
            verified = local;
            match &review.node {
                Some(node) => subject.push(format!("{} on node {node}", review.username)),
                None => subject.push(review.username.clone()),
            }
            if self.bind_identifiers {
                if let Some(node) = &review.node {
                    owned.add(
                        node_addresses.as_deref().unwrap_or_default(),
                        format!("node {node}"),
                    );
                } else {
                    owned
                        .owners
                        .push(format!("{} (bound to no node)", review.username));
                }
            }
        }
        if self.bind_identifiers {
            owned.check(identifiers)?;
        }
        Ok(AgentIdentity {
            subject: subject.join(", "),
            verified,
        })
    }
}

impl Tokens {
    /// The review of `token`, from the cache, from a review under way or from a new one;
    /// an error unless it is valid for the audience and names the expected account.
    async fn review(&self, token: &str, metrics: &Agents) -> Result<Answer, AuthRefusal> {
        if let Some(verifier) = &self.policy.verifier {
            match verifier
                .verify_after_startup(token, VERIFIER_STARTUP_WAIT)
                .await
            {
                Outcome::Verified(verified) => {
                    metrics.token_verification("verified", "");
                    return self.verified(verifier, token, verified).await;
                }
                Outcome::Refused(refusal) => {
                    metrics.token_verification("refused", refusal.label());
                    let reason = Printable::new(&refusal.to_string()).to_string();
                    return Err(AuthRefusal::Refused(reason));
                }
                Outcome::Fallback(fallback) => {
                    metrics.token_verification("fallback", fallback.label());
                    debug!(reason = %fallback, "token sent to TokenReview");
                }
            }
        }
        let answer = match self.lookup(token, metrics)? {
            Lookup::Ready(answer) => answer,
            Lookup::Pending { due, mut answer } => {
                let waited =
                    tokio::time::timeout(TOKEN_REVIEW_PATIENCE, answer.wait_for(Option::is_some))
                        .await;
                match waited.map(|answer| answer.map(|answer| answer.clone())) {
                    Ok(Ok(Some(Ok(answer)))) => answer,
                    Ok(Ok(Some(Err(error)))) => return Err(AuthRefusal::Unavailable(error)),
                    // The review task ended without an answer (its runtime stopped).
                    Ok(Ok(None) | Err(_)) => {
                        let error = ApiError::Request("the token review was abandoned".into());
                        return Err(AuthRefusal::Unavailable(error));
                    }
                    Err(_) => {
                        return Err(AuthRefusal::Queued {
                            retry_after: retry_after(due, Instant::now()),
                        })
                    }
                }
            }
        };
        self.check(answer)
    }

    /// What a locally verified token says, in a review's shape. With binding and a node the
    /// watch has not delivered: while the verifier starts, the nodes' listing is waited for
    /// (a returning fleet would otherwise cost a Node GET each); after, the addresses are read
    /// from kube-apiserver.
    async fn verified(
        &self,
        verifier: &TokenVerifier,
        token: &str,
        mut verified: Verified,
    ) -> Result<Answer, AuthRefusal> {
        if self.bind_identifiers && verified.node.is_some() && verified.node_addresses.is_none() {
            verifier.settled(VERIFIER_STARTUP_WAIT).await;
            if let Outcome::Verified(again) = verifier.verify(token).await {
                verified = again;
            }
        }
        let node = verified.node.as_ref().map(|node| node.name.clone());
        let node_addresses = match (&node, verified.node_addresses.clone()) {
            (Some(node), None) if self.bind_identifiers => Some(
                self.policy
                    .api
                    .node_addresses(node)
                    .await
                    .map_err(AuthRefusal::Unavailable)?,
            ),
            (_, addresses) => addresses,
        };
        let answer = Answer {
            review: Review {
                authenticated: true,
                username: verified.username.clone(),
                audiences: vec![self.policy.audience.clone()],
                node,
                error: None,
            },
            node_addresses,
            local: Some(Box::new(verified)),
        };
        self.check(answer)
    }

    /// The cached answer for `token`, or the review that will give it (started here if none
    /// is under way).
    fn lookup(&self, token: &str, metrics: &Agents) -> Result<Lookup, AuthRefusal> {
        let key = digest(token);
        let now = Instant::now();
        let mut reviews = lock(&self.reviews);
        if let Some(answer) = reviews.cache.get(&key, now) {
            metrics.token_review("cached");
            return Ok(Lookup::Ready(answer));
        }
        if let Some((due, answer)) = reviews.in_flight.get(&key) {
            return Ok(Lookup::Pending {
                due: *due,
                answer: answer.clone(),
            });
        }
        // Due once the client's rate limit lets it go and kube-apiserver answered.
        let due = now + self.policy.api.queue_wait() + ANSWER_TIME;
        if reviews.in_flight.len() >= MAX_REVIEWS_IN_FLIGHT {
            return Err(AuthRefusal::Queued {
                retry_after: retry_after(due, now),
            });
        }
        let (send, answer) = watch::channel(None);
        reviews.in_flight.insert(key, (due, answer.clone()));
        drop(reviews);
        let task = ReviewTask {
            policy: self.policy.clone(),
            reviews: self.reviews.clone(),
            key,
            token: token.to_owned(),
            bind_identifiers: self.bind_identifiers,
            counter: metrics.token_reviews(),
        };
        tokio::spawn(task.run(send));
        Ok(Lookup::Pending { due, answer })
    }

    /// An error unless `answer` says the token is valid for the audience and the account.
    fn check(&self, answer: Answer) -> Result<Answer, AuthRefusal> {
        let review = &answer.review;
        if !review.authenticated {
            let reason = review.error.as_deref().unwrap_or("not authenticated");
            return Err(AuthRefusal::Rejected(Printable::new(reason).to_string()));
        }
        if !review.audiences.contains(&self.policy.audience) {
            return Err(AuthRefusal::WrongAudience(self.policy.audience.clone()));
        }
        if review.username != self.username {
            return Err(AuthRefusal::WrongAccount {
                got: Printable::new(&review.username).to_string(),
                want: self.username.clone(),
            });
        }
        Ok(answer)
    }
}

/// Where a token's answer comes from.
enum Lookup {
    Ready(Answer),
    /// A review under way, its answer due at `due`.
    Pending {
        due: Instant,
        answer: AnswerWatch,
    },
}

/// Allowed for kube-apiserver's answer once a review has left the rate limit.
const ANSWER_TIME: Duration = Duration::from_secs(1);

/// Whole seconds until `due`, at least one, at most [`MAX_RETRY_AFTER`].
fn retry_after(due: Instant, now: Instant) -> Duration {
    let wait = due.saturating_duration_since(now).as_secs() + 1;
    Duration::from_secs(wait).min(MAX_RETRY_AFTER)
}

/// One token's review, run as its own task so that its answer outlives the connection that
/// asked.
struct ReviewTask {
    policy: Arc<TokenPolicy>,
    reviews: Arc<Mutex<Reviews>>,
    key: [u8; 32],
    token: String,
    bind_identifiers: bool,
    counter: TokenReviews,
}

impl ReviewTask {
    async fn run(self, send: watch::Sender<Option<Result<Answer, ApiError>>>) {
        let answer = self.ask().await;
        self.counter.count(match &answer {
            Ok(answer) if answer.review.authenticated => "authenticated",
            Ok(_) => "rejected",
            Err(_) => "error",
        });
        let mut reviews = lock(&self.reviews);
        reviews.in_flight.remove(&self.key);
        if let Ok(answer) = &answer {
            reviews
                .cache
                .insert(self.key, answer.clone(), Instant::now());
        }
        drop(reviews);
        let _ = send.send(Some(answer));
    }

    async fn ask(&self) -> Result<Answer, ApiError> {
        let api = &self.policy.api;
        let review = api.review(&self.token, &self.policy.audience).await?;
        let node_addresses = match &review.node {
            Some(node) if self.bind_identifiers && review.authenticated => {
                Some(api.node_addresses(node).await?)
            }
            _ => None,
        };
        Ok(Answer {
            review,
            node_addresses,
            local: None,
        })
    }
}

fn lock(reviews: &Mutex<Reviews>) -> std::sync::MutexGuard<'_, Reviews> {
    reviews
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn digest(token: &str) -> [u8; 32] {
    let hash = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(hash.as_ref());
    key
}

/// Recent answers by token digest, each for `ttl` from its first use (an answer nobody has
/// used yet for [`UNCLAIMED_TTL`]), at most [`CACHE_ENTRIES`].
#[derive(Debug)]
struct ReviewCache {
    ttl: Duration,
    entries: HashMap<[u8; 32], Cached>,
}

#[derive(Debug)]
struct Cached {
    /// When it was stored, or first used.
    at: Instant,
    claimed: bool,
    answer: Answer,
}

impl Cached {
    fn fresh(&self, ttl: Duration, now: Instant) -> bool {
        let ttl = if self.claimed {
            ttl
        } else {
            ttl.max(UNCLAIMED_TTL)
        };
        now.saturating_duration_since(self.at) < ttl
    }
}

impl ReviewCache {
    fn new(ttl: Duration) -> ReviewCache {
        ReviewCache {
            ttl,
            entries: HashMap::new(),
        }
    }

    fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Answer> {
        let cached = self.entries.get_mut(key)?;
        if !cached.fresh(self.ttl, now) {
            return None;
        }
        if !cached.claimed {
            cached.claimed = true;
            cached.at = now;
        }
        Some(cached.answer.clone())
    }

    /// Keeps `answer`. With a TTL of 0 answers are still handed to the agent that waited
    /// for them, but used once: never again.
    fn insert(&mut self, key: [u8; 32], answer: Answer, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        if self.entries.len() >= CACHE_ENTRIES {
            let ttl = self.ttl;
            self.entries.retain(|_, cached| cached.fresh(ttl, now));
        }
        if self.entries.len() >= CACHE_ENTRIES {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, cached)| cached.at)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        let cached = Cached {
            at: now,
            claimed: false,
            answer,
        };
        self.entries.insert(key, cached);
    }
}

/// The `host`/`ipv4`/`ipv6` values an agent's identity vouches for.
#[derive(Debug, Default)]
struct Owned {
    keys: HashSet<HostKey>,
    /// What vouched, for the refusal's wording.
    owners: Vec<String>,
}

impl Owned {
    fn add(&mut self, names: &[String], owner: String) {
        self.keys
            .extend(names.iter().map(|name| HostKey::from_host(name)));
        self.owners.push(owner);
    }

    fn check(&self, identifiers: &AgentIdentifiers) -> Result<(), AuthRefusal> {
        let claims = identifiers
            .hosts
            .iter()
            .map(|host| ("host", host.clone(), HostKey::from_host(host)))
            .chain(
                identifiers
                    .ipv4
                    .iter()
                    .map(|ip| ("ipv4", ip.to_string(), HostKey::from(*ip))),
            )
            .chain(
                identifiers
                    .ipv6
                    .iter()
                    .map(|ip| ("ipv6", ip.to_string(), HostKey::from(*ip))),
            );
        for (key, value, host_key) in claims {
            if !self.keys.contains(&host_key) {
                return Err(AuthRefusal::NotYours {
                    key,
                    value: Printable::new(&value).to_string(),
                    owner: self.owners.join(" and "),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(user: &str) -> Answer {
        Answer {
            review: Review {
                authenticated: true,
                username: user.to_owned(),
                audiences: vec!["a".into()],
                node: None,
                error: None,
            },
            node_addresses: None,
            local: None,
        }
    }

    #[test]
    fn the_cache_keeps_an_answer_for_its_ttl_from_first_use_and_stays_bounded() {
        let start = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut cache = ReviewCache::new(ttl);
        cache.insert(digest("t1"), review("u1"), start);
        // Nobody used it for longer than the TTL: its agent gave up waiting, and finds it
        // when it comes back.
        let back = start + UNCLAIMED_TTL - Duration::from_secs(1);
        assert_eq!(cache.get(&digest("t1"), back), Some(review("u1")));
        assert_eq!(
            cache.get(&digest("t1"), back + ttl - Duration::from_millis(1)),
            Some(review("u1"))
        );
        assert_eq!(cache.get(&digest("t1"), back + ttl), None);
        // Never used: gone after the unclaimed TTL.
        cache.insert(digest("t3"), review("u3"), start);
        assert_eq!(cache.get(&digest("t3"), start + UNCLAIMED_TTL), None);
        assert_eq!(cache.get(&digest("t2"), start), None);
        for i in 0..CACHE_ENTRIES + 10 {
            cache.insert(
                digest(&i.to_string()),
                review("u"),
                start + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(cache.entries.len(), CACHE_ENTRIES);
        let mut off = ReviewCache::new(Duration::ZERO);
        off.insert(digest("t"), review("u"), start);
        assert_eq!(off.get(&digest("t"), start), None);
    }

    #[test]
    fn retry_after_is_whole_seconds_until_the_answer_is_due_and_bounded() {
        let now = Instant::now();
        assert_eq!(retry_after(now, now), Duration::from_secs(1));
        assert_eq!(
            retry_after(now + Duration::from_millis(2500), now),
            Duration::from_secs(3)
        );
        assert_eq!(
            retry_after(now + Duration::from_secs(3600), now),
            MAX_RETRY_AFTER
        );
        let queued = AuthRefusal::Queued {
            retry_after: Duration::from_secs(3),
        };
        assert_eq!(queued.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(queued.retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn only_owned_host_and_address_claims_pass() {
        let mut owned = Owned::default();
        owned.add(
            &["node-1".into(), "10.0.0.5".into(), "fd00::5".into()],
            "node node-1".into(),
        );
        let ok = AgentIdentifiers::parse(
            "host=Node-1.&ipv4=10.0.0.5&ipv6=fd00:0::5&cidr=10.244.0.0/16&default-route=true",
        )
        .unwrap();
        owned.check(&ok).unwrap();
        for (query, claim) in [
            ("host=node-2", "host=node-2"),
            ("ipv4=10.0.0.6", "ipv4=10.0.0.6"),
            ("ipv6=fd00::6", "ipv6=fd00::6"),
            ("host=10.0.0.6", "host=10.0.0.6"),
        ] {
            let error = owned
                .check(&AgentIdentifiers::parse(query).unwrap())
                .unwrap_err();
            assert_eq!(error.status(), StatusCode::FORBIDDEN);
            assert!(error.to_string().contains(claim), "{error}");
            assert!(error.to_string().contains("node node-1"), "{error}");
        }
    }
}
