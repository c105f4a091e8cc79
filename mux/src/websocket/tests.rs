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
fn raw(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![first, payload.len() as u8];
    frame.extend_from_slice(payload);
    frame
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
