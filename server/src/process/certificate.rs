//! What a peer's certificate names: its subject, common name and SANs, and which TLS roles its
//! extended key usage allows, for identity checks (agent identity binding, the frontend's
//! allowed clients, the peer port's allowed peers) and logs.

use std::fmt;
use std::net::IpAddr;

use bridgehead_proto::text::Printable;
use rustls::pki_types::CertificateDer;

/// A certificate's subject and SANs (DNS names and IP addresses as text).
pub struct CertificateNames {
    /// The subject, as `CN=node-1, O=...` (escaped).
    pub subject: String,
    /// The common name, if any.
    pub common_name: Option<String>,
    /// DNS names and IP addresses.
    pub sans: Vec<String>,
    /// The roles its extended key usage names (none without the extension).
    pub usages: Usages,
}

/// The TLS roles a certificate's extended key usage names. A certificate without the
/// extension names none here: roles are only ever required, never assumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usages {
    /// `serverAuth`.
    pub server_auth: bool,
    /// `clientAuth`.
    pub client_auth: bool,
}

impl fmt::Debug for CertificateNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateNames")
            .field("subject", &self.subject)
            .field("sans", &self.sans)
            .field("usages", &self.usages)
            .finish()
    }
}

pub fn certificate_names(certificate: &CertificateDer<'_>) -> CertificateNames {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(certificate.as_ref()) else {
        // The handshake verified it; a certificate webpki accepts but this parser does not
        // vouches for nothing.
        return CertificateNames {
            subject: "(unparsable)".to_owned(),
            common_name: None,
            sans: Vec::new(),
            usages: Usages::default(),
        };
    };
    let mut sans = Vec::new();
    if let Ok(Some(extension)) = parsed.subject_alternative_name() {
        for name in &extension.value.general_names {
            match name {
                GeneralName::DNSName(dns) => sans.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    sans.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    let common_name = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let usages = match parsed.extended_key_usage() {
        Ok(Some(extension)) => Usages {
            server_auth: extension.value.server_auth,
            client_auth: extension.value.client_auth,
        },
        _ => Usages::default(),
    };
    CertificateNames {
        subject: Printable::new(&parsed.subject().to_string()).to_string(),
        common_name,
        sans,
        usages,
    }
}

impl CertificateNames {
    /// Whether `name` is the common name or a DNS SAN (ASCII case-insensitive).
    pub fn names(&self, name: &str) -> bool {
        self.common_name
            .iter()
            .chain(&self.sans)
            .any(|known| known.eq_ignore_ascii_case(name))
    }
}
