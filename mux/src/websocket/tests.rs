//! The framing against tungstenite's, byte for byte both ways, and the RFC's rules.

use bytes::Bytes;

use super::Message as Outgoing;
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::protocol::Role as TungRole;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::*;

/// Sends `payload` as one message: its first half encoded into the message, the rest spliced
/// in two pieces (the vectored write), so every way a message is made is on the wire.
async fn send_all<W: AsyncWrite + Unpin>(writer: &mut Writer<W>, payload: &[u8]) {
    let mut message = Outgoing::default();
    message.clear(16);
    let (copied, spliced) = payload.split_at(payload.len() / 2);
    message.bytes().extend_from_slice(copied);
    let (a, b) = spliced.split_at(spliced.len() / 2);
    message.splice(Bytes::copy_from_slice(a));
    message.splice(Bytes::copy_from_slice(b));
    assert_eq!(message.len(), payload.len());
    writer.send_binary(&mut message).await.unwrap();
    writer.flush().await.unwrap();
}

#[tokio::test]
async fn tungstenite_reads_what_the_writer_sends_in_either_role() {
    for (ours, theirs) in [
        (Role::Client, TungRole::Server),
        (Role::Server, TungRole::Client),
    ] {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut writer = Writer::new(a, ours);
        let mut peer = WebSocketStream::from_raw_socket(b, theirs, None).await;
        // Each length encoding: 7-bit, 16-bit, 64-bit.
        for len in [0, 1, 125, 126, 65_535, 65_536, 300_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            send_all(&mut writer, &payload).await;
            match peer.next().await.unwrap().unwrap() {
                Message::Binary(got) => assert_eq!(got, payload, "{ours:?}, {len} bytes"),
                other => panic!("{other:?}"),
            }
        }
        writer.ping().await.unwrap();
        assert!(matches!(
            peer.next().await.unwrap().unwrap(),
            Message::Ping(_)
        ));
        writer.send_close(close_code::AWAY, "bye").await.unwrap();
        match peer.next().await.unwrap().unwrap() {
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 1001);
                assert_eq!(frame.reason.as_str(), "bye");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn the_reader_reads_what_tungstenite_sends_masked_or_not_fragmented_or_not() {
    for (ours, theirs) in [
        (Role::Server, TungRole::Client),
        (Role::Client, TungRole::Server),
    ] {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut reader = Reader::new(a, ours, &[]);
        let mut peer = WebSocketStream::from_raw_socket(b, theirs, None).await;
        for len in [0, 1, 125, 126, 65_535, 65_536, 300_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            peer.send(Message::Binary(payload.clone().into()))
                .await
                .unwrap();
            match reader.next().await.unwrap() {
                Incoming::Binary(got) => assert_eq!(got, payload, "{ours:?}, {len} bytes"),
                other => panic!("{other:?}"),
            }
        }
        peer.send(Message::Ping(Bytes::from_static(b"are you there")))
            .await
            .unwrap();
        assert!(matches!(reader.next().await.unwrap(), Incoming::Ping(p) if p == "are you there"));
        peer.send(Message::Text("hello".into())).await.unwrap();
        assert!(matches!(reader.next().await.unwrap(), Incoming::Text));
        peer.close(None).await.unwrap();
        assert!(matches!(reader.next().await.unwrap(), Incoming::Close));
    }
}

/// Raw frames, as a server (unmasked) sends them to a client reader.
/// An unmasked frame whose first byte is `first`, any length (the reader in the client's role
/// takes unmasked frames).
fn raw(first: u8, payload: &[u8]) -> Vec<u8> {
    let (mut wire, len) = (vec![first], payload.len());
    match len {
        0..=125 => wire.push(len as u8),
        126..=0xFFFF => {
            wire.push(126);
            wire.extend((len as u16).to_be_bytes());
        }
        _ => {
            wire.push(127);
            wire.extend((len as u64).to_be_bytes());
        }
    }
    wire.extend_from_slice(payload);
    wire
}

#[tokio::test]
async fn a_fragmented_message_with_a_ping_between_its_fragments_arrives_whole() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let mut reader = Reader::new(a, Role::Client, &[]);
    let mut wire = raw(BINARY, b"frag");
    wire.extend(raw(FIN | PING, b"p"));
    wire.extend(raw(CONTINUATION, b"men"));
    wire.extend(raw(FIN | CONTINUATION, b"ted"));
    b.write_all(&wire).await.unwrap();
    assert!(matches!(reader.next().await.unwrap(), Incoming::Ping(p) if p == "p"));
    assert!(matches!(reader.next().await.unwrap(), Incoming::Binary(m) if m == "fragmented"));
}

#[tokio::test]
async fn framing_violations_are_errors_not_panics() {
    let cases: [(Role, Vec<u8>, &str); 8] = [
        (Role::Server, raw(FIN | BINARY, b"x"), "unmasked"),
        (
            Role::Client,
            vec![FIN | BINARY, MASKED | 1, 0, 0, 0, 0, b'x'],
            "masked",
        ),
        (Role::Client, raw(FIN | 0x40 | BINARY, b"x"), "reserved"),
        (Role::Client, raw(PING, b""), "fragmented control"),
        (
            Role::Client,
            {
                let mut f = vec![FIN | PING, 126, 0, 126];
                f.extend([0; 126]);
                f
            },
            "control frame longer",
        ),
        (
            Role::Client,
            raw(FIN | CONTINUATION, b"x"),
            "continuation without",
        ),
        (
            Role::Client,
            {
                let mut f = raw(BINARY, b"a");
                f.extend(raw(FIN | BINARY, b"b"));
                f
            },
            "inside a fragmented",
        ),
        (Role::Client, raw(FIN | 0x3, b""), "unknown opcode"),
    ];
    for (role, wire, expected) in cases {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut reader = Reader::new(a, role, &[]);
        b.write_all(&wire).await.unwrap();
        let error = reader.next().await.unwrap_err();
        assert!(error.to_string().contains(expected), "{expected}: {error}");
    }
}

#[tokio::test]
async fn a_frame_past_the_limit_is_refused_from_its_header_and_eof_without_close_is_an_error() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let mut reader = Reader::new(a, Role::Client, &[]);
    let mut header = vec![FIN | BINARY, 127];
    header.extend_from_slice(&(MAX_MESSAGE as u64 + 1).to_be_bytes());
    b.write_all(&header).await.unwrap();
    assert!(matches!(reader.next().await, Err(WsError::TooLarge(_))));

    let (a, mut b) = tokio::io::duplex(1 << 16);
    let mut reader = Reader::new(a, Role::Client, &[]);
    b.write_all(&[FIN | BINARY, 5, b'a']).await.unwrap();
    drop(b);
    assert!(matches!(
        reader.next().await,
        Err(WsError::EndedWithoutClose)
    ));
}

#[tokio::test]
async fn bytes_read_past_the_upgrade_start_the_first_frame() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let wire = raw(FIN | BINARY, b"early and late");
    let mut reader = Reader::new(a, Role::Client, &wire[..5]);
    b.write_all(&wire[5..]).await.unwrap();
    assert!(matches!(reader.next().await.unwrap(), Incoming::Binary(m) if m == "early and late"));
}

#[test]
fn unmasking_matches_the_rfc_for_every_length_and_the_zero_key_is_free() {
    let key = [0x37, 0xfa, 0x21, 0x3d];
    for len in 0..40 {
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut masked = plain.clone();
        unmask(&mut masked, key);
        for (i, (m, p)) in masked.iter().zip(&plain).enumerate() {
            assert_eq!(*m, p ^ key[i % 4]);
        }
        unmask(&mut masked, key);
        assert_eq!(masked, plain);
        unmask(&mut masked, [0; 4]);
        assert_eq!(masked, plain);
    }
}

/// A 300 KB message comes in as one buffer of its size: after the header, the reads go
/// straight into it, and no byte of the message is copied a second time.
#[tokio::test]
async fn a_large_message_is_read_into_one_buffer_of_its_size() {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut reader = Reader::new(a, Role::Client, &[]);
    let payload = vec![7u8; 300_000];
    let mut wire = vec![FIN | BINARY, 127];
    wire.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    wire.extend_from_slice(&payload);
    b.write_all(&wire).await.unwrap();
    let Incoming::Binary(got) = reader.next().await.unwrap() else {
        panic!("not binary");
    };
    assert_eq!(got.len(), payload.len());
    // What is left of the buffer after the message is empty: it was sized to the frame.
    assert_eq!(reader.buf.len(), 0);
}

/// Runs `body` on a fresh single-threaded runtime (proptest cases are synchronous).
fn block_on<F: std::future::Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body)
}

proptest::proptest! {
    /// Whatever bytes arrive, the reader returns messages and then an error or the close: it
    /// never panics and never waits for more than was sent once the sender is gone.
    #[test]
    fn arbitrary_bytes_end_in_an_error_or_a_close_never_a_panic(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        client in proptest::prelude::any::<bool>(),
    ) {
        block_on(async {
            let role = if client { Role::Client } else { Role::Server };
            let (a, mut b) = tokio::io::duplex(4096);
            let mut reader = Reader::new(a, role, &[]);
            let send = async move {
                let _ = b.write_all(&bytes).await;
            };
            let read = async {
                loop {
                    match reader.next().await {
                        Ok(Incoming::Close) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            };
            tokio::join!(send, read);
        });
    }

    /// Messages of any sizes, some of their bytes spliced in, come out whole and in order,
    /// interleaved with pings, in either role.
    #[test]
    fn arbitrary_messages_come_out_as_they_went_in(
        messages in proptest::collection::vec(
            (proptest::collection::vec(proptest::prelude::any::<u8>(), 0..70_000), 0usize..4),
            1..6,
        ),
        client in proptest::prelude::any::<bool>(),
    ) {
        block_on(async {
            let (ours, theirs) = if client {
                (Role::Client, Role::Server)
            } else {
                (Role::Server, Role::Client)
            };
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut writer = Writer::new(a, ours);
            let mut reader = Reader::new(b, theirs, &[]);
            let expected: Vec<Vec<u8>> = messages.iter().map(|(m, _)| m.clone()).collect();
            let send = async move {
                for (payload, pieces) in &messages {
                    let mut message = Outgoing::default();
                    message.clear(64);
                    let mut rest = &payload[..];
                    for piece in 0..*pieces {
                        let cut = rest.len() / 2;
                        if piece % 2 == 0 {
                            message.bytes().extend_from_slice(&rest[..cut]);
                        } else {
                            message.splice(Bytes::copy_from_slice(&rest[..cut]));
                        }
                        rest = &rest[cut..];
                    }
                    message.bytes().extend_from_slice(rest);
                    writer.send_binary(&mut message).await.unwrap();
                    writer.ping().await.unwrap();
                }
            };
            let receive = async {
                let mut got = Vec::new();
                while got.len() < expected.len() {
                    match reader.next().await.unwrap() {
                        Incoming::Binary(payload) => got.push(payload.to_vec()),
                        Incoming::Ping(_) => {}
                        other => panic!("{other:?}"),
                    }
                }
                got
            };
            let ((), got) = tokio::join!(send, receive);
            assert_eq!(got, expected);
        });
    }
}

/// Every length is written in the shortest form RFC 6455 §5.2 allows (a longer one is a
/// protocol error to a strict peer), a client's header with its mask bit and key.
#[test]
fn lengths_take_the_shortest_encoding() {
    let server = Writer::new(tokio::io::sink(), Role::Server);
    let client = Writer::new(tokio::io::sink(), Role::Client);
    let header = |writer: &Writer<tokio::io::Sink>, len: usize| {
        let (bytes, end) = writer.header(0x2, len);
        bytes[..end].to_vec()
    };
    assert_eq!(header(&server, 0), [0x82, 0]);
    assert_eq!(header(&server, 125), [0x82, 125]);
    assert_eq!(header(&server, 126), [0x82, 126, 0, 126]);
    assert_eq!(header(&server, 0xFFFF), [0x82, 126, 0xFF, 0xFF]);
    assert_eq!(
        header(&server, 0x1_0000),
        [0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]
    );
    assert_eq!(header(&client, 5), [0x82, 0x85, 0, 0, 0, 0]);
    assert_eq!(header(&client, 300), [0x82, 0xFE, 1, 44, 0, 0, 0, 0]);
}

/// A close frame's reason is cut to fit a control frame's 125 bytes, on a character
/// boundary: the peer gets valid UTF-8 after the code.
#[test]
fn a_long_close_reason_is_cut_on_a_character_boundary() {
    let writer = Writer::new(tokio::io::sink(), Role::Server);
    let mut out = Vec::new();
    writer.close(&mut out, 1001, &"é".repeat(100));
    // Header, code, then 61 whole characters (122 bytes): 123 would split one.
    assert_eq!(out.len(), 2 + 2 + 122);
    assert_eq!(out[..4], [0x88, 124, 0x03, 0xE9]);
    assert!(std::str::from_utf8(&out[4..]).is_ok());
    let mut short = Vec::new();
    writer.close(&mut short, 1000, "bye");
    assert_eq!(short, [0x88, 5, 0x03, 0xE8, b'b', b'y', b'e']);
}

/// A message goes through a transport that buffers (TLS does) only when flushed: the writer
/// flushes what it wrote.
#[tokio::test]
async fn a_message_reaches_the_peer_through_a_buffering_transport() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let mut writer = Writer::new(tokio::io::BufWriter::new(a), Role::Server);
    let mut peer = WebSocketStream::from_raw_socket(b, TungRole::Client, None).await;
    let mut message = Outgoing::default();
    message.clear(16);
    message.bytes().extend_from_slice(b"through the buffer");
    writer.send_binary(&mut message).await.unwrap();
    writer.flush().await.unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), peer.next())
        .await
        .expect("the message stayed in the buffer")
        .unwrap()
        .unwrap();
    assert_eq!(
        got,
        Message::Binary(Bytes::from_static(b"through the buffer"))
    );
}

/// A control frame may carry 125 bytes, not one more.
#[tokio::test]
async fn a_control_frame_of_125_bytes_is_taken() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let mut reader = Reader::new(a, Role::Client, &[]);
    b.write_all(&raw(FIN | PING, &[7; 125])).await.unwrap();
    assert!(matches!(reader.next().await.unwrap(), Incoming::Ping(p) if p.len() == 125));
}

/// A message in fragments may add up to `MAX_MESSAGE` bytes, not one more.
#[tokio::test]
async fn fragments_may_add_up_to_max_message_and_no_further() {
    for (extra, taken) in [(0, true), (1, false)] {
        let (a, mut b) = tokio::io::duplex(4 * MAX_MESSAGE);
        let mut reader = Reader::new(a, Role::Client, &[]);
        let half = MAX_MESSAGE / 2;
        let mut wire = raw(BINARY, &vec![1; half]);
        wire.extend(raw(FIN | CONTINUATION, &vec![2; half + extra]));
        b.write_all(&wire).await.unwrap();
        match reader.next().await {
            Ok(Incoming::Binary(message)) => {
                assert!(
                    taken,
                    "a message of {} bytes was taken",
                    MAX_MESSAGE + extra
                );
                assert_eq!(message.len(), MAX_MESSAGE);
            }
            Err(WsError::TooLarge(len)) => {
                assert!(!taken, "a message of {len} bytes was refused");
                assert_eq!(len, (MAX_MESSAGE + extra) as u64);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Records how much room each read offered.
struct Offers<R> {
    io: R,
    offered: Vec<usize>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Offers<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let room = buf.remaining();
        self.offered.push(room);
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

/// Between messages the reader waits with 4 KiB of room (`READ_BUFFER`): an idle session
/// holds that much, not the last message's buffer.
#[tokio::test]
async fn an_idle_reader_waits_with_4_kib_of_room() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let mut reader = Reader::new(
        Offers {
            io: a,
            offered: Vec::new(),
        },
        Role::Client,
        &[],
    );
    b.write_all(&raw(FIN | BINARY, b"x")).await.unwrap();
    assert!(matches!(reader.next().await.unwrap(), Incoming::Binary(m) if m == "x"));
    assert_eq!(reader.io.offered[0], 4 * 1024);
}
