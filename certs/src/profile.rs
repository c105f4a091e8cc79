//! The certificate profiles: what the CA and each kind of leaf certificate contain.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use time::{Duration, OffsetDateTime};

use crate::{san, CertError, CertKey};

/// How long the CA is valid.
const CA_LIFETIME: Duration = Duration::days(3653);

/// How long a leaf certificate is valid.
const LEAF_LIFETIME: Duration = Duration::days(365);

/// How far into the past validity starts, so that clocks a little behind still accept it.
const BACKDATE: Duration = Duration::hours(1);

/// A CA that signs leaves, and its certificate.
pub(crate) struct Ca {
    pub(crate) cert_key: CertKey,
    pub(crate) issuer: Issuer<'static, KeyPair>,
}

/// What a leaf certificate is for: its extended key usage.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    /// A TLS server (`serverAuth`).
    Server,
    /// A TLS client (`clientAuth`).
    Client,
    /// Both: a server's peer certificate, presented to the peers it dials and to those that
    /// dial it (`serverAuth` and `clientAuth`).
    Peer,
}

/// Makes a self-signed CA named `common_name` that may sign leaves but no further CAs.
pub(crate) fn ca(common_name: &str) -> Result<Ca, CertError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = validity(CA_LIFETIME);

    let key = new_key()?;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        cert_key: CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
        issuer: Issuer::new(params, key),
    })
}

/// Makes a leaf certificate with a fresh key, signed by `issuer`, with subject
/// `CN=common_name` and an `O=` for each of `organizations` (Kubernetes reads groups there).
pub(crate) fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    common_name: &str,
    organizations: &[&str],
    role: Role,
    sans: &[SanType],
) -> Result<CertKey, CertError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    for organization in organizations {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *organization);
    }
    params.subject_alt_names = sans.to_vec();
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match role {
        Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Role::Peer => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.use_authority_key_identifier_extension = true;
    (params.not_before, params.not_after) = validity(LEAF_LIFETIME);

    let key = new_key()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Node `node`'s agent certificate (`clientAuth`, `CN=node`, the SANs `node` and each of
/// `addresses`): the names and addresses the server's `--bind-agent-identifiers` lets that agent
/// announce. `node` must be a DNS name ([`CertError::InvalidNodeName`]).
pub(crate) fn agent(
    issuer: &Issuer<'static, KeyPair>,
    node: &str,
    addresses: &[String],
) -> Result<CertKey, CertError> {
    let sans = san::agent_sans(node, addresses)?;
    leaf(issuer, node, &[], Role::Client, &sans)
}

fn new_key() -> Result<KeyPair, CertError> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?)
}

/// `(not_before, not_after)`: from an hour ago until `lifetime` from now.
fn validity(lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - BACKDATE, now + lifetime)
}
