//! Go's own TLS and HTTP stacks, dialing the way kube-apiserver's egress selector does
//! (`e2e/go/kubeclient.go`): Go sends its client certificate only when the server names its
//! CA, reads the response with `http.ReadResponse` and fails on any byte buffered after it.
//! Needs the `go` toolchain (CI installs Debian's golang-go); without it the tests are skipped
//! loudly, and a client that does not build fails them with the compiler's message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use bridgehead_e2e::process::start_pair;
use bridgehead_e2e::{target, Pki, Server, ServerOptions};

/// Builds the Go client once per test binary: `Ok(None)` when there is no Go toolchain, an
/// error with the compiler's message when it does not build.
fn kubeclient() -> Result<Option<&'static Path>, &'static str> {
    static BUILT: OnceLock<Result<Option<PathBuf>, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("bridgehead-kubeclient-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let binary = dir.join("kubeclient");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("go/kubeclient.go");
        let output = Command::new("go")
            .arg("build")
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GO111MODULE", "off")
            .output();
        match output {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("running go build: {error}")),
            Ok(output) if output.status.success() => Ok(Some(binary)),
            Ok(output) => Err(format!(
                "go build of {} failed:\n{}",
                source.display(),
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    });
    match built {
        Ok(binary) => Ok(binary.as_deref()),
        Err(message) => Err(message),
    }
}

macro_rules! go_or_skip {
    ($name:literal) => {
        match kubeclient() {
            Ok(Some(client)) => client,
            Ok(None) => {
                return bridgehead_e2e::skip::skip(
                    $name,
                    "no Go toolchain: apt-get install golang-go",
                )
            }
            Err(message) => panic!("{message}"),
        }
    };
}

fn run_tcp(client: &Path, pki: &Pki, server: &Server, target: &str, message: &str) -> Output {
    Command::new(client)
        .arg("tcp")
        .arg(server.frontend_addr().to_string())
        .arg(pki.path("ca.crt"))
        .arg(pki.path("client.crt"))
        .arg(pki.path("client.key"))
        .args([target, message])
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "Go client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn go_client_tunnels_through_the_mtls_frontend() {
    let client = go_or_skip!("go_client_tunnels_through_the_mtls_frontend");
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let out = run_tcp(client, &pki, &server, &echo.to_string(), "hello from Go");
    assert_eq!(stdout(&out), "hello from Go");
    let v6 = target::echo("[::1]:0").unwrap();
    assert_eq!(
        stdout(&run_tcp(client, &pki, &server, &v6.to_string(), "v6")),
        "v6"
    );
}

#[test]
fn go_client_tunnels_through_the_unix_socket() {
    let client = go_or_skip!("go_client_tunnels_through_the_unix_socket");
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bridgehead.sock");
    let (_server, _agent) = start_pair(
        &pki,
        ServerOptions {
            uds: Some(socket.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let out = Command::new(client)
        .arg("uds")
        .arg(&socket)
        .args([&echo.to_string(), "over the socket"])
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "over the socket");
}

/// A target that speaks first must not make Go see bytes buffered behind the 200.
#[test]
fn go_client_accepts_a_speak_first_target() {
    let client = go_or_skip!("go_client_accepts_a_speak_first_target");
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let greeter = target::who_am_i("127.0.0.1:0", "220 greetings").unwrap();
    for _ in 0..3 {
        // The message has the greeting's length: the client prints what it reads back.
        let out = run_tcp(
            client,
            &pki,
            &server,
            &greeter.to_string(),
            "EHLO bridgehd\n",
        );
        assert_eq!(stdout(&out), "220 greetings\n");
    }
}

#[test]
fn go_client_sees_the_failure_status() {
    let client = go_or_skip!("go_client_sees_the_failure_status");
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let out = run_tcp(client, &pki, &server, "127.0.0.1:9", "x");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("503") && stderr.contains("no agent"),
        "{stderr}"
    );
}
