//! The whole agent through `run`: health endpoints while the server is unreachable, and a
//! session with a minimal fake server (mTLS, upgrade checks, a tunnel to a local echo
//! listener, a refused dial, drain on shutdown). Everything stays on 127.0.0.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bridgehead_agent::{Cli, Config};
use bridgehead_certs::Pki;
use bridgehead_mux::{Keepalive, Mux, OpenFailure};
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::tls;
use bridgehead_test_support::{bounded, TEST_TIMEOUT};
use bytes::Bytes;
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_util::sync::CancellationToken;

/// Health and admin listeners on ephemeral loopback ports.
async fn listeners() -> bridgehead_agent::Listeners {
    bridgehead_agent::Listeners {
        health: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: TcpListener::bind("127.0.0.1:0").await.unwrap(),
    }
}

/// A bounded poll: the last resort for waiting on the agent's state from outside.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// `GET path` over HTTP/1.1: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

struct Pkidir {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Pkidir {
    fn new() -> Pkidir {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pki");
        Pki::generate(&[]).unwrap().write_dir(&path, false).unwrap();
        Pkidir { _dir: dir, path }
    }

    fn file(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }
}

fn config(args: &[&str]) -> Config {
    Cli::try_parse_from(std::iter::once("bridgehead-agent").chain(args.iter().copied()))
        .unwrap()
        .into_config()
        .unwrap()
}

/// A loopback port that refuses connections: a bound socket that never listens, held for the
/// test's lifetime (leaked), so no other test can take the port meanwhile.
async fn closed_port() -> u16 {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    std::mem::forget(socket);
    port
}

#[tokio::test]
async fn health_while_the_server_is_unreachable() {
    bounded(async {
        tls::install_crypto_provider();
        let pki = Pkidir::new();
        let port = closed_port().await.to_string();
        let config = config(&[
            "--ca-cert",
            &pki.file("cluster-ca.crt"),
            "--proxy-server-port",
            &port,
            "--sync-interval",
            "20ms",
            "--sync-interval-cap",
            "50ms",
        ]);
        let listeners = listeners().await;
        let health_addr = listeners.health.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(bridgehead_agent::run(config, listeners, shutdown.clone()));

        timeout(TEST_TIMEOUT, async {
            assert_eq!(get(health_addr, "/healthz").await, (200, "ok\n".to_owned()));
            eventually("/readyz to name the refused connection", || async {
                let (status, body) = get(health_addr, "/readyz").await;
                assert_eq!(status, 503, "{body}");
                assert!(body.starts_with("not connected to server: "), "{body}");
                body.contains("refused")
            })
            .await;
            let (status, metrics) = get(health_addr, "/metrics").await;
            assert_eq!(status, 200);
            assert!(
                metrics.contains("bridgehead_agent_connected 0\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("bridgehead_agent_streams_open 0\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("bridgehead_agent_dials_total{result=\"refused\"} 0\n"),
                "{metrics}"
            );
            eventually("a reconnect", || async {
                let (_, metrics) = get(health_addr, "/metrics").await;
                !metrics.contains("bridgehead_agent_reconnects_total 0\n")
            })
            .await;
            assert_eq!(get(health_addr, "/nope").await.0, 404);

            shutdown.cancel();
            agent.await.unwrap().unwrap();
        })
        .await
        .unwrap();
    })
    .await
}

/// What the fake server saw in the upgrade request.
#[derive(Debug)]
struct Upgrade {
    path: String,
    query: String,
    subprotocol: Option<String>,
    authorization: Option<String>,
}

fn server_tls(pki: &Pkidir) -> tokio_rustls::TlsAcceptor {
    let roots = tls::load_roots(Path::new(&pki.file("cluster-ca.crt"))).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, tls::provider())
            .build()
            .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            tls::load_certs(Path::new(&pki.file("cluster.crt"))).unwrap(),
            tls::load_key(Path::new(&pki.file("cluster.key"))).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// Accepts one agent: TLS with a client certificate, the upgrade (reporting what it saw),
/// then a server-side session.
async fn fake_server(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: oneshot::Sender<Upgrade>,
    session: oneshot::Sender<Mux>,
) {
    let (socket, _) = listener.accept().await.unwrap();
    let tls = acceptor.accept(socket).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert!(tls.get_ref().1.peer_certificates().is_some());
    // The error type is tungstenite's `Callback` contract, large or not.
    #[allow(clippy::result_large_err)]
    let callback = move |request: &Request, mut response: Response| {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let upgrade = Upgrade {
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
            subprotocol: header("sec-websocket-protocol"),
            authorization: header("authorization"),
        };
        let _ = seen.send(upgrade);
        response.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(bridgehead_proto::SUBPROTOCOL),
        );
        Ok::<_, ErrorResponse>(response)
    };
    // tungstenite answers the upgrade; the agent sends no frame before the answer, so nothing
    // past the request is left in tungstenite's buffer when the session takes the stream.
    let ws = tokio_tungstenite::accept_hdr_async(tls, callback)
        .await
        .unwrap()
        .into_inner();
    let ws = bridgehead_mux::WebSocket::new(ws, bridgehead_mux::WsRole::Server, Default::default());
    let mux = Mux::server();
    let _ = session.send(mux.clone());
    let _ = mux
        .run(ws, Keepalive::default(), CancellationToken::new())
        .await;
}

/// Echoes every connection until EOF, then closes.
async fn echo_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut rd, mut wr) = socket.split();
                tokio::io::copy(&mut rd, &mut wr).await.unwrap();
                wr.shutdown().await.unwrap();
            });
        }
    });
    port
}

/// Writes `data`, finishes, and reads the echo to the end.
async fn echo_through(stream: &bridgehead_mux::MuxStream, data: &'static [u8]) -> Vec<u8> {
    stream.write(Bytes::from_static(data)).await.unwrap();
    stream.finish().unwrap();
    let mut echoed = Vec::new();
    while let Some(chunk) = stream.read().await.unwrap() {
        echoed.extend_from_slice(&chunk);
    }
    echoed
}

#[tokio::test]
async fn session_with_a_fake_server() {
    bounded(async {
        tls::install_crypto_provider();
        let pki = Pkidir::new();
        let token_dir = tempfile::tempdir().unwrap();
        let token = token_dir.path().join("token");
        std::fs::write(&token, "secret-token\n").unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_port = listener.local_addr().unwrap().port().to_string();
        let (seen_tx, seen_rx) = oneshot::channel();
        let (session_tx, session_rx) = oneshot::channel();
        tokio::spawn(fake_server(listener, server_tls(&pki), seen_tx, session_tx));

        let config = config(&[
            "--ca-cert",
            &pki.file("cluster-ca.crt"),
            "--agent-cert",
            &pki.file("agent.crt"),
            "--agent-key",
            &pki.file("agent.key"),
            "--proxy-server-host",
            "127.0.0.1",
            "--proxy-server-port",
            &server_port,
            "--agent-id",
            "test-agent",
            "--agent-identifiers",
            "host=node1&ipv4=10.0.0.5",
            "--service-account-token-path",
            &token.display().to_string(),
            "--drain-grace-period",
            "20s",
        ]);
        let listeners = listeners().await;
        let health_addr = listeners.health.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(bridgehead_agent::run(config, listeners, shutdown.clone()));

        timeout(TEST_TIMEOUT, async {
            let upgrade = seen_rx.await.unwrap();
            assert_eq!(upgrade.path, "/connect");
            assert_eq!(upgrade.query, "id=test-agent&host=node1&ipv4=10.0.0.5");
            assert_eq!(upgrade.subprotocol.as_deref(), Some("bridgehead.v1"));
            assert_eq!(
                upgrade.authorization.as_deref(),
                Some("Bearer secret-token")
            );
            let server = session_rx.await.unwrap();

            eventually("/readyz to turn 200", || async {
                get(health_addr, "/readyz").await.0 == 200
            })
            .await;

            // A tunnel to a local echo listener.
            let echo_port = echo_listener().await;
            let stream = server
                .open("127.0.0.1", echo_port, Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(
                echo_through(&stream, b"hello through the agent").await,
                b"hello through the agent"
            );
            drop(stream);

            // A refused dial comes back typed.
            let refused = server
                .open("127.0.0.1", closed_port().await, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    refused,
                    OpenFailure::Dial {
                        code: ErrorCode::Refused,
                        ..
                    }
                ),
                "{refused:?}"
            );

            let (_, metrics) = get(health_addr, "/metrics").await;
            assert!(
                metrics.contains("bridgehead_agent_connected 1\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("bridgehead_agent_dials_total{result=\"ok\"} 1\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("bridgehead_agent_dials_total{result=\"refused\"} 1\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("bridgehead_agent_dial_duration_seconds_count 2\n"),
                "{metrics}"
            );
            eventually("the tunnel's bytes to be counted", || async {
                let (_, metrics) = get(health_addr, "/metrics").await;
                metrics.contains("bridgehead_agent_bytes_total{direction=\"to_target\"} 23\n")
                    && metrics
                        .contains("bridgehead_agent_bytes_total{direction=\"from_target\"} 23\n")
                    && metrics.contains("bridgehead_agent_streams_open 0\n")
            })
            .await;

            // Shutdown with a tunnel open: the agent drains, the tunnel keeps working, and the
            // agent exits as soon as it ends, well before the grace period.
            let open = server
                .open("127.0.0.1", echo_port, Duration::from_secs(5))
                .await
                .unwrap();
            shutdown.cancel();
            server.peer_drained().await;
            assert!(server.peer_draining());
            let (status, body) = get(health_addr, "/readyz").await;
            assert_eq!((status, body.as_str()), (503, "shutting down\n"));
            let refused = server
                .open("127.0.0.1", echo_port, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(matches!(refused, OpenFailure::Refused(_)), "{refused:?}");
            assert_eq!(echo_through(&open, b"last words").await, b"last words");
            drop(open);
            timeout(Duration::from_secs(10), agent)
                .await
                .expect("the agent exits once its last tunnel ends")
                .unwrap()
                .unwrap();
            server.closed().await;
        })
        .await
        .unwrap();
    })
    .await
}

/// A server that refuses every upgrade with 400 and a reason: the reason reaches `/readyz`.
#[tokio::test]
async fn refused_upgrade_shows_status_and_reason() {
    bounded(async {
        tls::install_crypto_provider();
        let pki = Pkidir::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_port = listener.local_addr().unwrap().port().to_string();
        let acceptor = server_tls(&pki);
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    #[allow(clippy::result_large_err)]
                    let refuse = |_: &Request, _: Response| {
                        let mut answer =
                            ErrorResponse::new(Some("malformed identifier query: nope".into()));
                        *answer.status_mut() =
                            tokio_tungstenite::tungstenite::http::StatusCode::BAD_REQUEST;
                        Err(answer)
                    };
                    let _ = tokio_tungstenite::accept_hdr_async(tls, refuse).await;
                });
            }
        });
        let config = config(&[
            "--ca-cert",
            &pki.file("cluster-ca.crt"),
            "--agent-cert",
            &pki.file("agent.crt"),
            "--agent-key",
            &pki.file("agent.key"),
            "--proxy-server-port",
            &server_port,
            "--sync-interval",
            "20ms",
            "--sync-interval-cap",
            "50ms",
        ]);
        let listeners = listeners().await;
        let health_addr = listeners.health.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(bridgehead_agent::run(config, listeners, shutdown.clone()));
        timeout(TEST_TIMEOUT, async {
            eventually("/readyz to show the refusal", || async {
                let (status, body) = get(health_addr, "/readyz").await;
                assert_eq!(status, 503, "{body}");
                body.contains("400") && body.contains("malformed identifier query: nope")
            })
            .await;
            shutdown.cancel();
            agent.await.unwrap().unwrap();
        })
        .await
        .unwrap();
    })
    .await
}
