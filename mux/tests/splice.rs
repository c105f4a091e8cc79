//! Splicing as a tunnel's owner sees it: bytes handed in ahead of the socket's own wait for
//! credit like any others, and a failed tunnel's socket ends with a TCP reset.

use std::io::ErrorKind;
use std::time::Duration;

use bridgehead_mux::splice::{self, Moved, TunnelSocket};
use bridgehead_mux::MuxStream;
use bridgehead_test_support::{bounded, MuxPair};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A server stream and its agent end over a live session with the default 256 KiB windows.
async fn stream_pair() -> (MuxStream, MuxStream, CancellationToken) {
    let shutdown = CancellationToken::new();
    let MuxPair { server, agent } = MuxPair::new(256 * 1024, &shutdown);
    let accepted = tokio::spawn(async move { agent.accept().await.unwrap().accept().unwrap() });
    let stream = server.open("x", 1, Duration::from_secs(5)).await.unwrap();
    (stream, accepted.await.unwrap(), shutdown)
}

/// More early bytes than the peer's window: the window's worth goes at once, the rest when
/// the peer's reads grant credit again. The splice runs in a task of its own, so only the
/// credit's wake-up can move it on.
#[tokio::test]
async fn early_bytes_beyond_the_window_wait_for_credit() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let early: Bytes = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
        let (mut client, socket) = tokio::io::duplex(64 * 1024);
        let splicing = tokio::spawn({
            let early = early.clone();
            async move {
                let mut moved = Moved::default();
                let result = splice::splice(socket, &stream, early, &mut moved).await;
                (result, moved)
            }
        });
        let mut got = Vec::new();
        while got.len() < early.len() {
            got.extend_from_slice(&peer.read().await.unwrap().expect("more early bytes"));
        }
        assert!(got == early, "the early bytes arrived changed");
        client.shutdown().await.unwrap();
        assert_eq!(peer.read().await.unwrap(), None, "the client's EOF");
        peer.finish().unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        let (result, moved) = splicing.await.unwrap();
        result.unwrap();
        assert_eq!(
            moved,
            Moved {
                up: early.len() as u64,
                down: 0
            }
        );
        shutdown.cancel();
    })
    .await
}

/// How a test lets go of the accepted socket.
#[derive(Debug, Clone, Copy)]
enum Close {
    Plain,
    Abort,
    AbortBoxed,
}

#[tokio::test]
async fn abort_on_close_turns_the_close_into_a_reset() {
    bounded(async {
        for close in [Close::Plain, Close::Abort, Close::AbortBoxed] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (socket, _) = listener.accept().await.unwrap();
            match close {
                Close::Plain => drop(socket),
                Close::Abort => {
                    socket.abort_on_close();
                    drop(socket);
                }
                Close::AbortBoxed => {
                    let socket = Box::new(socket);
                    TunnelSocket::abort_on_close(&socket);
                    drop(socket);
                }
            }
            let mut buf = [0; 1];
            let read = client.read(&mut buf).await;
            match close {
                Close::Plain => assert_eq!(read.unwrap(), 0, "a plain close is a FIN"),
                Close::Abort | Close::AbortBoxed => assert_eq!(
                    read.unwrap_err().kind(),
                    ErrorKind::ConnectionReset,
                    "{close:?}"
                ),
            }
        }
    })
    .await
}
