//! The generated PKI works with rustls: each leaf verifies against its own CA for its purpose
//! and names, not for the other purpose, not against the other CA (the frontend CA takes no
//! agent, the cluster CA no frontend client), not against another PKI's CAs; and the keys
//! complete real mutual-TLS handshakes on the side they belong to only.

use std::sync::Arc;

use bridgehead_certs::{CertKey, ClusterCa, Pki};
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

fn roots(ca: &CertKey) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(cert(ca)).unwrap();
    Arc::new(roots)
}

fn verify_as_client(ca: &CertKey, leaf: &CertKey) -> Result<(), Error> {
    let verifier = WebPkiClientVerifier::builder(roots(ca)).build().unwrap();
    verifier
        .verify_client_cert(&cert(leaf), &[], UnixTime::now())
        .map(drop)
}

fn verify_as_server(ca: &CertKey, leaf: &CertKey, name: &str) -> Result<(), Error> {
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

/// A leaf of the other CA has an issuer no root is named after (`UnknownIssuer`); a leaf of
/// another PKI's same-named CA gets as far as the signature (`BadSignature`).
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

fn addresses() -> Vec<String> {
    vec!["10.0.0.5".to_owned(), "fd00::5".to_owned()]
}

#[test]
fn client_certificates_verify_as_clients_against_their_own_ca() {
    let pki = pki();
    verify_as_client(&pki.frontend_ca, &pki.client).unwrap();
    verify_as_client(&pki.frontend_ca, &pki.issue_client("curl").unwrap()).unwrap();
    verify_as_client(&pki.cluster_ca, &pki.agent).unwrap();
    verify_as_client(
        &pki.cluster_ca,
        &pki.issue_agent("node-7", &addresses()).unwrap(),
    )
    .unwrap();
}

#[test]
fn server_and_cluster_certificates_verify_for_default_and_extra_names() {
    let pki = pki();
    for (ca, leaf) in [
        (&pki.frontend_ca, &pki.server),
        (&pki.cluster_ca, &pki.cluster),
    ] {
        for name in ["localhost", "127.0.0.1", "::1", EXTRA_DNS, EXTRA_IP] {
            verify_as_server(ca, leaf, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

#[test]
fn server_certificate_does_not_verify_for_other_names() {
    let pki = pki();
    for name in ["other.example", "10.96.0.21", "fd00::1", "svc"] {
        let result = verify_as_server(&pki.frontend_ca, &pki.server, name);
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
    for leaf in [&pki.client, &pki.issue_client("x").unwrap()] {
        assert_wrong_purpose(verify_as_server(&pki.frontend_ca, leaf, "localhost"));
    }
    for leaf in [&pki.agent, &pki.issue_agent("localhost", &[]).unwrap()] {
        assert_wrong_purpose(verify_as_server(&pki.cluster_ca, leaf, "localhost"));
    }
}

#[test]
fn server_certificates_are_not_usable_as_client_certificates() {
    let pki = pki();
    assert_wrong_purpose(verify_as_client(&pki.frontend_ca, &pki.server));
    assert_wrong_purpose(verify_as_client(&pki.cluster_ca, &pki.cluster));
}

#[test]
fn the_frontend_ca_verifies_no_agent_or_cluster_certificate() {
    let pki = pki();
    assert_foreign(verify_as_client(&pki.frontend_ca, &pki.agent));
    assert_foreign(verify_as_client(
        &pki.frontend_ca,
        &pki.issue_agent("node-1", &addresses()).unwrap(),
    ));
    assert_foreign(verify_as_server(
        &pki.frontend_ca,
        &pki.cluster,
        "localhost",
    ));
}

#[test]
fn the_cluster_ca_verifies_no_client_or_server_certificate() {
    let pki = pki();
    assert_foreign(verify_as_client(&pki.cluster_ca, &pki.client));
    assert_foreign(verify_as_client(
        &pki.cluster_ca,
        &pki.issue_client("bridgehead-agent").unwrap(),
    ));
    assert_foreign(verify_as_server(&pki.cluster_ca, &pki.server, "localhost"));
}

#[test]
fn certificates_from_another_pki_are_rejected() {
    let ours = pki();
    let theirs = pki();
    assert_foreign(verify_as_client(&ours.frontend_ca, &theirs.client));
    assert_foreign(verify_as_client(
        &ours.frontend_ca,
        &theirs.issue_client("bridgehead-client").unwrap(),
    ));
    assert_foreign(verify_as_client(&ours.cluster_ca, &theirs.agent));
    assert_foreign(verify_as_client(
        &ours.cluster_ca,
        &theirs.issue_agent("node-1", &[]).unwrap(),
    ));
    assert_foreign(verify_as_server(
        &ours.frontend_ca,
        &theirs.server,
        "localhost",
    ));
    assert_foreign(verify_as_server(
        &ours.cluster_ca,
        &theirs.cluster,
        "localhost",
    ));
}

#[test]
fn cas_cannot_be_used_as_leaves() {
    let pki = pki();
    for ca in [&pki.frontend_ca, &pki.cluster_ca] {
        assert!(verify_as_client(ca, ca).is_err());
        assert!(verify_as_server(ca, ca, "localhost").is_err());
    }
}

#[test]
fn agents_signed_by_the_cluster_ca_loaded_from_disk_chain_to_it_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (pki, other) = (pki(), pki());
    pki.write_dir(tmp.path(), false).unwrap();
    let loaded = ClusterCa::load(tmp.path()).unwrap();
    let agent = loaded.issue_agent("node-3", &addresses()).unwrap();

    verify_as_client(&pki.cluster_ca, &agent).unwrap();
    assert_foreign(verify_as_client(&pki.frontend_ca, &agent));
    assert_foreign(verify_as_client(&other.cluster_ca, &agent));
    handshake(
        &pki.cluster_ca,
        &pki.cluster,
        &pki.cluster_ca,
        &agent,
        "localhost",
    )
    .unwrap();
}

/// Runs a mutual-TLS handshake in memory: the server trusts `client_ca` for client
/// certificates, the client trusts `server_ca` and connects to `name`.
fn handshake(
    server_ca: &CertKey,
    server: &CertKey,
    client_ca: &CertKey,
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
    let (frontend, cluster) = (&pki.frontend_ca, &pki.cluster_ca);
    handshake(frontend, &pki.server, frontend, &pki.client, "127.0.0.1").unwrap();
    handshake(cluster, &pki.cluster, cluster, &pki.agent, "localhost").unwrap();
    let curl = pki.issue_client("curl").unwrap();
    handshake(frontend, &pki.server, frontend, &curl, "::1").unwrap();
    let node = pki.issue_agent("node-1", &addresses()).unwrap();
    handshake(cluster, &pki.cluster, cluster, &node, EXTRA_IP).unwrap();
}

#[test]
fn an_agent_certificate_opens_no_frontend_connection_and_a_client_one_no_agent_session() {
    let pki = pki();
    let (frontend, cluster) = (&pki.frontend_ca, &pki.cluster_ca);
    let node = pki.issue_agent("node-1", &[]).unwrap();
    for agent in [&pki.agent, &node] {
        assert_foreign(handshake(
            frontend,
            &pki.server,
            frontend,
            agent,
            "localhost",
        ));
    }
    let curl = pki.issue_client("curl").unwrap();
    for client in [&pki.client, &curl] {
        assert_foreign(handshake(
            cluster,
            &pki.cluster,
            cluster,
            client,
            "localhost",
        ));
    }
}

#[test]
fn handshake_with_a_foreign_client_certificate_fails() {
    let ours = pki();
    let theirs = pki();
    let frontend = &ours.frontend_ca;
    let result = handshake(
        frontend,
        &ours.server,
        frontend,
        &theirs.client,
        "localhost",
    );
    assert_foreign(result);
}
