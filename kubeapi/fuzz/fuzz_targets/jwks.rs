//! Arbitrary bytes through the JWKS parser (`parsers::jwks`, what issuer discovery reads from
//! kube-apiserver), and a token checked against the keys it read (`parsers::check`).
//!
//! The input is the JWKS, then optionally a NUL byte and a token. Checks: nothing panics; an
//! accepted JWKS is a strict JSON object (no member named twice) holding no more keys than its
//! `keys` array; a token that parses gets an answer from the keys, and a token no key of the
//! input could have signed (its signature empty) is never valid.

#![no_main]

use bridgehead_kubeapi::serviceaccount::parsers;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (jwks, token) = match data.iter().position(|&byte| byte == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &b""[..]),
    };
    let Ok(count) = parsers::jwks(jwks) else {
        assert_eq!(parsers::check(jwks, "eyJhbGciOiJFUzI1NiJ9.e30.c2ln"), None);
        return;
    };
    let document = parsers::strict_json(jwks).expect("an accepted JWKS is strict JSON");
    let listed = document["keys"].as_array().map_or(0, Vec::len);
    assert!(count <= listed, "{count} keys of {listed}");
    let Ok(token) = std::str::from_utf8(token) else {
        return;
    };
    let parsed = parsers::token(token);
    let checked = parsers::check(jwks, token);
    assert_eq!(checked.is_some(), parsed.is_ok());
    if let Ok(parts) = parsed {
        if parts.signature.is_empty() {
            assert_ne!(checked, Some("valid"), "an empty signature verified");
        }
    }
});
