//! The generated PKI works with rustls: each leaf verifies against its CA for its purpose and
//! names, not for the other purpose, not against another PKI's CA; and the keys complete real
//! mutual-TLS handshakes.

use std::sync::Arc;

use bridgehead_certs::{CertKey, Pki};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, ClientConnection, Error, RootCertStore, ServerConfig,
    ServerConnection,
};

const EXTRA_DNS: &str = "bridgehead.kube-system.svc";
const EXTRA_IP: &str = "10.96.0.20";

fn pki() -> Pki {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Pki::generate(&[EXTRA_DNS.to_owned(), EXTRA_IP.to_owned()]).unwrap()
}

fn cert(cert_key: &CertKey) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(cert_key.cert_pem.as_bytes()).unwrap()
}

fn key(cert_key: &CertKey) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(cert_key.key_pem.as_bytes()).unwrap()
}

fn roots(pki: &Pki) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(cert(&pki.ca)).unwrap();
    Arc::new(roots)
}

fn verify_as_client(ca: &Pki, leaf: &CertKey) -> Result<(), Error> {
    let verifier = WebPkiClientVerifier::builder(roots(ca)).build().unwrap();
    verifier
        .verify_client_cert(&cert(leaf), &[], UnixTime::now())
        .map(drop)
}

fn verify_as_server(ca: &Pki, leaf: &CertKey, name: &str) -> Result<(), Error> {
    let verifier = WebPkiServerVerifier::builder(roots(ca)).build().unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    verifier
        .verify_server_cert(&cert(leaf), &[], &name, &[], UnixTime::now())
        .map(drop)
}

fn assert_wrong_purpose(result: Result<(), Error>) {
    assert!(
        matches!(
            result,
            Err(Error::InvalidCertificate(
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. }
            ))
        ),
        "{result:?}"
    );
}

/// Every PKI's CA is named `bridgehead-ca`, so webpki finds a candidate issuer by name and then
/// rejects the signature; `UnknownIssuer` would do as well.
fn assert_foreign(result: Result<(), Error>) {
    assert!(
        matches!(
            result,
            Err(Error::InvalidCertificate(
                CertificateError::BadSignature | CertificateError::UnknownIssuer
            ))
        ),
        "{result:?}"
    );
}

#[test]
fn client_and_agent_certificates_verify_as_clients() {
    let pki = pki();
    verify_as_client(&pki, &pki.client).unwrap();
    verify_as_client(&pki, &pki.agent).unwrap();
    verify_as_client(&pki, &pki.issue_client("agent-7").unwrap()).unwrap();
}

#[test]
fn server_and_cluster_certificates_verify_for_default_and_extra_names() {
    let pki = pki();
    for leaf in [&pki.server, &pki.cluster] {
        for name in ["localhost", "127.0.0.1", "::1", EXTRA_DNS, EXTRA_IP] {
            verify_as_server(&pki, leaf, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

#[test]
fn server_certificate_does_not_verify_for_other_names() {
    let pki = pki();
    for name in ["other.example", "10.96.0.21", "fd00::1", "svc"] {
        let result = verify_as_server(&pki, &pki.server, name);
        assert!(
            matches!(
                result,
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                ))
            ),
            "{name}: {result:?}"
        );
    }
}

#[test]
fn client_certificates_are_not_usable_as_server_certificates() {
    let pki = pki();
    for leaf in [&pki.client, &pki.agent, &pki.issue_client("x").unwrap()] {
        assert_wrong_purpose(verify_as_server(&pki, leaf, "localhost"));
    }
}

#[test]
fn server_certificates_are_not_usable_as_client_certificates() {
    let pki = pki();
    assert_wrong_purpose(verify_as_client(&pki, &pki.server));
    assert_wrong_purpose(verify_as_client(&pki, &pki.cluster));
}

#[test]
fn certificates_from_another_pki_are_rejected() {
    let ours = pki();
    let theirs = pki();
    assert_foreign(verify_as_client(&ours, &theirs.client));
    assert_foreign(verify_as_client(&ours, &theirs.agent));
    assert_foreign(verify_as_client(
        &ours,
        &theirs.issue_client("bridgehead-agent").unwrap(),
    ));
    assert_foreign(verify_as_server(&ours, &theirs.server, "localhost"));
    assert_foreign(verify_as_server(&ours, &theirs.cluster, "localhost"));
}

#[test]
fn ca_cannot_be_used_as_a_leaf() {
    let pki = pki();
    assert!(verify_as_client(&pki, &pki.ca).is_err());
    assert!(verify_as_server(&pki, &pki.ca, "localhost").is_err());
}

/// Runs a mutual-TLS handshake in memory: the server trusts `client_ca` for client
/// certificates, the client trusts `server_ca` and connects to `name`.
fn handshake(
    server_ca: &Pki,
    server: &CertKey,
    client_ca: &Pki,
    client: &CertKey,
    name: &str,
) -> Result<(), Error> {
    let client_verifier = WebPkiClientVerifier::builder(roots(client_ca))
        .build()
        .unwrap();
    let server_config = ServerConfig::builder()
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(vec![cert(server)], key(server))?;
    let client_config = ClientConfig::builder()
        .with_root_certificates(roots(server_ca))
        .with_client_auth_cert(vec![cert(client)], key(client))?;
    let mut server_conn = ServerConnection::new(Arc::new(server_config))?;
    let mut client_conn = ClientConnection::new(
        Arc::new(client_config),
        ServerName::try_from(name.to_owned()).unwrap(),
    )?;

    for _ in 0..10 {
        if !client_conn.is_handshaking() && !server_conn.is_handshaking() {
            return Ok(());
        }
        let mut buf = Vec::new();
        while client_conn.wants_write() {
            client_conn.write_tls(&mut buf).unwrap();
        }
        server_conn.read_tls(&mut buf.as_slice()).unwrap();
        server_conn.process_new_packets()?;

        let mut buf = Vec::new();
        while server_conn.wants_write() {
            server_conn.write_tls(&mut buf).unwrap();
        }
        client_conn.read_tls(&mut buf.as_slice()).unwrap();
        client_conn.process_new_packets()?;
    }
    panic!("handshake did not finish");
}

#[test]
fn keys_match_certificates_in_mutual_tls_handshakes() {
    let pki = pki();
    handshake(&pki, &pki.server, &pki, &pki.client, "127.0.0.1").unwrap();
    handshake(&pki, &pki.cluster, &pki, &pki.agent, "localhost").unwrap();
    handshake(
        &pki,
        &pki.server,
        &pki,
        &pki.issue_client("curl").unwrap(),
        "::1",
    )
    .unwrap();
}

#[test]
fn handshake_with_a_foreign_client_certificate_fails() {
    let ours = pki();
    let theirs = pki();
    let result = handshake(&ours, &ours.server, &ours, &theirs.client, "localhost");
    assert_foreign(result);
}
