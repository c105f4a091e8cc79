//! The `bridgehead-certs` binary end to end: exit codes, output lines, flags from the
//! environment.

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;
use x509_parser::prelude::X509Certificate;

const EXIT_USAGE: i32 = 64;

/// The binary with no `BRIDGEHEAD_*` variables inherited from the test's environment.
fn certs() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bridgehead-certs"));
    for var in [
        "BRIDGEHEAD_DIR",
        "BRIDGEHEAD_SAN",
        "BRIDGEHEAD_FORCE",
        "BRIDGEHEAD_NODE",
        "BRIDGEHEAD_ADDRESS",
        "BRIDGEHEAD_OUT",
    ] {
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

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn pem(path: &Path) -> Pem {
    let bytes = fs::read(path).unwrap();
    Pem::read(std::io::Cursor::new(bytes)).unwrap().0
}

fn sans(path: &Path) -> Vec<String> {
    let pem = pem(path);
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
                "wrote {d}/frontend-ca.crt  (frontend CA: bridgehead-server --server-ca-cert, to \
                 verify CONNECT clients; caBundle in kube-apiserver's EgressSelectorConfiguration \
                 and curl --proxy-cacert, to verify the frontend)"
            ),
            format!(
                "wrote {d}/frontend-ca.key  (frontend CA private key: no component reads it; keep \
                 it off the cluster)"
            ),
            format!(
                "wrote {d}/server.crt, server.key  (bridgehead-server --server-cert/--server-key: \
                 the CONNECT frontend)"
            ),
            format!(
                "wrote {d}/client.crt, client.key  (kube-apiserver clientCert/clientKey; curl \
                 --proxy-cert/--proxy-key)"
            ),
            format!(
                "wrote {d}/cluster-ca.crt  (cluster CA: bridgehead-server --cluster-ca-cert, to \
                 verify agents; bridgehead-agent --ca-cert, to verify the agent endpoint)"
            ),
            format!(
                "wrote {d}/cluster-ca.key  (cluster CA private key: no component reads it; keep \
                 it off the cluster; bridgehead-certs agent signs per-node agent certificates \
                 with it)"
            ),
            format!(
                "wrote {d}/cluster.crt, cluster.key  (bridgehead-server \
                 --cluster-cert/--cluster-key: the agent endpoint)"
            ),
            format!(
                "wrote {d}/agent.crt, agent.key  (bridgehead-agent --agent-cert/--agent-key, \
                 shared by every node; bridgehead-certs agent makes one per node)"
            ),
            format!(
                "wrote {d}/peer.crt, peer.key  (bridgehead-server --peer-cert/--peer-key (and \
                 --peer-ca-cert frontend-ca.crt): servers that forward tunnels to each other)"
            ),
        ]
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 14);
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
    let ca = fs::read_to_string(tmp.path().join("frontend-ca.crt")).unwrap();

    let (code, stdout, stderr) = run(&mut init());
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "bridgehead-certs: {}/frontend-ca.crt already exists; refusing to overwrite it \
             (pass --force to replace the PKI)\n",
            tmp.path().display()
        )
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("frontend-ca.crt")).unwrap(),
        ca
    );

    let (code, stdout, stderr) = run(init().arg("--force"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 9);
    assert_ne!(
        fs::read_to_string(tmp.path().join("frontend-ca.crt")).unwrap(),
        ca
    );
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
    assert!(stdout.starts_with(&format!(
        "wrote {}/frontend-ca.crt  (",
        tmp.path().display()
    )));
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
        &["agent", "--dir", "x"],
        &["agent", "--node", "n"],
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

/// The old-layout refusal, as `bridgehead-certs` prints it for `dir`.
fn old_layout_message(dir: &Path) -> String {
    format!(
        "bridgehead-certs: {} holds an old one-CA PKI (ca.crt, ca.key): that CA signed every \
         certificate, so the agent certificate on every node is also accepted by the CONNECT \
         frontend. Make a new PKI with two CAs (`bridgehead-certs init` into a new directory, or \
         into this one with --force, which leaves ca.crt and ca.key for you to delete) and roll \
         it out: bridgehead-server --server-cert/--server-key/--server-ca-cert \
         (frontend-ca.crt) and --cluster-cert/--cluster-key/--cluster-ca-cert (cluster-ca.crt); \
         every agent's --ca-cert (cluster-ca.crt) and --agent-cert/--agent-key; \
         kube-apiserver's caBundle (frontend-ca.crt) and clientCert/clientKey. Until then, keep \
         running the old PKI with bridgehead-server --allow-shared-ca\n",
        dir.display()
    )
}

/// What an older bridgehead-certs wrote.
fn old_layout(dir: &Path) {
    for name in ["ca", "server", "cluster", "client", "agent"] {
        fs::write(dir.join(format!("{name}.crt")), "old").unwrap();
        fs::write(dir.join(format!("{name}.key")), "old").unwrap();
    }
}

#[test]
fn init_refuses_an_old_one_ca_directory_with_the_migration_and_force_migrates_it() {
    let tmp = tempfile::tempdir().unwrap();
    old_layout(tmp.path());

    let (code, stdout, stderr) = run(certs().args(["init", "--dir"]).arg(tmp.path()));
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert_eq!(stderr, old_layout_message(tmp.path()));
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 10);

    let (code, stdout, stderr) = run(certs().args(["init", "--force", "--dir"]).arg(tmp.path()));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 9);
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 16);
    assert_eq!(
        fs::read_to_string(tmp.path().join("ca.key")).unwrap(),
        "old"
    );
}

#[test]
fn agent_writes_a_node_certificate_chained_to_the_cluster_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    assert_eq!(run(certs().args(["init", "--dir"]).arg(&dir)).0, 0);

    let (code, stdout, stderr) = run(certs().args(["agent", "--dir"]).arg(&dir).args([
        "--node",
        "node-1",
        "--address",
        "10.0.0.5",
        "--address",
        "fd00::5",
    ]));

    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    assert_eq!(
        stdout,
        format!(
            "wrote {}/agent-node-1.crt, agent-node-1.key  (bridgehead-agent \
             --agent-cert/--agent-key on node node-1; SANs node-1, 10.0.0.5, fd00::5: what the \
             server's --bind-agent-identifiers lets it announce as host, ipv4 and ipv6)\n",
            dir.display()
        )
    );
    let crt = dir.join("agent-node-1.crt");
    assert_eq!(sans(&crt), ["node-1", "10.0.0.5", "fd00::5"]);
    assert_eq!(mode(&crt), 0o644);
    assert_eq!(mode(&dir.join("agent-node-1.key")), 0o600);

    let agent = pem(&crt);
    let agent = agent.parse_x509().unwrap();
    let subject = |cert: &X509Certificate<'_>| cert.subject().to_string();
    assert_eq!(subject(&agent), "CN=node-1");
    assert_eq!(agent.issuer().to_string(), "CN=bridgehead-cluster-ca");
    assert!(
        agent
            .extended_key_usage()
            .unwrap()
            .unwrap()
            .value
            .client_auth
    );
    let cluster_ca = pem(&dir.join("cluster-ca.crt"));
    let cluster_ca = cluster_ca.parse_x509().unwrap();
    agent
        .verify_signature(Some(cluster_ca.public_key()))
        .unwrap();
    let frontend_ca = pem(&dir.join("frontend-ca.crt"));
    let frontend_ca = frontend_ca.parse_x509().unwrap();
    assert!(agent
        .verify_signature(Some(frontend_ca.public_key()))
        .is_err());
}

#[test]
fn agent_writes_into_out_from_the_environment_and_replaces_only_with_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let out = tmp.path().join("nodes");
    assert_eq!(run(certs().args(["init", "--dir"]).arg(&dir)).0, 0);
    let agent = || {
        let mut cmd = certs();
        cmd.arg("agent")
            .env("BRIDGEHEAD_DIR", &dir)
            .env("BRIDGEHEAD_NODE", "node-2.example")
            .env("BRIDGEHEAD_ADDRESS", "10.0.0.6,node-2")
            .env("BRIDGEHEAD_OUT", &out);
        cmd
    };

    let (code, _, stderr) = run(&mut agent());
    assert_eq!(code, 0, "{stderr}");
    let crt = out.join("agent-node-2.example.crt");
    assert_eq!(sans(&crt), ["node-2.example", "10.0.0.6", "node-2"]);
    assert_eq!(mode(&out), 0o700);
    assert!(!dir.join("agent-node-2.example.crt").exists());
    let first = fs::read_to_string(&crt).unwrap();

    let (code, stdout, stderr) = run(&mut agent());
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(
        stderr,
        format!(
            "bridgehead-certs: {} already exists; refusing to overwrite it (pass --force to \
             replace it)\n",
            crt.display()
        )
    );
    assert_eq!(fs::read_to_string(&crt).unwrap(), first);

    let (code, _, stderr) = run(agent().env("BRIDGEHEAD_FORCE", "true"));
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(fs::read_to_string(&crt).unwrap(), first);
}

#[test]
fn agent_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = |node: &str| {
        let mut cmd = certs();
        cmd.args(["agent", "--node", node, "--dir"]).arg(tmp.path());
        cmd
    };

    let (code, _, stderr) = run(&mut agent("node-1"));
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "bridgehead-certs: cannot read {}/cluster-ca.crt: No such file or directory (os \
             error 2) (make the PKI with `bridgehead-certs init` first)\n",
            tmp.path().display()
        )
    );

    old_layout(tmp.path());
    let (code, _, stderr) = run(&mut agent("node-1"));
    assert_eq!(code, 1);
    assert_eq!(stderr, old_layout_message(tmp.path()));

    for (node, reason) in [
        ("10.0.0.1", "an IP address; a node name is a DNS name"),
        ("*.nodes", "a wildcard; a node name names one node"),
        ("../x", "empty label (two dots in a row, or a leading dot)"),
        (
            "x/y",
            "DNS names may only hold letters, digits, '-', '_' and '.' (and a leading '*.')",
        ),
    ] {
        let (code, stdout, stderr) = run(&mut agent(node));
        assert_eq!(
            (code, stdout.as_str()),
            (EXIT_USAGE, ""),
            "{node}: {stderr}"
        );
        assert_eq!(
            stderr,
            format!("bridgehead-certs: invalid node name {node:?}: {reason}\n")
        );
    }
    // Usage errors come before the directory is read.
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 10);
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
    let (code, stdout, _) = run(certs().args(["agent", "--help"]));
    assert_eq!(code, 0);
    for expected in [
        "--dir",
        "--node",
        "--address",
        "--out",
        "--force",
        "BRIDGEHEAD_NODE",
        "BRIDGEHEAD_ADDRESS",
        "BRIDGEHEAD_OUT",
    ] {
        assert!(stdout.contains(expected), "{expected} not in {stdout}");
    }
    let (code, stdout, _) = run(certs().arg("--version"));
    assert_eq!(code, 0);
    assert!(stdout.starts_with("bridgehead-certs "), "{stdout}");
}
