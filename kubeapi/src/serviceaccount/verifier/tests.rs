//! [`TokenVerifier`] against a stand-in kube-apiserver on loopback (plain HTTP): issuer
//! discovery whose keys the test rotates, and lists and watches of the agent's pod and
//! service account whose events the test sends. Counts the key fetches, so that pacing shows.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::super::keys::tests::{jwks, TestKey};
use super::super::tests::{claims_issued, signed_text, ACCOUNT, AUDIENCE, ISSUER, NAMESPACE};
use super::super::MIN_REFETCH_INTERVAL;
use super::super::{Fallback, Malformed};
use super::*;

const TEST_TIMEOUT: Duration = Duration::from_secs(20);
/// A wait that, if it were waited out, would fail the test by its timeout.
const LONGER_THAN_THE_TEST: Duration = Duration::from_secs(600);
/// Watch events the stand-in holds for watchers that have not read them yet.
const EVENTS: usize = 16;

/// What the stand-in serves.
struct StandIn {
    jwks: Mutex<Vec<u8>>,
    jwks_fetches: AtomicUsize,
    /// Answer 500 to the keys, as a kube-apiserver whose discovery fails.
    jwks_failing: AtomicBool,
    /// Lines for the pods' watch.
    pod_events: broadcast::Sender<String>,
    pod_watch_started: tokio::sync::Notify,
    /// Answer 403 to lists and watches, as for a server with only TokenReview's RBAC.
    forbid_watches: bool,
    /// Streaming lists refused (each watch asks once, then lists in pages).
    streaming_refused: AtomicUsize,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn json(status: u16, text: String) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)).boxed_unsync())
        .unwrap_or_default()
}

fn metadata(kind: &str, name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "meta.k8s.io/v1", "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "resourceVersion": "1"},
    })
}

impl StandIn {
    fn answer(&self, request: &hyper::Request<hyper::body::Incoming>) -> hyper::Response<Body> {
        let path = request.uri().path();
        let watch = request.uri().query().unwrap_or("").contains("watch=true");
        let (object, name, uid) = match path {
            "/.well-known/openid-configuration" => {
                let configuration = serde_json::json!({
                    "issuer": ISSUER, "jwks_uri": "https://unused/openid/v1/jwks"});
                return json(200, configuration.to_string());
            }
            "/openid/v1/jwks" => {
                self.jwks_fetches.fetch_add(1, Ordering::SeqCst);
                if self.jwks_failing.load(Ordering::SeqCst) {
                    let status = serde_json::json!({"kind": "Status", "code": 500});
                    return json(500, status.to_string());
                }
                let body = self.jwks.lock().unwrap().clone();
                return json(200, String::from_utf8(body).unwrap());
            }
            "/api/v1/namespaces/kube-system/pods" => ("pods", "agent-1", "pod-uid"),
            "/api/v1/namespaces/kube-system/serviceaccounts" => {
                ("serviceaccounts", ACCOUNT, "sa-uid")
            }
            _ => {
                let status = serde_json::json!({"kind": "Status", "code": 404, "message": path});
                return json(404, status.to_string());
            }
        };
        if self.forbid_watches {
            let status = serde_json::json!({"kind": "Status", "code": 403, "message": object});
            return json(403, status.to_string());
        }
        // As a kube-apiserver without streaming lists (WatchList off, or before 1.27): the
        // verifier lists in pages then.
        if watch
            && request
                .uri()
                .query()
                .unwrap_or("")
                .contains("sendInitialEvents=true")
        {
            self.streaming_refused.fetch_add(1, Ordering::SeqCst);
            let status = serde_json::json!({"kind": "Status", "code": 422, "reason": "Invalid",
                "message": "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"});
            return json(422, status.to_string());
        }
        if !watch {
            let list = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                "metadata": {"resourceVersion": "1"},
                "items": [metadata("PartialObjectMetadata", name, uid)],
            });
            return json(200, list.to_string());
        }
        // A watch: the pods' carries what the test sends; the account's stays quiet.
        let receiver = (object == "pods").then(|| self.pod_events.subscribe());
        if receiver.is_some() {
            self.pod_watch_started.notify_one();
        }
        let lines = futures_util::stream::unfold(receiver, |receiver| async move {
            let mut receiver = receiver?;
            let line = receiver.recv().await.ok()?;
            Some((Ok(Frame::data(Bytes::from(line))), Some(receiver)))
        });
        let quiet = futures_util::stream::pending();
        let body = if object == "pods" {
            StreamBody::new(futures_util::StreamExt::boxed(lines)).boxed_unsync()
        } else {
            StreamBody::new(futures_util::StreamExt::boxed(quiet)).boxed_unsync()
        };
        hyper::Response::builder()
            .header("content-type", "application/json")
            .body(body)
            .unwrap_or_default()
    }
}

/// Serves `stand_in` on a loopback port until `stop`; the API's URL.
async fn serve(stand_in: Arc<StandIn>, stop: CancellationToken) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                () = stop.cancelled() => return,
            };
            let stand_in = stand_in.clone();
            let service = hyper::service::service_fn(move |request| {
                let answer = stand_in.answer(&request);
                async move { Ok::<_, Infallible>(answer) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    url
}

fn now() -> i64 {
    At::now().unix
}

/// A stand-in serving `key` as `k1`, and a verifier started against it.
async fn start(
    key: &TestKey,
    forbid_watches: bool,
    stop: &CancellationToken,
) -> (Arc<StandIn>, TokenVerifier) {
    let settings = VerifierSettings::new(NAMESPACE, ACCOUNT, AUDIENCE);
    start_with(key, forbid_watches, settings, stop).await
}

/// [`start`] with `settings`.
async fn start_with(
    key: &TestKey,
    forbid_watches: bool,
    settings: VerifierSettings,
    stop: &CancellationToken,
) -> (Arc<StandIn>, TokenVerifier) {
    let stand_in = Arc::new(StandIn {
        jwks: Mutex::new(jwks(&[(key, "k1")])),
        jwks_fetches: AtomicUsize::new(0),
        jwks_failing: AtomicBool::new(false),
        pod_events: broadcast::channel(EVENTS).0,
        pod_watch_started: tokio::sync::Notify::new(),
        forbid_watches,
        streaming_refused: AtomicUsize::new(0),
    });
    let url = serve(stand_in.clone(), stop.clone()).await;
    let config = kube::Config::new(url.parse().unwrap());
    let api = Arc::new(KubeApi::with_config(config, 0.0, 0).unwrap());
    let verifier = TokenVerifier::start(api, settings, stop.clone());
    (stand_in, verifier)
}

#[tokio::test]
async fn without_rbac_for_the_watches_tokens_fall_back_and_garbage_is_still_refused() {
    let stop = CancellationToken::new();
    let k1 = TestKey::p256();
    let (_stand_in, verifier) = start(&k1, true, &stop).await;
    tokio::time::timeout(TEST_TIMEOUT, async {
        loop {
            let changed = verifier.changed();
            if verifier.freshness().keys.is_some() {
                return;
            }
            changed.await;
        }
    })
    .await
    .expect("the keys were never fetched");
    let good = signed_text(&k1, "k1", &claims_issued(now() - 600));
    assert_eq!(
        verifier.verify(&good).await,
        Outcome::Fallback(Fallback::NotSynced)
    );
    // Once the watches were forbidden, nothing is waited for.
    let settled = tokio::time::timeout(
        TEST_TIMEOUT,
        verifier.verify_after_startup(&good, LONGER_THAN_THE_TEST),
    );
    assert_eq!(
        settled.await.expect("waited for a start that cannot come"),
        Outcome::Fallback(Fallback::NotSynced)
    );
    let forged = signed_text(&TestKey::p256(), "k1", &claims_issued(now() - 600));
    assert_eq!(
        verifier.verify(&forged).await,
        Outcome::Refused(Refusal::BadSignature)
    );
    assert!(!verifier.is_ready());
    assert_eq!(verifier.freshness().watches(), None);
    stop.cancel();
}

#[tokio::test]
async fn tokens_are_verified_from_discovery_and_watches_with_paced_key_fetches() {
    let stop = CancellationToken::new();
    let k1 = TestKey::p256();
    let (stand_in, verifier) = start(&k1, false, &stop).await;
    // A token presented at once waits for the start rather than falling back.
    let good = signed_text(&k1, "k1", &claims_issued(now() - 600));
    let first = tokio::time::timeout(
        TEST_TIMEOUT,
        verifier.verify_after_startup(&good, LONGER_THAN_THE_TEST),
    );
    assert!(matches!(
        first.await.expect("verify_after_startup never answered"),
        Outcome::Verified(_)
    ));
    tokio::time::timeout(TEST_TIMEOUT, verifier.ready())
        .await
        .expect("the verifier never got ready");
    let fetches = || stand_in.jwks_fetches.load(Ordering::SeqCst);
    assert_eq!(fetches(), 1);
    // Both watches asked for a streaming list once, were refused, and listed in pages.
    assert_eq!(stand_in.streaming_refused.load(Ordering::SeqCst), 2);
    let freshness = verifier.freshness();
    assert_eq!(freshness.watches(), Some(Duration::ZERO));
    assert!(freshness.keys.is_some());
    assert_eq!(freshness.nodes, None);

    let Outcome::Verified(verified) = verifier.verify(&good).await else {
        panic!("a good token was not verified");
    };
    assert_eq!(verified.pod.uid, "pod-uid");
    assert_eq!(verifier.recheck(&verified), None);
    // Garbage and forgeries cost nothing.
    assert_eq!(
        verifier.verify("not-a-token").await,
        Outcome::Refused(Refusal::Malformed(Malformed::NotThreeParts))
    );
    let forger = TestKey::p256();
    let forged = signed_text(&forger, "k1", &claims_issued(now() - 600));
    assert_eq!(
        verifier.verify(&forged).await,
        Outcome::Refused(Refusal::BadSignature)
    );
    assert_eq!(fetches(), 1);

    // The issuer rotates in a key. Within the pacing interval of the last fetch, a token
    // naming it goes to TokenReview; after it, the first such token fetches the keys again.
    let k2 = TestKey::p384();
    *stand_in.jwks.lock().unwrap() = jwks(&[(&k1, "k1"), (&k2, "k2")]);
    let rotated = signed_text(&k2, "k2", &claims_issued(now() - 600));
    tokio::time::pause();
    assert_eq!(
        verifier.verify(&rotated).await,
        Outcome::Fallback(Fallback::UnknownKey)
    );
    assert_eq!(fetches(), 1);
    tokio::time::advance(MIN_REFETCH_INTERVAL).await;
    assert!(matches!(
        verifier.verify(&rotated).await,
        Outcome::Verified(_)
    ));
    assert_eq!(fetches(), 2);
    // Another unknown key right after: no fetch, TokenReview's.
    let made_up = signed_text(&forger, "k3", &claims_issued(now() - 600));
    assert_eq!(
        verifier.verify(&made_up).await,
        Outcome::Fallback(Fallback::UnknownKey)
    );
    // An unknown key on claims that fail: refused, no fetch either.
    let mut expired = claims_issued(now() - 7200);
    expired["exp"] = (now() - 3600).into();
    assert_eq!(
        verifier.verify(&signed_text(&forger, "k4", &expired)).await,
        Outcome::Refused(Refusal::Expired)
    );
    assert_eq!(fetches(), 2);
    tokio::time::resume();

    // The pod is deleted: its tokens are refused as soon as the watch says so, and a session
    // verified earlier learns it too.
    let deleted = serde_json::json!({
        "type": "DELETED",
        "object": metadata("PartialObjectMetadata", "agent-1", "pod-uid"),
    });
    tokio::time::timeout(TEST_TIMEOUT, stand_in.pod_watch_started.notified())
        .await
        .expect("the pods were never watched");
    let revoked = verifier.revoked();
    stand_in
        .pod_events
        .send(format!("{deleted}\n"))
        .expect("no pod watch");
    tokio::time::timeout(TEST_TIMEOUT, revoked)
        .await
        .expect("the deletion never arrived");
    assert_eq!(
        verifier.verify(&good).await,
        Outcome::Refused(Refusal::PodGone)
    );
    assert_eq!(verifier.recheck(&verified), Some(Refusal::PodGone));
    stop.cancel();
}

/// Keys that cannot be fetched again stop vouching for tokens at their maximum age: tokens go
/// to TokenReview (a key the issuer dropped meanwhile would still be listed), and the first
/// token after a fetch works again is verified locally again.
#[tokio::test]
async fn keys_discovery_cannot_renew_stop_verifying_at_their_maximum_age() {
    let stop = CancellationToken::new();
    let k1 = TestKey::p256();
    let mut settings = VerifierSettings::new(NAMESPACE, ACCOUNT, AUDIENCE);
    // No scheduled refresh within the test: only tokens ask for fetches.
    settings.key_refresh = LONGER_THAN_THE_TEST;
    settings.max_key_age = Duration::from_secs(60);
    let max_key_age = settings.max_key_age;
    let (stand_in, verifier) = start_with(&k1, false, settings, &stop).await;
    let good = signed_text(&k1, "k1", &claims_issued(now() - 600));
    let first = tokio::time::timeout(
        TEST_TIMEOUT,
        verifier.verify_after_startup(&good, LONGER_THAN_THE_TEST),
    );
    assert!(matches!(
        first.await.expect("verify_after_startup never answered"),
        Outcome::Verified(_)
    ));
    let fetches = || stand_in.jwks_fetches.load(Ordering::SeqCst);
    assert_eq!(fetches(), 1);

    stand_in.jwks_failing.store(true, Ordering::SeqCst);
    tokio::time::pause();
    // Within the age (the time the start took counts too: half of it is ample).
    tokio::time::advance(max_key_age / 2).await;
    assert!(matches!(verifier.verify(&good).await, Outcome::Verified(_)));
    assert_eq!(fetches(), 1);
    // Past the age: one fetch is tried, fails, and the token is TokenReview's.
    tokio::time::advance(max_key_age / 2 + Duration::from_millis(1)).await;
    assert_eq!(
        verifier.verify(&good).await,
        Outcome::Fallback(Fallback::KeysStale)
    );
    assert_eq!(fetches(), 2);
    // Paced: the next token does not fetch.
    assert_eq!(
        verifier.verify(&good).await,
        Outcome::Fallback(Fallback::KeysStale)
    );
    assert_eq!(fetches(), 2);
    // Discovery works again: the next token, once fetches may start again, brings new keys.
    stand_in.jwks_failing.store(false, Ordering::SeqCst);
    tokio::time::advance(MIN_REFETCH_INTERVAL).await;
    assert!(matches!(verifier.verify(&good).await, Outcome::Verified(_)));
    assert_eq!(fetches(), 3);
    tokio::time::resume();
    stop.cancel();
}
