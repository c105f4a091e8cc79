//! `Pki::write_dir`: the files, their modes and contents, the refusal to overwrite, and the
//! refusal of a directory holding the old one-CA layout.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bridgehead_certs::{CertError, Pki};

/// The file names, a contract with the scripts that deploy them, in the order written.
const NAMES: [&str; 14] = [
    "frontend-ca.crt",
    "frontend-ca.key",
    "server.crt",
    "server.key",
    "client.crt",
    "client.key",
    "cluster-ca.crt",
    "cluster-ca.key",
    "cluster.crt",
    "cluster.key",
    "agent.crt",
    "agent.key",
    "peer.crt",
    "peer.key",
];

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn writes_every_file_with_its_pem_and_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nested").join("pki");
    let pki = Pki::generate(&[]).unwrap();

    let written = pki.write_dir(&dir, false).unwrap();

    assert_eq!(written, NAMES.map(|name| dir.join(name)));
    assert_eq!(mode(&dir), 0o700);
    let mut listed = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    listed.sort();
    let mut expected = NAMES.map(String::from).to_vec();
    expected.sort();
    assert_eq!(listed, expected);

    let contents = [
        &pki.frontend_ca,
        &pki.server,
        &pki.client,
        &pki.cluster_ca,
        &pki.cluster,
        &pki.agent,
        &pki.peer,
    ]
    .into_iter()
    .flat_map(|ck| [&ck.cert_pem, &ck.key_pem]);
    for (path, content) in written.iter().zip(contents) {
        assert_eq!(&fs::read_to_string(path).unwrap(), content);
        let expected_mode = if path.extension().unwrap() == "key" {
            0o600
        } else {
            0o644
        };
        assert_eq!(mode(path), expected_mode, "{}", path.display());
    }
}

#[test]
fn an_existing_directory_keeps_its_mode() {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o750)).unwrap();
    Pki::generate(&[])
        .unwrap()
        .write_dir(tmp.path(), false)
        .unwrap();
    assert_eq!(mode(tmp.path()), 0o750);
}

#[test]
fn refuses_to_overwrite_and_writes_nothing_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let existing = tmp.path().join("client.key");
    fs::write(&existing, "keep me").unwrap();

    let err = Pki::generate(&[])
        .unwrap()
        .write_dir(tmp.path(), false)
        .unwrap_err();

    match &err {
        CertError::Exists(path) => assert_eq!(path, &existing),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(&existing.display().to_string()));
    assert_eq!(fs::read_to_string(&existing).unwrap(), "keep me");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn a_second_pki_replaces_the_first_with_force() {
    let tmp = tempfile::tempdir().unwrap();
    let first = Pki::generate(&[]).unwrap();
    first.write_dir(tmp.path(), false).unwrap();
    let server_key = tmp.path().join("server.key");
    fs::set_permissions(&server_key, fs::Permissions::from_mode(0o644)).unwrap();

    let second = Pki::generate(&[]).unwrap();
    assert!(matches!(
        second.write_dir(tmp.path(), false),
        Err(CertError::Exists(_))
    ));
    let written = second.write_dir(tmp.path(), true).unwrap();

    assert_eq!(written.len(), NAMES.len());
    assert_eq!(
        fs::read_to_string(tmp.path().join("cluster-ca.crt")).unwrap(),
        second.cluster_ca.cert_pem
    );
    assert_eq!(
        fs::read_to_string(&server_key).unwrap(),
        second.server.key_pem
    );
    assert_eq!(mode(&server_key), 0o600);
}

#[test]
fn force_replaces_a_symlink_instead_of_writing_through_it() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("elsewhere");
    fs::write(&target, "untouched").unwrap();
    let dir = tmp.path().join("pki");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("agent.key")).unwrap();

    let pki = Pki::generate(&[]).unwrap();
    assert!(matches!(
        pki.write_dir(&dir, false),
        Err(CertError::Exists(path)) if path == dir.join("agent.key")
    ));
    pki.write_dir(&dir, true).unwrap();

    assert_eq!(fs::read_to_string(&target).unwrap(), "untouched");
    assert!(!fs::symlink_metadata(dir.join("agent.key"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(mode(&dir.join("agent.key")), 0o600);
}

#[test]
fn a_file_in_the_way_of_the_directory_is_an_io_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    fs::write(&file, "").unwrap();

    let err = Pki::generate(&[])
        .unwrap()
        .write_dir(&file, true)
        .unwrap_err();

    assert!(
        matches!(&err, CertError::Io { path, .. } if path == &file),
        "{err:?}"
    );
    assert!(err.to_string().contains(&file.display().to_string()));
}

/// Writes what an older bridgehead-certs left: one `ca.crt`/`ca.key` and the four leaves.
fn old_layout(dir: &Path) {
    for name in ["ca", "server", "cluster", "client", "agent"] {
        fs::write(
            dir.join(format!("{name}.crt")),
            format!("old {name} certificate"),
        )
        .unwrap();
        fs::write(dir.join(format!("{name}.key")), format!("old {name} key")).unwrap();
    }
}

#[test]
fn refuses_a_directory_with_the_old_one_ca_layout_and_explains_the_migration() {
    let tmp = tempfile::tempdir().unwrap();
    old_layout(tmp.path());
    let pki = Pki::generate(&[]).unwrap();

    let err = pki.write_dir(tmp.path(), false).unwrap_err();

    assert!(
        matches!(&err, CertError::OldLayout { dir } if dir == tmp.path()),
        "{err:?}"
    );
    let message = err.to_string();
    for expected in [
        &format!(
            "{} holds an old one-CA PKI (ca.crt, ca.key)",
            tmp.path().display()
        ),
        "--server-ca-cert (frontend-ca.crt)",
        "--cluster-ca-cert (cluster-ca.crt)",
        "--ca-cert (cluster-ca.crt)",
        "caBundle (frontend-ca.crt) and clientCert/clientKey",
        "--force",
        "bridgehead-server --allow-shared-ca",
    ] {
        assert!(message.contains(expected), "{expected:?} not in {message}");
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 10);
    assert_eq!(
        fs::read_to_string(tmp.path().join("server.key")).unwrap(),
        "old server key"
    );

    for name in ["ca.crt", "ca.key"] {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join(name), "old").unwrap();
        assert!(matches!(
            pki.write_dir(tmp.path(), false),
            Err(CertError::OldLayout { .. })
        ));
    }
}

#[test]
fn force_writes_the_new_layout_over_the_old_and_leaves_the_old_ca_alone() {
    let tmp = tempfile::tempdir().unwrap();
    old_layout(tmp.path());
    let pki = Pki::generate(&[]).unwrap();

    pki.write_dir(tmp.path(), true).unwrap();

    assert_eq!(
        fs::read_to_string(tmp.path().join("server.key")).unwrap(),
        pki.server.key_pem
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("ca.key")).unwrap(),
        "old ca key"
    );
    // Migrated: a second run without --force is refused for the new files, not the old ones.
    let again = Pki::generate(&[]).unwrap().write_dir(tmp.path(), false);
    assert!(
        matches!(&again, Err(CertError::Exists(path)) if path == &tmp.path().join("frontend-ca.crt")),
        "{again:?}"
    );
}
