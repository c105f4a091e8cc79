//! Who an agent is, and what it may announce.
//!
//! An agent proves itself with a client certificate from `--cluster-ca-cert` (checked by the
//! TLS handshake), a ServiceAccount token in `Authorization: Bearer` (checked here with a
//! TokenReview: the audience `--authentication-audience`, then the user
//! `system:serviceaccount:<--agent-namespace>:<--agent-service-account>`), or both, when both
//! are configured. Recent answers are cached for a short time (`--token-review-cache-ttl`),
//! keyed by the token's SHA-256, never the token itself.
//!
//! With `--bind-agent-identifiers`, an agent may announce only the `host`/`ipv4`/`ipv6` values
//! that belong to it: its certificate's DNS and IP SANs, and for a token bound to a pod, the
//! name and addresses of that pod's node (TokenReview's `authentication.kubernetes.io/node-name`
//! and that Node's `status.addresses`). An agent that claims anything else is refused with the
//! claim named. `cidr` and `default-route` are not bound: they say what an agent can reach, not
//! who it is.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_proto::text::Printable;
use http::StatusCode;
use rustls::pki_types::CertificateDer;
use tokio::time::Instant;

use crate::certificate::certificate_names;
use crate::kubernetes::{ApiError, KubeApi, Review, ServerQuestions};
use crate::metrics::Metrics;
use crate::router::HostKey;

/// Most token reviews remembered.
const CACHE_ENTRIES: usize = 4096;

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
    #[error("token is for {got}, not {want}")]
    WrongAccount { got: String, want: String },
    #[error("token is not valid for audience {0}")]
    WrongAudience(String),
    #[error("cannot review the token: {0}")]
    Unavailable(ApiError),
    #[error("identifier {key}={value} does not belong to {owner}")]
    NotYours {
        key: &'static str,
        value: String,
        owner: String,
    },
}

impl AuthRefusal {
    /// 401 for a missing credential, 503 when kube-apiserver could not be asked, 403 else.
    pub fn status(&self) -> StatusCode {
        match self {
            AuthRefusal::NoToken | AuthRefusal::NoCertificate => StatusCode::UNAUTHORIZED,
            AuthRefusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AuthRefusal::Rejected(_)
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
    policy: TokenPolicy,
    username: String,
    cache: std::sync::Mutex<ReviewCache>,
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
                cache: std::sync::Mutex::new(ReviewCache::new(policy.cache_ttl)),
                policy,
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
        metrics: &Metrics,
    ) -> Result<AgentIdentity, AuthRefusal> {
        let mut subject = Vec::new();
        let mut owned = Owned::default();
        if self.certificates {
            let certificate = presented.certificate.ok_or(AuthRefusal::NoCertificate)?;
            let names = certificate_names(certificate);
            subject.push(format!("certificate {}", names.subject));
            owned.add(&names.sans, format!("the certificate {}", names.subject));
        }
        if let Some(tokens) = &self.tokens {
            let token = presented.bearer.ok_or(AuthRefusal::NoToken)?;
            let review = tokens.review(token, metrics).await?;
            match &review.node {
                Some(node) => subject.push(format!("{} on node {node}", review.username)),
                None => subject.push(review.username.clone()),
            }
            if self.bind_identifiers {
                if let Some(node) = &review.node {
                    let addresses = tokens
                        .policy
                        .api
                        .node_addresses(node)
                        .await
                        .map_err(AuthRefusal::Unavailable)?;
                    owned.add(&addresses, format!("node {node}"));
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
        })
    }
}

impl Tokens {
    /// The review of `token`, from the cache or from kube-apiserver; an error unless it is
    /// valid for the audience and names the expected account.
    async fn review(&self, token: &str, metrics: &Metrics) -> Result<Review, AuthRefusal> {
        let key = digest(token);
        let cached = self.lock().get(&key, Instant::now());
        let review = match cached {
            Some(review) => {
                metrics.token_review("cached");
                review
            }
            None => {
                let answer = self.policy.api.review(token, &self.policy.audience).await;
                let review = match answer {
                    Ok(review) => review,
                    Err(error) => {
                        metrics.token_review("error");
                        return Err(AuthRefusal::Unavailable(error));
                    }
                };
                metrics.token_review(if review.authenticated {
                    "authenticated"
                } else {
                    "rejected"
                });
                self.lock().insert(key, review.clone(), Instant::now());
                review
            }
        };
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
        Ok(review)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReviewCache> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn digest(token: &str) -> [u8; 32] {
    let hash = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(hash.as_ref());
    key
}

/// Recent reviews by token digest, each for `ttl`, at most [`CACHE_ENTRIES`].
#[derive(Debug)]
struct ReviewCache {
    ttl: Duration,
    entries: HashMap<[u8; 32], (Instant, Review)>,
}

impl ReviewCache {
    fn new(ttl: Duration) -> ReviewCache {
        ReviewCache {
            ttl,
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &[u8; 32], now: Instant) -> Option<Review> {
        let (at, review) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| review.clone())
    }

    fn insert(&mut self, key: [u8; 32], review: Review, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        if self.entries.len() >= CACHE_ENTRIES {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        }
        if self.entries.len() >= CACHE_ENTRIES {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (now, review));
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

    fn review(user: &str) -> Review {
        Review {
            authenticated: true,
            username: user.to_owned(),
            audiences: vec!["a".into()],
            node: None,
            error: None,
        }
    }

    #[test]
    fn the_cache_forgets_after_its_ttl_and_stays_bounded() {
        let start = Instant::now();
        let mut cache = ReviewCache::new(Duration::from_secs(10));
        cache.insert(digest("t1"), review("u1"), start);
        assert_eq!(
            cache.get(&digest("t1"), start + Duration::from_secs(9)),
            Some(review("u1"))
        );
        assert_eq!(
            cache.get(&digest("t1"), start + Duration::from_secs(10)),
            None
        );
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
