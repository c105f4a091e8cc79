//! The parsers local verification runs on bytes nobody vouches for — an agent's token, the
//! issuer's JWKS — as plain functions over plain types, for the fuzz targets (`kubeapi/fuzz`,
//! a workspace of its own that sees only this crate's public API). Nothing here is trusted
//! or trusts: a signature's check says what the keys say and no more.

use super::json::{self, JsonError};
use super::jwt::{Malformed, Token};
use super::keys::{KeySet, SignatureCheck};

/// What [`token`] found: the parts as decoded, no claim or signature judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenParts {
    /// The header's `kid`, if any and not empty.
    pub key_id: Option<String>,
    /// How many bytes of the text the signature covers: `header.claims`.
    pub signed_len: usize,
    /// The signature's bytes.
    pub signature: Vec<u8>,
}

/// Takes `text` apart as [`super::TokenVerifier::verify`] does first.
pub fn token(text: &str) -> Result<TokenParts, Malformed> {
    let token = Token::parse(text)?;
    Ok(TokenParts {
        key_id: token.key_id,
        signed_len: token.signed.len(),
        signature: token.signature,
    })
}

/// Reads `json` as the issuer's JWKS; how many keys it keeps (signing keys, readable or not).
pub fn jwks(json: &[u8]) -> Result<usize, String> {
    KeySet::parse(json)
        .map(|keys| keys.len())
        .map_err(|error| error.to_string())
}

/// What the keys of `jwks` say of `token`'s signature: `valid`, `invalid`, `unknown_key` or
/// `unsupported`; `None` when either does not parse.
pub fn check(jwks: &[u8], token: &str) -> Option<&'static str> {
    let keys = KeySet::parse(jwks).ok()?;
    let token = Token::parse(token).ok()?;
    Some(match keys.check(&token) {
        SignatureCheck::Valid => "valid",
        SignatureCheck::Invalid => "invalid",
        SignatureCheck::UnknownKey => "unknown_key",
        SignatureCheck::Unsupported => "unsupported",
    })
}

/// Why [`strict_json`] refused a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrictJsonError {
    /// Not JSON, or not an object.
    NotAnObject,
    /// An object, at any depth, names a member twice.
    DuplicateMember,
}

/// `json` read as the token's and the keys' parsers read JSON: one object, no object naming a
/// member twice.
pub fn strict_json(json: &[u8]) -> Result<serde_json::Value, StrictJsonError> {
    json::object(json).map_err(|error| match error {
        JsonError::DuplicateMember => StrictJsonError::DuplicateMember,
        JsonError::NotAnObject | JsonError::Shape => StrictJsonError::NotAnObject,
    })
}
