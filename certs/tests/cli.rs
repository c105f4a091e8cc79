//! The `bridgehead-certs` binary end to end: exit codes, output lines, flags from the
//! environment.

use std::fs;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Output};

use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

const EXIT_USAGE: i32 = 64;

/// The binary with no `BRIDGEHEAD_*` variables inherited from the test's environment.
fn certs() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bridgehead-certs"));
    for var in ["BRIDGEHEAD_DIR", "BRIDGEHEAD_SAN", "BRIDGEHEAD_FORCE"] {
        cmd.env_remove(var);
    }
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap(),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

fn sans(path: &Path) -> Vec<String> {
    let bytes = fs::read(path).unwrap();
    let (pem, _) = Pem::read(std::io::Cursor::new(bytes)).unwrap();
    let cert = pem.parse_x509().unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::DNSName(dns) => dns.to_string(),
            GeneralName::IPAddress(&[a, b, c, d]) => IpAddr::from([a, b, c, d]).to_string(),
            GeneralName::IPAddress(bytes) => {
                IpAddr::from(<[u8; 16]>::try_from(*bytes).unwrap()).to_string()
            }
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn init_writes_the_pki_and_says_which_flag_takes_each_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");

    let (code, stdout, stderr) = run(certs().args(["init", "--dir"]).arg(&dir).args([
        "--san",
        "proxy.example",
        "--san",
        "10.0.0.9",
    ]));

    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    let d = dir.display();
    let lines = stdout.lines().collect::<Vec<_>>();
    assert_eq!(
        lines,
        [
            format!(
                "wrote {d}/ca.crt  (CA: --server-ca-cert and --cluster-ca-cert on \
                 bridgehead-server, --ca-cert on bridgehead-agent, caBundle in kube-apiserver's \
                 EgressSelectorConfiguration, curl --proxy-cacert)"
            ),
            format!("wrote {d}/ca.key  (CA private key: no component reads it; keep it off the cluster)"),
            format!(
                "wrote {d}/server.crt, server.key  (bridgehead-server --server-cert/--server-key: \
                 the CONNECT frontend)"
            ),
            format!(
                "wrote {d}/cluster.crt, cluster.key  (bridgehead-server \
                 --cluster-cert/--cluster-key: the agent endpoint)"
            ),
            format!(
                "wrote {d}/client.crt, client.key  (kube-apiserver clientCert/clientKey; curl \
                 --proxy-cert/--proxy-key)"
            ),
            format!("wrote {d}/agent.crt, agent.key  (bridgehead-agent --agent-cert/--agent-key)"),
        ]
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 10);
    assert_eq!(
        sans(&dir.join("cluster.crt")),
        ["localhost", "127.0.0.1", "::1", "proxy.example", "10.0.0.9",]
    );
}

#[test]
fn init_refuses_to_overwrite_without_force_and_replaces_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let init = || {
        let mut cmd = certs();
        cmd.args(["init", "--dir"]).arg(tmp.path());
        cmd
    };
    assert_eq!(run(&mut init()).0, 0);
    let ca = fs::read_to_string(tmp.path().join("ca.crt")).unwrap();

    let (code, stdout, stderr) = run(&mut init());
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "bridgehead-certs: {}/ca.crt already exists; refusing to overwrite it \
             (pass --force to replace the PKI)\n",
            tmp.path().display()
        )
    );
    assert_eq!(fs::read_to_string(tmp.path().join("ca.crt")).unwrap(), ca);

    let (code, stdout, stderr) = run(init().arg("--force"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 6);
    assert_ne!(fs::read_to_string(tmp.path().join("ca.crt")).unwrap(), ca);
}

#[test]
fn flags_come_from_the_environment_too() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("agent.key"), "old").unwrap();

    let (code, stdout, stderr) = run(certs()
        .arg("init")
        .env("BRIDGEHEAD_DIR", tmp.path())
        .env("BRIDGEHEAD_SAN", "one.example,two.example")
        .env("BRIDGEHEAD_FORCE", "true"));

    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with(&format!("wrote {}/ca.crt  (", tmp.path().display())));
    let sans = sans(&tmp.path().join("server.crt"));
    assert_eq!(sans[3..], ["one.example", "two.example"]);
    assert_ne!(
        fs::read_to_string(tmp.path().join("agent.key")).unwrap(),
        "old"
    );
}

#[test]
fn usage_errors_exit_64() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["init", "--bogus"][..],
        &["init"],
        &[],
        &["frobnicate"],
        &["init", "--dir"],
    ] {
        let (code, stdout, stderr) = run(certs().args(args));
        assert_eq!(code, EXIT_USAGE, "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert!(!stderr.is_empty(), "{args:?}");
    }

    let (code, _, stderr) = run(certs()
        .args(["init", "--san", "bad..name", "--dir"])
        .arg(tmp.path()));
    assert_eq!(code, EXIT_USAGE);
    assert_eq!(
        stderr,
        "bridgehead-certs: invalid SAN \"bad..name\": empty label (two dots in a row, or a \
         leading dot)\n"
    );
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn help_and_version_exit_0() {
    let (code, stdout, _) = run(certs().args(["init", "--help"]));
    assert_eq!(code, 0);
    for expected in [
        "--dir",
        "--san",
        "--force",
        "BRIDGEHEAD_DIR",
        "BRIDGEHEAD_SAN",
        "BRIDGEHEAD_FORCE",
    ] {
        assert!(stdout.contains(expected), "{expected} not in {stdout}");
    }
    let (code, stdout, _) = run(certs().arg("--version"));
    assert_eq!(code, 0);
    assert!(stdout.starts_with("bridgehead-certs "), "{stdout}");
}
