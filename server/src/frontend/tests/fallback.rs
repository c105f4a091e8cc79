//! `--fallback-proxy` as the client sees it: a stand-in fallback on a Unix socket answers each
//! relayed CONNECT as a test tells it, and the client gets exactly `200` and a tunnel, or a
//! refusal the server wrote.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::*;
use crate::routing::fallback::{Fallback, FallbackConfig, FallbackDestinations};

/// A fallback proxy on a Unix socket that answers every CONNECT with `answer` and then holds
/// the connection until the server closes it; sends each request head it read on `heads`.
struct StandIn {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    heads: tokio::sync::mpsc::Receiver<String>,
}

impl StandIn {
    fn start(answer: &'static [u8]) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fallback.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (sent, heads) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let sent = sent.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut byte = [0u8; 1];
                        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let _ = sent.send(String::from_utf8_lossy(&head).into_owned()).await;
                    let _ = conn.write_all(answer).await;
                    let mut rest = Vec::new();
                    let _ = conn.read_to_end(&mut rest).await;
                });
            }
        });
        StandIn {
            _dir: dir,
            socket,
            heads,
        }
    }

    fn path(&self) -> &Path {
        &self.socket
    }
}

/// A server with no agent, so that every CONNECT goes to `fallback`, with the default
/// destination policy.
fn context_to(fallback: &StandIn) -> Arc<Context> {
    context_with_policy(fallback, &FallbackDestinations::default())
}

/// [`context_to`] with the policy of `destinations`.
fn context_with_policy(fallback: &StandIn, destinations: &FallbackDestinations) -> Arc<Context> {
    let config = FallbackConfig::Unix(fallback.path().to_owned());
    let registry = Registry::new(vec![Strategy::Default], 100);
    context_with_fallback(
        registry,
        TEST_TIMEOUT,
        Some(Fallback::new(config, destinations).unwrap()),
    )
}

fn connect(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
}

/// The answer's head and body for a CONNECT to `target`; a `200` comes back at once with no
/// body (its tunnel left to close), so that a test expecting a refusal fails rather than
/// waits on a tunnel.
async fn answer_to(ctx: &Arc<Context>, target: &str) -> (String, String) {
    let (server, mut client) = connection();
    let served = serve(server, ctx);
    client.io.write_all(&connect(target)).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        client.io.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    if head.starts_with("HTTP/1.1 200 ") {
        return (head, String::new());
    }
    let mut body = Vec::new();
    client.io.read_to_end(&mut body).await.unwrap();
    served.await.unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// Whether the client gets the `200` for `target` (the stand-in answers every CONNECT so).
async fn opens(ctx: &Arc<Context>, target: &str) -> bool {
    let (server, mut client) = connection();
    let served = serve(server, ctx);
    client.io.write_all(&connect(target)).await.unwrap();
    let mut answer = vec![0u8; head::ESTABLISHED.len()];
    client.io.read_exact(&mut answer).await.unwrap();
    drop(client);
    served.await.unwrap();
    answer == head::ESTABLISHED
}

fn fallback_dials(ctx: &Context, result: &str) -> f64 {
    metric(
        ctx,
        &format!("bridgehead_server_fallback_dials_total{{result=\"{result}\"}}"),
    )
}

/// Only `200` opens a tunnel: any other answer of the fallback — a 2xx that RFC 9110 lets a
/// client take as an open tunnel, a redirect, its own refusal — reaches the client as a 502
/// that names the fallback and quotes its status and reason.
#[tokio::test]
async fn a_fallback_answer_other_than_200_is_a_502_quoting_it() {
    bounded(async {
        for (answer, quoted) in [
            (&b"HTTP/1.1 204 No Content\r\n\r\n"[..], "204 No Content"),
            (
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: 0\r\n\r\n",
                "206 Partial Content",
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
                "101 Switching Protocols",
            ),
            (b"HTTP/1.1 302 Found\r\nLocation: /\r\n\r\n", "302 Found"),
            (
                b"HTTP/1.1 503 Service Unavailable\r\n\r\n",
                "503 Service Unavailable",
            ),
        ] {
            let mut fallback = StandIn::start(answer);
            let ctx = context_to(&fallback);
            let (head, body) = refusal_of(&ctx, HEAD).await;
            assert!(head.starts_with("HTTP/1.1 502 "), "{quoted}: {head}");
            let url = format!("unix://{}", fallback.path().display());
            assert!(
                body.contains(&format!("fallback proxy {url} answered {quoted}")),
                "{quoted}: {body}"
            );
            let relayed = fallback.heads.recv().await.unwrap();
            assert!(
                relayed.starts_with("CONNECT 10.0.0.5:10250 HTTP/1.1\r\n"),
                "{relayed}"
            );
            assert_eq!(fallback_dials(&ctx, "refused"), 1.0, "{quoted}");
            assert_eq!(dials(&ctx, "other"), 1.0, "{quoted}");
        }
    })
    .await
}

/// A `200` opens the tunnel: the client gets the server's own `200` and the fallback's bytes
/// behind its answer are the tunnel's first.
#[tokio::test]
async fn a_fallback_200_opens_the_tunnel() {
    bounded(async {
        let fallback = StandIn::start(b"HTTP/1.1 200 Connection established\r\n\r\nbanner");
        let ctx = context_to(&fallback);
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        let expected = [head::ESTABLISHED, b"banner"].concat();
        assert_eq!(read_n(&mut client.io, expected.len()).await, expected);
        assert_eq!(fallback_dials(&ctx, "ok"), 1.0);
        drop(client);
        served.await.unwrap();
    })
    .await
}

/// The destination policy the agents apply covers what goes to the fallback too: by default
/// the metadata and link-local addresses and "this host" get a 403 that names the rule, and
/// the fallback is never asked; other targets, and names, are relayed.
#[tokio::test]
async fn targets_the_default_policy_denies_never_reach_the_fallback() {
    bounded(async {
        let mut fallback = StandIn::start(b"HTTP/1.1 200 Connection established\r\n\r\n");
        let ctx = context_to(&fallback);
        for (target, says) in [
            ("169.254.169.254:80", "link-local"),
            ("[fd00:ec2::254]:80", "cloud metadata"),
            ("[fe80::1]:443", "link-local"),
            ("[::ffff:169.254.169.254]:80", "link-local"),
            ("0.0.0.0:10250", "this host"),
            ("[::]:10250", "this host"),
        ] {
            let (head, body) = answer_to(&ctx, target).await;
            assert!(head.starts_with("HTTP/1.1 403 "), "{target}: {head} {body}");
            assert!(
                body.contains("not relayed to fallback proxy"),
                "{target}: {body}"
            );
            assert!(body.contains(says), "{target}: {body}");
        }
        assert!(fallback.heads.try_recv().is_err(), "the fallback was asked");
        assert_eq!(fallback_dials(&ctx, "denied"), 6.0);
        assert_eq!(dials(&ctx, "not_permitted"), 6.0);
        for target in ["10.0.0.5:10250", "127.0.0.1:8080", "node-1.example:10250"] {
            assert!(opens(&ctx, target).await, "{target}");
            let relayed = fallback.heads.recv().await.unwrap();
            assert!(
                relayed.starts_with(&format!("CONNECT {target} ")),
                "{relayed}"
            );
        }
    })
    .await
}

/// The operator's rules: a deny rule narrows (loopback, in production), an exemption widens
/// the defaults for a migration window (a metadata port the cluster reached through
/// konnectivity on purpose), an allow list keeps to the networks it names.
#[tokio::test]
async fn operator_rules_narrow_widen_and_list_what_reaches_the_fallback() {
    bounded(async {
        use bridgehead_runtime::destinations::parse_rules;
        let fallback = StandIn::start(b"HTTP/1.1 200 Connection established\r\n\r\n");
        let rules = |list| parse_rules(list).unwrap();
        let ctx = context_with_policy(
            &fallback,
            &FallbackDestinations {
                allowed: vec![],
                denied: rules("127.0.0.0/8,[::1/128]"),
                exempt: rules("169.254.169.254/32:80"),
            },
        );
        let (head, body) = answer_to(&ctx, "127.0.0.1:8080").await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        assert!(
            body.contains("denied by --fallback-denied-destinations 127.0.0.0/8"),
            "{body}"
        );
        assert!(opens(&ctx, "169.254.169.254:80").await);
        let (head, body) = answer_to(&ctx, "169.254.169.254:443").await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        assert!(body.contains("denied by default"), "{body}");

        let listed = context_with_policy(
            &fallback,
            &FallbackDestinations {
                allowed: rules("10.0.0.0/8"),
                ..FallbackDestinations::default()
            },
        );
        assert!(opens(&listed, "10.1.2.3:443").await);
        let (head, body) = answer_to(&listed, "192.168.1.1:443").await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        assert!(
            body.contains("not in --fallback-allowed-destinations"),
            "{body}"
        );
    })
    .await
}
