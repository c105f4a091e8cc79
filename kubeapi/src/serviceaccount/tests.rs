//! The whole verdict ([`decide`]) on tokens signed here, against watched state set here: each
//! refusal, each fallback, and the rules at their boundaries.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::keys::tests::{jwks, TestKey};
use super::keys::KeySet;
use super::liveness::{Change, Entry};
use super::*;

const NOW: i64 = 2_000_000_000;
pub(crate) const ISSUER: &str = "https://kubernetes.default.svc";
pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const ACCOUNT: &str = "bridgehead-agent";
pub(crate) const AUDIENCE: &str = "bridgehead";

fn settings() -> VerifierSettings {
    let mut settings = VerifierSettings::new(NAMESPACE, ACCOUNT, AUDIENCE);
    settings.watch_nodes = true;
    settings
}

/// The claims kube-apiserver puts in a pod-bound token, issued `age` seconds before NOW.
fn claims(age: i64) -> serde_json::Value {
    claims_issued(NOW - age)
}

/// The claims of a token issued at `issued` (seconds since the epoch).
pub(crate) fn claims_issued(issued: i64) -> serde_json::Value {
    serde_json::json!({
        "aud": [AUDIENCE],
        "exp": issued + 3600,
        "iat": issued,
        "nbf": issued,
        "iss": ISSUER,
        "jti": "4d8f7e4a-0f39-4e3f-9a3c-1f2b3c4d5e6f",
        "sub": format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}"),
        "kubernetes.io": {
            "namespace": NAMESPACE,
            "node": {"name": "node-1", "uid": "node-uid"},
            "pod": {"name": "agent-1", "uid": "pod-uid"},
            "serviceaccount": {"name": ACCOUNT, "uid": "sa-uid"},
        },
    })
}

fn sign(key: &TestKey, kid: &str, claims: &serde_json::Value) -> Token {
    Token::parse(&signed_text(key, kid, claims)).unwrap()
}

/// A token of `claims` signed by `key`, naming key `kid`.
pub(crate) fn signed_text(key: &TestKey, kid: &str, claims: &serde_json::Value) -> String {
    let header = serde_json::json!({"alg": key.algorithm(), "kid": kid});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = URL_SAFE_NO_PAD.encode(key.sign(input.as_bytes()));
    format!("{input}.{signature}")
}

fn issuer(keys: &[(&TestKey, &str)]) -> Issuer {
    Issuer {
        issuer: ISSUER.into(),
        keys: KeySet::parse(&jwks(keys)).unwrap(),
    }
}

/// Watches that listed the agent's pod and account, and its node.
fn live(now: Instant) -> Live {
    let mut live = Live::new(true);
    let entry = |uid: &str| Entry {
        uid: uid.into(),
        deleting_since: None,
    };
    for (objects, name, uid) in [
        (&mut live.pods, "agent-1", "pod-uid"),
        (&mut live.account, ACCOUNT, "sa-uid"),
    ] {
        objects.apply(Change::Relist, now);
        objects.apply(Change::Listing(name.into(), entry(uid)), now);
        objects.apply(Change::Listed, now);
    }
    let nodes = live.nodes.as_mut().unwrap();
    nodes.apply(Change::Relist, now);
    let addresses = vec!["node-1".to_owned(), "10.0.0.1".to_owned()];
    nodes.apply(Change::Listing("node-1".into(), addresses), now);
    nodes.apply(Change::Listed, now);
    live
}

struct Case {
    settings: VerifierSettings,
    /// The keys, or why there are none.
    issuer: Result<Issuer, Fallback>,
    live: Live,
    now: Instant,
}

impl Case {
    fn new(key: &TestKey) -> Case {
        let now = Instant::now();
        Case {
            settings: settings(),
            issuer: Ok(issuer(&[(key, "k1")])),
            live: live(now),
            now,
        }
    }

    fn decide(&self, token: &Token) -> Step {
        self.decide_at(token, NOW, self.now)
    }

    fn decide_at(&self, token: &Token, now_unix: i64, now: Instant) -> Step {
        let signature = self
            .issuer
            .as_ref()
            .map_or(SignatureCheck::UnknownKey, |issuer| {
                issuer.keys.check(token)
            });
        decide(
            &self.settings,
            &self.settings.expected(),
            token,
            self.issuer.as_ref().map_err(|missing| *missing),
            signature,
            &self.live,
            At {
                unix: now_unix,
                instant: now,
            },
        )
    }
}

fn refused(refusal: Refusal) -> Step {
    Step::Done(Outcome::Refused(refusal))
}

fn fallback(reason: Fallback) -> Step {
    Step::Done(Outcome::Fallback(reason))
}

#[test]
fn a_live_agents_token_is_verified_with_its_pod_and_node() {
    for key in [TestKey::p256(), TestKey::p384(), TestKey::rsa()] {
        let case = Case::new(&key);
        let Step::Done(Outcome::Verified(verified)) = case.decide(&sign(&key, "k1", &claims(600)))
        else {
            panic!("{} not verified", key.algorithm());
        };
        assert_eq!(
            verified.username,
            "system:serviceaccount:kube-system:bridgehead-agent"
        );
        assert_eq!(verified.service_account_uid, "sa-uid");
        assert_eq!(
            verified.pod,
            BoundObject {
                name: "agent-1".into(),
                uid: "pod-uid".into()
            }
        );
        assert_eq!(verified.node.as_ref().unwrap().name, "node-1");
        assert_eq!(
            verified.node_addresses.as_deref(),
            Some(&["node-1".to_owned(), "10.0.0.1".to_owned()][..])
        );
        assert_eq!(
            verified.expires_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs((NOW - 600 + 3600) as u64)
        );
    }
}

#[test]
fn a_node_not_in_the_watch_leaves_its_addresses_to_the_caller() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let mut claims = claims(600);
    claims["kubernetes.io"]["node"]["name"] = "node-2".into();
    let Step::Done(Outcome::Verified(verified)) = case.decide(&sign(&key, "k1", &claims)) else {
        panic!("not verified");
    };
    assert_eq!(verified.node_addresses, None);
    // Nodes not watched at all: the same.
    case.live.nodes = None;
    let Step::Done(Outcome::Verified(verified)) =
        case.decide(&sign(&key, "k1", &self::claims(600)))
    else {
        panic!("not verified");
    };
    assert_eq!(verified.node_addresses, None);
}

#[test]
fn a_known_keys_bad_signature_is_refused_whatever_the_rest() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let forger = TestKey::p256();
    let forged = sign(&forger, "k1", &claims(600));
    assert_eq!(case.decide(&forged), refused(Refusal::BadSignature));
    // Even before the watches list.
    case.live = Live::new(true);
    assert_eq!(case.decide(&forged), refused(Refusal::BadSignature));
}

#[test]
fn each_claim_that_fails_is_refused_signed_or_not() {
    let key = TestKey::p256();
    let case = Case::new(&key);
    let stranger = TestKey::p256();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = claims(600);
        edit(&mut claims);
        claims
    };
    let cases: Vec<(serde_json::Value, Refusal)> = vec![
        (with(&|c| c["exp"] = (NOW - 61).into()), Refusal::Expired),
        (
            with(&|c| c["nbf"] = (NOW + 61).into()),
            Refusal::NotYetValid,
        ),
        (
            with(&|c| c["iat"] = (NOW + 61).into()),
            Refusal::NotYetValid,
        ),
        (
            with(&|c| c["aud"] = serde_json::json!(["https://kubernetes.default.svc"])),
            Refusal::WrongAudience,
        ),
        (
            with(&|c| {
                c["kubernetes.io"]["serviceaccount"]["name"] = "someone-else".into();
                c["sub"] = "system:serviceaccount:kube-system:someone-else".into();
            }),
            Refusal::WrongAccount {
                got: "system:serviceaccount:kube-system:someone-else".into(),
            },
        ),
        (
            with(&|c| {
                c["kubernetes.io"]["namespace"] = "default".into();
                c["sub"] = "system:serviceaccount:default:bridgehead-agent".into();
            }),
            Refusal::WrongAccount {
                got: "system:serviceaccount:default:bridgehead-agent".into(),
            },
        ),
        (
            with(&|c| c["kubernetes.io"]["pod"]["uid"] = "recreated".into()),
            Refusal::PodGone,
        ),
        (
            with(&|c| c["kubernetes.io"]["pod"]["name"] = "deleted-long-ago".into()),
            Refusal::PodGone,
        ),
        (
            with(&|c| c["kubernetes.io"]["serviceaccount"]["uid"] = "old-account".into()),
            Refusal::AccountGone,
        ),
    ];
    for (claims, refusal) in cases {
        assert_eq!(
            case.decide(&sign(&key, "k1", &claims)),
            refused(refusal.clone()),
            "signed: {claims}"
        );
        // The same claims under a key nobody lists: refused all the same, no fetch.
        assert_eq!(
            case.decide(&sign(&stranger, "made-up", &claims)),
            refused(refusal),
            "unknown key: {claims}"
        );
    }
}

#[test]
fn an_unknown_key_is_fetched_for_only_when_the_rest_is_a_live_agents() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let rotated = TestKey::p256();
    let token = sign(&rotated, "k2", &claims(600));
    assert_eq!(case.decide(&token), Step::NeedKeys(Fallback::UnknownKey));
    // After the refetch the new key is listed: verified.
    case.issuer = Ok(issuer(&[(&key, "k1"), (&rotated, "k2")]));
    assert!(matches!(
        case.decide(&token),
        Step::Done(Outcome::Verified(_))
    ));
    // Under a key nobody lists, what the claims cannot settle is refused, not sent on.
    let stranger = TestKey::p256();
    let mut unbound = claims(600);
    unbound["kubernetes.io"]
        .as_object_mut()
        .unwrap()
        .remove("pod");
    assert_eq!(
        case.decide(&sign(&stranger, "x", &unbound)),
        refused(Refusal::UnknownKey)
    );
    let mut elsewhere = claims(600);
    elsewhere["iss"] = "https://attacker.example".into();
    assert_eq!(
        case.decide(&sign(&stranger, "x", &elsewhere)),
        refused(Refusal::WrongIssuer)
    );
    // Under a key nobody lists, a pod the watches cannot vouch for is not sent on either:
    // not seen yet, not listed, or stale.
    let mut unseen = claims(0);
    unseen["kubernetes.io"]["pod"] = serde_json::json!({"name": "agent-2", "uid": "new"});
    assert_eq!(
        case.decide(&sign(&stranger, "x", &unseen)),
        refused(Refusal::UnknownKey)
    );
    let listed = std::mem::replace(&mut case.live, Live::new(true));
    let made_up = sign(&stranger, "x", &claims(600));
    assert_eq!(case.decide(&made_up), refused(Refusal::UnknownKey));
    case.live = listed;
    // No keys yet at all: the same rules, and then a fetch.
    case.issuer = Err(Fallback::KeysUnavailable);
    assert_eq!(
        case.decide(&token),
        Step::NeedKeys(Fallback::KeysUnavailable)
    );
    // Nor is a token bound to no pod refused for a key nobody could check: it goes on (a
    // server with only konnectivity's RBAC reviews it, as before).
    assert_eq!(
        case.decide(&sign(&key, "k1", &unbound)),
        Step::NeedKeys(Fallback::KeysUnavailable)
    );
    // With neither keys nor watches (a server with only TokenReview's RBAC), every token that
    // could be right goes on.
    let listed = std::mem::replace(&mut case.live, Live::new(true));
    assert_eq!(
        case.decide(&token),
        Step::NeedKeys(Fallback::KeysUnavailable)
    );
    case.live = listed;
    let mut expired = claims(600);
    expired["exp"] = (NOW - 61).into();
    assert_eq!(
        case.decide(&sign(&key, "k1", &expired)),
        refused(Refusal::Expired)
    );
}

#[test]
fn what_cannot_be_settled_here_goes_to_tokenreview() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    // Not bound to a pod.
    let mut unbound = claims(600);
    unbound["kubernetes.io"]
        .as_object_mut()
        .unwrap()
        .remove("pod");
    assert_eq!(
        case.decide(&sign(&key, "k1", &unbound)),
        fallback(Fallback::NotPodBound)
    );
    // Signed by the issuer's key under an issuer discovery does not name...
    let mut migrating = claims(600);
    migrating["iss"] = "https://old-issuer.example".into();
    assert_eq!(
        case.decide(&sign(&key, "k1", &migrating)),
        fallback(Fallback::UnlistedIssuer)
    );
    // ...unless the settings accept it.
    case.settings.issuers = vec!["https://old-issuer.example".into()];
    assert!(matches!(
        case.decide(&sign(&key, "k1", &migrating)),
        Step::Done(Outcome::Verified(_))
    ));
    // A pod made a moment ago may not be in the watch yet; an old token's missing pod is gone.
    let mut fresh = claims(NOT_SEEN_GRACE_SECS);
    fresh["kubernetes.io"]["pod"] = serde_json::json!({"name": "agent-2", "uid": "new"});
    assert_eq!(
        case.decide(&sign(&key, "k1", &fresh)),
        fallback(Fallback::NotSeenYet)
    );
    let mut old = claims(NOT_SEEN_GRACE_SECS + 1);
    old["kubernetes.io"]["pod"] = serde_json::json!({"name": "agent-2", "uid": "new"});
    assert_eq!(
        case.decide(&sign(&key, "k1", &old)),
        refused(Refusal::PodGone)
    );
    // A key of a kind not checked here.
    let json = serde_json::json!({"keys": [
        {"kty": "EC", "crv": "P-521", "kid": "k9", "x": "AA", "y": "AA"}]});
    case.issuer = Ok(Issuer {
        issuer: ISSUER.into(),
        keys: KeySet::parse(json.to_string().as_bytes()).unwrap(),
    });
    assert_eq!(
        case.decide(&sign(&key, "k9", &claims(600))),
        fallback(Fallback::UnsupportedKey)
    );
}

#[test]
fn watches_decide_only_while_current() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let token = sign(&key, "k1", &claims(600));
    // Not listed yet.
    case.live = Live::new(true);
    assert_eq!(case.decide(&token), fallback(Fallback::NotSynced));
    // Nodes are not needed for a verdict.
    case.live = live(case.now);
    case.live.nodes = Some(Table::default());
    assert!(matches!(
        case.decide(&token),
        Step::Done(Outcome::Verified(Verified {
            node_addresses: None,
            ..
        }))
    ));
    // The pods' watch fails: its last state decides up to the bound, then TokenReview.
    case.live.pods.apply(Change::Failed, case.now);
    let bound = case.settings.max_staleness;
    assert!(matches!(
        case.decide_at(&token, NOW, case.now + bound),
        Step::Done(Outcome::Verified(_))
    ));
    assert_eq!(
        case.decide_at(&token, NOW, case.now + bound + Duration::from_millis(1)),
        fallback(Fallback::Stale)
    );
}

#[test]
fn a_deleted_pod_counts_for_a_minute_past_its_deletion_time() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let token = sign(&key, "k1", &claims(600));
    let deleting = |since: i64| {
        Change::Applied(
            "agent-1".into(),
            Entry {
                uid: "pod-uid".into(),
                deleting_since: Some(since),
            },
        )
    };
    case.live.pods.apply(deleting(NOW - LEEWAY_SECS), case.now);
    assert!(matches!(
        case.decide(&token),
        Step::Done(Outcome::Verified(_))
    ));
    case.live
        .pods
        .apply(deleting(NOW - LEEWAY_SECS - 1), case.now);
    assert_eq!(case.decide(&token), refused(Refusal::PodGone));
    // Deleted outright: gone at once, even for a token issued a moment ago.
    let fresh = sign(&key, "k1", &claims(0));
    case.live
        .pods
        .apply(Change::Deleted("agent-1".into()), case.now);
    assert_eq!(case.decide(&fresh), refused(Refusal::PodGone));
    // The service account likewise.
    let mut case = Case::new(&key);
    case.live
        .account
        .apply(Change::Deleted(ACCOUNT.into()), case.now);
    assert_eq!(case.decide(&token), refused(Refusal::AccountGone));
}

#[test]
fn keys_past_their_age_judge_nothing_and_go_to_a_fetch() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let token = sign(&key, "k1", &claims(600));
    case.issuer = Err(Fallback::KeysStale);
    // A good token is not verified by keys that may list a dropped key: a fetch, then
    // TokenReview.
    assert_eq!(case.decide(&token), Step::NeedKeys(Fallback::KeysStale));
    // Nor is a token signed by a key nobody lists refused for it: the keys cannot say.
    let stranger = TestKey::p256();
    assert_eq!(
        case.decide(&sign(&stranger, "k1", &claims(600))),
        Step::NeedKeys(Fallback::KeysStale)
    );
    // The claims still refuse what kube-apiserver would.
    let mut expired = claims(600);
    expired["exp"] = (NOW - 61).into();
    assert_eq!(
        case.decide(&sign(&key, "k1", &expired)),
        refused(Refusal::Expired)
    );
}

#[test]
fn a_failing_nodes_watch_past_the_bound_leaves_the_addresses_to_a_live_read() {
    let key = TestKey::p256();
    let mut case = Case::new(&key);
    let token = sign(&key, "k1", &claims(600));
    let addresses = |step: Step| match step {
        Step::Done(Outcome::Verified(verified)) => verified.node_addresses,
        other => panic!("not verified: {other:?}"),
    };
    assert_eq!(
        addresses(case.decide(&token)),
        Some(vec!["node-1".to_owned(), "10.0.0.1".to_owned()])
    );
    // The nodes' watch fails: its last addresses bind identities up to the bound, then the
    // caller reads the Node (the token itself still verifies: pods and account are current).
    case.live
        .nodes
        .as_mut()
        .unwrap()
        .apply(Change::Failed, case.now);
    let bound = case.settings.max_staleness;
    assert!(addresses(case.decide_at(&token, NOW, case.now + bound)).is_some());
    assert_eq!(
        addresses(case.decide_at(&token, NOW, case.now + bound + Duration::from_millis(1))),
        None
    );
}
