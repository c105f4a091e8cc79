//! The issuer's public keys (a JWKS as kube-apiserver serves it at `/openid/v1/jwks`) and the
//! signature check, with `ring`, the crypto the binaries' TLS already uses. Also when the keys
//! may be fetched again: on a schedule, and on a key id not seen, at most once per
//! [`MIN_REFETCH_INTERVAL`] so that tokens naming made-up keys cannot make the server hammer
//! kube-apiserver.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use tokio::time::Instant;

use super::jwt::{Algorithm, Token};
use super::Fallback;

/// Fewest time between two fetches of the keys.
pub const MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// Smallest RSA modulus checked here (ring's floor): a smaller key's tokens go to TokenReview.
const MIN_RSA_BITS: usize = 2048;

/// Why a JWKS could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JwksError {
    #[error("not a JSON Web Key Set: {0}")]
    Json(super::json::JsonError),
}

/// One issuer key, ready to check signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PublicKey {
    /// An uncompressed point (`0x04 || x || y`) on P-256 or P-384.
    Ec { p384: bool, point: Vec<u8> },
    /// Big-endian modulus and exponent.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// A key this verifier cannot check (P-521, Ed25519, a short RSA modulus, ...): its
    /// tokens go to TokenReview rather than being refused.
    Unsupported,
}

/// What the keys say of a token's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignatureCheck {
    /// A key the token names (or any key, when it names none) signed it.
    Valid,
    /// The token names a known key (or none) and no key signed it.
    Invalid,
    /// The token names a key that is not in the set.
    UnknownKey,
    /// The key it names is one this verifier cannot check.
    Unsupported,
}

/// The keys of one fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeySet {
    keys: Vec<(Option<String>, PublicKey)>,
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    #[serde(default)]
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
}

impl KeySet {
    /// Reads a JWKS. Keys for encryption are left out; a key with fields that do not decode
    /// is kept as one this verifier cannot check, so that its tokens are not refused for it.
    pub(crate) fn parse(json: &[u8]) -> Result<KeySet, JwksError> {
        let jwks: Jwks = super::json::object(json).map_err(JwksError::Json)?;
        let keys = jwks
            .keys
            .into_iter()
            .filter(|jwk| jwk.usage.as_deref().is_none_or(|usage| usage == "sig"))
            .map(|jwk| {
                let key = PublicKey::from_jwk(&jwk).unwrap_or(PublicKey::Unsupported);
                (jwk.kid.filter(|kid| !kid.is_empty()), key)
            })
            .collect();
        Ok(KeySet { keys })
    }

    /// How many keys the set holds.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Checks `token`'s signature: against the key its `kid` names, or, with no `kid`, against
    /// each key in turn (as kube-apiserver does).
    pub(crate) fn check(&self, token: &Token) -> SignatureCheck {
        let candidates: Vec<&PublicKey> = match &token.key_id {
            Some(kid) => self
                .keys
                .iter()
                .filter(|(id, _)| id.as_deref() == Some(kid.as_str()))
                .map(|(_, key)| key)
                .collect(),
            None => self.keys.iter().map(|(_, key)| key).collect(),
        };
        if candidates.is_empty() {
            return if token.key_id.is_some() {
                SignatureCheck::UnknownKey
            } else {
                SignatureCheck::Invalid
            };
        }
        let mut unsupported = false;
        for key in candidates {
            match key.verify(token.algorithm, &token.signed, &token.signature) {
                SignatureCheck::Valid => return SignatureCheck::Valid,
                SignatureCheck::Unsupported => unsupported = true,
                SignatureCheck::Invalid | SignatureCheck::UnknownKey => {}
            }
        }
        if unsupported {
            SignatureCheck::Unsupported
        } else {
            SignatureCheck::Invalid
        }
    }
}

impl PublicKey {
    fn from_jwk(jwk: &Jwk) -> Option<PublicKey> {
        let field = |value: &Option<String>| {
            value
                .as_deref()
                .and_then(|text| URL_SAFE_NO_PAD.decode(text).ok())
        };
        match jwk.kty.as_str() {
            "EC" => {
                let (p384, size) = match jwk.crv.as_deref()? {
                    "P-256" => (false, 32),
                    "P-384" => (true, 48),
                    _ => return None,
                };
                let (x, y) = (field(&jwk.x)?, field(&jwk.y)?);
                // RFC 7518 6.2.1.2: coordinates are full length; anything else is no point.
                if x.len() != size || y.len() != size {
                    return None;
                }
                let mut point = Vec::with_capacity(1 + 2 * size);
                point.push(0x04);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                Some(PublicKey::Ec { p384, point })
            }
            "RSA" => {
                let (n, e) = (field(&jwk.n)?, field(&jwk.e)?);
                let significant = n.iter().skip_while(|&&byte| byte == 0).count();
                if significant * 8 < MIN_RSA_BITS {
                    return None;
                }
                Some(PublicKey::Rsa { n, e })
            }
            _ => None,
        }
    }

    fn verify(&self, algorithm: Algorithm, signed: &[u8], signature: &[u8]) -> SignatureCheck {
        let ok = match (self, algorithm) {
            (PublicKey::Unsupported, _) => return SignatureCheck::Unsupported,
            (PublicKey::Ec { p384: false, point }, Algorithm::Es256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed, signature)
                    .is_ok()
            }
            (PublicKey::Ec { p384: true, point }, Algorithm::Es384) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(signed, signature)
                    .is_ok()
            }
            (PublicKey::Rsa { n, e }, algorithm) => {
                let parameters: &signature::RsaParameters = match algorithm {
                    Algorithm::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Algorithm::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    Algorithm::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
                    Algorithm::Es256 | Algorithm::Es384 | Algorithm::Es512 => {
                        return SignatureCheck::Invalid
                    }
                };
                RsaPublicKeyComponents { n, e }
                    .verify(parameters, signed, signature)
                    .is_ok()
            }
            // The algorithm does not fit the key: no signature of it can be valid.
            (PublicKey::Ec { .. }, _) => false,
        };
        if ok {
            SignatureCheck::Valid
        } else {
            SignatureCheck::Invalid
        }
    }
}

/// The keys held, with the issuer discovery named, and when they may be fetched again.
#[derive(Debug, Default)]
pub(crate) struct KeyRing {
    current: Option<Arc<Issuer>>,
    fetched: Option<Instant>,
    attempted: Option<Instant>,
    /// How many fetches succeeded: a caller that saw an older set may try the new one.
    generation: u64,
}

/// What one discovery found: the issuer and its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issuer {
    pub(crate) issuer: String,
    pub(crate) keys: KeySet,
}

impl KeyRing {
    /// The keys of the last successful fetch.
    pub(crate) fn current(&self) -> Option<Arc<Issuer>> {
        self.current.clone()
    }

    /// Whether a fetch may start at `now`: none has started within [`MIN_REFETCH_INTERVAL`].
    pub(crate) fn may_fetch(&self, now: Instant) -> bool {
        self.attempted
            .is_none_or(|at| now.saturating_duration_since(at) >= MIN_REFETCH_INTERVAL)
    }

    /// A fetch starts at `now`.
    pub(crate) fn attempt(&mut self, now: Instant) {
        self.attempted = Some(now);
    }

    /// A fetch at `now` found `issuer`.
    pub(crate) fn replace(&mut self, issuer: Issuer, now: Instant) {
        self.current = Some(Arc::new(issuer));
        self.fetched = Some(now);
        self.generation += 1;
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// How long ago the keys were last fetched, if ever.
    pub(crate) fn age(&self, now: Instant) -> Option<Duration> {
        self.fetched.map(|at| now.saturating_duration_since(at))
    }

    /// The keys, if fetched no more than `max_age` before `now`; else why not. Keys older than
    /// that vouch for nothing: a key the issuer has since dropped would stay trusted for as
    /// long as discovery fails.
    pub(crate) fn usable(&self, now: Instant, max_age: Duration) -> Result<Arc<Issuer>, Fallback> {
        match (&self.current, self.age(now)) {
            (Some(issuer), Some(age)) if age <= max_age => Ok(issuer.clone()),
            (Some(_), _) => Err(Fallback::KeysStale),
            (None, _) => Err(Fallback::KeysUnavailable),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair as _, RsaKeyPair};

    /// A signing key made at test time, and its JWK.
    pub(crate) enum TestKey {
        Ec(EcdsaKeyPair, bool),
        Rsa(RsaKeyPair),
    }

    impl TestKey {
        pub(crate) fn p256() -> TestKey {
            TestKey::ec(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, false)
        }

        pub(crate) fn p384() -> TestKey {
            TestKey::ec(&signature::ECDSA_P384_SHA384_FIXED_SIGNING, true)
        }

        fn ec(algorithm: &'static signature::EcdsaSigningAlgorithm, p384: bool) -> TestKey {
            let rng = SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(algorithm, &rng).unwrap();
            TestKey::Ec(
                EcdsaKeyPair::from_pkcs8(algorithm, pkcs8.as_ref(), &rng).unwrap(),
                p384,
            )
        }

        /// A 2048-bit RSA key, made by `openssl` (ring verifies RSA but does not make keys).
        pub(crate) fn rsa() -> TestKey {
            let output = std::process::Command::new("openssl")
                .args([
                    "genpkey",
                    "-algorithm",
                    "RSA",
                    "-pkeyopt",
                    "rsa_keygen_bits:2048",
                ])
                .args(["-outform", "DER"])
                .output()
                .expect("running openssl to make an RSA test key");
            assert!(output.status.success(), "openssl genpkey failed");
            // RSAPrivateKey (PKCS#1) in DER, as OpenSSL 3 writes it.
            TestKey::Rsa(RsaKeyPair::from_der(&output.stdout).unwrap())
        }

        pub(crate) fn algorithm(&self) -> &'static str {
            match self {
                TestKey::Ec(_, false) => "ES256",
                TestKey::Ec(_, true) => "ES384",
                TestKey::Rsa(_) => "RS256",
            }
        }

        pub(crate) fn sign(&self, message: &[u8]) -> Vec<u8> {
            let rng = SystemRandom::new();
            match self {
                TestKey::Ec(key, _) => key.sign(&rng, message).unwrap().as_ref().to_vec(),
                TestKey::Rsa(key) => {
                    let mut out = vec![0; key.public().modulus_len()];
                    key.sign(&signature::RSA_PKCS1_SHA256, &rng, message, &mut out)
                        .unwrap();
                    out
                }
            }
        }

        pub(crate) fn jwk(&self, kid: &str) -> serde_json::Value {
            let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
            match self {
                TestKey::Ec(key, p384) => {
                    let point = key.public_key().as_ref();
                    let size = (point.len() - 1) / 2;
                    serde_json::json!({
                        "use": "sig", "kty": "EC", "kid": kid,
                        "crv": if *p384 { "P-384" } else { "P-256" },
                        "alg": self.algorithm(),
                        "x": b64(&point[1..1 + size]), "y": b64(&point[1 + size..]),
                    })
                }
                TestKey::Rsa(key) => {
                    let public = key.public();
                    let components: RsaPublicKeyComponents<Vec<u8>> = public.into();
                    serde_json::json!({
                        "use": "sig", "kty": "RSA", "kid": kid, "alg": "RS256",
                        "n": b64(&components.n), "e": b64(&components.e),
                    })
                }
            }
        }
    }

    pub(crate) fn jwks(keys: &[(&TestKey, &str)]) -> Vec<u8> {
        let keys: Vec<_> = keys.iter().map(|(key, kid)| key.jwk(kid)).collect();
        serde_json::to_vec(&serde_json::json!({ "keys": keys })).unwrap()
    }

    fn signed(key: &TestKey, kid: Option<&str>, algorithm: &str) -> Token {
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        let header = match kid {
            Some(kid) => serde_json::json!({"alg": algorithm, "kid": kid}),
            None => serde_json::json!({"alg": algorithm}),
        };
        let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(b"{}"));
        let signature = key.sign(input.as_bytes());
        Token::parse(&format!("{input}.{}", b64(&signature))).unwrap()
    }

    #[test]
    fn each_key_kind_verifies_its_own_signatures_only() {
        let (p256, p384, rsa) = (TestKey::p256(), TestKey::p384(), TestKey::rsa());
        let set = KeySet::parse(&jwks(&[(&p256, "a"), (&p384, "b"), (&rsa, "c")])).unwrap();
        assert_eq!(set.len(), 3);
        for (key, kid) in [(&p256, "a"), (&p384, "b"), (&rsa, "c")] {
            let token = signed(key, Some(kid), key.algorithm());
            assert_eq!(set.check(&token), SignatureCheck::Valid, "{kid}");
            // Without a kid every key is tried.
            let token = signed(key, None, key.algorithm());
            assert_eq!(
                set.check(&token),
                SignatureCheck::Valid,
                "{kid} without kid"
            );
        }
        // Another key's id: the signature does not verify.
        let token = signed(&p256, Some("b"), "ES256");
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
        let token = signed(&p256, Some("c"), "ES256");
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
        // The right key, but the header names an algorithm that does not fit it.
        let token = signed(&p256, Some("a"), "ES384");
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
        let token = signed(&rsa, Some("c"), "PS256");
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
        // A key made here, unknown to the set.
        let stranger = TestKey::p256();
        let token = signed(&stranger, Some("z"), "ES256");
        assert_eq!(set.check(&token), SignatureCheck::UnknownKey);
        let token = signed(&stranger, None, "ES256");
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
        // One flipped bit of the signed part.
        let mut token = signed(&p256, Some("a"), "ES256");
        token.signed[3] ^= 1;
        assert_eq!(set.check(&token), SignatureCheck::Invalid);
    }

    #[test]
    fn keys_this_verifier_cannot_check_send_their_tokens_elsewhere() {
        let p256 = TestKey::p256();
        let mut short = p256.jwk("short");
        short["x"] = serde_json::json!("AAAA");
        let json = serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-521", "kid": "p521", "x": "AA", "y": "AA"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "AA"},
            {"kty": "RSA", "kid": "small", "n": URL_SAFE_NO_PAD.encode([0xff; 128]), "e": "AQAB"},
            short,
            {"kty": "EC", "use": "enc", "crv": "P-256", "kid": "enc", "x": "AA", "y": "AA"},
        ]});
        let set = KeySet::parse(json.to_string().as_bytes()).unwrap();
        assert_eq!(set.len(), 4, "the encryption key is left out");
        for kid in ["p521", "ed", "small", "short"] {
            let token = signed(&p256, Some(kid), "ES256");
            assert_eq!(set.check(&token), SignatureCheck::Unsupported, "{kid}");
        }
        let token = signed(&p256, Some("enc"), "ES256");
        assert_eq!(set.check(&token), SignatureCheck::UnknownKey);
        for bad in [&b"{}"[..], b"[]", b"{\"keys\": 1}", b"garbage"] {
            assert!(KeySet::parse(bad).is_err());
        }
    }

    #[test]
    fn a_jwks_that_names_a_member_twice_is_refused() {
        use super::super::json::JsonError;
        let (a, b) = (TestKey::p256(), TestKey::p256());
        let (one, other) = (a.jwk("a").to_string(), b.jwk("b").to_string());
        // Which `keys`, which `x`? serde_json alone would take the last of each.
        let twice_keys = format!(r#"{{"keys":[{one}],"keys":[{other}]}}"#);
        let mut twice_x = a.jwk("a");
        let x = twice_x["x"].to_string();
        twice_x.as_object_mut().unwrap().remove("x");
        let twice_x = format!(
            r#"{{"keys":[{}]}}"#,
            twice_x
                .to_string()
                .replacen('{', &format!("{{\"x\":{x},\"x\":{x},"), 1)
        );
        for json in [twice_keys, twice_x] {
            assert_eq!(
                KeySet::parse(json.as_bytes()),
                Err(JwksError::Json(JsonError::DuplicateMember)),
                "{json}"
            );
        }
        assert_eq!(
            KeySet::parse(&jwks(&[(&a, "a"), (&b, "b")])).unwrap().len(),
            2
        );
    }

    #[test]
    fn fetches_are_paced() {
        let start = Instant::now();
        let mut ring = KeyRing::default();
        assert!(ring.may_fetch(start));
        assert_eq!(ring.age(start), None);
        ring.attempt(start);
        assert!(!ring.may_fetch(start));
        assert!(!ring.may_fetch(start + MIN_REFETCH_INTERVAL - Duration::from_millis(1)));
        assert!(ring.may_fetch(start + MIN_REFETCH_INTERVAL));
        let issuer = Issuer {
            issuer: "https://i".into(),
            keys: KeySet::default(),
        };
        ring.replace(issuer.clone(), start + Duration::from_secs(1));
        assert_eq!(
            ring.age(start + Duration::from_secs(4)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(ring.current().as_deref(), Some(&issuer));
    }

    #[test]
    fn keys_past_their_maximum_age_are_not_used() {
        let start = Instant::now();
        let max_age = Duration::from_secs(600);
        let mut ring = KeyRing::default();
        assert_eq!(
            ring.usable(start, max_age).unwrap_err(),
            Fallback::KeysUnavailable
        );
        let issuer = Issuer {
            issuer: "https://i".into(),
            keys: KeySet::default(),
        };
        ring.replace(issuer.clone(), start);
        assert_eq!(
            ring.usable(start + max_age, max_age).as_deref(),
            Ok(&issuer)
        );
        // Fetches that fail since do not make them younger.
        ring.attempt(start + max_age);
        assert_eq!(
            ring.usable(start + max_age + Duration::from_millis(1), max_age)
                .unwrap_err(),
            Fallback::KeysStale
        );
        // A fetch that works does.
        ring.replace(issuer.clone(), start + max_age + Duration::from_secs(1));
        assert_eq!(
            ring.usable(start + 2 * max_age, max_age).as_deref(),
            Ok(&issuer)
        );
    }
}
