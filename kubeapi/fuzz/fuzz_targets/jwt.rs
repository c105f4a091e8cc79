//! Arbitrary bytes through the token parser (`parsers::token`, what local verification runs
//! first on an agent's bearer token) and the strict JSON reader its header and claims go
//! through (`parsers::strict_json`).
//!
//! Checks: nothing panics; an accepted token is three base64url parts (no padding, canonical)
//! whose first two are what the signature covers and whose last is the signature; an accepted
//! JSON document is an object and is what serde_json reads from the same bytes; a document
//! refused for a member named twice is one serde_json reads as an object.

#![no_main]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bridgehead_kubeapi::serviceaccount::parsers::{self, StrictJsonError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parsers::strict_json(data) {
        Ok(value) => {
            assert!(value.is_object(), "{value}");
            let plain: serde_json::Value = serde_json::from_slice(data)
                .expect("serde_json reads what the strict reader reads");
            assert_eq!(plain, value);
        }
        Err(StrictJsonError::DuplicateMember) => {
            let plain: serde_json::Value =
                serde_json::from_slice(data).expect("a repeat is refused only in valid JSON");
            assert!(plain.is_object(), "{plain}");
        }
        Err(StrictJsonError::NotAnObject) => {}
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parts) = parsers::token(text) else {
        return;
    };
    let pieces: Vec<&str> = text.split('.').collect();
    assert_eq!(pieces.len(), 3, "{text:?}");
    assert_eq!(parts.signed_len, pieces[0].len() + 1 + pieces[1].len());
    assert_eq!(URL_SAFE_NO_PAD.encode(&parts.signature), pieces[2]);
    for piece in &pieces[..2] {
        let decoded = URL_SAFE_NO_PAD
            .decode(piece)
            .expect("an accepted part decodes");
        assert_eq!(&URL_SAFE_NO_PAD.encode(decoded), piece);
    }
    assert!(parts.key_id.as_deref() != Some(""));
});
