//! What an idle splice keeps: polled by hand over an in-memory socket, so its state can be
//! looked at between polls.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;

use bridgehead_proto::frame::MAX_DATA_PAYLOAD;
use bridgehead_proto::session::{Role as SessionRole, SessionConfig, DEFAULT_MAX_WINDOW};

use super::{
    splice, EarnedBuffer, EarnedTotal, Moved, Splice, TunnelSocket, IDLE_READ, STREAMING_READ,
};
use crate::{Keepalive, Mux, MuxStream};
use bridgehead_test_support::bounded;

/// A server stream and its agent end, over a live session.
async fn stream_pair() -> (MuxStream, MuxStream, CancellationToken) {
    let (mut server, mut agent, shutdown) = streams(DEFAULT_MAX_WINDOW, 1).await;
    (server.remove(0), agent.remove(0), shutdown)
}

/// `n` server streams and their agent ends, over one live session whose ends announce
/// `window`.
async fn streams(window: u32, n: usize) -> (Vec<MuxStream>, Vec<MuxStream>, CancellationToken) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let config = |role| SessionConfig {
        initial_window: window,
        max_window: window,
        ..SessionConfig::new(role)
    };
    let server = Mux::new(config(SessionRole::Server));
    let agent = Mux::new(config(SessionRole::Agent));
    let shutdown = CancellationToken::new();
    let server_ws = crate::WebSocket::new(a, crate::WsRole::Server, bytes::Bytes::new());
    let agent_ws = crate::WebSocket::new(b, crate::WsRole::Client, bytes::Bytes::new());
    tokio::spawn({
        let (server, shutdown) = (server.clone(), shutdown.clone());
        async move { server.run(server_ws, Keepalive::default(), shutdown).await }
    });
    tokio::spawn({
        let (agent, shutdown) = (agent.clone(), shutdown.clone());
        async move { agent.run(agent_ws, Keepalive::default(), shutdown).await }
    });
    let (mut servers, mut agents) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let agent = agent.clone();
        let accepted = tokio::spawn(async move { agent.accept().await.unwrap().accept().unwrap() });
        servers.push(server.open("x", 1, Duration::from_secs(5)).await.unwrap());
        agents.push(accepted.await.unwrap());
    }
    (servers, agents, shutdown)
}

/// Polls `splice` once; it must not finish.
async fn poll_once<S>(splice: &mut Splice<'_, S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    poll_fn(|cx| {
        assert!(Pin::new(&mut *splice).poll(cx).is_pending(), "{splice:?}");
        Poll::Ready(())
    })
    .await;
}

/// Drives `splice` until `client` has read `buf.len()` bytes.
async fn read_through(
    splice: &mut Splice<'_, &mut DuplexStream>,
    client: &mut DuplexStream,
    buf: &mut [u8],
) {
    tokio::select! {
        read = client.read_exact(buf) => {
            read.unwrap();
        }
        result = splice => panic!("the splice ended: {result:?}"),
    }
}

/// A read that exactly fills the small buffer switches to large reads; when the next read
/// finds nothing, the large buffer goes, so the tunnel does not sit on it while quiet.
#[tokio::test]
async fn a_quiet_uplink_holds_no_read_buffer() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, mut socket) = tokio::io::duplex(1024 * 1024);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        client.write_all(&[7; IDLE_READ]).await.unwrap();
        poll_once(&mut splice).await;
        assert!(!splice.up.streaming, "{:?}", splice.up);
        assert_eq!(splice.up.big.capacity(), 0, "{:?}", splice.up);
        let chunk = peer.read().await.unwrap().unwrap();
        assert_eq!(chunk.len(), IDLE_READ);

        // A burst still streams through the large buffer.
        client.write_all(&vec![8; 200_000]).await.unwrap();
        poll_once(&mut splice).await;
        assert_eq!(splice.up.big.capacity(), 0, "{:?}", splice.up);
        let mut got = 0;
        while got < 200_000 {
            got += peer.read().await.unwrap().unwrap().len();
        }
        assert_eq!(got, 200_000);
        assert_eq!(splice.moved.up, (IDLE_READ + 200_000) as u64);
        shutdown.cancel();
    })
    .await
}

/// Over a real socket, with the uplink waiting for the socket's readiness before it asks the
/// session for credit: bursts of every size still arrive whole, and each time the socket is
/// drained the large read buffer goes.
#[tokio::test]
async fn an_uplink_waiting_for_readiness_moves_bursts_and_lets_its_buffer_go() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, mut socket) = tokio::net::UnixStream::pair().unwrap();
        let mut moved = Moved::default();
        let mut splice =
            splice(&mut socket, &stream, Bytes::new(), &mut moved).reading_when_ready();
        let mut total = 0;
        for burst in [IDLE_READ, 200_000, 10] {
            client.write_all(&vec![9; burst]).await.unwrap();
            let mut got = 0;
            while got < burst {
                tokio::select! {
                    chunk = peer.read() => got += chunk.unwrap().unwrap().len(),
                    result = &mut splice => panic!("the splice ended: {result:?}"),
                }
            }
            assert_eq!(got, burst);
            total += burst;
            poll_once(&mut splice).await;
            assert!(!splice.up.streaming, "{:?}", splice.up);
            assert_eq!(splice.up.big.capacity(), 0, "{:?}", splice.up);
        }
        assert_eq!(splice.moved.up, total as u64);
        shutdown.cancel();
    })
    .await
}

/// A burst of chunks goes out in one write, and the list that carried it does not stay.
#[tokio::test]
async fn a_quiet_downlink_holds_no_chunks() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, mut socket) = tokio::io::duplex(1024 * 1024);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        for _ in 0..4 {
            peer.write(Bytes::from_static(b"burst ")).await.unwrap();
        }
        let mut got = [0; 24];
        read_through(&mut splice, &mut client, &mut got).await;
        assert_eq!(&got, b"burst burst burst burst ");
        assert!(splice.down.head.is_empty(), "{:?}", splice.down);
        assert_eq!(splice.down.rest.capacity(), 0, "{:?}", splice.down);
        shutdown.cancel();
    })
    .await
}

/// A socket that keeps what is written until it is flushed — as a TLS stream keeps its last
/// records when its TCP socket is full — still delivers a chunk after which the stream goes
/// quiet: the downlink flushes before it waits.
#[tokio::test]
async fn the_downlink_flushes_before_it_waits() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, socket) = tokio::io::duplex(1024 * 1024);
        // In a task of its own, the splice is polled only when something wakes it: no other
        // future's wake-up (the read's timeout, say) can make up for a missing flush.
        let splicing = tokio::spawn(async move {
            let mut socket = tokio::io::BufWriter::new(socket);
            let mut moved = Moved::default();
            splice(&mut socket, &stream, Bytes::new(), &mut moved).await
        });
        peer.write(Bytes::from_static(b"last words")).await.unwrap();
        let mut got = [0; 10];
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut got))
            .await
            .expect("the chunk stayed in the socket's buffer")
            .unwrap();
        assert_eq!(&got, b"last words");
        assert!(!splicing.is_finished());
        shutdown.cancel();
    })
    .await
}

/// A test socket over a duplex stream that notes how many bytes each read asked for and,
/// like a TLS stream, may return at most one record's worth per read.
#[derive(Debug)]
struct TestSocket {
    io: DuplexStream,
    /// Most bytes one read returns.
    record: Option<usize>,
    asked: Vec<usize>,
}

impl TestSocket {
    /// Reads at most one TLS record's worth at a time, as a TLS stream does.
    fn records(io: DuplexStream) -> TestSocket {
        TestSocket {
            io,
            record: Some(16 * 1024),
            asked: Vec::new(),
        }
    }

    /// Reads what it is asked for, noting how much that was.
    fn noting(io: DuplexStream) -> TestSocket {
        TestSocket {
            io,
            record: None,
            asked: Vec::new(),
        }
    }
}

impl tokio::io::AsyncRead for TestSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let asked = buf.remaining();
        self.asked.push(asked);
        let Some(record) = self.record else {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        };
        let mut bytes = vec![0; asked.min(record)];
        let mut read = tokio::io::ReadBuf::new(&mut bytes);
        let poll = Pin::new(&mut self.io).poll_read(cx, &mut read);
        buf.put_slice(read.filled());
        poll
    }
}

impl tokio::io::AsyncWrite for TestSocket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A burst from a socket that returns a record per read streams in record-sized chunks; it
/// does not fall back to the small buffer between records (which split every record in two).
#[tokio::test]
async fn a_burst_of_records_streams_whole_records() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, socket) = tokio::io::duplex(1024 * 1024);
        let mut socket = TestSocket::records(socket);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        let total = IDLE_READ + 6 * 16 * 1024 + 3000;
        client.write_all(&vec![9; total]).await.unwrap();
        poll_once(&mut splice).await;
        let mut sizes = Vec::new();
        while sizes.iter().sum::<usize>() < total {
            sizes.push(peer.read().await.unwrap().unwrap().len());
        }
        assert_eq!(sizes.first(), Some(&IDLE_READ), "{sizes:?}");
        assert!(
            sizes[1..sizes.len() - 1].iter().all(|&n| n == 16 * 1024),
            "chunk sizes {sizes:?}"
        );
        shutdown.cancel();
    })
    .await
}

/// A bulk burst is read in reads that double while they fill their buffer, from a frame's
/// worth up to [`STREAMING_READ`], and arrives whole in frame-sized chunks; once the burst is
/// drained, the next one starts at a frame's worth again, and a trickle never reads more.
#[tokio::test]
async fn a_bulk_burst_is_read_in_growing_reads() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, socket) = tokio::io::duplex(8 * 1024 * 1024);
        let mut socket = TestSocket::noting(socket);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        let total = IDLE_READ + 4 * STREAMING_READ;
        let mut got = 0;
        for burst in [total, 3 * MAX_DATA_PAYLOAD / 2, 1000] {
            splice.socket.asked.clear();
            client.write_all(&vec![5; burst]).await.unwrap();
            let expected = got + burst;
            let read = async {
                while got < expected {
                    let chunk = peer.read().await.unwrap().unwrap();
                    assert!(chunk.len() <= MAX_DATA_PAYLOAD, "{}", chunk.len());
                    got += chunk.len();
                }
            };
            tokio::select! {
                () = read => {}
                result = &mut splice => panic!("the splice ended: {result:?}"),
            }
            // Reads that found nothing asked again: what counts is what the reads that
            // moved the burst asked for, the small read that tells a burst from a trickle
            // first.
            let asked: Vec<usize> = splice.socket.asked.clone();
            assert_eq!(asked[0], IDLE_READ, "{asked:?}");
            let doubling: Vec<usize> = (0..4).map(|i| MAX_DATA_PAYLOAD << i).collect();
            assert!(asked.iter().all(|&n| n <= STREAMING_READ), "{asked:?}");
            if burst == total {
                // A read may also be held to the stream's credit (the session's queue).
                assert_eq!(asked[1..5], doubling[..4], "{asked:?}");
                let largest = asked.iter().filter(|&&n| n == STREAMING_READ).count();
                assert!(largest >= 3, "{asked:?}");
            } else if burst == 1000 {
                assert!(asked.iter().all(|&n| n <= MAX_DATA_PAYLOAD), "{asked:?}");
            } else {
                assert_eq!(asked[1..3], doubling[..2], "{asked:?}");
            }
        }
        assert_eq!(got, total + 3 * MAX_DATA_PAYLOAD / 2 + 1000);
        shutdown.cancel();
    })
    .await
}

/// A streaming read that comes back short switches back to the small buffer and lets the
/// large one go at once, not only once a read finds nothing.
#[tokio::test]
async fn a_short_streaming_read_lets_the_large_buffer_go() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, mut socket) = tokio::io::duplex(1024 * 1024);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        // One small read that fills its buffer, then a large read that gets only 100 bytes.
        client.write_all(&[7; IDLE_READ + 100]).await.unwrap();
        poll_once(&mut splice).await;
        assert!(!splice.up.streaming, "{:?}", splice.up);
        assert_eq!(splice.up.big.capacity(), 0, "{:?}", splice.up);
        let mut got = 0;
        while got < IDLE_READ + 100 {
            got += peer.read().await.unwrap().unwrap().len();
        }
        shutdown.cancel();
    })
    .await
}

/// A client socket that records the chunks of every write and never sends anything.
#[derive(Debug, Default)]
struct Recorder {
    /// Per write call, the length of each slice written.
    writes: Vec<Vec<usize>>,
}

impl tokio::io::AsyncRead for Recorder {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }
}

impl tokio::io::AsyncWrite for Recorder {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.writes.push(vec![buf.len()]);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).filter(|&n| n > 0).collect();
        let total = lens.iter().sum();
        self.writes.push(lens);
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Chunks already buffered go out together, in vectored writes of at most 16 chunks or
/// 256 KiB (whichever comes first), and are counted once each.
#[tokio::test]
async fn a_burst_goes_out_in_writes_of_at_most_16_chunks_or_256_kib() {
    bounded(async {
        let (server, agent, shutdown) = streams(1 << 20, 2).await;
        let cases = [
            (20, 100, vec![vec![100; 16], vec![100; 4]]),
            (5, 64 * 1024, vec![vec![64 * 1024; 4], vec![64 * 1024]]),
        ];
        for (chunks, size, writes) in cases {
            let mut socket = Recorder::default();
            let mut moved = Moved::default();
            let mut splice = splice(&mut socket, &server[0], Bytes::new(), &mut moved);
            for _ in 0..chunks {
                agent[0].write(Bytes::from(vec![1; size])).await.unwrap();
            }
            // The marker travels behind the burst: once it is read, all of the burst is here.
            agent[1].write(Bytes::from_static(b"!")).await.unwrap();
            assert_eq!(server[1].read().await.unwrap().as_deref(), Some(&b"!"[..]));
            poll_once(&mut splice).await;
            assert_eq!(splice.socket.writes, writes, "{chunks} chunks of {size}");
            assert_eq!(splice.moved.down, (chunks * size) as u64);
        }
        shutdown.cancel();
    })
    .await
}

/// Counts what a splice tells its meter.
#[derive(Default)]
struct Waits {
    window: std::sync::atomic::AtomicU64,
    queue: std::sync::atomic::AtomicU64,
}

impl super::Meter for Waits {
    fn moved(&self, _up: u64, _down: u64) {}

    fn waited(&self, why: super::SendWait) {
        let counter = match why {
            super::SendWait::Window => &self.window,
            super::SendWait::Queue => &self.queue,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Waits {
    /// (waits for the window, waits for the queue) so far.
    fn counts(&self) -> (u64, u64) {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (load(&self.window), load(&self.queue))
    }
}

/// An uplink whose socket has more than the peer's window tells its meter it waits for the
/// window, once per wait however often the task is polled meanwhile; once the peer reads and
/// grants, the bytes move on, and the next time the window runs out is the next wait.
#[tokio::test]
async fn an_uplink_out_of_window_tells_its_meter_once_per_wait() {
    bounded(async {
        const WINDOW: usize = 64 * 1024;
        let (server, agent, shutdown) = streams(WINDOW as u32, 1).await;
        let (mut client, mut socket) = tokio::io::duplex(4 * WINDOW);
        let (mut moved, waits) = (Moved::default(), Waits::default());
        let mut splice =
            super::splice_metered(&mut socket, &server[0], Bytes::new(), &mut moved, &waits);
        client.write_all(&vec![5; 3 * WINDOW]).await.unwrap();
        for _ in 0..3 {
            poll_once(&mut splice).await;
        }
        assert_eq!(splice.moved.up, WINDOW as u64);
        assert_eq!(waits.counts(), (1, 0));
        // The peer reads the window: its grants let the rest move, one window at a time.
        let reading = async {
            let mut got = 0;
            while got < 3 * WINDOW {
                got += agent[0].read().await.unwrap().unwrap().len();
            }
        };
        tokio::select! {
            () = reading => {}
            result = &mut splice => panic!("the splice ended: {result:?}"),
        }
        assert_eq!(splice.moved.up, 3 * WINDOW as u64);
        let (window, _) = waits.counts();
        assert!(window >= 2, "{window} waits");
        shutdown.cancel();
    })
    .await
}

/// A socket that takes less than a chunk per write gets the chunk in pieces, in order, and
/// then the next chunk.
#[tokio::test]
async fn a_chunk_larger_than_a_write_goes_out_in_pieces() {
    bounded(async {
        let (stream, peer, shutdown) = stream_pair().await;
        let (mut client, mut socket) = tokio::io::duplex(1024);
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &stream, Bytes::new(), &mut moved);
        let first: Bytes = (0..10_000).map(|i| (i % 251) as u8).collect();
        peer.write(first.clone()).await.unwrap();
        peer.write(Bytes::from_static(b"next")).await.unwrap();
        let mut got = vec![0; first.len() + 4];
        read_through(&mut splice, &mut client, &mut got).await;
        assert!(got[..first.len()] == first[..], "the chunk arrived changed");
        assert_eq!(&got[first.len()..], b"next");
        shutdown.cancel();
    })
    .await
}

/// A loopback TCP connection whose reading end starts with a receive buffer of `start`, set
/// before it connected: (the reading end, the writing end).
async fn tcp_with_receive_buffer(start: u32) -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(start).unwrap();
    let reading = socket
        .connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (writing, _) = listener.accept().await.unwrap();
    (reading, writing)
}

/// The receive buffer the kernel gives `socket` (twice what was set).
fn receive_buffer(socket: &tokio::net::TcpStream) -> usize {
    socket2::SockRef::from(socket).recv_buffer_size().unwrap()
}

/// A tunnel socket earns its receive buffer by reading: one whose stream stalls after its
/// first window keeps the small buffer it started with, one whose stream keeps reading
/// doubles it up to the largest. Without the earning both would keep the start.
#[tokio::test]
async fn a_socket_earns_its_receive_buffer_by_reading() {
    bounded(async {
        const WINDOW: usize = 64 * 1024;
        let (server, agent, shutdown) = streams(WINDOW as u32, 2).await;
        let policy = EarnedBuffer {
            start: 8 * 1024,
            max: 64 * 1024,
        };
        for (i, stalls) in [(0, true), (1, false)] {
            let (mut socket, mut target) = tcp_with_receive_buffer(policy.start).await;
            assert_eq!(receive_buffer(&socket), 16 * 1024);
            let total = 2 << 20;
            let writing = tokio::spawn(async move {
                let _ = target.write_all(&vec![5; total]).await;
                target
            });
            let mut moved = Moved::default();
            let mut splice = splice(&mut socket, &agent[i], Bytes::new(), &mut moved)
                .earning(Some(policy), None);
            let mut got = 0;
            if stalls {
                // The client takes the first window and never lets go of it: no more credit.
                let held = poll_fn(|cx| loop {
                    match server[i].poll_read_held(cx) {
                        Poll::Ready(chunk) => got += chunk.unwrap().unwrap().len(),
                        Poll::Pending if got >= WINDOW => return Poll::Ready(()),
                        Poll::Pending => return Poll::Pending,
                    }
                });
                tokio::select! {
                    () = held => {}
                    result = &mut splice => panic!("the splice ended: {result:?}"),
                }
                poll_once(&mut splice).await;
                drop(splice);
                assert_eq!(got, WINDOW);
                assert_eq!(
                    receive_buffer(&socket),
                    16 * 1024,
                    "a stalled tunnel earned"
                );
                writing.abort();
            } else {
                let reading = async {
                    while got < total {
                        got += server[i].read().await.unwrap().unwrap().len();
                    }
                };
                tokio::select! {
                    () = reading => {}
                    result = &mut splice => panic!("the splice ended: {result:?}"),
                }
                drop(splice);
                assert_eq!(
                    receive_buffer(&socket),
                    128 * 1024,
                    "a reading tunnel earned"
                );
                drop(writing.await.unwrap());
            }
        }
        shutdown.cancel();
    })
    .await
}

/// What reading sockets earn beyond their start comes out of one total: a second socket
/// earns only what the first left, and a socket's share comes back when its splice ends.
/// Without the total both sockets would earn the largest buffer.
#[tokio::test]
async fn sockets_earn_from_one_total() {
    bounded(async {
        let (server, agent, shutdown) = streams(64 * 1024, 2).await;
        let policy = EarnedBuffer {
            start: 8 * 1024,
            max: 64 * 1024,
        };
        let total = EarnedTotal::new(64 * 1024);
        // Moves 2 MiB from the target through the splice, and leaves the splice open.
        async fn moves(splice: &mut Splice<'_, &mut tokio::net::TcpStream>, stream: &MuxStream) {
            let reading = async {
                let mut got = 0;
                while got < 2 << 20 {
                    got += stream.read().await.unwrap().unwrap().len();
                }
            };
            tokio::select! {
                () = reading => {}
                result = splice => panic!("the splice ended: {result:?}"),
            }
        }
        let mut sockets = Vec::new();
        for _ in 0..2 {
            let (socket, mut target) = tcp_with_receive_buffer(policy.start).await;
            tokio::spawn(async move { target.write_all(&vec![7; 2 << 20]).await });
            sockets.push(socket);
        }
        let (first, second) = sockets.split_at_mut(1);
        let (mut moved_first, mut moved_second) = (Moved::default(), Moved::default());
        let mut splice_first = splice(&mut first[0], &agent[0], Bytes::new(), &mut moved_first)
            .earning_within(Some(policy), None, Some(&total));
        moves(&mut splice_first, &server[0]).await;
        assert_eq!(total.earned(), 56 * 1024, "the first earned the largest");
        let mut splice_second = splice(&mut second[0], &agent[1], Bytes::new(), &mut moved_second)
            .earning_within(Some(policy), None, Some(&total));
        moves(&mut splice_second, &server[1]).await;
        assert_eq!(total.earned(), 64 * 1024, "the second earned what was left");
        drop(splice_first);
        assert_eq!(total.earned(), 8 * 1024, "the first's share came back");
        drop(splice_second);
        assert_eq!(total.earned(), 0);
        assert_eq!(receive_buffer(&first[0]), 128 * 1024);
        assert_eq!(receive_buffer(&second[0]), 32 * 1024);
        shutdown.cancel();
    })
    .await
}

#[test]
fn the_earned_buffer_doubles_at_eight_times_its_size() {
    let policy = EarnedBuffer {
        start: 8 * 1024,
        max: 64 * 1024,
    };
    let kib = |n: u64| n * 1024;
    assert_eq!(policy.size(0), 8 * 1024);
    assert_eq!(policy.size(kib(128) - 1), 8 * 1024);
    assert_eq!(policy.size(kib(128)), 16 * 1024);
    assert_eq!(policy.size(kib(256)), 32 * 1024);
    assert_eq!(policy.size(kib(512)), 64 * 1024);
    assert_eq!(policy.size(u64::MAX), 64 * 1024);
    // A start at or above the largest stays where it is.
    let fixed = EarnedBuffer {
        start: 64 * 1024,
        max: 32 * 1024,
    };
    assert_eq!(fixed.size(u64::MAX), 64 * 1024);
}

/// A Unix-socket client's socket earns its send buffer by taking bytes: one whose client
/// reads doubles it up to the largest; one whose client stalls keeps the buffer it started
/// with, and that is all the kernel holds for it. Without the earning both would keep the
/// start.
#[tokio::test]
async fn a_unix_socket_earns_its_send_buffer_by_writing() {
    bounded(async {
        const WINDOW: usize = 64 * 1024;
        let (server, agent, shutdown) = streams(WINDOW as u32, 2).await;
        let policy = EarnedBuffer {
            start: 8 * 1024,
            max: 104 * 1024,
        };
        let send_buffer = |socket: &tokio::net::UnixStream| {
            socket2::SockRef::from(socket).send_buffer_size().unwrap()
        };
        let chunk = Bytes::from(vec![6; 64 * 1024]);
        for (i, stalls) in [(0, true), (1, false)] {
            let (mut socket, mut client) = tokio::net::UnixStream::pair().unwrap();
            socket2::SockRef::from(&socket)
                .set_send_buffer_size(policy.start as usize)
                .unwrap();
            let mut moved = Moved::default();
            let mut splice = splice(&mut socket, &server[i], Bytes::new(), &mut moved)
                .earning(None, Some(policy));
            let mut pending = Bytes::new();
            let mut sent = 0;
            let total = 2 << 20;
            let mut got = vec![0; total];
            let mut read = 0;
            // The agent's end sends as its credit allows; the splice writes into the socket;
            // the client reads (or not). Stalled: the splice holds a chunk the full socket did
            // not take, and the agent's end has no credit: nothing moves until the client reads.
            poll_fn(|cx| loop {
                assert!(Pin::new(&mut splice).poll(cx).is_pending());
                if !stalls {
                    let mut buf = tokio::io::ReadBuf::new(&mut got[read..]);
                    if let Poll::Ready(done) =
                        tokio::io::AsyncRead::poll_read(Pin::new(&mut client), cx, &mut buf)
                    {
                        done.unwrap();
                        read += buf.filled().len();
                        if read == total {
                            return Poll::Ready(());
                        }
                        continue;
                    }
                }
                if sent < total || !pending.is_empty() {
                    if pending.is_empty() {
                        pending = chunk.clone();
                        sent += chunk.len();
                    }
                    if let Poll::Ready(credit) = agent[i].poll_writable(cx) {
                        credit.unwrap();
                        agent[i].send(&mut pending, true).unwrap();
                        continue;
                    }
                }
                if stalls && !splice.down.head.is_empty() {
                    return Poll::Ready(());
                }
                return Poll::Pending;
            })
            .await;
            drop(splice);
            let expected = if stalls { 16 * 1024 } else { 208 * 1024 };
            assert_eq!(send_buffer(&socket), expected, "stalls: {stalls}");
        }
        shutdown.cancel();
    })
    .await
}

/// What a tunnel's owner asks of its socket reaches the socket itself through a `Box` (the
/// frontend's clients) or a `&mut` (the agent's targets): the receive buffer and the reset on
/// close of a TCP socket, the send buffer of a Unix socket, which has no receive buffer to
/// earn (`Unsupported`: its tunnel earns nothing there).
#[tokio::test]
async fn a_boxed_or_borrowed_socket_is_the_socket() {
    let (tcp, _peer) = tcp_with_receive_buffer(8 * 1024).await;
    let boxed = Box::new(tcp);
    boxed.set_receive_buffer(32 * 1024).unwrap();
    assert_eq!(receive_buffer(&boxed), 64 * 1024);
    let mut tcp = *boxed;
    let borrowed = &mut tcp;
    TunnelSocket::set_receive_buffer(&borrowed, 16 * 1024).unwrap();
    TunnelSocket::abort_on_close(&borrowed);
    let linger = socket2::SockRef::from(&tcp).linger().unwrap();
    assert_eq!(linger, Some(std::time::Duration::ZERO));

    let (unix, _client) = tokio::net::UnixStream::pair().unwrap();
    let boxed = Box::new(unix);
    boxed.set_send_buffer(16 * 1024).unwrap();
    let sent = socket2::SockRef::from(&*boxed).send_buffer_size().unwrap();
    assert_eq!(sent, 32 * 1024);
    let refused = boxed.set_receive_buffer(16 * 1024).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::Unsupported);
}

/// A Unix socket given a receive policy earns nothing, and its attempt takes nothing from
/// the total for good: the share it asked for comes back at once.
#[tokio::test]
async fn a_socket_that_cannot_grow_gives_its_share_back() {
    bounded(async {
        let (server, agent, shutdown) = streams(64 * 1024, 1).await;
        let policy = EarnedBuffer {
            start: 8 * 1024,
            max: 64 * 1024,
        };
        let total = EarnedTotal::new(64 * 1024);
        let (mut socket, mut client) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(async move { client.write_all(&vec![3; 1 << 20]).await });
        let mut moved = Moved::default();
        let mut splice = splice(&mut socket, &agent[0], Bytes::new(), &mut moved).earning_within(
            Some(policy),
            None,
            Some(&total),
        );
        let reading = async {
            let mut got = 0;
            while got < 1 << 20 {
                got += server[0].read().await.unwrap().unwrap().len();
            }
        };
        tokio::select! {
            () = reading => {}
            result = &mut splice => panic!("the splice ended: {result:?}"),
        }
        assert_eq!(total.earned(), 0);
        drop(splice);
        assert_eq!(total.earned(), 0);
        shutdown.cancel();
    })
    .await
}
