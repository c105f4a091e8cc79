//! The linux/arm64 binaries, run under qemu-user on this (amd64) machine: built as
//! scripts/release.sh builds them (scripts/build-static.sh: the same sources, target, static
//! glibc, remapped paths and commit), each is an aarch64 program with no loader and no shared
//! library, prints its version, makes a PKI, and a server and an agent of it carry a real
//! `curl -p` through the tunnel.
//!
//! The release's build, not a cheaper one: docs/release.md ("CI") has the measured cost of a
//! dev-profile cross build, and what the by-hand release checks beyond this.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bridgehead_e2e::client::curl;
use bridgehead_e2e::process::output_within;
use bridgehead_e2e::release::{elf, missing_to_build, static_binaries, EM_AARCH64};
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions, Wrapper};

const TEST: &str = "arm64_binaries_run_and_tunnel_under_qemu";
const PLATFORM: &str = "linux/arm64";
/// Startup and registration waits are multiplied by this: emulated, a TLS handshake and the
/// process start take several times longer.
const PATIENCE: u32 = 10;

/// qemu-user for aarch64 (Debian's qemu-user-static), if installed.
fn qemu() -> Option<PathBuf> {
    ["qemu-aarch64-static", "qemu-aarch64"]
        .iter()
        .find_map(|name| {
            let output = Command::new(name).arg("--version").output().ok()?;
            output.status.success().then(|| PathBuf::from(name))
        })
}

#[test]
fn arm64_binaries_run_and_tunnel_under_qemu() {
    let Some(qemu) = qemu() else {
        return bridgehead_e2e::skip::skip(TEST, "needs qemu-user (Debian's qemu-user-static)");
    };
    let missing = missing_to_build(&[PLATFORM]);
    if !missing.is_empty() {
        let reason = format!(
            "building for {PLATFORM} needs {}: scripts/install-test-deps.sh (as root) installs them",
            missing.join(", ")
        );
        return bridgehead_e2e::skip::skip(TEST, &reason);
    }
    let bin = static_binaries(PLATFORM).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let commit = bridgehead_runtime::build::COMMIT;
    for name in ["bridgehead-server", "bridgehead-agent", "bridgehead-certs"] {
        let path = bin.join(name);
        assert_eq!(
            elf(&path).unwrap(),
            (EM_AARCH64, false),
            "{name}: aarch64, static"
        );
        let mut command = Command::new(&qemu);
        command.arg(&path).arg("--version");
        let output = output_within(command, Duration::from_secs(60)).unwrap();
        assert!(output.status.success(), "{name} --version: {output:?}");
        // `-dirty` after the commit where the tree has changes (scripts/build-static.sh).
        let stdout = String::from_utf8_lossy(&output.stdout);
        let expected = format!("{name} {version} (commit {commit}");
        assert!(
            stdout.starts_with(&expected),
            "{stdout:?}, not {expected:?}"
        );
    }

    // The PKI from the arm64 bridgehead-certs, written over a fresh one's files: the server,
    // the agent and curl below read every certificate and key from these paths.
    let pki = Pki::new().unwrap();
    let mut init = Command::new(&qemu);
    init.arg(bin.join("bridgehead-certs"))
        .args(["init", "--force", "--dir"])
        .arg(pki.dir());
    let output = output_within(init, Duration::from_secs(120)).unwrap();
    assert!(output.status.success(), "certs init: {output:?}");

    let under_qemu = Wrapper {
        command: vec![qemu.clone().into()],
        patience: PATIENCE,
    };
    let server = Server::start(
        &pki,
        ServerOptions {
            wrapper: Some(under_qemu.clone()),
            bin_dir: Some(bin.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let _agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            wrapper: Some(under_qemu),
            bin_dir: Some(bin),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let web = target::who_am_i(
        "127.0.0.1:0",
        "HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nfrom arm64!",
    )
    .unwrap();
    let out = curl(&pki, &server.frontend, &format!("http://{web}/"), &[]).unwrap();
    assert!(
        out.status.success(),
        "curl -p through the arm64 server and agent: {}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.process.stderr()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from arm64!\n");
}
