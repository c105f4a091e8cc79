//! `--fallback-proxy` against konnectivity itself (ANP's proxy-server in http-connect mode on
//! a Unix socket, with its own agent; built by `scripts/anp-build.sh`): while no Bridgehead
//! agent matches a target, the CONNECT goes through konnectivity and works; once an agent is
//! there, it wins. And the fallback's failures reach the client as statuses, bounded by the
//! dial timeout; half-close carried both ways. Needs Go for ANP; skipped loudly otherwise.

use std::io::{Read, Write};
use std::time::Duration;

use bridgehead_e2e::client::{
    kube_connect, tls_config, tls_connect, tls_shutdown_write, tls_stream,
};
use bridgehead_e2e::konnectivity::{self, AGENTS};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

fn server_with(pki: &Pki, args: &[String]) -> Server {
    Server::start(
        pki,
        ServerOptions {
            args: args.to_vec(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// A CONNECT to `target` through `server`, an echo round trip of `message` with a half-close,
/// and the whole echo back.
fn echo_through(pki: &Pki, server: &Server, target: &str, message: &[u8]) {
    let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), target).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(
        reply.extra.is_empty(),
        "bytes after the 200: {:?}",
        reply.extra
    );
    conn.write_all(message).unwrap();
    let mut back = vec![0u8; message.len()];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(back, message);
}

#[test]
fn connects_no_agent_matches_go_through_konnectivity_until_an_agent_is_there() {
    let test = "connects_no_agent_matches_go_through_konnectivity_until_an_agent_is_there";
    let Some((anp_server, anp_agent)) = konnectivity::binaries() else {
        bridgehead_e2e::skip::skip(
            test,
            "konnectivity not built: run scripts/anp-build.sh (needs Go)",
        );
        return;
    };
    let pki = Pki::with_sans(&[AGENTS.to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("konnectivity.sock");
    let anp = konnectivity::start_pair(&pki, (&anp_server, &anp_agent), Some(&socket), "fallback")
        .unwrap();
    let server = server_with(
        &pki,
        &[format!("--fallback-proxy=unix://{}", socket.display())],
    );
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let fallback_ok = "bridgehead_server_fallback_dials_total{result=\"ok\"}";

    // No Bridgehead agent: konnectivity carries it, bytes both ways and the half-close.
    echo_through(&pki, &server, &echo, b"through konnectivity");
    echo_through(&pki, &server, &echo, b"again");
    assert_eq!(server.metric(fallback_ok).unwrap(), 2.0);
    wait_until(Duration::from_secs(10), || {
        server.process.stderr().matches("fallback unix://").count() >= 2
    })
    .unwrap_or_else(|_| {
        panic!(
            "no tunnel line names the fallback:\n{}",
            server.process.stderr()
        )
    });

    // What konnectivity answers, the client gets: its agent cannot reach a closed port.
    // Held for the whole test: dropping it frees the port for any other test's listener.
    let closed_port = target::closed_port().unwrap();
    let closed = closed_port.to_string();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &closed).unwrap();
    assert_ne!(reply.status, 200, "{}", reply.head);
    assert!(
        reply.head.contains("fallback proxy") || reply.status >= 500,
        "{}",
        reply.head
    );

    // A Bridgehead agent arrives: it wins every CONNECT it matches.
    let _agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    echo_through(&pki, &server, &echo, b"through bridgehead");
    assert_eq!(server.metric(fallback_ok).unwrap(), 2.0);
    assert_eq!(
        server
            .metric("bridgehead_server_fallback_tunnels_open")
            .unwrap(),
        0.0
    );
    drop(anp);
}

/// Half-close each way through the fallback, with a proxy that keeps it (another Bridgehead
/// server on a Unix socket, with its agent): konnectivity itself ends both directions at its
/// client's EOF, so it cannot show this.
#[test]
fn a_fallback_tunnel_keeps_half_close() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("old-proxy.sock");
    let old = Server::start(
        &pki,
        ServerOptions {
            uds: Some(socket.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let _old_agent = Agent::start(&pki, &old, AgentOptions::default()).unwrap();
    old.wait_agents(1).unwrap();
    let server = server_with(
        &pki,
        &[format!("--fallback-proxy=unix://{}", socket.display())],
    );
    let counter = target::counter("127.0.0.1:0").unwrap().to_string();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let mut tls = tls_stream(config, server.frontend_addr()).unwrap();
    assert_eq!(kube_connect(&mut tls, &counter).unwrap().status, 200);
    // The client's EOF reaches the target, which answers only then.
    tls.write_all(&vec![7u8; 300_000]).unwrap();
    tls_shutdown_write(&mut tls).unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 300000");
    let ok = "bridgehead_server_fallback_dials_total{result=\"ok\"}";
    assert_eq!(server.metric(ok).unwrap(), 1.0);
}

#[test]
fn a_fallback_that_is_gone_or_silent_gets_502_or_504_on_time() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone.sock");
    let silent = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    for (socket, status) in [(&gone, 502), (&silent, 504)] {
        let server = server_with(
            &pki,
            &[
                format!("--fallback-proxy=unix://{}", socket.display()),
                "--dial-timeout=500ms".to_owned(),
            ],
        );
        let started = std::time::Instant::now();
        let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
        let reply = kube_connect(conn.as_mut(), &echo).unwrap();
        assert_eq!(reply.status, status, "{}", reply.head);
        assert!(reply.head.contains("fallback proxy"), "{}", reply.head);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let label = if status == 502 {
            "unreachable"
        } else {
            "timed_out"
        };
        let series = format!("bridgehead_server_fallback_dials_total{{result=\"{label}\"}}");
        assert_eq!(server.metric(&series).unwrap(), 1.0);
    }
    drop(listener);
}
