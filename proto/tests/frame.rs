//! Frame encoding and decoding: golden bytes (quoted by `docs/protocol.md`), round trips, every
//! decode error, every truncated prefix, and property tests.

use bridgehead_proto::frame::{kind, HEADER_LEN, MAX_DATA_PAYLOAD, MAX_HOST_LEN, MAX_REASON_LEN};
use bridgehead_proto::{DecodeError, ErrorCode, Frame};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

/// Hex with spaces between fields, as `docs/protocol.md` prints it.
fn hex(spaced: &str) -> Vec<u8> {
    let digits: Vec<u8> = spaced
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    assert!(
        digits.len() % 2 == 0,
        "odd number of hex digits in {spaced:?}"
    );
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn encode(frame: &Frame) -> Bytes {
    let mut buf = BytesMut::new();
    frame.encode(&mut buf);
    assert_eq!(buf.len(), frame.encoded_len(), "encoded_len of {frame:?}");
    buf.freeze()
}

fn decode(bytes: &[u8]) -> Result<Frame, DecodeError> {
    Frame::decode(Bytes::copy_from_slice(bytes))
}

/// One example of every frame type with its exact bytes: `type | stream | length | body`, the
/// body split into its fields. These strings appear verbatim in `docs/protocol.md`.
fn golden() -> Vec<(Frame, &'static str)> {
    vec![
        (
            Frame::Dial {
                stream: 1,
                timeout_ms: 10_000,
                window: 256 * 1024,
                port: 10250,
                host: "10.0.0.5".into(),
            },
            "01 00000001 00000013 00002710 00040000 280a 08 31302e302e302e35",
        ),
        (
            Frame::DialOk {
                stream: 1,
                window: 256 * 1024,
            },
            "02 00000001 00000004 00040000",
        ),
        (
            Frame::DialErr {
                stream: 2,
                code: ErrorCode::Refused,
                message: "connection refused".into(),
            },
            "03 00000002 00000013 01 636f6e6e656374696f6e2072656675736564",
        ),
        (
            Frame::Data {
                stream: 1,
                payload: Bytes::from_static(b"hello"),
            },
            "04 00000001 00000005 68656c6c6f",
        ),
        (
            Frame::Window {
                stream: 1,
                increment: 128 * 1024,
            },
            "05 00000001 00000004 00020000",
        ),
        (Frame::Fin { stream: 1 }, "06 00000001 00000000"),
        (
            Frame::Reset {
                stream: 1,
                code: ErrorCode::Cancelled,
                reason: "client closed".into(),
            },
            "07 00000001 0000000e 08 636c69656e7420636c6f736564",
        ),
        (Frame::Drain, "08 00000000 00000000"),
    ]
}

#[test]
fn golden_bytes() {
    let golden = golden();
    let kinds: Vec<u8> = golden.iter().map(|(_, h)| hex(h)[0]).collect();
    assert_eq!(
        kinds,
        [
            kind::DIAL,
            kind::DIAL_OK,
            kind::DIAL_ERR,
            kind::DATA,
            kind::WINDOW,
            kind::FIN,
            kind::RESET,
            kind::DRAIN
        ],
        "one golden frame per type, in type order"
    );
    for (frame, spaced) in golden {
        let bytes = hex(spaced);
        assert_eq!(&encode(&frame)[..], &bytes[..], "encoding of {frame:?}");
        assert_eq!(decode(&bytes), Ok(frame));
    }
}

#[test]
fn golden_bytes_are_quoted_in_the_spec() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    let spec = std::fs::read_to_string(path).expect("reading docs/protocol.md");
    for (frame, spaced) in golden() {
        assert!(
            spec.contains(spaced),
            "docs/protocol.md must quote {spaced:?} ({frame:?})"
        );
    }
}

#[test]
fn error_codes_round_trip() {
    for code in 0..=u8::MAX {
        let decoded = ErrorCode::from_u8(code);
        assert_eq!(decoded.to_u8(), code);
        assert_eq!(
            matches!(decoded, ErrorCode::Unknown(_)),
            code > 14,
            "code {code}"
        );
    }
    assert_eq!(ErrorCode::Refused.to_string(), "refused");
    assert_eq!(ErrorCode::Unknown(200).to_string(), "unknown(200)");
}

#[test]
fn round_trip_every_variant() {
    let frames = vec![
        Frame::Dial {
            stream: u32::MAX,
            timeout_ms: u32::MAX,
            window: 0,
            port: 0,
            host: "fd00::5".into(),
        },
        Frame::Dial {
            stream: 7,
            timeout_ms: 0,
            window: u32::MAX,
            port: u16::MAX,
            host: "x".repeat(MAX_HOST_LEN),
        },
        Frame::DialOk {
            stream: 3,
            window: 0,
        },
        Frame::DialErr {
            stream: 3,
            code: ErrorCode::Unknown(250),
            message: String::new(),
        },
        Frame::DialErr {
            stream: 3,
            code: ErrorCode::NameNotResolved,
            message: "é".repeat(MAX_REASON_LEN / 2),
        },
        Frame::Data {
            stream: 9,
            payload: Bytes::from(vec![0xa5; MAX_DATA_PAYLOAD]),
        },
        Frame::Data {
            stream: 9,
            payload: Bytes::from_static(&[0]),
        },
        Frame::Window {
            stream: 9,
            increment: u32::MAX,
        },
        Frame::Fin { stream: u32::MAX },
        Frame::Reset {
            stream: 1,
            code: ErrorCode::FlowControl,
            reason: "r".repeat(MAX_REASON_LEN),
        },
        Frame::Drain,
    ];
    for frame in frames {
        assert_eq!(Frame::decode(encode(&frame)), Ok(frame));
    }
}

/// Names every `DecodeError` variant; the exhaustive match makes a new variant fail to compile
/// here until `every_decode_error` produces it.
fn variant(error: &DecodeError) -> &'static str {
    match error {
        DecodeError::Truncated { .. } => "Truncated",
        DecodeError::UnknownType(_) => "UnknownType",
        DecodeError::TooLarge { .. } => "TooLarge",
        DecodeError::BadLength { .. } => "BadLength",
        DecodeError::BadStream { .. } => "BadStream",
        DecodeError::EmptyData => "EmptyData",
        DecodeError::ZeroWindow => "ZeroWindow",
        DecodeError::EmptyHost => "EmptyHost",
        DecodeError::InvalidUtf8 => "InvalidUtf8",
        DecodeError::TrailingBytes(_) => "TrailingBytes",
    }
}

const ALL_VARIANTS: [&str; 10] = [
    "Truncated",
    "UnknownType",
    "TooLarge",
    "BadLength",
    "BadStream",
    "EmptyData",
    "ZeroWindow",
    "EmptyHost",
    "InvalidUtf8",
    "TrailingBytes",
];

#[test]
fn every_decode_error() {
    let bad_length = |kind, len, expected| DecodeError::BadLength {
        kind,
        len,
        expected,
    };
    let cases: Vec<(&str, DecodeError)> = vec![
        (
            "",
            DecodeError::Truncated {
                needed: 9,
                available: 0,
            },
        ),
        (
            "04 00000001 000000",
            DecodeError::Truncated {
                needed: 9,
                available: 8,
            },
        ),
        (
            "04 00000001 00000005 6865",
            DecodeError::Truncated {
                needed: 14,
                available: 11,
            },
        ),
        ("00 00000001 00000000", DecodeError::UnknownType(0x00)),
        ("09 00000000 00000000", DecodeError::UnknownType(0x09)),
        ("ff 00000001 00000004", DecodeError::UnknownType(0xff)),
        (
            "04 00000001 00010001",
            DecodeError::TooLarge {
                len: 65537,
                max: 65536,
            },
        ),
        (
            "04 00000001 ffffffff",
            DecodeError::TooLarge {
                len: u32::MAX as usize,
                max: 65536,
            },
        ),
        (
            "01 00000001 0000000a 00002710 00040000 280a",
            bad_length(kind::DIAL, 10, "11 + host length"),
        ),
        (
            "01 00000001 00000012 00002710 00040000 280a 08 31302e302e302e",
            bad_length(kind::DIAL, 18, "11 + host length"),
        ),
        (
            "01 00000001 00000014 00002710 00040000 280a 08 31302e302e302e3535",
            bad_length(kind::DIAL, 20, "11 + host length"),
        ),
        (
            "02 00000001 00000003 000400",
            bad_length(kind::DIAL_OK, 3, "4"),
        ),
        (
            "02 00000001 00000005 0004000000",
            bad_length(kind::DIAL_OK, 5, "4"),
        ),
        (
            "03 00000001 00000000",
            bad_length(kind::DIAL_ERR, 0, "1 to 1025"),
        ),
        (
            "07 00000001 00000000",
            bad_length(kind::RESET, 0, "1 to 1025"),
        ),
        (
            "05 00000001 00000003 000001",
            bad_length(kind::WINDOW, 3, "4"),
        ),
        ("06 00000001 00000001 00", bad_length(kind::FIN, 1, "0")),
        ("08 00000000 00000001 00", bad_length(kind::DRAIN, 1, "0")),
        (
            "08 00000001 00000000",
            DecodeError::BadStream {
                kind: kind::DRAIN,
                stream: 1,
                expected: "session frames use stream 0",
            },
        ),
        (
            "04 00000000 00000001 00",
            DecodeError::BadStream {
                kind: kind::DATA,
                stream: 0,
                expected: "stream frames need a non-zero stream id",
            },
        ),
        ("04 00000001 00000000", DecodeError::EmptyData),
        ("05 00000001 00000004 00000000", DecodeError::ZeroWindow),
        (
            "01 00000001 0000000b 00002710 00040000 280a 00",
            DecodeError::EmptyHost,
        ),
        (
            "01 00000001 0000000c 00002710 00040000 280a 01 ff",
            DecodeError::InvalidUtf8,
        ),
        ("03 00000001 00000002 01 c3", DecodeError::InvalidUtf8),
        ("07 00000001 00000003 01 c328", DecodeError::InvalidUtf8),
        ("06 00000001 00000000 06", DecodeError::TrailingBytes(1)),
        (
            "06 00000001 00000000 06 00000001 00000000",
            DecodeError::TrailingBytes(9),
        ),
    ];
    let mut seen = Vec::new();
    for (spaced, expected) in cases {
        let got = decode(&hex(spaced));
        assert_eq!(got, Err(expected.clone()), "decoding {spaced:?}");
        assert!(!expected.to_string().is_empty());
        seen.push(variant(&expected));
    }
    for name in ALL_VARIANTS {
        assert!(
            seen.contains(&name),
            "no input produces DecodeError::{name}"
        );
    }

    // Reason text of exactly the limit is fine, one byte over is not.
    let mut at_limit = hex("07 00000001 00000401 0d");
    at_limit.extend(std::iter::repeat_n(b'x', MAX_REASON_LEN));
    assert!(matches!(decode(&at_limit), Ok(Frame::Reset { .. })));
    let mut over = hex("03 00000001 00000402 0d");
    over.extend(std::iter::repeat_n(b'x', MAX_REASON_LEN + 1));
    assert_eq!(
        decode(&over),
        Err(bad_length(kind::DIAL_ERR, 1026, "1 to 1025"))
    );
}

#[test]
fn every_truncated_prefix_is_truncated() {
    for (frame, spaced) in golden() {
        let bytes = hex(spaced);
        for n in 0..bytes.len() {
            let expected = DecodeError::Truncated {
                needed: if n < HEADER_LEN {
                    HEADER_LEN
                } else {
                    bytes.len()
                },
                available: n,
            };
            assert_eq!(
                decode(&bytes[..n]),
                Err(expected.clone()),
                "{n}-byte prefix of {frame:?}"
            );
            let all: Vec<_> = Frame::decode_all(Bytes::copy_from_slice(&bytes[..n])).collect();
            let want = if n == 0 { vec![] } else { vec![Err(expected)] };
            assert_eq!(all, want, "decode_all of a {n}-byte prefix of {frame:?}");
        }
    }
}

#[test]
fn decode_all_reads_several_frames() {
    let golden = golden();
    let mut message = BytesMut::new();
    for (frame, _) in &golden {
        frame.encode(&mut message);
    }
    let decoded: Vec<Frame> = Frame::decode_all(message.freeze())
        .collect::<Result<_, _>>()
        .unwrap();
    let expected: Vec<Frame> = golden.into_iter().map(|(f, _)| f).collect();
    assert_eq!(decoded, expected);
    assert_eq!(Frame::decode_all(Bytes::new()).count(), 0);
}

#[test]
fn decode_all_stops_at_the_first_error() {
    let mut message = hex("06 00000001 00000000");
    message.extend(hex("04 00000001 00000000"));
    message.extend(hex("06 00000002 00000000"));
    let items: Vec<_> = Frame::decode_all(Bytes::from(message)).collect();
    assert_eq!(
        items,
        vec![Ok(Frame::Fin { stream: 1 }), Err(DecodeError::EmptyData)]
    );

    let mut trailing = hex("06 00000001 00000000");
    trailing.extend([0x06, 0x00]);
    let items: Vec<_> = Frame::decode_all(Bytes::from(trailing)).collect();
    assert_eq!(
        items,
        vec![
            Ok(Frame::Fin { stream: 1 }),
            Err(DecodeError::Truncated {
                needed: 9,
                available: 2
            })
        ]
    );
}

#[test]
fn decode_one_advances_and_data_is_not_copied() {
    let mut src = Bytes::from(hex("04 00000001 00000005 68656c6c6f 06 00000001 00000000"));
    let base = src.as_ptr() as usize;
    let Ok(Frame::Data { payload, .. }) = Frame::decode_one(&mut src) else {
        panic!("expected DATA");
    };
    assert_eq!(
        payload.as_ptr() as usize,
        base + HEADER_LEN,
        "payload is a slice"
    );
    assert_eq!(src.len(), HEADER_LEN);
    assert_eq!(Frame::decode_one(&mut src), Ok(Frame::Fin { stream: 1 }));
    assert!(src.is_empty());
}

#[test]
fn long_text_is_cut_at_char_boundaries() {
    // 1022 ASCII bytes then a 3-byte '€': 1025 bytes, cut to 1022 (not 1024, mid-character).
    let reason = format!("{}€", "a".repeat(MAX_REASON_LEN - 2));
    let frame = Frame::Reset {
        stream: 1,
        code: ErrorCode::Shutdown,
        reason: reason.clone(),
    };
    let bytes = encode(&frame);
    assert_eq!(bytes.len(), HEADER_LEN + 1 + 1022);
    assert_eq!(
        Frame::decode(bytes),
        Ok(Frame::Reset {
            stream: 1,
            code: ErrorCode::Shutdown,
            reason: reason[..1022].to_owned(),
        })
    );

    // All 2-byte characters: 600 × 'é' = 1200 bytes, cut to exactly 1024.
    let frame = Frame::DialErr {
        stream: 1,
        code: ErrorCode::Other,
        message: "é".repeat(600),
    };
    let Ok(Frame::DialErr { message, .. }) = Frame::decode(encode(&frame)) else {
        panic!("expected DIAL_ERR");
    };
    assert_eq!(message, "é".repeat(512));

    // A host of 254 ASCII bytes and a 2-byte character: 256 bytes, cut to 254. The header's
    // length must count the cut host, not min(len, 255).
    let host = format!("{}é", "h".repeat(MAX_HOST_LEN - 1));
    let frame = Frame::Dial {
        stream: 1,
        timeout_ms: 1,
        window: 1,
        port: 1,
        host: host.clone(),
    };
    let bytes = encode(&frame);
    assert_eq!(bytes.len(), HEADER_LEN + 11 + 254);
    let Ok(Frame::Dial { host: decoded, .. }) = Frame::decode(bytes) else {
        panic!("expected DIAL");
    };
    assert_eq!(decoded, host[..254]);

    // Plain ASCII over the limit is cut at the limit.
    let frame = Frame::Dial {
        stream: 1,
        timeout_ms: 1,
        window: 1,
        port: 1,
        host: "h".repeat(300),
    };
    let Ok(Frame::Dial { host: decoded, .. }) = Frame::decode(encode(&frame)) else {
        panic!("expected DIAL");
    };
    assert_eq!(decoded.len(), MAX_HOST_LEN);
}

fn stream_id() -> impl Strategy<Value = u32> {
    1..=u32::MAX
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    any::<u8>().prop_map(ErrorCode::from_u8)
}

/// Any frame that decodes: non-empty host of at most 255 bytes, text of at most 1024 bytes,
/// 1 to 65536 payload bytes, non-zero WINDOW increments, canonical error codes.
fn arb_frame() -> impl Strategy<Value = Frame> {
    let host = prop_oneof![
        "[a-z0-9.:-]{1,255}",
        "\\PC{1,63}", // at most 4 bytes a character: 252 bytes
    ];
    let text = "\\PC{0,256}"; // at most 1024 bytes
    let payload = prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 1..=256),
        1 => prop::collection::vec(any::<u8>(), MAX_DATA_PAYLOAD - 16..=MAX_DATA_PAYLOAD),
    ];
    prop_oneof![
        (stream_id(), any::<u32>(), any::<u32>(), any::<u16>(), host).prop_map(
            |(stream, timeout_ms, window, port, host)| Frame::Dial {
                stream,
                timeout_ms,
                window,
                port,
                host,
            }
        ),
        (stream_id(), any::<u32>()).prop_map(|(stream, window)| Frame::DialOk { stream, window }),
        (stream_id(), error_code(), text).prop_map(|(stream, code, message)| Frame::DialErr {
            stream,
            code,
            message,
        }),
        (stream_id(), payload).prop_map(|(stream, payload)| Frame::Data {
            stream,
            payload: Bytes::from(payload),
        }),
        (stream_id(), 1..=u32::MAX)
            .prop_map(|(stream, increment)| Frame::Window { stream, increment }),
        stream_id().prop_map(|stream| Frame::Fin { stream }),
        (stream_id(), error_code(), text).prop_map(|(stream, code, reason)| Frame::Reset {
            stream,
            code,
            reason,
        }),
        Just(Frame::Drain),
    ]
}

/// Bytes that start like a frame (known type, small length) so decoding goes past the header.
fn frame_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        (
            0u8..=9,
            0u32..=3,
            0u32..=40,
            prop::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(kind, stream, len, body)| {
                let mut bytes = vec![kind];
                bytes.extend(stream.to_be_bytes());
                bytes.extend(len.to_be_bytes());
                bytes.extend(body);
                bytes
            }),
        0..4,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn arbitrary_frames_round_trip(frame in arb_frame()) {
        let bytes = encode(&frame);
        prop_assert_eq!(Frame::decode(bytes), Ok(frame));
    }

    #[test]
    fn arbitrary_frame_sequences_round_trip(frames in prop::collection::vec(arb_frame(), 0..8)) {
        let mut message = BytesMut::new();
        for frame in &frames {
            frame.encode(&mut message);
        }
        let decoded: Result<Vec<Frame>, _> = Frame::decode_all(message.freeze()).collect();
        prop_assert_eq!(decoded, Ok(frames));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        frame_like_bytes(),
    ]) {
        let mut ok = 0;
        let mut errors = 0;
        for item in Frame::decode_all(Bytes::from(bytes)) {
            match item {
                Ok(frame) => {
                    ok += 1;
                    prop_assert_eq!(Frame::decode(encode(&frame)), Ok(frame));
                }
                Err(_) => errors += 1,
            }
        }
        prop_assert!(errors <= 1, "decode_all ends after the first error ({ok} frames before)");
    }
}
