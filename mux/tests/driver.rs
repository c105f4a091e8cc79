//! The session driver as the peer's WebSocket sees it, the peer being a raw tungstenite socket
//! that speaks the frames by hand: the close code each end of a session sends and what `run`
//! returns, the message size limit, and the dial deadline kept by the
//! session's one timer.

use std::time::Duration;

use bridgehead_mux::{Keepalive, Mux, OpenFailure, SessionEnd, WebSocket, MAX_MESSAGE};
use bridgehead_proto::frame::{HEADER_LEN, MAX_DATA_PAYLOAD};
use bridgehead_proto::{ErrorCode, Frame};
use bridgehead_test_support::bounded;
use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

/// Keepalive that never fires within a test.
const QUIET: Keepalive = Keepalive {
    interval_ms: 3_600_000,
    timeout_ms: 7_200_000,
};

type Peer = WebSocketStream<DuplexStream>;

/// A session `mux` driven in a task, and a tungstenite peer at the other end of its
/// WebSocket.
async fn session(
    mux: &Mux,
    keepalive: Keepalive,
    shutdown: &CancellationToken,
) -> (JoinHandle<Result<(), SessionEnd>>, Peer) {
    let (a, b) = tokio::io::duplex(4 * MAX_MESSAGE);
    let ws = WebSocket::new(a, bridgehead_mux::WsRole::Server, Bytes::new());
    let peer = WebSocketStream::from_raw_socket(b, Role::Client, None).await;
    let (mux, shutdown) = (mux.clone(), shutdown.clone());
    let run = tokio::spawn(async move { mux.run(ws, keepalive, shutdown).await });
    (run, peer)
}

fn message(frames: &[Frame]) -> Message {
    let mut buf = BytesMut::new();
    for frame in frames {
        frame.encode(&mut buf);
    }
    Message::Binary(buf.freeze())
}

/// The frames of the next binary message the peer receives (pings are skipped).
async fn next_frames(peer: &mut Peer) -> Vec<Frame> {
    loop {
        match peer.next().await.expect("the session ended").unwrap() {
            Message::Binary(bytes) => {
                return Frame::decode_all(bytes).map(Result::unwrap).collect();
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("{other:?}"),
        }
    }
}

/// The close frame the peer receives, if the session sends one before the WebSocket ends.
async fn close_code(peer: &mut Peer) -> Option<CloseCode> {
    while let Some(message) = peer.next().await {
        match message {
            Ok(Message::Close(frame)) => return frame.map(|f| f.code),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// How a test ends the session.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Shutdown,
    Close,
    PeerCloses,
    TextMessage,
    Garbage,
}

#[tokio::test]
async fn each_ending_sends_its_close_code_and_run_says_whether_it_was_orderly() {
    bounded(async {
        let cases = [
            (Ending::Shutdown, Some(CloseCode::Away), true),
            (Ending::Close, Some(CloseCode::Away), true),
            // The peer started the closing handshake: the session answers it.
            (Ending::PeerCloses, Some(CloseCode::Normal), true),
            (Ending::TextMessage, Some(CloseCode::Protocol), false),
            (Ending::Garbage, Some(CloseCode::Protocol), false),
        ];
        for (ending, code, orderly) in cases {
            let mux = Mux::agent();
            let shutdown = CancellationToken::new();
            let (run, mut peer) = session(&mux, QUIET, &shutdown).await;
            match ending {
                Ending::Shutdown => shutdown.cancel(),
                Ending::Close => mux.close("closing"),
                Ending::PeerCloses => peer
                    .send(Message::Close(Some(
                        tokio_tungstenite::tungstenite::protocol::CloseFrame {
                            code: CloseCode::Normal,
                            reason: "bye".into(),
                        },
                    )))
                    .await
                    .unwrap(),
                Ending::TextMessage => peer.send(Message::Text("hello".into())).await.unwrap(),
                Ending::Garbage => peer
                    .send(Message::Binary(Bytes::from_static(b"\xff garbage")))
                    .await
                    .unwrap(),
            }
            assert_eq!(close_code(&mut peer).await, code, "{ending:?}");
            let result = run.await.unwrap();
            assert_eq!(result.is_ok(), orderly, "{ending:?}: {result:?}");
            let end = mux.closed().await;
            let expected = match ending {
                Ending::Shutdown => matches!(end, SessionEnd::Shutdown),
                Ending::Close => matches!(&end, SessionEnd::Closed(reason) if reason == "closing"),
                Ending::PeerCloses => matches!(end, SessionEnd::ClosedByPeer),
                Ending::TextMessage | Ending::Garbage => matches!(end, SessionEnd::Protocol(_)),
            };
            assert!(expected, "{ending:?}: {end:?}");
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_gets_a_normal_close() {
    bounded(async {
        let mux = Mux::agent();
        let keepalive = Keepalive {
            interval_ms: 3_600_000,
            timeout_ms: 10_000,
        };
        let (run, mut peer) = session(&mux, keepalive, &CancellationToken::new()).await;
        assert_eq!(close_code(&mut peer).await, Some(CloseCode::Normal));
        let result = run.await.unwrap();
        assert!(
            matches!(result, Err(SessionEnd::KeepaliveTimeout(_))),
            "{result:?}"
        );
    })
    .await
}

/// A process that was stopped (SIGSTOP, a paused VM) wakes with its silence timer long past
/// due while the peer's messages wait unread: that is not the peer's silence. The session
/// gives the peer one more interval, and only a peer that stays silent after it is dropped.
#[tokio::test(start_paused = true)]
async fn a_timer_that_fires_late_gives_the_peer_one_more_interval() {
    bounded(async {
        let mux = Mux::agent();
        let keepalive = Keepalive {
            interval_ms: 1_000,
            timeout_ms: 3_000,
        };
        let (run, mut peer) = session(&mux, keepalive, &CancellationToken::new()).await;
        // The session runs, its silence timer set...
        tokio::time::sleep(Duration::from_millis(10)).await;
        // ...then the clock jumps 10 s at once, as it does for a process that did not run.
        tokio::time::advance(Duration::from_secs(10)).await;
        // Let the session's tasks see the jump.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !run.is_finished(),
            "dropped the peer for this end's own pause"
        );
        // The peer is heard within the interval: the session lives on.
        peer.send(Message::Ping(Bytes::from_static(b"here")))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!run.is_finished(), "dropped a peer that was heard");
        // Silent from then on (not even answering pings: nothing reads its end), it is
        // dropped as any silent peer.
        let result = run.await.unwrap();
        assert!(
            matches!(result, Err(SessionEnd::KeepaliveTimeout(_))),
            "{result:?}"
        );
    })
    .await
}

/// DATA frames for `stream` filling exactly `len` bytes of one message: as many of the largest
/// frames as fit, then one with the rest.
fn data_message(stream: u32, len: usize) -> Message {
    const LARGEST: usize = HEADER_LEN + MAX_DATA_PAYLOAD;
    let rest = len % LARGEST;
    assert!(
        rest > HEADER_LEN,
        "{len} leaves no room for a last DATA frame"
    );
    let sizes = std::iter::repeat_n(LARGEST, len / LARGEST).chain([rest]);
    let frames: Vec<Frame> = sizes
        .map(|size| Frame::Data {
            stream,
            payload: Bytes::from(vec![0u8; size - HEADER_LEN]),
        })
        .collect();
    let message = message(&frames);
    assert_eq!(message.len(), len);
    message
}

fn dial(stream: u32) -> Frame {
    Frame::Dial {
        stream,
        timeout_ms: 10_000,
        window: 1000,
        port: 1,
        host: "target".into(),
    }
}

/// The session takes a message of `MAX_MESSAGE` bytes (1 MiB) and ends the session on
/// a larger one. (The DATA in them is beyond the stream's credit, which resets only that
/// stream: the session goes on.)
#[tokio::test]
async fn a_message_of_max_message_bytes_is_taken_and_a_larger_one_ends_the_session() {
    bounded(async {
        assert_eq!(MAX_MESSAGE, 1 << 20);
        let mux = Mux::agent();
        let shutdown = CancellationToken::new();
        let (run, mut peer) = session(&mux, QUIET, &shutdown).await;
        peer.send(message(&[dial(1)])).await.unwrap();
        let first = mux.accept().await.unwrap();
        peer.send(data_message(1, MAX_MESSAGE)).await.unwrap();
        // Still alive: the next dial arrives.
        peer.send(message(&[dial(2)])).await.unwrap();
        let second = mux.accept().await.expect("the session survived 1 MiB");
        assert_eq!((first.id(), second.id()), (1, 2));
        peer.send(data_message(2, MAX_MESSAGE + 1)).await.unwrap();
        let result = run.await.unwrap();
        assert!(
            matches!(result, Err(SessionEnd::WebSocket(_))),
            "{result:?}"
        );
    })
    .await
}

/// The dial's deadline is the session's: the open fails exactly when it passes, and the agent
/// is told RESET `cancelled`.
#[tokio::test(start_paused = true)]
async fn a_dial_fails_at_its_deadline_and_the_agent_hears_cancelled() {
    bounded(async {
        let mux = Mux::server();
        let shutdown = CancellationToken::new();
        let (_run, mut peer) = session(&mux, QUIET, &shutdown).await;
        let started = tokio::time::Instant::now();
        let open = tokio::spawn({
            let mux = mux.clone();
            async move { mux.open("target", 1, Duration::from_secs(10)).await }
        });
        let dialed = next_frames(&mut peer).await;
        assert!(
            matches!(
                &dialed[..],
                [Frame::Dial {
                    stream: 1,
                    timeout_ms: 10_000,
                    ..
                }]
            ),
            "{dialed:?}"
        );
        let cancelled = next_frames(&mut peer).await;
        assert!(
            matches!(
                &cancelled[..],
                [Frame::Reset {
                    stream: 1,
                    code: ErrorCode::Cancelled,
                    ..
                }]
            ),
            "{cancelled:?}"
        );
        let result = open.await.unwrap();
        assert!(
            matches!(result, Err(OpenFailure::TimedOut(t)) if t == Duration::from_secs(10)),
            "{result:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(mux.open_streams(), 0);
        shutdown.cancel();
    })
    .await
}

/// A dial the agent refused stays refused even when the session ends right behind the
/// answer; a dial the session ended before any answer is the session's failure.
#[tokio::test]
async fn a_dial_fails_with_the_agents_answer_or_with_the_session() {
    bounded(async {
        for refused in [true, false] {
            let mux = Mux::server();
            let shutdown = CancellationToken::new();
            let (_run, mut peer) = session(&mux, QUIET, &shutdown).await;
            let open = tokio::spawn({
                let mux = mux.clone();
                async move { mux.open("target", 1, Duration::from_secs(10)).await }
            });
            next_frames(&mut peer).await;
            if refused {
                let answer = Frame::DialErr {
                    stream: 1,
                    code: ErrorCode::Refused,
                    message: "connection refused".into(),
                };
                peer.feed(message(&[answer])).await.unwrap();
            }
            // The answer and the close arrive together: the session has ended by the time
            // the open looks at the answer.
            peer.feed(Message::Close(None)).await.unwrap();
            peer.flush().await.unwrap();
            let result = open.await.unwrap();
            if refused {
                assert!(
                    matches!(&result, Err(OpenFailure::Dial { code: ErrorCode::Refused, message }) if message == "connection refused"),
                    "{result:?}"
                );
            } else {
                assert!(
                    matches!(result, Err(OpenFailure::SessionClosed(SessionEnd::ClosedByPeer))),
                    "{result:?}"
                );
            }
        }
    })
    .await
}

/// The session's end reaches a waiting dial as its own signal, not as a reset code: an
/// agent that refuses with `connection_reset` (a code a peer may send) right before the
/// session closes gave an answer, and the open reports that answer.
#[tokio::test]
async fn a_dial_refused_with_connection_reset_is_the_agents_answer_not_the_sessions_end() {
    bounded(async {
        let mux = Mux::server();
        let shutdown = CancellationToken::new();
        let (_run, mut peer) = session(&mux, QUIET, &shutdown).await;
        let open = tokio::spawn({
            let mux = mux.clone();
            async move { mux.open("target", 1, Duration::from_secs(10)).await }
        });
        next_frames(&mut peer).await;
        let answer = Frame::DialErr {
            stream: 1,
            code: ErrorCode::ConnectionReset,
            message: "reset by the target".into(),
        };
        peer.feed(message(&[answer])).await.unwrap();
        peer.feed(Message::Close(None)).await.unwrap();
        peer.flush().await.unwrap();
        let result = open.await.unwrap();
        assert!(
            matches!(&result, Err(OpenFailure::Dial { code: ErrorCode::ConnectionReset, message }) if message == "reset by the target"),
            "{result:?}"
        );
    })
    .await
}

/// Frames queued together go out together: sixteen full DATA frames leave in four messages of
/// about 256 KiB, not one message per frame.
#[tokio::test]
async fn the_writer_batches_queued_frames_into_messages_of_256_kib() {
    bounded(async {
        let mux = Mux::agent();
        let shutdown = CancellationToken::new();
        let (_run, mut peer) = session(&mux, QUIET, &shutdown).await;
        let mut ask = dial(1);
        if let Frame::Dial { window, .. } = &mut ask {
            *window = 1 << 20;
        }
        peer.send(message(&[ask])).await.unwrap();
        let stream = mux.accept().await.unwrap().accept().unwrap();
        let answer = next_frames(&mut peer).await;
        assert!(
            matches!(&answer[..], [Frame::DialOk { stream: 1, .. }]),
            "{answer:?}"
        );
        stream
            .write(Bytes::from(vec![0; 16 * MAX_DATA_PAYLOAD]))
            .await
            .unwrap();
        let mut per_message = Vec::new();
        while per_message.iter().sum::<usize>() < 16 {
            per_message.push(next_frames(&mut peer).await.len());
        }
        assert_eq!(per_message, [4, 4, 4, 4]);
        shutdown.cancel();
    })
    .await
}

/// A stream's DATA goes out from the task that sent it while the session's sending side is
/// free: the session's own task takes no turn for it (on a round trip, a task's turn less in
/// each process). Its frames still arrive whole and in order.
#[tokio::test]
async fn a_stream_sends_its_data_without_a_turn_of_the_sessions_task() {
    bounded(async {
        let mux = Mux::agent();
        let shutdown = CancellationToken::new();
        let (a, b) = tokio::io::duplex(4 * MAX_MESSAGE);
        let ws = WebSocket::new(a, bridgehead_mux::WsRole::Client, Bytes::new());
        let mut peer = WebSocketStream::from_raw_socket(b, Role::Server, None).await;
        let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let _run = tokio::spawn({
            let (mux, shutdown, polls) = (mux.clone(), shutdown.clone(), polls.clone());
            async move {
                let mut run = std::pin::pin!(mux.run(ws, QUIET, shutdown));
                std::future::poll_fn(|cx| {
                    polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::future::Future::poll(run.as_mut(), cx)
                })
                .await
            }
        });
        peer.send(message(&[dial(1)])).await.unwrap();
        let stream = mux.accept().await.unwrap().accept().unwrap();
        let answer = next_frames(&mut peer).await;
        assert!(
            matches!(&answer[..], [Frame::DialOk { stream: 1, .. }]),
            "{answer:?}"
        );
        for round in 0..3u8 {
            // Whatever woke the session's task (the DIAL, the answer) has had its turn.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            let before = polls.load(std::sync::atomic::Ordering::SeqCst);
            stream.write(Bytes::from(vec![round; 64])).await.unwrap();
            let frames = next_frames(&mut peer).await;
            assert_eq!(
                frames,
                [Frame::Data {
                    stream: 1,
                    payload: Bytes::from(vec![round; 64])
                }]
            );
            assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), before);
        }
        shutdown.cancel();
    })
    .await
}

/// A stream that sent its own data leaves the session's task asleep: nothing wakes it for
/// frames already on their way (the task is given every chance to run before the count).
#[tokio::test]
async fn a_stream_that_sent_its_own_data_does_not_wake_the_sessions_task() {
    bounded(async {
        let mux = Mux::agent();
        let shutdown = CancellationToken::new();
        let (a, b) = tokio::io::duplex(4 * MAX_MESSAGE);
        let ws = WebSocket::new(a, bridgehead_mux::WsRole::Client, Bytes::new());
        let mut peer = WebSocketStream::from_raw_socket(b, Role::Server, None).await;
        let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let _run = tokio::spawn({
            let (mux, shutdown, polls) = (mux.clone(), shutdown.clone(), polls.clone());
            async move {
                let mut run = std::pin::pin!(mux.run(ws, QUIET, shutdown));
                std::future::poll_fn(|cx| {
                    polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::future::Future::poll(run.as_mut(), cx)
                })
                .await
            }
        });
        peer.send(message(&[dial(1)])).await.unwrap();
        let stream = mux.accept().await.unwrap().accept().unwrap();
        next_frames(&mut peer).await;
        for round in 0..3u8 {
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            let before = polls.load(std::sync::atomic::Ordering::SeqCst);
            stream.write(Bytes::from(vec![round; 64])).await.unwrap();
            assert_eq!(next_frames(&mut peer).await.len(), 1);
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), before);
        }
        shutdown.cancel();
    })
    .await
}

/// Keepalive on the wire: an idle session pings its peer every interval, and answers a ping
/// with a pong carrying the ping's payload (tungstenite answers for the peer, so the peer is
/// seen alive and the session lives on).
#[tokio::test(start_paused = true)]
async fn an_idle_session_pings_every_interval_and_answers_a_ping_with_its_payload() {
    bounded(async {
        let mux = Mux::agent();
        let keepalive = Keepalive {
            interval_ms: 1_000,
            timeout_ms: 3_000,
        };
        let (run, mut peer) = session(&mux, keepalive, &CancellationToken::new()).await;
        for _ in 0..3 {
            match peer.next().await.expect("the session ended").unwrap() {
                Message::Ping(_) => {}
                other => panic!("{other:?}"),
            }
        }
        peer.send(Message::Ping(Bytes::from_static(b"are you there")))
            .await
            .unwrap();
        loop {
            match peer.next().await.expect("the session ended").unwrap() {
                Message::Pong(payload) => {
                    assert_eq!(&payload[..], b"are you there");
                    break;
                }
                Message::Ping(_) => {}
                other => panic!("{other:?}"),
            }
        }
        assert!(!run.is_finished(), "a session whose peer answers ended");
    })
    .await
}

/// A session given a home (its own thread's runtime) tells its streams where that is, so
/// whoever splices one of them moves there.
#[tokio::test]
async fn a_streams_home_is_its_sessions() {
    bounded(async {
        let mux = Mux::agent();
        let shutdown = CancellationToken::new();
        let (_run, mut peer) = session(&mux, QUIET, &shutdown).await;
        let home = tokio::runtime::Handle::current();
        mux.set_home(home.clone());
        peer.send(message(&[dial(1)])).await.unwrap();
        let stream = mux.accept().await.unwrap().accept().unwrap();
        assert_eq!(
            stream.home().map(tokio::runtime::Handle::id),
            Some(home.id())
        );
        let unhomed = Mux::agent();
        let (_run, mut peer) = session(&unhomed, QUIET, &shutdown).await;
        peer.send(message(&[dial(1)])).await.unwrap();
        let stream = unhomed.accept().await.unwrap().accept().unwrap();
        assert!(stream.home().is_none());
        shutdown.cancel();
    })
    .await
}
