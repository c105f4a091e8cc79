//! The command line: defaults, validation, and the binary's exit code 64 on a bad config.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bridgehead_agent::Cli;
use bridgehead_certs::Pki;
use clap::Parser;

struct Files {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pki");
        Pki::generate(&[]).unwrap().write_dir(&path, false).unwrap();
        Files { _dir: dir, path }
    }

    fn file(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }
}

fn parse(args: &[&str]) -> anyhow::Result<bridgehead_agent::Config> {
    let cli = Cli::try_parse_from(std::iter::once("bridgehead-agent").chain(args.iter().copied()))?;
    cli.into_config()
}

fn error_of(args: &[&str]) -> String {
    format!("{:#}", parse(args).unwrap_err())
}

#[test]
fn defaults() {
    let f = Files::new();
    let ca = f.file("cluster-ca.crt");
    let config = parse(&["--ca-cert", &ca, "--agent-id", "a1"]).unwrap();
    assert_eq!(config.servers.host, "127.0.0.1");
    assert_eq!(config.servers.port, 8132);
    assert_eq!(config.server_authority(), "127.0.0.1:8132");
    assert_eq!(config.process.health_address.to_string(), "0.0.0.0:8093");
    assert_eq!(config.sessions.keepalive().interval_ms, 5_000);
    assert_eq!(config.sessions.keepalive().timeout_ms, 15_000);
    assert_eq!(config.servers.sync_interval, Duration::from_secs(1));
    // ANP's defaults: 1s, growing to 10s.
    assert_eq!(config.servers.sync_interval_cap, Duration::from_secs(10));
    assert!(!config.servers.sync_forever);
    assert_eq!(config.sessions.drain_grace_period, Duration::from_secs(30));
    assert_eq!(config.sessions.max_tunnels, 10_000);
    assert_eq!(config.agent_id(), "a1");
    for (flag, expected) in [
        ("--sync-forever", true),
        ("--sync-forever=true", true),
        ("--sync-forever=false", false),
    ] {
        let config = parse(&["--ca-cert", &ca, flag]).unwrap();
        assert_eq!(config.servers.sync_forever, expected, "{flag}");
    }
    assert_eq!(config.identifiers.to_query(), "id=a1");
    assert!(config.tls.client_cert.is_none());
    assert!(config.tls.token_path.is_none());
}

#[test]
fn several_server_addresses() {
    let f = Files::new();
    let ca = f.file("cluster-ca.crt");
    let config = parse(&[
        "--ca-cert",
        &ca,
        "--proxy-server-host",
        "10.0.0.1, [fd00::1] ,servers.example",
    ])
    .unwrap();
    assert_eq!(
        config.servers.hosts,
        ["10.0.0.1", "fd00::1", "servers.example"]
    );
    assert_eq!(config.servers.host, "10.0.0.1");
}

#[test]
fn lease_counting() {
    let f = Files::new();
    let ca = f.file("cluster-ca.crt");
    let with = |extra: &[&str]| parse(&[&["--ca-cert", &ca][..], extra].concat());
    assert!(with(&[]).unwrap().servers.lease_counting.is_none());
    assert!(with(&["--count-server-leases=false"])
        .unwrap()
        .servers
        .lease_counting
        .is_none());
    // ANP's defaults.
    let leases = with(&["--count-server-leases"])
        .unwrap()
        .servers
        .lease_counting
        .unwrap();
    assert_eq!(leases.namespace, "kube-system");
    assert_eq!(leases.selector, "k8s-app=konnectivity-server");
    assert_eq!(leases.kubeconfig, None);
    assert!(!leases.max_with_answers);
    let leases = with(&[
        "--count-server-leases=true",
        "--lease-namespace=bh",
        "--lease-label-selector=app=bh,tier!=test",
        "--kubeconfig=/k",
        "--server-count-source=max",
    ])
    .unwrap()
    .servers
    .lease_counting
    .unwrap();
    assert_eq!(leases.namespace, "bh");
    assert_eq!(leases.selector, "app=bh,tier!=test");
    assert_eq!(
        leases.kubeconfig.as_deref(),
        Some(std::path::Path::new("/k"))
    );
    assert!(leases.max_with_answers);
    // The deprecated spelling still works.
    let leases = with(&["--count-server-leases", "--lease-label=app=old"])
        .unwrap()
        .servers
        .lease_counting
        .unwrap();
    assert_eq!(leases.selector, "app=old");
    for (args, want) in [
        (
            &["--lease-label-selector=*bad*"][..],
            "--lease-label-selector",
        ),
        (&["--lease-label-selector="], "empty label selector"),
        (&["--lease-namespace="], "--lease-namespace is empty"),
    ] {
        let error = format!(
            "{:#}",
            with(&[&["--count-server-leases"], args].concat()).unwrap_err()
        );
        assert!(error.contains(want), "{args:?}: {error}");
    }
    assert!(with(&["--server-count-source=min"]).is_err());
}

#[test]
fn identifiers_and_server_name() {
    let f = Files::new();
    let (ca, crt, key) = (
        f.file("cluster-ca.crt"),
        f.file("agent.crt"),
        f.file("agent.key"),
    );
    let config = parse(&[
        "--ca-cert",
        &ca,
        "--agent-cert",
        &crt,
        "--agent-key",
        &key,
        "--agent-id",
        "node-1",
        "--agent-identifiers",
        "host=node1&ipv4=10.0.0.5&ipv6=fd00::5&cidr=10.244.1.7/24&default-route=true",
        "--proxy-server-host",
        "[::1]",
        "--keepalive-time",
        "500ms",
    ])
    .unwrap();
    assert_eq!(
        config.identifiers.to_query(),
        "id=node-1&host=node1&ipv4=10.0.0.5&ipv6=fd00%3A%3A5&cidr=10.244.1.0%2F24&default-route=true"
    );
    assert_eq!(config.servers.host, "::1");
    assert_eq!(config.servers.hosts, ["::1"]);
    assert_eq!(config.server_authority(), "[::1]:8132");
    assert!(
        matches!(
            config.tls.server_name,
            rustls_pki_types::ServerName::IpAddress(_)
        ),
        "{:?}",
        config.tls.server_name
    );
    assert_eq!(config.sessions.keepalive().timeout_ms, 1_500);
    assert!(config.tls.client_cert.is_some());
}

#[test]
fn id_from_the_identifiers() {
    let f = Files::new();
    let config = parse(&[
        "--ca-cert",
        &f.file("cluster-ca.crt"),
        "--agent-identifiers",
        "host=a&id=from-query",
    ])
    .unwrap();
    assert_eq!(config.agent_id(), "from-query");
    assert_eq!(config.identifiers.to_query(), "id=from-query&host=a");
}

#[test]
fn default_agent_id_is_set() {
    let f = Files::new();
    let config = parse(&["--ca-cert", &f.file("cluster-ca.crt")]).unwrap();
    assert!(!config.agent_id().is_empty());
}

#[test]
fn invalid_configs() {
    let f = Files::new();
    let (ca, crt, key) = (
        f.file("cluster-ca.crt"),
        f.file("agent.crt"),
        f.file("agent.key"),
    );
    let cases: &[(&[&str], &str)] = &[
        (
            &["--agent-identifiers", "host=a&zone=b"],
            "unknown identifier key \"zone\"",
        ),
        (
            &["--agent-identifiers", "ipv4=10.0.0.300"],
            "invalid --agent-identifiers",
        ),
        (
            &["--agent-identifiers", "id=x&host=a", "--agent-id", "y"],
            "--agent-identifiers sets id= and --agent-id is given too",
        ),
        (&["--agent-id", "has space"], "invalid --agent-id"),
        (&["--agent-cert", &crt], "--agent-cert needs --agent-key"),
        (&["--agent-key", &key], "--agent-key needs --agent-cert"),
        (&["--agent-cert", &crt, "--agent-key", &ca], "--agent-key"),
        (
            &["--keepalive-time", "0"],
            "--keepalive-time must be above 0",
        ),
        (&["--max-tunnels", "0"], "--max-tunnels must be above 0"),
        (
            &["--sync-interval", "10s", "--sync-interval-cap", "1s"],
            "--sync-interval-cap",
        ),
        (&["--server-name", "bad name!"], "invalid --server-name"),
        (
            &["--proxy-server-host", "10.0.0.1,,10.0.0.2"],
            "--proxy-server-host is empty, or has an empty entry",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["--ca-cert", ca.as_str()];
        all.extend_from_slice(args);
        let error = error_of(&all);
        assert!(error.contains(want), "{args:?}: {error}");
    }
    let error = error_of(&["--ca-cert", "/nonexistent/ca.crt"]);
    assert!(error.contains("loading --ca-cert"), "{error}");
}

#[test]
fn bad_durations_are_clap_errors() {
    let error = Cli::try_parse_from([
        "bridgehead-agent",
        "--ca-cert",
        "x",
        "--sync-interval",
        "1x",
    ])
    .unwrap_err();
    assert!(error.to_string().contains("invalid duration"), "{error}");
}

fn run_binary(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_bridgehead-agent"))
        .args(args)
        .env_remove("BRIDGEHEAD_AGENT_ID")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_usage_error(args: &[&str], want: &str) {
    let (code, stderr) = run_binary(args);
    assert_eq!(code, Some(64), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("bridgehead-agent: "), "{stderr:?}");
    assert!(stderr.contains(want), "{stderr:?} lacks {want:?}");
}

#[test]
fn binary_exits_64_on_bad_config() {
    let f = Files::new();
    let (ca, crt) = (f.file("cluster-ca.crt"), f.file("agent.crt"));
    assert_usage_error(
        &[
            "--ca-cert",
            &ca,
            "--agent-identifiers",
            "host=a&colour=blue",
        ],
        "unknown identifier key \"colour\"",
    );
    assert_usage_error(
        &["--ca-cert", &ca, "--agent-cert", &crt],
        "--agent-cert needs --agent-key",
    );
    assert_usage_error(
        &["--ca-cert", &ca, "--drain-grace-period", "soon"],
        "invalid duration",
    );
    assert_usage_error(&[], "--ca-cert");
    assert_usage_error(&["--ca-cert", &ca, "--no-such-flag"], "--no-such-flag");
    let missing = Path::new("/nonexistent/ca.crt").display().to_string();
    assert_usage_error(&["--ca-cert", &missing], "loading --ca-cert");
}

#[test]
fn binary_help_and_version_exit_0() {
    for flag in ["--help", "--version"] {
        let output = Command::new(env!("CARGO_BIN_EXE_bridgehead-agent"))
            .arg(flag)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{flag}");
    }
}

#[test]
fn flags_read_the_environment() {
    let f = Files::new();
    let output = Command::new(env!("CARGO_BIN_EXE_bridgehead-agent"))
        .env("BRIDGEHEAD_CA_CERT", f.file("cluster-ca.crt"))
        .env("BRIDGEHEAD_AGENT_IDENTIFIERS", "host=a&shoe-size=9")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("shoe-size"));
}

#[test]
fn a_missing_or_empty_token_file_is_an_error_at_startup() {
    let f = Files::new();
    let ca = f.file("cluster-ca.crt");
    let missing = f.path.join("no-such-token").display().to_string();
    let error = error_of(&["--ca-cert", &ca, "--service-account-token-path", &missing]);
    assert!(
        error.contains("--service-account-token-path") && error.contains("no-such-token"),
        "{error}"
    );
    let empty = f.path.join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.display().to_string();
    let error = error_of(&["--ca-cert", &ca, "--service-account-token-path", &empty]);
    assert!(error.contains("is empty"), "{error}");
    let good = f.path.join("token");
    std::fs::write(&good, "a-token\n").unwrap();
    let good = good.display().to_string();
    let config = parse(&["--ca-cert", &ca, "--service-account-token-path", &good]).unwrap();
    assert_eq!(config.tls.token_path.as_deref(), Some(Path::new(&good)));
}
