//! The claim rules, as kube-apiserver applies them to a ServiceAccount token
//! (k8s.io/kubernetes `pkg/serviceaccount/jwt.go` and `claims.go`): `exp`, `nbf` and `iat`
//! with a minute's leeway, the audience, the account (kube-apiserver names the user by the
//! private `kubernetes.io` claim; `sub` must agree), the issuer, and the pod the token is bound
//! to. Pure: the time is given.

use super::jwt::{Claims, Reference};
use super::{Fallback, Refusal};

/// kube-apiserver's leeway on `exp`, `nbf` and `iat` (go-jose's default), in seconds; also
/// how long an object marked for deletion still counts.
pub const LEEWAY_SECS: i64 = 60;

/// What a token must say.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    pub(crate) audience: String,
    /// `system:serviceaccount:NS:NAME`.
    pub(crate) username: String,
}

/// Whether the signature was checked: a refusal needs no signature (a token that fails a rule
/// would fail it at kube-apiserver too), but only a signed token may be sent on to
/// TokenReview for a reason the claims cannot settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signed {
    Yes,
    /// The key is unknown; what the claims cannot settle is refused as
    /// [`Refusal::UnknownKey`].
    No,
}

/// What a token that passes the rules is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    pub(crate) username: String,
    pub(crate) account_uid: String,
    pub(crate) pod: Reference,
    pub(crate) node: Option<Reference>,
    pub(crate) issued_at: Option<i64>,
    pub(crate) expires_at: i64,
}

/// Why the rules did not pass the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Refused(Refusal),
    Fallback(Fallback),
}

/// Applies the rules at `now` (seconds since the epoch). `issuers` are the accepted issuers;
/// with none known yet the issuer is not judged.
pub(crate) fn check(
    claims: &Claims,
    expected: &Expected,
    issuers: &[&str],
    now: i64,
    signed: Signed,
) -> Result<Bound, Verdict> {
    // What the claims alone cannot settle: sent on when signed, refused when not.
    let unsettled = |reason: Fallback| match signed {
        Signed::Yes => Verdict::Fallback(reason),
        Signed::No => Verdict::Refused(Refusal::UnknownKey),
    };
    // A token with no expiry or no audience is not a projected one (a legacy Secret token):
    // kube-apiserver judges those by rules of their own.
    let (Some(expires_at), Some(audience)) = (claims.exp, claims.aud.as_ref()) else {
        return Err(unsettled(Fallback::NotPodBound));
    };
    if now - LEEWAY_SECS > expires_at {
        return Err(Verdict::Refused(Refusal::Expired));
    }
    if claims.nbf.is_some_and(|nbf| now + LEEWAY_SECS < nbf)
        || claims.iat.is_some_and(|iat| now + LEEWAY_SECS < iat)
    {
        return Err(Verdict::Refused(Refusal::NotYetValid));
    }
    if !audience.contains(&expected.audience) {
        return Err(Verdict::Refused(Refusal::WrongAudience));
    }
    let private = claims.kubernetes.clone().unwrap_or_default();
    let account = private.serviceaccount.clone().unwrap_or_default();
    // Without the private claim kube-apiserver finds no account to check: it refuses.
    let username = match &private.namespace {
        Some(namespace) if !account.name.is_empty() => {
            format!("system:serviceaccount:{namespace}:{}", account.name)
        }
        _ => {
            return Err(Verdict::Refused(Refusal::WrongAccount {
                got: claims.sub.clone().unwrap_or_default(),
            }))
        }
    };
    if username != expected.username {
        return Err(Verdict::Refused(Refusal::WrongAccount { got: username }));
    }
    if claims.sub.as_deref() != Some(username.as_str()) {
        return Err(Verdict::Refused(Refusal::WrongAccount {
            got: claims.sub.clone().unwrap_or_default(),
        }));
    }
    let issuer = claims.iss.as_deref().unwrap_or_default();
    if !issuers.is_empty() && !issuers.contains(&issuer) {
        // Signed by the issuer's key under another name: kube-apiserver may accept more
        // issuers than discovery names (`--service-account-issuer` given twice, during a
        // migration).
        return Err(match signed {
            Signed::Yes => Verdict::Fallback(Fallback::UnlistedIssuer),
            Signed::No => Verdict::Refused(Refusal::WrongIssuer),
        });
    }
    let Some(pod) = private
        .pod
        .filter(|pod| !pod.name.is_empty() && !pod.uid.is_empty())
    else {
        return Err(unsettled(Fallback::NotPodBound));
    };
    Ok(Bound {
        username,
        account_uid: account.uid,
        pod,
        node: private.node.filter(|node| !node.name.is_empty()),
        issued_at: claims.iat,
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::super::jwt::{Audience, Private};
    use super::*;

    const NOW: i64 = 1_000_000;
    const ISSUER: &str = "https://kubernetes.default.svc";

    fn expected() -> Expected {
        Expected {
            audience: "bridgehead".into(),
            username: "system:serviceaccount:kube-system:agent".into(),
        }
    }

    fn reference(name: &str, uid: &str) -> Option<Reference> {
        Some(Reference {
            name: name.into(),
            uid: uid.into(),
        })
    }

    fn good() -> Claims {
        Claims {
            iss: Some(ISSUER.into()),
            sub: Some("system:serviceaccount:kube-system:agent".into()),
            aud: Some(Audience::Many(vec!["other".into(), "bridgehead".into()])),
            exp: Some(NOW + 3600),
            nbf: Some(NOW),
            iat: Some(NOW),
            kubernetes: Some(Private {
                namespace: Some("kube-system".into()),
                serviceaccount: reference("agent", "sa-uid"),
                pod: reference("agent-x", "pod-uid"),
                node: reference("node-1", "node-uid"),
            }),
        }
    }

    fn run(claims: &Claims, now: i64, signed: Signed) -> Result<Bound, Verdict> {
        check(claims, &expected(), &[ISSUER, "https://old"], now, signed)
    }

    #[test]
    fn a_good_token_is_bound_to_its_pod_and_node() {
        let bound = run(&good(), NOW, Signed::Yes).unwrap();
        assert_eq!(bound.username, "system:serviceaccount:kube-system:agent");
        assert_eq!(bound.account_uid, "sa-uid");
        assert_eq!(bound.pod, reference("agent-x", "pod-uid").unwrap());
        assert_eq!(bound.node, reference("node-1", "node-uid"));
        assert_eq!(bound.expires_at, NOW + 3600);
        // Either accepted issuer; one audience as a string; no nbf or iat.
        let mut claims = good();
        claims.iss = Some("https://old".into());
        claims.aud = Some(Audience::One("bridgehead".into()));
        claims.nbf = None;
        claims.iat = None;
        run(&claims, NOW, Signed::Yes).unwrap();
        // With no issuer known yet the issuer is not judged.
        claims.iss = Some("https://elsewhere".into());
        check(&claims, &expected(), &[], NOW, Signed::No).unwrap();
    }

    #[test]
    fn times_hold_to_the_second_with_a_minutes_leeway() {
        let mut claims = good();
        claims.exp = Some(NOW);
        // Expired up to 60 s ago: still valid; 61 s: expired.
        assert!(run(&claims, NOW + 60, Signed::Yes).is_ok());
        assert_eq!(
            run(&claims, NOW + 61, Signed::Yes),
            Err(Verdict::Refused(Refusal::Expired))
        );
        // Valid from 60 s ahead: already accepted; 61 s ahead: not yet.
        let mut claims = good();
        claims.nbf = Some(NOW + 60);
        claims.iat = Some(NOW);
        assert!(run(&claims, NOW, Signed::Yes).is_ok());
        claims.nbf = Some(NOW + 61);
        assert_eq!(
            run(&claims, NOW, Signed::Yes),
            Err(Verdict::Refused(Refusal::NotYetValid))
        );
        // Issued in the future, past the leeway.
        let mut claims = good();
        claims.nbf = None;
        claims.iat = Some(NOW + 60);
        assert!(run(&claims, NOW, Signed::Yes).is_ok());
        claims.iat = Some(NOW + 61);
        assert_eq!(
            run(&claims, NOW, Signed::Yes),
            Err(Verdict::Refused(Refusal::NotYetValid))
        );
        // Refusals need no signature.
        let mut claims = good();
        claims.exp = Some(NOW - 61);
        assert_eq!(
            run(&claims, NOW, Signed::No),
            Err(Verdict::Refused(Refusal::Expired))
        );
    }

    #[test]
    fn audience_and_account_are_the_servers() {
        let mut claims = good();
        claims.aud = Some(Audience::Many(
            vec!["https://kubernetes.default.svc".into()],
        ));
        assert_eq!(
            run(&claims, NOW, Signed::Yes),
            Err(Verdict::Refused(Refusal::WrongAudience))
        );
        let account = |namespace: &str, name: &str, sub: &str| {
            let mut claims = good();
            let private = claims.kubernetes.as_mut().unwrap();
            private.namespace = Some(namespace.into());
            private.serviceaccount = reference(name, "sa-uid");
            claims.sub = Some(sub.into());
            run(&claims, NOW, Signed::Yes)
        };
        let wrong = |got: &str| Err(Verdict::Refused(Refusal::WrongAccount { got: got.into() }));
        assert_eq!(
            account(
                "kube-system",
                "other",
                "system:serviceaccount:kube-system:other"
            ),
            wrong("system:serviceaccount:kube-system:other")
        );
        assert_eq!(
            account("default", "agent", "system:serviceaccount:default:agent"),
            wrong("system:serviceaccount:default:agent")
        );
        // The private claim names the user; a `sub` that disagrees is not ours either.
        assert_eq!(
            account(
                "kube-system",
                "agent",
                "system:serviceaccount:kube-system:other"
            ),
            wrong("system:serviceaccount:kube-system:other")
        );
        // No private claim: not an account kube-apiserver can check; the `sub` is named.
        let mut claims = good();
        claims.kubernetes = None;
        assert_eq!(
            run(&claims, NOW, Signed::Yes),
            wrong("system:serviceaccount:kube-system:agent")
        );
    }

    #[test]
    fn what_the_claims_cannot_settle_goes_on_only_when_signed() {
        let mut unlisted = good();
        unlisted.iss = Some("https://elsewhere".into());
        assert_eq!(
            run(&unlisted, NOW, Signed::Yes),
            Err(Verdict::Fallback(Fallback::UnlistedIssuer))
        );
        assert_eq!(
            run(&unlisted, NOW, Signed::No),
            Err(Verdict::Refused(Refusal::WrongIssuer))
        );
        let mut unbound = good();
        unbound.kubernetes.as_mut().unwrap().pod = None;
        let mut legacy = good();
        legacy.exp = None;
        let mut no_audience = good();
        no_audience.aud = None;
        let mut empty_pod = good();
        empty_pod.kubernetes.as_mut().unwrap().pod = reference("agent-x", "");
        for claims in [unbound, legacy, no_audience, empty_pod] {
            assert_eq!(
                run(&claims, NOW, Signed::Yes),
                Err(Verdict::Fallback(Fallback::NotPodBound)),
                "{claims:?}"
            );
            assert_eq!(
                run(&claims, NOW, Signed::No),
                Err(Verdict::Refused(Refusal::UnknownKey)),
                "{claims:?}"
            );
        }
    }
}
