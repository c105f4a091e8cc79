//! The multiplexer over an in-memory duplex pipe: open, data both ways, half-close, reset,
//! flow control isolation, session loss.

use std::time::Duration;

use bridgehead_mux::{splice, DialRequest, Keepalive, Mux, OpenFailure, Serve};
use bridgehead_proto::ErrorCode;
use bridgehead_test_support::{bounded, MuxPair};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

struct Pair {
    server: Mux,
    agent: Mux,
    shutdown: CancellationToken,
}

async fn pair() -> Pair {
    let shutdown = CancellationToken::new();
    let MuxPair { server, agent } = MuxPair::new(256 * 1024, &shutdown);
    Pair {
        server,
        agent,
        shutdown,
    }
}

async fn next_dial(agent: &Mux) -> DialRequest {
    agent.accept().await.expect("a dial request")
}

#[tokio::test]
async fn open_echo_half_close() {
    bounded(async {
        let p = pair().await;
        let agent = p.agent.clone();
        let echo = tokio::spawn(async move {
            let dial = next_dial(&agent).await;
            assert_eq!((dial.host.as_str(), dial.port), ("10.0.0.5", 10250));
            let stream = dial.accept().unwrap();
            // Echo until the server finishes, then finish too.
            while let Some(chunk) = stream.read().await.unwrap() {
                stream.write(chunk).await.unwrap();
            }
            stream.finish().unwrap();
        });
        let stream = p
            .server
            .open("10.0.0.5", 10250, Duration::from_secs(5))
            .await
            .unwrap();
        // The agent took the stream when the DIAL came, before it answered.
        assert_eq!((p.server.open_streams(), p.agent.open_streams()), (1, 1));
        let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let payload = payload.clone();
            async {
                stream.write(Bytes::from(payload)).await.unwrap();
                stream.finish().unwrap();
            }
        };
        let reader = async {
            let mut got = Vec::new();
            while let Some(chunk) = stream.read().await.unwrap() {
                got.extend_from_slice(&chunk);
            }
            got
        };
        let ((), got) = tokio::join!(writer, reader);
        assert_eq!(got.len(), payload.len());
        assert!(got == payload, "echoed bytes differ");
        echo.await.unwrap();
        drop(stream);
        assert_eq!(p.server.open_streams(), 0);
        assert_eq!(p.agent.open_streams(), 0);
        p.shutdown.cancel();
    })
    .await
}

#[tokio::test]
async fn dial_errors_and_timeouts() {
    bounded(async {
        let p = pair().await;
        let agent = p.agent.clone();
        let agent_side = tokio::spawn(async move {
            let dial = next_dial(&agent).await;
            dial.reject(ErrorCode::Refused, "connection refused");
            // Second dial: never answered until the server gives up, which the agent hears.
            let dial = next_dial(&agent).await;
            dial.cancelled().await;
        });
        let err = p
            .server
            .open("10.0.0.5", 1, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                OpenFailure::Dial {
                    code: ErrorCode::Refused,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = p
            .server
            .open("10.0.0.5", 2, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, OpenFailure::TimedOut(_)), "{err:?}");
        assert_eq!(p.server.open_streams(), 0);
        agent_side.await.unwrap();
        p.shutdown.cancel();
    })
    .await
}

/// A stream whose reader stalls fills its own window and stops; a second stream on the same
/// session keeps moving, and the stalled one loses nothing once read again.
#[tokio::test]
async fn stalled_stream_does_not_block_others() {
    bounded(async {
        let p = pair().await;
        let agent = p.agent.clone();
        let agent_side = tokio::spawn(async move {
            let stalled = next_dial(&agent).await.accept().unwrap();
            let bulk = next_dial(&agent).await.accept().unwrap();
            // The agent pushes 2 MB into the stalled stream (which the server does not read) and
            // then 8 MB into the bulk one.
            let stall_writer = tokio::spawn(async move {
                stalled
                    .write(Bytes::from(vec![7u8; 2_000_000]))
                    .await
                    .unwrap();
                stalled.finish().unwrap();
                stalled
            });
            bulk.write(Bytes::from(vec![9u8; 8_000_000])).await.unwrap();
            bulk.finish().unwrap();
            (stall_writer, bulk)
        });
        let stalled = p.server.open("a", 1, Duration::from_secs(5)).await.unwrap();
        let bulk = p.server.open("b", 2, Duration::from_secs(5)).await.unwrap();
        let mut n = 0;
        while let Some(chunk) = bulk.read().await.unwrap() {
            n += chunk.len();
        }
        assert_eq!(n, 8_000_000);
        // Now drain the stalled stream: every byte is there.
        let mut m = 0;
        while let Some(chunk) = stalled.read().await.unwrap() {
            assert!(chunk.iter().all(|&b| b == 7));
            m += chunk.len();
        }
        assert_eq!(m, 2_000_000);
        let (w, _bulk) = agent_side.await.unwrap();
        w.await.unwrap();
        p.shutdown.cancel();
    })
    .await
}

#[tokio::test]
async fn session_loss_fails_every_stream() {
    bounded(async {
        let p = pair().await;
        let agent = p.agent.clone();
        tokio::spawn(async move {
            let s = next_dial(&agent).await.accept().unwrap();
            s.read().await.unwrap();
            agent.close("agent killed");
            std::future::pending::<()>().await;
        });
        let stream = p.server.open("x", 1, Duration::from_secs(5)).await.unwrap();
        stream.write(Bytes::from_static(b"x")).await.unwrap();
        let err = stream.read().await.unwrap_err();
        assert_eq!(err.code, ErrorCode::ConnectionReset);
        p.server.closed().await;
        assert_eq!(p.server.open_streams(), 0);
    })
    .await
}

#[tokio::test]
async fn splice_over_real_sockets_half_close() {
    bounded(async {
        let p = pair().await;
        let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap();
        // Target: read everything until EOF, then answer with the byte count, then close.
        tokio::spawn(async move {
            let (mut sock, _) = target.accept().await.unwrap();
            let mut all = Vec::new();
            sock.read_to_end(&mut all).await.unwrap();
            sock.write_all(format!("got {}", all.len()).as_bytes())
                .await
                .unwrap();
        });
        let agent = p.agent.clone();
        let agent_side = tokio::spawn(async move {
            let dial = next_dial(&agent).await;
            let sock = tokio::net::TcpStream::connect((dial.host.as_str(), dial.port))
                .await
                .unwrap();
            let stream = dial.accept().unwrap();
            let mut moved = splice::Moved::default();
            splice::splice(sock, &stream, Bytes::new(), &mut moved)
                .await
                .unwrap();
            moved
        });
        // Client side of the tunnel: a socket pair with the server's stream spliced on one end.
        let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let server = p.server.clone();
        let server_side = tokio::spawn(async move {
            let (sock, _) = front.accept().await.unwrap();
            let stream = server
                .open("127.0.0.1", target_addr.port(), Duration::from_secs(5))
                .await
                .unwrap();
            let mut moved = splice::Moved::default();
            splice::splice(sock, &stream, Bytes::from_static(b"early"), &mut moved)
                .await
                .unwrap();
            moved
        });
        let mut client = tokio::net::TcpStream::connect(front_addr).await.unwrap();
        client.write_all(&vec![1u8; 100_000]).await.unwrap();
        client.shutdown().await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert_eq!(answer, "got 100005");
        // Both splices end once both directions did, and count what they moved.
        let moved = |up, down| splice::Moved { up, down };
        assert_eq!(server_side.await.unwrap(), moved(100_005, 10));
        assert_eq!(agent_side.await.unwrap(), moved(10, 100_005));
        p.shutdown.cancel();
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn keepalive_detects_a_silent_peer() {
    bounded(async {
        let (a, _b) = tokio::io::duplex(1024);
        let ws =
            bridgehead_mux::WebSocket::new(a, bridgehead_mux::WsRole::Server, bytes::Bytes::new());
        let server = Mux::server();
        let result = server
            .run(ws, Keepalive::default(), CancellationToken::new())
            .await;
        assert!(
            matches!(result, Err(bridgehead_mux::SessionEnd::KeepaliveTimeout(_))),
            "{result:?}"
        );
    })
    .await
}

/// A peer that keeps talking outlives many keepalive timeouts; once it falls silent, the
/// session ends one timeout after the last message, not earlier and not much later.
#[tokio::test(start_paused = true)]
async fn keepalive_counts_from_the_last_message() {
    bounded(async {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        let (a, b) = tokio::io::duplex(64 * 1024);
        let ws =
            bridgehead_mux::WebSocket::new(a, bridgehead_mux::WsRole::Server, bytes::Bytes::new());
        let mut peer = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
        let keepalive = Keepalive {
            interval_ms: 3_600_000,
            timeout_ms: 10_000,
        };
        let server = Mux::server();
        let session = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let result = server.run(ws, keepalive, CancellationToken::new()).await;
            (result, started.elapsed())
        });
        // Five timeouts' worth of talking, a message every 4 s.
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            peer.send(Message::Pong(Default::default())).await.unwrap();
        }
        let (result, lived) = session.await.unwrap();
        assert!(
            matches!(result, Err(bridgehead_mux::SessionEnd::KeepaliveTimeout(_))),
            "{result:?}"
        );
        // Last message at 48 s: dead at 58 s.
        assert!(
            lived >= Duration::from_secs(58) && lived < Duration::from_secs(59),
            "{lived:?}"
        );
    })
    .await
}

/// The agent writes its last bytes and FIN and closes its session right away: the server
/// still reads every byte and a clean EOF.
#[tokio::test]
async fn last_bytes_survive_a_session_close() {
    bounded(async {
        let p = pair().await;
        let agent = p.agent.clone();
        tokio::spawn(async move {
            let stream = next_dial(&agent).await.accept().unwrap();
            stream.write(Bytes::from_static(b"tail")).await.unwrap();
            stream.finish().unwrap();
            agent.close("agent exiting");
        });
        let stream = p.server.open("x", 1, Duration::from_secs(5)).await.unwrap();
        p.server.closed().await;
        // What arrived can be taken without waiting, once.
        assert_eq!(stream.try_read().as_deref(), Some(&b"tail"[..]));
        // A peek at the end (the downlink's batching does one) must not eat the EOF.
        assert_eq!(stream.try_read(), None);
        assert_eq!(stream.read().await.unwrap(), None);
        // The send direction died with the session.
        assert!(stream.write(Bytes::from_static(b"x")).await.is_err());
    })
    .await
}

/// DRAIN reaches the peer once: it sees the drain, the drained end does not.
#[tokio::test]
async fn drain_reaches_the_peer() {
    bounded(async {
        let p = pair().await;
        assert!(!p.server.peer_draining());
        p.agent.drain();
        p.server.peer_drained().await;
        assert!(p.server.peer_draining());
        assert!(!p.agent.peer_draining());
        // A draining agent gets no new stream.
        let refused = p.server.open("x", 1, Duration::from_secs(5)).await;
        assert!(
            matches!(refused, Err(OpenFailure::Refused(_))),
            "{refused:?}"
        );
        p.shutdown.cancel();
    })
    .await
}

/// `Mux::serve` runs the caller's work beside the session (here, the agent's accept loop)
/// and its drain handling once the peer drains, and the session outlives both.
#[tokio::test]
async fn serve_runs_the_work_beside_and_the_drain_handling_once_the_peer_drains() {
    bounded(async {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server_ws =
            bridgehead_mux::WebSocket::new(a, bridgehead_mux::WsRole::Server, Bytes::new());
        let agent_ws =
            bridgehead_mux::WebSocket::new(b, bridgehead_mux::WsRole::Client, Bytes::new());
        let (server, agent) = (Mux::server(), Mux::agent());
        let shutdown = CancellationToken::new();
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel();
        let served = tokio::spawn({
            let (agent, shutdown) = (agent.clone(), shutdown.clone());
            async move {
                let accepting = agent.clone();
                let beside = async move {
                    let mut held = Vec::new();
                    while let Some(dial) = accepting.accept().await {
                        let stream = dial.accept().unwrap();
                        stream.write(Bytes::from_static(b"hello")).await.unwrap();
                        held.push(stream);
                    }
                };
                let on_drain = async move {
                    let _ = drained_tx.send(());
                };
                let serve = Serve::new(Keepalive::default(), shutdown)
                    .on_peer_drain(on_drain)
                    .beside(beside);
                agent.serve(agent_ws, serve).await
            }
        });
        tokio::spawn({
            let (server, shutdown) = (server.clone(), shutdown.clone());
            async move { server.run(server_ws, Keepalive::default(), shutdown).await }
        });
        let stream = server
            .open("target", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(stream.read().await.unwrap().as_deref(), Some(&b"hello"[..]));
        server.drain();
        drained_rx.await.expect("the drain handling ran");
        assert!(!served.is_finished(), "the session ended with the drain");
        shutdown.cancel();
        assert!(served.await.unwrap().is_ok());
    })
    .await
}

/// Waiting for the peer's drain ends when the session does, drained or not.
#[tokio::test]
async fn waiting_for_a_drain_ends_with_the_session() {
    bounded(async {
        let p = pair().await;
        p.server.close("going away");
        p.server.peer_drained().await;
        assert!(!p.server.peer_draining());
        p.agent.peer_drained().await;
        assert!(!p.agent.peer_draining());
    })
    .await
}

/// Stream ids are the wire's, counted from 1, and both ends name a stream alike.
#[tokio::test]
async fn both_ends_name_a_stream_by_its_wire_id() {
    bounded(async {
        let p = pair().await;
        for id in [1, 2] {
            let agent = p.agent.clone();
            let accepted = tokio::spawn(async move {
                let dial = next_dial(&agent).await;
                let asked = dial.id();
                (asked, dial.accept().unwrap())
            });
            let stream = p.server.open("x", 1, Duration::from_secs(5)).await.unwrap();
            let (asked, agent_stream) = accepted.await.unwrap();
            assert_eq!((stream.id(), asked, agent_stream.id()), (id, id, id));
        }
        p.shutdown.cancel();
    })
    .await
}

/// How the server lets go of an open stream.
#[derive(Debug, Clone, Copy)]
enum LetGo {
    Reset,
    Drop,
}

/// A reset reaches the other end with its code and reason; dropping a stream resets it.
#[tokio::test]
async fn a_reset_or_a_dropped_stream_reaches_the_other_end() {
    bounded(async {
        let p = pair().await;
        for let_go in [LetGo::Reset, LetGo::Drop] {
            let agent = p.agent.clone();
            let accepted = tokio::spawn(async move { next_dial(&agent).await.accept().unwrap() });
            let stream = p.server.open("x", 1, Duration::from_secs(5)).await.unwrap();
            let agent_stream = accepted.await.unwrap();
            let (code, reason) = match let_go {
                LetGo::Reset => {
                    stream.reset(ErrorCode::Refused, "gave up");
                    let end = stream.read().await.unwrap_err();
                    assert_eq!((end.code, end.by_peer), (ErrorCode::Refused, false));
                    (ErrorCode::Refused, "gave up")
                }
                LetGo::Drop => {
                    drop(stream);
                    (ErrorCode::Cancelled, "stream dropped")
                }
            };
            let end = agent_stream.read().await.unwrap_err();
            assert_eq!(
                (end.code, end.reason.as_str(), end.by_peer),
                (code, reason, true),
                "{let_go:?}"
            );
            assert_eq!(p.server.open_streams(), 0, "{let_go:?}");
        }
        p.shutdown.cancel();
    })
    .await
}

/// The router's load: the streams open or dialing, and of those the dials the agent has not
/// answered yet.
#[tokio::test]
async fn load_counts_the_dials_still_waiting_for_their_answer() {
    bounded(async {
        let p = pair().await;
        assert_eq!(p.server.load(), (0, 0));
        let server = p.server.clone();
        let opening =
            tokio::spawn(async move { server.open("x", 1, Duration::from_secs(5)).await });
        // The server counted the dial before its DIAL went out.
        let dial = next_dial(&p.agent).await;
        assert_eq!(p.server.load(), (1, 1));
        let _agent_stream = dial.accept().unwrap();
        let stream = opening.await.unwrap().unwrap();
        assert_eq!(p.server.load(), (1, 0));
        drop(stream);
        assert_eq!(p.server.load(), (0, 0));
        p.shutdown.cancel();
    })
    .await
}
