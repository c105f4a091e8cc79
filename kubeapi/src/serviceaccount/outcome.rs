//! What local verification says of a token: verified (and bound to what), refused (why), or
//! not settled here (why; the caller asks TokenReview).

use std::time::{Duration, SystemTime};

use super::jwt::Malformed;

/// The verdict on one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Verified(Verified),
    /// kube-apiserver would refuse it too; no API call is needed to say so.
    Refused(Refusal),
    /// Local verification cannot settle it: ask TokenReview.
    Fallback(Fallback),
}

/// A token that passed every check kube-apiserver makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `system:serviceaccount:NS:NAME`.
    pub username: String,
    pub service_account_uid: String,
    /// The pod the token is bound to.
    pub pod: BoundObject,
    /// The node that pod was on when the token was issued (the claim kube-apiserver adds to
    /// pod-bound tokens; TokenReview's `authentication.kubernetes.io/node-name`).
    pub node: Option<BoundObject>,
    /// With nodes watched: the node's name, then every address in its status, as the server
    /// binds identities. `None` when the node is not (yet) in the watch, or nodes are not
    /// watched: then the caller reads the Node itself.
    pub node_addresses: Option<Vec<String>>,
    pub expires_at: SystemTime,
    /// `iat`, for [`super::TokenVerifier::recheck`].
    pub(crate) issued_at: Option<i64>,
}

/// An object a token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundObject {
    pub name: String,
    pub uid: String,
}

/// Why a token is refused. [`Refusal::label`] names it for metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("malformed token: {0}")]
    Malformed(Malformed),
    /// A key the token names (or, naming none, every key) did not sign it.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// It names a key the issuer does not list, and it is not a token of an agent pod the
    /// watches vouch for either.
    #[error("the token names a key the issuer does not list")]
    UnknownKey,
    #[error("the token is from another issuer")]
    WrongIssuer,
    #[error("the token is not valid for the server's audience")]
    WrongAudience,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    /// The token is another account's; `got` is the user it names, as sent (escape it before
    /// it reaches a log or an answer).
    #[error("the token is for {got}")]
    WrongAccount { got: String },
    #[error("the pod the token is bound to is gone")]
    PodGone,
    #[error("the token's service account is gone")]
    AccountGone,
}

impl Refusal {
    /// A metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::BadSignature => "bad_signature",
            Refusal::UnknownKey => "unknown_key",
            Refusal::WrongIssuer => "wrong_issuer",
            Refusal::WrongAudience => "wrong_audience",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::WrongAccount { .. } => "wrong_account",
            Refusal::PodGone => "pod_gone",
            Refusal::AccountGone => "account_gone",
        }
    }
}

/// Why local verification leaves a token to TokenReview. [`Fallback::label`] names it for
/// metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Fallback {
    /// A watch has not listed yet (starting, or forbidden).
    #[error("the watches have not listed yet")]
    NotSynced,
    /// A watch has been failing for longer than the settings allow.
    #[error("the watched state is too old")]
    Stale,
    /// The issuer's keys were never fetched (starting, forbidden, or not served).
    #[error("the issuer's keys are not known")]
    KeysUnavailable,
    /// The issuer's keys were last fetched longer ago than the settings allow (discovery has
    /// been failing since): they may list a key the issuer has dropped.
    #[error("the issuer's keys are too old")]
    KeysStale,
    /// The token names a key not listed even after fetching the keys again (or too soon to
    /// fetch again), and its claims are those of a token of an agent pod the watches show
    /// standing.
    #[error("the token names a key the issuer does not list")]
    UnknownKey,
    /// The key it names is one this verifier cannot check (P-521, Ed25519, a short RSA key).
    #[error("the token's key is of a kind not checked here")]
    UnsupportedKey,
    /// Signed by the issuer's key under an issuer discovery does not name (kube-apiserver
    /// accepts every `--service-account-issuer` given; discovery names the first).
    #[error("the token's issuer is not the one discovery names")]
    UnlistedIssuer,
    /// Not a pod-bound projected token (a legacy Secret token, or one bound to no pod).
    #[error("the token is not bound to a pod")]
    NotPodBound,
    /// Its pod or service account is missing from the watch, and the token is young enough
    /// that the watch may not have delivered it yet.
    #[error("the token's pod or service account is not in the watch yet")]
    NotSeenYet,
}

impl Fallback {
    /// A metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Fallback::NotSynced => "not_synced",
            Fallback::Stale => "stale",
            Fallback::KeysUnavailable => "keys_unavailable",
            Fallback::KeysStale => "keys_stale",
            Fallback::UnknownKey => "unknown_key",
            Fallback::UnsupportedKey => "unsupported_key",
            Fallback::UnlistedIssuer => "unlisted_issuer",
            Fallback::NotPodBound => "not_pod_bound",
            Fallback::NotSeenYet => "not_seen_yet",
        }
    }
}

/// How old the state behind local verification is: for the keys, the time since they were
/// last fetched; for each watch, the time since it was last known in sync (zero while it is).
/// `None`: never (or, for nodes, not watched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    pub keys: Option<Duration>,
    pub pods: Option<Duration>,
    pub service_account: Option<Duration>,
    pub nodes: Option<Duration>,
}

impl Freshness {
    /// The age of the older of the watches verification needs (pods, service account):
    /// the figure to export, and the one [`Fallback::Stale`] bounds. `None` until both listed.
    pub fn watches(&self) -> Option<Duration> {
        Some(self.pods?.max(self.service_account?))
    }
}
