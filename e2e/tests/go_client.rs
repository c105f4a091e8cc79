//! kube-apiserver's own egress dialer (k8s.io/apiserver `pkg/server/egressselector`, built
//! from its Go module as `kubeclient` by `scripts/k8s-build.sh`) dialing through Bridgehead:
//! Go's TLS sends its client certificate only when the server names its CA, the dialer reads
//! the response with `http.ReadResponse` and fails on any byte buffered after it, and on a
//! refusal it reports only the status line. Skipped loudly where it is not built.

use std::path::Path;
use std::process::{Command, Output};

use bridgehead_e2e::kubernetes::Binaries;
use bridgehead_e2e::process::start_pair;
use bridgehead_e2e::{target, Pki, Server, ServerOptions};

/// kubeclient, or a loud skip of `$name`.
macro_rules! go_or_skip {
    ($name:literal) => {
        match Binaries::find() {
            Some(binaries) => binaries.kubeclient,
            None => {
                return bridgehead_e2e::skip::skip(
                    $name,
                    "kubeclient not built: run scripts/k8s-build.sh (needs Go)",
                )
            }
        }
    };
}

fn run_tcp(client: &Path, pki: &Pki, server: &Server, target: &str, message: &str) -> Output {
    Command::new(client)
        .arg("tcp")
        .arg(server.frontend_addr().to_string())
        .arg(pki.path("frontend-ca.crt"))
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
    let out = run_tcp(&client, &pki, &server, &echo.to_string(), "hello from Go");
    assert_eq!(stdout(&out), "hello from Go");
    let v6 = target::echo("[::1]:0").unwrap();
    assert_eq!(
        stdout(&run_tcp(&client, &pki, &server, &v6.to_string(), "v6")),
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
    let out = Command::new(&client)
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
            &client,
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
    let out = run_tcp(&client, &pki, &server, "127.0.0.1:9", "x");
    assert!(!out.status.success());
    // The dialer reports the status line alone: the reason travels in its reason phrase.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("code 503: 503 no agent matches (tried default)"),
        "{stderr}"
    );
}
