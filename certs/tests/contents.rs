//! What the generated certificates contain, read back with x509-parser: names, issuers, key
//! type, CA constraints, key usages, extended key usages, SANs and validity.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use bridgehead_certs::{CertError, CertKey, ClusterCa, Pki};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::pem::Pem;
use x509_parser::prelude::X509Certificate;

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;
/// Slack for the time between generating and checking.
const SLACK: i64 = 300;

/// Parses `cert_key`'s certificate and hands it to `check`.
fn with_cert<T>(cert_key: &CertKey, check: impl FnOnce(&X509Certificate<'_>) -> T) -> T {
    let (pem, _) = Pem::read(std::io::Cursor::new(cert_key.cert_pem.as_bytes())).unwrap();
    check(&pem.parse_x509().unwrap())
}

fn common_name(cert: &X509Certificate<'_>) -> String {
    let names = cert
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().unwrap().to_owned())
        .collect::<Vec<_>>();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .try_into()
        .unwrap()
}

/// The certificate is valid from about an hour ago for about `lifetime` seconds from now.
fn assert_validity(cert: &X509Certificate<'_>, lifetime: i64) {
    let now = now();
    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    assert!((now - HOUR - SLACK..=now - HOUR + SLACK).contains(&not_before));
    assert!((now + lifetime - SLACK..=now + lifetime + SLACK).contains(&not_after));
}

fn assert_p256(cert: &X509Certificate<'_>) {
    let spki = cert.public_key();
    assert_eq!(spki.algorithm.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .unwrap()
        .as_oid()
        .unwrap();
    assert_eq!(curve, OID_EC_P256);
}

/// `(serverAuth, clientAuth)`, and that no other purpose is allowed.
fn purposes(cert: &X509Certificate<'_>) -> (bool, bool) {
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(!eku.any && !eku.code_signing && !eku.email_protection && eku.other.is_empty());
    (eku.server_auth, eku.client_auth)
}

fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let Some(san) = cert.subject_alternative_name().unwrap() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::DNSName(dns) => format!("DNS:{dns}"),
            GeneralName::IPAddress(bytes) => {
                let ip = match bytes.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).unwrap()),
                    16 => IpAddr::from(<[u8; 16]>::try_from(*bytes).unwrap()),
                    n => panic!("IP SAN of {n} bytes"),
                };
                format!("IP:{ip}")
            }
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

/// The certificate's subject key identifier, or its authority key identifier.
fn key_id(cert: &X509Certificate<'_>, authority: bool) -> Vec<u8> {
    cert.iter_extensions()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) if !authority => Some(id.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(aki) if authority => {
                aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => None,
        })
        .unwrap()
}

/// Checks what every leaf shares: issued by `ca` (by name and key identifier), not a CA,
/// digitalSignature only, P-256, one year; returns its common name.
fn check_leaf(ca: &CertKey, leaf: &CertKey) -> String {
    let (ca_subject, ca_key_id) =
        with_cert(ca, |ca| (ca.subject().as_raw().to_vec(), key_id(ca, false)));
    with_cert(leaf, |cert| {
        assert_eq!(cert.issuer().as_raw(), ca_subject);
        assert_eq!(key_id(cert, true), ca_key_id);
        assert!(!cert.is_ca());
        let usage = cert.key_usage().unwrap().unwrap();
        assert!(usage.critical);
        assert!(usage.value.digital_signature());
        assert!(!usage.value.key_cert_sign() && !usage.value.crl_sign());
        assert_p256(cert);
        assert_validity(cert, 365 * DAY);
        common_name(cert)
    })
}

#[test]
fn the_two_cas_are_p256_cas_that_sign_leaves_only() {
    let pki = Pki::generate(&[]).unwrap();
    for (ca, name) in [
        (&pki.frontend_ca, "bridgehead-frontend-ca"),
        (&pki.cluster_ca, "bridgehead-cluster-ca"),
    ] {
        with_cert(ca, |ca| {
            assert_eq!(common_name(ca), name);
            assert_eq!(ca.issuer().as_raw(), ca.subject().as_raw());
            let constraints = ca.basic_constraints().unwrap().unwrap();
            assert!(constraints.critical);
            assert!(constraints.value.ca);
            assert_eq!(constraints.value.path_len_constraint, Some(0));
            let usage = ca.key_usage().unwrap().unwrap().value;
            assert!(usage.key_cert_sign() && usage.crl_sign() && usage.digital_signature());
            assert!(ca.extended_key_usage().unwrap().is_none());
            assert_p256(ca);
            assert_validity(ca, 3653 * DAY);
        });
    }
    assert_ne!(pki.frontend_ca.key_pem, pki.cluster_ca.key_pem);
}

#[test]
fn server_and_cluster_certificates_are_for_servers_with_loopback_and_extra_sans() {
    let extra = ["10.0.0.5", "bridgehead.example", "fd00::5", "localhost"].map(String::from);
    let pki = Pki::generate(&extra).unwrap();
    for (ca, leaf, name) in [
        (&pki.frontend_ca, &pki.server, "bridgehead-server"),
        (&pki.cluster_ca, &pki.cluster, "bridgehead-cluster"),
    ] {
        assert_eq!(check_leaf(ca, leaf), name);
        with_cert(leaf, |cert| {
            assert_eq!(purposes(cert), (true, false));
            assert_eq!(
                sans(cert),
                [
                    "DNS:localhost",
                    "IP:127.0.0.1",
                    "IP:::1",
                    "IP:10.0.0.5",
                    "DNS:bridgehead.example",
                    "IP:fd00::5",
                ]
            );
        });
    }
}

#[test]
fn client_and_agent_certificates_are_for_clients_without_sans() {
    let pki = Pki::generate(&[]).unwrap();
    for (ca, leaf, name) in [
        (&pki.frontend_ca, &pki.client, "bridgehead-client"),
        (&pki.cluster_ca, &pki.agent, "bridgehead-agent"),
    ] {
        assert_eq!(check_leaf(ca, leaf), name);
        with_cert(leaf, |cert| {
            assert_eq!(purposes(cert), (false, true));
            assert_eq!(sans(cert), Vec::<String>::new());
        });
    }
}

#[test]
fn issued_client_certificates_come_from_the_frontend_ca_with_the_given_name_and_a_fresh_key() {
    let pki = Pki::generate(&[]).unwrap();
    let one = pki.issue_client("kube-apiserver-2").unwrap();
    let two = pki.issue_client("kube-apiserver-2").unwrap();
    assert_eq!(check_leaf(&pki.frontend_ca, &one), "kube-apiserver-2");
    with_cert(&one, |cert| assert_eq!(purposes(cert), (false, true)));
    assert_ne!(one.key_pem, two.key_pem);
    assert_ne!(one.cert_pem, two.cert_pem);
}

#[test]
fn issued_agent_certificates_come_from_the_cluster_ca_named_after_the_node() {
    let pki = Pki::generate(&[]).unwrap();
    let addresses = ["10.0.0.7", "[fd00::7]", "node-7.example", "10.0.0.7"].map(String::from);
    let agent = pki.issue_agent("node-7", &addresses).unwrap();
    assert_eq!(check_leaf(&pki.cluster_ca, &agent), "node-7");
    with_cert(&agent, |cert| {
        assert_eq!(purposes(cert), (false, true));
        assert_eq!(
            sans(cert),
            [
                "DNS:node-7",
                "IP:10.0.0.7",
                "IP:fd00::7",
                "DNS:node-7.example"
            ]
        );
    });
}

#[test]
fn agents_from_the_cluster_ca_loaded_from_disk_look_like_the_ones_from_the_pki() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&[]).unwrap();
    pki.write_dir(tmp.path(), false).unwrap();
    let loaded = ClusterCa::load(tmp.path()).unwrap();
    assert_eq!(loaded.ca, pki.cluster_ca);

    let agent = loaded
        .issue_agent("node-9", &["10.0.0.9".to_owned()])
        .unwrap();
    assert_eq!(check_leaf(&pki.cluster_ca, &agent), "node-9");
    with_cert(&agent, |cert| {
        assert_eq!(purposes(cert), (false, true));
        assert_eq!(sans(cert), ["DNS:node-9", "IP:10.0.0.9"]);
    });
}

#[test]
fn an_agent_needs_a_dns_node_name() {
    let pki = Pki::generate(&[]).unwrap();
    for bad in [
        "10.0.0.1",
        "fd00::1",
        "*.nodes.example",
        "",
        "node 1",
        "node_1.",
    ] {
        match pki.issue_agent(bad, &[]) {
            Err(err @ CertError::InvalidNodeName { .. }) => {
                assert!(err
                    .to_string()
                    .starts_with(&format!("invalid node name {bad:?}: ")))
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(matches!(
        pki.issue_agent("node-1", &["bad..name".to_owned()]),
        Err(CertError::InvalidSan { .. })
    ));
}

#[test]
fn every_key_is_pkcs8_pem_and_distinct() {
    let pki = Pki::generate(&[]).unwrap();
    let keys = all(&pki).map(|ck| &ck.key_pem);
    for (i, key) in keys.iter().enumerate() {
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        assert!(!keys[..i].contains(key));
    }
    let other = Pki::generate(&[]).unwrap();
    assert_ne!(other.frontend_ca.key_pem, pki.frontend_ca.key_pem);
    assert_ne!(other.cluster_ca.key_pem, pki.cluster_ca.key_pem);
}

#[test]
fn debug_output_never_shows_a_private_key() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&[]).unwrap();
    pki.write_dir(tmp.path(), false).unwrap();
    let loaded = ClusterCa::load(tmp.path()).unwrap();
    let debug = format!(
        "{pki:?} {:?} {:?} {loaded:?}",
        pki.issue_client("x").unwrap(),
        pki.issue_agent("x", &[]).unwrap()
    );
    assert!(debug.contains("BEGIN CERTIFICATE"));
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    for cert_key in all(&pki) {
        let body = cert_key.key_pem.lines().nth(1).unwrap();
        assert!(!debug.contains(body));
    }
}

fn all(pki: &Pki) -> [&CertKey; 6] {
    [
        &pki.frontend_ca,
        &pki.server,
        &pki.client,
        &pki.cluster_ca,
        &pki.cluster,
        &pki.agent,
    ]
}

#[test]
fn invalid_extra_sans_are_refused() {
    for bad in ["", "two words", "a..b", "-x.example", "300.1.1.1"] {
        match Pki::generate(&["ok.example".to_owned(), bad.to_owned()]) {
            Err(err @ CertError::InvalidSan { .. }) => {
                assert!(err
                    .to_string()
                    .starts_with(&format!("invalid SAN {bad:?}: ")))
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn pki_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Pki>();
    assert_send_sync::<ClusterCa>();
    assert_send_sync::<CertKey>();
    assert_send_sync::<CertError>();
}
