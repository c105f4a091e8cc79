//! Which build runs: every binary's `--version` names the workspace's version and the commit
//! checked out when it was built; the server and the agent log both on their first line and
//! export them as `bridgehead_build_info`.

use std::process::Command;

use bridgehead_e2e::process::{binary, start_pair};
use bridgehead_e2e::{Pki, ServerOptions};

/// The version every binary carries: the workspace's, which this crate shares.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The first 12 hex digits of the commit checked out here, asked of git itself (not of the
/// constant the binaries were built with, which is what is under test).
fn checked_out_commit() -> Option<String> {
    let output = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let head = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && head.trim().len() >= 12).then(|| head.trim()[..12].to_owned())
}

#[test]
fn version_names_the_version_and_the_commit() {
    let Some(commit) = checked_out_commit() else {
        return bridgehead_e2e::skip::skip(
            "version_names_the_version_and_the_commit",
            "not in a git checkout",
        );
    };
    for name in ["bridgehead-server", "bridgehead-agent", "bridgehead-certs"] {
        let output = Command::new(binary(name).unwrap())
            .arg("--version")
            .output()
            .unwrap();
        assert!(output.status.success(), "{name} --version: {output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("{name} {VERSION} (commit {commit})\n"),
            "{name} --version"
        );
    }
}

#[test]
fn first_log_line_and_metric_name_the_build() {
    let pki = Pki::new().unwrap();
    let json = ServerOptions {
        args: vec!["--log-format".into(), "json".into()],
        ..Default::default()
    };
    let (server, agent) = start_pair(&pki, json).unwrap();
    let commit = bridgehead_runtime::build::COMMIT;
    assert_eq!(commit.len(), 12, "{commit}");

    // The server's log is JSON: the first line's fields.
    let log = server.process.stderr();
    let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(first["message"], "starting", "{log}");
    assert_eq!(first["program"], "bridgehead-server", "{log}");
    assert_eq!(first["version"], VERSION, "{log}");
    assert_eq!(first["commit"], commit, "{log}");
    // The agent's is text.
    let log = agent.process.stderr();
    let first = log.lines().next().unwrap();
    for part in [
        "starting",
        "program=\"bridgehead-agent\"",
        &format!("version=\"{VERSION}\""),
        &format!("commit=\"{commit}\""),
    ] {
        assert!(first.contains(part), "{part} not in the first line: {log}");
    }

    let series = format!("bridgehead_build_info{{version=\"{VERSION}\",commit=\"{commit}\"}}");
    assert_eq!(server.metric(&series).unwrap(), 1.0, "server: {series}");
    assert_eq!(agent.metric(&series).unwrap(), 1.0, "agent: {series}");
}
