//! Property tests of the parsers that read what nobody vouches for: the strict JSON reader
//! agrees with serde_json wherever it accepts and refuses a member named twice at any depth;
//! a token comes apart into exactly the base64url parts it was made of, or is refused with a
//! reason, never a panic; a JWKS of any shape is read or refused, and checking any token
//! against it answers. `kubeapi/fuzz` runs the same parsers under libFuzzer.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::Value;

use super::json::{self, JsonError};
use super::jwt::{Malformed, Token};
use super::keys::KeySet;
use super::parsers;

/// JSON values a few levels deep, with short names so that objects meet the same names.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        "[a-z\\\\\"é\\n]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-c]{1,2}", inner, 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// A JSON object with at least one member.
fn object() -> impl Strategy<Value = serde_json::Map<String, Value>> {
    btree_map("[a-c]{1,2}", value(), 1..5).prop_map(|members| members.into_iter().collect())
}

/// `object` as text with its first member written twice, then wrapped `depth` times in an
/// object or an array member, so that the repeat sits at any depth.
fn with_a_repeat(object: &serde_json::Map<String, Value>, wraps: &[bool]) -> String {
    let (name, first) = object.iter().next().expect("a member");
    let text = Value::Object(object.clone()).to_string();
    let repeat = format!("{}:{first},", Value::from(name.as_str()));
    let mut text = format!("{{{repeat}{}", &text[1..]);
    for &in_array in wraps {
        text = if in_array {
            format!(r#"{{"w":[1,{text}]}}"#)
        } else {
            format!(r#"{{"w":{text}}}"#)
        };
    }
    text
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

proptest! {
    #[test]
    fn strict_json_reads_what_serde_json_writes(object in btree_map("[a-c]{1,2}", value(), 0..5)) {
        let object = Value::Object(object.into_iter().collect());
        let text = object.to_string();
        prop_assert_eq!(json::object::<Value>(text.as_bytes()), Ok(object));
    }

    #[test]
    fn a_member_named_twice_at_any_depth_is_refused(
        object in object(),
        wraps in vec(any::<bool>(), 0..4),
    ) {
        let text = with_a_repeat(&object, &wraps);
        // serde_json alone reads it, keeping one of the two.
        prop_assert!(serde_json::from_str::<Value>(&text).is_ok());
        prop_assert_eq!(json::object::<Value>(text.as_bytes()), Err(JsonError::DuplicateMember));
    }

    #[test]
    fn strict_json_accepts_nothing_serde_json_reads_otherwise(bytes in vec(any::<u8>(), 0..64)) {
        if let Ok(value) = json::object::<Value>(&bytes) {
            prop_assert_eq!(serde_json::from_slice::<Value>(&bytes).ok(), Some(value));
        }
    }

    #[test]
    fn a_token_comes_apart_into_the_parts_it_was_made_of(
        header in object(),
        claims in object(),
        signature in vec(any::<u8>(), 0..80),
        alg in prop::sample::select(vec!["ES256", "RS256", "PS512", "HS256", "none"]),
    ) {
        let mut header = header;
        header.insert("alg".into(), Value::from(alg));
        header.remove("crit");
        let signed = format!(
            "{}.{}",
            b64(Value::Object(header.clone()).to_string().as_bytes()),
            b64(Value::Object(claims.clone()).to_string().as_bytes())
        );
        let text = format!("{signed}.{}", b64(&signature));
        match Token::parse(&text) {
            Ok(token) => {
                prop_assert_eq!(token.signed, signed.as_bytes().to_vec());
                prop_assert_eq!(&token.signature, &signature);
                let kid = header.get("kid").and_then(Value::as_str).filter(|kid| !kid.is_empty());
                prop_assert_eq!(token.key_id.as_deref(), kid);
            }
            // Claims of the wrong types (`exp` a string) and algorithms no issuer signs with
            // are refused; the parts themselves always decode.
            Err(malformed) => prop_assert!(
                matches!(malformed, Malformed::Claims | Malformed::Algorithm | Malformed::Header),
                "{malformed:?}"
            ),
        }
        // The same parts with a member of the header or the claims written twice.
        let repeated_claims = format!(
            "{}.{}.{}",
            b64(Value::Object(header.clone()).to_string().as_bytes()),
            b64(with_a_repeat(&claims, &[]).as_bytes()),
            b64(&signature)
        );
        let repeated_header = format!(
            "{}.{}.{}",
            b64(with_a_repeat(&header, &[]).as_bytes()),
            b64(b"{}"),
            b64(&signature)
        );
        prop_assert_eq!(Token::parse(&repeated_header).unwrap_err(), Malformed::DuplicateMember);
        let claims_refusal = Token::parse(&repeated_claims).unwrap_err();
        // The header is read first: an algorithm nobody signs with is refused before.
        prop_assert!(
            matches!(claims_refusal, Malformed::DuplicateMember | Malformed::Algorithm),
            "{claims_refusal:?}"
        );
    }

    #[test]
    fn any_text_is_a_token_or_a_reason(text in "[A-Za-z0-9_.=+/-]{0,120}") {
        if let Ok(token) = Token::parse(&text) {
            let (signed, signature) = text.rsplit_once('.').expect("three parts");
            prop_assert_eq!(token.signed, signed.as_bytes().to_vec());
            prop_assert_eq!(b64(&token.signature), signature);
        }
        let _ = parsers::token(&text);
    }

    #[test]
    fn any_jwks_is_read_or_refused_and_any_token_checked_against_it(
        keys in vec(
            btree_map(
                prop::sample::select(vec!["kty", "kid", "crv", "x", "y", "n", "e", "use", "alg"]),
                prop_oneof![
                    prop::sample::select(vec!["EC", "RSA", "OKP", "P-256", "P-384", "sig", "enc", "k1", "AQAB"])
                        .prop_map(Value::from),
                    vec(any::<u8>(), 0..66).prop_map(|bytes| Value::from(b64(&bytes))),
                    value(),
                ],
                0..9,
            ),
            0..4,
        ),
        kid in prop::option::of(prop::sample::select(vec!["k1", "k2", ""])),
        signature in vec(any::<u8>(), 0..80),
    ) {
        let keys: Vec<Value> = keys
            .into_iter()
            .map(|members| Value::Object(members.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
            .collect();
        let jwks = serde_json::json!({ "keys": keys }).to_string();
        let set = KeySet::parse(jwks.as_bytes());
        if let Ok(set) = &set {
            prop_assert!(set.len() <= keys.len());
        }
        let header = match kid {
            Some(kid) => serde_json::json!({"alg": "ES256", "kid": kid}),
            None => serde_json::json!({"alg": "ES256"}),
        };
        let token = format!("{}.{}.{}", b64(header.to_string().as_bytes()), b64(b"{}"), b64(&signature));
        let checked = parsers::check(jwks.as_bytes(), &token);
        prop_assert_eq!(checked.is_some(), set.is_ok());
        // No key this test makes signed the token.
        prop_assert_ne!(checked, Some("valid"));
    }
}
