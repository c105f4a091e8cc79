//! Who is a peer: the one rule both ends of a peer session apply to the other's certificate,
//! once TLS has verified that it chains to `--peer-ca-cert`.
//!
//! That CA is the frontend's (a peer opens tunnels as a CONNECT client does), so the chain
//! alone would let in every certificate it signed: kube-apiserver's, curl's, the frontend's
//! own. A peer's certificate must also
//! - carry both `serverAuth` and `clientAuth` (a peer is each of them, one per direction;
//!   `bridgehead-certs` gives those two only to `peer.crt`),
//! - name none of `--allowed-clients` (a CONNECT client's certificate is never a peer's,
//!   whatever CA issued it),
//! - name one of `--allowed-peers`, by common name or DNS SAN.
//!
//! What this leaves out: the server id a peer claims in its upgrade request, which is only a
//! label (bounded where it is read, `accepted.rs`).

use std::sync::Arc;

use rustls::pki_types::CertificateDer;

use crate::config::PeeringConfig;
use crate::process::certificate::{certificate_names, CertificateNames};

/// The names a peer's certificate must (and must not) carry.
#[derive(Debug, Clone)]
pub struct PeerPolicy {
    allowed: Arc<[String]>,
    clients: Arc<[String]>,
}

/// Why a certificate is not a peer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAPeer {
    #[error("no client certificate")]
    NoCertificate,
    #[error("certificate {subject} names {name}, one of --allowed-clients: a CONNECT client's certificate is never a peer's")]
    Client { subject: String, name: String },
    #[error("certificate {subject} lacks {missing} in its extended key usage: a peer's carries serverAuth and clientAuth")]
    Usage {
        subject: String,
        missing: &'static str,
    },
    #[error("certificate {subject} is not among --allowed-peers")]
    NotAllowed { subject: String },
}

impl PeerPolicy {
    pub fn new(peering: &PeeringConfig) -> PeerPolicy {
        PeerPolicy {
            allowed: peering.allowed.as_slice().into(),
            clients: peering.clients.as_slice().into(),
        }
    }

    /// The certificate's subject when it is a peer's; why not otherwise.
    pub fn check(&self, certificate: Option<&CertificateDer<'_>>) -> Result<String, NotAPeer> {
        let names = certificate
            .map(certificate_names)
            .ok_or(NotAPeer::NoCertificate)?;
        self.check_names(names)
    }

    fn check_names(&self, names: CertificateNames) -> Result<String, NotAPeer> {
        if let Some(name) = self.clients.iter().find(|name| names.names(name)) {
            return Err(NotAPeer::Client {
                subject: names.subject,
                name: name.clone(),
            });
        }
        let missing = match (names.usages.server_auth, names.usages.client_auth) {
            (true, true) => None,
            (false, true) => Some("serverAuth"),
            (true, false) => Some("clientAuth"),
            (false, false) => Some("serverAuth and clientAuth"),
        };
        if let Some(missing) = missing {
            return Err(NotAPeer::Usage {
                subject: names.subject,
                missing,
            });
        }
        if !self.allowed.iter().any(|name| names.names(name)) {
            return Err(NotAPeer::NotAllowed {
                subject: names.subject,
            });
        }
        Ok(names.subject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &[&str], clients: &[&str]) -> PeerPolicy {
        let owned = |names: &[&str]| -> Arc<[String]> {
            names
                .iter()
                .map(|n| (*n).to_owned())
                .collect::<Vec<_>>()
                .into()
        };
        PeerPolicy {
            allowed: owned(allowed),
            clients: owned(clients),
        }
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    /// Every certificate `bridgehead-certs init` writes from the frontend CA, against the
    /// default policy: only `peer.crt` is a peer's.
    #[test]
    fn of_the_frontend_cas_certificates_only_the_peer_certificate_is_a_peers() {
        let pki = bridgehead_certs::Pki::generate(&[]).unwrap();
        let default = policy(&[crate::config::DEFAULT_ALLOWED_PEER], &[]);
        assert_eq!(
            default.check(Some(&der(&pki.peer.cert_pem))).unwrap(),
            "CN=bridgehead-peer"
        );
        // kube-apiserver's and curl's (clientAuth only), named or not.
        let client = der(&pki.client.cert_pem);
        assert!(matches!(
            default.check(Some(&client)),
            Err(NotAPeer::Usage {
                missing: "serverAuth",
                ..
            })
        ));
        let named = policy(&["bridgehead-client"], &[]);
        assert!(matches!(
            named.check(Some(&client)),
            Err(NotAPeer::Usage { .. })
        ));
        // The frontend's own (serverAuth only).
        let server = der(&pki.server.cert_pem);
        assert!(matches!(
            policy(&["bridgehead-server"], &[]).check(Some(&server)),
            Err(NotAPeer::Usage {
                missing: "clientAuth",
                ..
            })
        ));
        // A client certificate issued with the peer's name.
        let impostor = pki
            .issue_client(crate::config::DEFAULT_ALLOWED_PEER)
            .unwrap();
        assert!(matches!(
            default.check(Some(&der(&impostor.cert_pem))),
            Err(NotAPeer::Usage { .. })
        ));
        assert_eq!(default.check(None), Err(NotAPeer::NoCertificate));
    }

    #[test]
    fn a_peer_certificate_must_be_named_and_never_a_clients() {
        let pki = bridgehead_certs::Pki::generate(&[]).unwrap();
        let peer = der(&pki.peer.cert_pem);
        let error = policy(&["cp-peer"], &[]).check(Some(&peer)).unwrap_err();
        assert!(matches!(error, NotAPeer::NotAllowed { .. }));
        assert!(error.to_string().contains("--allowed-peers"), "{error}");
        // Names compare as --allowed-clients' do: common name or DNS SAN, any case.
        assert!(policy(&["cp-peer", "BRIDGEHEAD-PEER"], &[])
            .check(Some(&peer))
            .is_ok());
        assert!(policy(&["localhost"], &[]).check(Some(&peer)).is_ok());
        let error = policy(&["bridgehead-peer"], &["localhost"])
            .check(Some(&peer))
            .unwrap_err();
        assert!(matches!(error, NotAPeer::Client { .. }), "{error}");
        assert!(error.to_string().contains("never a peer's"), "{error}");
    }
}
