//! `ClusterCa::load` and `ClusterCa::write_agent`: the cluster CA read back from a PKI
//! directory, every way that can fail, and the per-node agent files.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bridgehead_certs::{CertError, ClusterCa, Pki};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use time::{Duration, OffsetDateTime};

/// A fresh PKI written into a temporary directory.
fn pki_dir() -> (tempfile::TempDir, Pki) {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::generate(&[]).unwrap();
    pki.write_dir(tmp.path(), false).unwrap();
    (tmp, pki)
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn invalid_ca(dir: &Path) -> (std::path::PathBuf, &'static str) {
    match ClusterCa::load(dir) {
        Err(CertError::InvalidCa { path, reason }) => (path, reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn loads_the_cluster_ca_it_wrote() {
    let (tmp, pki) = pki_dir();
    let loaded = ClusterCa::load(tmp.path()).unwrap();
    assert_eq!(loaded.ca, pki.cluster_ca);
}

#[test]
fn write_agent_writes_the_node_certificate_and_key_with_their_modes() {
    let (tmp, _) = pki_dir();
    let out = tmp.path().join("nodes");
    let loaded = ClusterCa::load(tmp.path()).unwrap();

    let written = loaded
        .write_agent(&out, "node-1", &["10.0.0.1".to_owned()], false)
        .unwrap();

    assert_eq!(
        written,
        [out.join("agent-node-1.crt"), out.join("agent-node-1.key")]
    );
    assert_eq!(mode(&out), 0o700);
    assert_eq!(mode(&written[0]), 0o644);
    assert_eq!(mode(&written[1]), 0o600);
    assert!(fs::read_to_string(&written[0])
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----\n"));
    assert!(fs::read_to_string(&written[1])
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----\n"));

    let before = fs::read_to_string(&written[1]).unwrap();
    assert!(matches!(
        loaded.write_agent(&out, "node-1", &[], false),
        Err(CertError::Exists(path)) if path == written[0]
    ));
    assert_eq!(fs::read_to_string(&written[1]).unwrap(), before);
    loaded.write_agent(&out, "node-1", &[], true).unwrap();
    assert_ne!(fs::read_to_string(&written[1]).unwrap(), before);
}

#[test]
fn write_agent_refuses_a_bad_node_name_before_writing() {
    let (tmp, _) = pki_dir();
    let loaded = ClusterCa::load(tmp.path()).unwrap();
    let out = tmp.path().join("nodes");
    assert!(matches!(
        loaded.write_agent(&out, "../node", &[], false),
        Err(CertError::InvalidNodeName { .. })
    ));
    assert!(!out.exists());
}

#[test]
fn a_missing_cluster_ca_is_an_io_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    match ClusterCa::load(tmp.path()) {
        Err(CertError::Io {
            action,
            path,
            source,
        }) => {
            assert_eq!((action, path), ("read", tmp.path().join("cluster-ca.crt")));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }

    let (tmp, _) = pki_dir();
    fs::remove_file(tmp.path().join("cluster-ca.key")).unwrap();
    assert!(matches!(
        ClusterCa::load(tmp.path()),
        Err(CertError::Io { path, .. }) if path == tmp.path().join("cluster-ca.key")
    ));
}

#[test]
fn an_old_one_ca_directory_gets_the_migration_hint() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("ca.crt"), "old").unwrap();
    fs::write(tmp.path().join("ca.key"), "old").unwrap();
    let err = ClusterCa::load(tmp.path()).unwrap_err();
    assert!(
        matches!(&err, CertError::OldLayout { dir } if dir == tmp.path()),
        "{err:?}"
    );
    assert!(err.to_string().contains("--allow-shared-ca"), "{err}");
}

#[test]
fn a_key_that_is_not_the_cas_is_a_mismatch() {
    let (tmp, _) = pki_dir();
    let dir = tmp.path();
    fs::copy(dir.join("frontend-ca.key"), dir.join("cluster-ca.key")).unwrap();
    let err = ClusterCa::load(dir).unwrap_err();
    assert!(
        matches!(&err, CertError::CaKeyMismatch { cert, key }
            if cert == &dir.join("cluster-ca.crt") && key == &dir.join("cluster-ca.key")),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "{}/cluster-ca.key is not the private key of {}/cluster-ca.crt",
            dir.display(),
            dir.display()
        )
    );
}

#[test]
fn a_leaf_in_place_of_the_ca_is_not_a_ca() {
    let (tmp, _) = pki_dir();
    let dir = tmp.path();
    fs::copy(dir.join("cluster.crt"), dir.join("cluster-ca.crt")).unwrap();
    fs::copy(dir.join("cluster.key"), dir.join("cluster-ca.key")).unwrap();
    assert_eq!(
        invalid_ca(dir),
        (dir.join("cluster-ca.crt"), "not a CA certificate")
    );
}

#[test]
fn files_that_are_not_pem_are_invalid() {
    let (tmp, _) = pki_dir();
    let dir = tmp.path();
    let key = fs::read_to_string(dir.join("cluster-ca.key")).unwrap();

    fs::write(dir.join("cluster-ca.crt"), "not a certificate").unwrap();
    assert_eq!(
        invalid_ca(dir),
        (dir.join("cluster-ca.crt"), "not a PEM certificate")
    );
    fs::write(dir.join("cluster-ca.crt"), &key).unwrap();
    assert_eq!(
        invalid_ca(dir),
        (dir.join("cluster-ca.crt"), "not a PEM certificate")
    );

    fs::copy(dir.join("frontend-ca.crt"), dir.join("cluster-ca.crt")).unwrap();
    fs::write(dir.join("cluster-ca.key"), "not a key").unwrap();
    assert_eq!(
        invalid_ca(dir),
        (dir.join("cluster-ca.key"), "not a PEM PKCS#8 private key")
    );
}

#[test]
fn an_expired_ca_is_invalid() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "bridgehead-cluster-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let now = OffsetDateTime::now_utc();
    (params.not_before, params.not_after) = (now - Duration::days(2), now - Duration::days(1));
    let cert = params.self_signed(&key).unwrap();
    fs::write(dir.join("cluster-ca.crt"), cert.pem()).unwrap();
    fs::write(dir.join("cluster-ca.key"), key.serialize_pem()).unwrap();

    assert_eq!(
        invalid_ca(dir),
        (
            dir.join("cluster-ca.crt"),
            "the CA is expired or not valid yet"
        )
    );
}
