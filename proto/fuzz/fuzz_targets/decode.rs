//! Raw bytes, as one WebSocket binary message, through the frame decoder.
//!
//! Checks: decoding never panics; `decode_all` ends at the first error; every frame it returns
//! re-encodes to exactly the bytes it was decoded from, and `encoded_len` is exact.

#![no_main]

use bridgehead_proto::Frame;
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let message = Bytes::copy_from_slice(data);

    // decode_one, frame by frame, so each frame can be compared with its own bytes.
    let mut rest = message.clone();
    let mut frames = Vec::new();
    let mut failed = false;
    while !rest.is_empty() {
        let before = rest.clone();
        match Frame::decode_one(&mut rest) {
            Ok(frame) => {
                let consumed = before.len() - rest.len();
                let mut encoded = BytesMut::new();
                frame.encode(&mut encoded);
                assert_eq!(encoded.len(), frame.encoded_len());
                assert_eq!(&encoded[..], &before[..consumed], "re-encoding {frame:?}");
                assert_eq!(Frame::decode(encoded.freeze()).as_ref(), Ok(&frame));
                frames.push(frame);
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
    }

    // decode_all yields the same frames, then at most one error, then stops.
    let all: Vec<_> = Frame::decode_all(message).collect();
    assert_eq!(all.len(), frames.len() + usize::from(failed));
    for (item, frame) in all.iter().zip(&frames) {
        assert_eq!(item.as_ref(), Ok(frame));
    }
    if failed {
        assert!(all.last().is_some_and(|item| item.is_err()));
    }
});
