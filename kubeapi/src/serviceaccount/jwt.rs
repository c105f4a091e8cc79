//! A JSON Web Token in compact form (`header.claims.signature`, each base64url without
//! padding), taken apart with no trust placed in it: the header names the algorithm and the
//! key, the claims say who the token is for, and the signature covers the first two parts as
//! they were sent. Nothing here checks the signature or a claim.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;

use super::json::{self, JsonError};

/// Longest token taken apart: projected tokens are about a kilobyte, so anything near this is
/// not one, and decoding it would only cost memory.
pub(crate) const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Why a token could not be taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("longer than any ServiceAccount token")]
    TooLong,
    #[error("not three dot-separated parts")]
    NotThreeParts,
    #[error("a part is not base64url")]
    Encoding,
    #[error("the header is not a JWS header")]
    Header,
    #[error("the claims are not a JSON object of the expected types")]
    Claims,
    /// `none`, a shared-secret (`HS*`) algorithm or one no issuer uses: kube-apiserver's keys
    /// are public keys, so such a token never verifies.
    #[error("the signature algorithm is not one a ServiceAccount issuer signs with")]
    Algorithm,
    /// A `crit` header: an extension this verifier (and kube-apiserver's) does not implement.
    #[error("critical header extensions")]
    Critical,
    /// The header or the claims name a member twice: go-jose refuses such a token, and
    /// serde_json would read the last of the two where another parser reads the first.
    #[error("the header or the claims name a member twice")]
    DuplicateMember,
}

/// The signature algorithms a token's header may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Es256,
    Es384,
    Es512,
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
}

impl Algorithm {
    fn from_name(name: &str) -> Option<Algorithm> {
        Some(match name {
            "ES256" => Algorithm::Es256,
            "ES384" => Algorithm::Es384,
            "ES512" => Algorithm::Es512,
            "RS256" => Algorithm::Rs256,
            "RS384" => Algorithm::Rs384,
            "RS512" => Algorithm::Rs512,
            "PS256" => Algorithm::Ps256,
            "PS384" => Algorithm::Ps384,
            "PS512" => Algorithm::Ps512,
            _ => return None,
        })
    }
}

/// A token taken apart. Its `Debug` leaves out the signed part and the signature: together
/// they are the token, a credential.
#[derive(Clone)]
pub(crate) struct Token {
    pub(crate) algorithm: Algorithm,
    /// The header's `kid`, if any.
    pub(crate) key_id: Option<String>,
    pub(crate) claims: Claims,
    /// `header.claims` as sent: what the signature covers.
    pub(crate) signed: Vec<u8>,
    pub(crate) signature: Vec<u8>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("algorithm", &self.algorithm)
            .field("key_id", &self.key_id)
            .field("claims", &self.claims)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// The claims a ServiceAccount token carries (the public ones of RFC 7519 and kube-apiserver's
/// private `kubernetes.io`). Absent claims are `None`: which absences matter is the claim
/// rules' business.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct Claims {
    #[serde(default)]
    pub(crate) iss: Option<String>,
    #[serde(default)]
    pub(crate) sub: Option<String>,
    #[serde(default)]
    pub(crate) aud: Option<Audience>,
    #[serde(default, deserialize_with = "numeric_date")]
    pub(crate) exp: Option<i64>,
    #[serde(default, deserialize_with = "numeric_date")]
    pub(crate) nbf: Option<i64>,
    #[serde(default, deserialize_with = "numeric_date")]
    pub(crate) iat: Option<i64>,
    #[serde(default, rename = "kubernetes.io")]
    pub(crate) kubernetes: Option<Private>,
}

/// `aud`: one string or a list of them (RFC 7519 allows both; go-jose reads both).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub(crate) enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    pub(crate) fn contains(&self, audience: &str) -> bool {
        match self {
            Audience::One(one) => one == audience,
            Audience::Many(many) => many.iter().any(|a| a == audience),
        }
    }
}

/// kube-apiserver's private claim: the namespace, the service account, and the object the
/// token is bound to.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct Private {
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) serviceaccount: Option<Reference>,
    #[serde(default)]
    pub(crate) pod: Option<Reference>,
    #[serde(default)]
    pub(crate) node: Option<Reference>,
}

/// A name and UID, as the private claim refers to objects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Reference {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) uid: String,
}

/// A NumericDate: seconds since the epoch, integral or not (go-jose takes fractions and drops
/// them, and so does this).
fn numeric_date<'de, D: serde::Deserializer<'de>>(from: D) -> Result<Option<i64>, D::Error> {
    let number = Option::<serde_json::Number>::deserialize(from)?;
    let Some(number) = number else {
        return Ok(None);
    };
    if let Some(whole) = number.as_i64() {
        return Ok(Some(whole));
    }
    match number.as_f64() {
        // Within i64, not NaN: `as` truncates towards zero, as Go's conversion does.
        Some(float) if float.is_finite() && float.abs() < 9.0e18 => Ok(Some(float as i64)),
        _ => Err(serde::de::Error::custom("NumericDate out of range")),
    }
}

impl Token {
    /// Takes `text` apart.
    pub(crate) fn parse(text: &str) -> Result<Token, Malformed> {
        if text.len() > MAX_TOKEN_LEN {
            return Err(Malformed::TooLong);
        }
        let mut parts = text.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Malformed::NotThreeParts);
        };
        let decode = |part: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| Malformed::Encoding)
        };
        let header: Header = object(&decode(header)?, Malformed::Header)?;
        if header.crit.is_some() {
            return Err(Malformed::Critical);
        }
        let algorithm = Algorithm::from_name(&header.alg).ok_or(Malformed::Algorithm)?;
        let claims_bytes = decode(claims)?;
        let claims: Claims = object(&claims_bytes, Malformed::Claims)?;
        let signature = decode(signature)?;
        let signed_len = text.len() - signature_len(text);
        Ok(Token {
            algorithm,
            key_id: header.kid.filter(|kid| !kid.is_empty()),
            claims,
            signed: text.as_bytes()[..signed_len].to_vec(),
            signature,
        })
    }
}

/// `json` as a `T`, or why not: `otherwise` unless a member is named twice.
fn object<T: serde::de::DeserializeOwned>(
    json: &[u8],
    otherwise: Malformed,
) -> Result<T, Malformed> {
    json::object(json).map_err(|error| match error {
        JsonError::DuplicateMember => Malformed::DuplicateMember,
        JsonError::NotAnObject | JsonError::Shape => otherwise,
    })
}

/// The length of the last part and its dot.
fn signature_len(text: &str) -> usize {
    text.rfind('.').map_or(0, |dot| text.len() - dot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn token(header: &str, claims: &str) -> String {
        format!(
            "{}.{}.{}",
            b64(header.as_bytes()),
            b64(claims.as_bytes()),
            b64(b"sig")
        )
    }

    #[test]
    fn a_token_comes_apart_with_what_its_signature_covers() {
        let text = token(
            r#"{"alg":"ES256","kid":"k1","typ":"JWT"}"#,
            r#"{"iss":"https://i","aud":["a","b"],"exp":20,"nbf":10.9,"iat":10,
                "sub":"system:serviceaccount:ns:sa",
                "kubernetes.io":{"namespace":"ns","serviceaccount":{"name":"sa","uid":"u1"},
                  "pod":{"name":"p","uid":"u2"},"node":{"name":"n","uid":"u3"}},
                "jti":"x","unknown":{"nested":true}}"#,
        );
        let parsed = Token::parse(&text).unwrap();
        let shown = format!("{parsed:?}");
        assert!(
            !shown.contains("signed") && !shown.contains("signature"),
            "{shown}"
        );
        assert_eq!(parsed.algorithm, Algorithm::Es256);
        assert_eq!(parsed.key_id.as_deref(), Some("k1"));
        assert_eq!(parsed.signature, b"sig");
        assert_eq!(
            parsed.signed,
            text.rsplit_once('.').unwrap().0.as_bytes().to_vec()
        );
        let claims = parsed.claims;
        assert_eq!(claims.iss.as_deref(), Some("https://i"));
        assert!(claims.aud.as_ref().unwrap().contains("b"));
        assert!(!claims.aud.as_ref().unwrap().contains("c"));
        assert_eq!(
            (claims.exp, claims.nbf, claims.iat),
            (Some(20), Some(10), Some(10))
        );
        let private = claims.kubernetes.unwrap();
        assert_eq!(private.namespace.as_deref(), Some("ns"));
        assert_eq!(private.pod.unwrap().uid, "u2");
        assert_eq!(private.node.unwrap().name, "n");
    }

    #[test]
    fn one_audience_may_be_a_string_and_claims_may_be_missing() {
        let parsed = Token::parse(&token(r#"{"alg":"RS256"}"#, r#"{"aud":"a"}"#)).unwrap();
        assert_eq!(parsed.key_id, None);
        assert!(parsed.claims.aud.unwrap().contains("a"));
        assert_eq!(parsed.claims.exp, None);
        assert_eq!(parsed.claims.kubernetes, None);
    }

    #[test]
    fn malformed_tokens_are_named() {
        let long = "a".repeat(MAX_TOKEN_LEN + 1);
        let cases: Vec<(String, Malformed)> = vec![
            (long, Malformed::TooLong),
            ("".into(), Malformed::NotThreeParts),
            ("a.b".into(), Malformed::NotThreeParts),
            ("a.b.c.d".into(), Malformed::NotThreeParts),
            ("not-a-token".into(), Malformed::NotThreeParts),
            ("@@.e30.c2ln".into(), Malformed::Encoding),
            (format!("{}.e30.c2ln", b64(b"[1]")), Malformed::Header),
            (
                format!("{}.e30.c2ln", b64(br#"["ES256"]"#)),
                Malformed::Header,
            ),
            (token(r#"{"alg":"none"}"#, "{}"), Malformed::Algorithm),
            (token(r#"{"alg":"HS256"}"#, "{}"), Malformed::Algorithm),
            (
                token(r#"{"alg":"ES256","crit":["b64"]}"#, "{}"),
                Malformed::Critical,
            ),
            (token(r#"{"alg":"ES256"}"#, "[]"), Malformed::Claims),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"exp":"soon"}"#),
                Malformed::Claims,
            ),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"exp":1e300}"#),
                Malformed::Claims,
            ),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"aud":7}"#),
                Malformed::Claims,
            ),
            (
                format!("{}.e30.@", b64(br#"{"alg":"ES256"}"#)),
                Malformed::Encoding,
            ),
            // A member named twice, in the header or the claims, at any depth: go-jose
            // refuses these, where serde_json alone would take the last.
            (
                token(r#"{"alg":"ES256","alg":"HS256"}"#, "{}"),
                Malformed::DuplicateMember,
            ),
            (
                token(r#"{"alg":"ES256","kid":"a","kid":"b"}"#, "{}"),
                Malformed::DuplicateMember,
            ),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"aud":"x","sub":"a","sub":"b"}"#),
                Malformed::DuplicateMember,
            ),
            (
                token(
                    r#"{"alg":"ES256"}"#,
                    r#"{"kubernetes.io":{"pod":{"name":"a","uid":"1","uid":"2"}}}"#,
                ),
                Malformed::DuplicateMember,
            ),
        ];
        for (text, want) in cases {
            let got = Token::parse(&text)
                .map(|token| format!("{token:?}"))
                .unwrap_err();
            assert_eq!(got, want, "{text:.60}");
        }
    }
}
