//! Every way a CONNECT fails: the status, and a one-line `text/plain` reason. And the clients
//! the mTLS frontend must refuse.

use std::time::Duration;

use bridgehead_e2e::client::{
    kube_connect, request_reply, tls, tls_config, tls_connect, tls_connect_with, ErrorReply,
    IO_TIMEOUT,
};
use bridgehead_e2e::netns::TestNet;
use bridgehead_e2e::process::start_pair;
use bridgehead_e2e::{target, AgentOptions, Pki, Server, ServerOptions};

/// Sends `request` on a fresh mTLS connection and reads the whole answer.
fn ask(pki: &Pki, server: &Server, request: &str) -> ErrorReply {
    let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
    request_reply(conn.as_mut(), request.as_bytes()).unwrap()
}

fn connect_request(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
}

/// `reply` has `status` and a one-line plain-text reason containing `reason` (lowercase).
fn assert_refusal(reply: &ErrorReply, status: u16, reason: &str) {
    assert_eq!(reply.status, status, "{}{}", reply.head, reply.body);
    let content_type = reply.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain"),
        "content-type {content_type:?} in {}",
        reply.head
    );
    let text = reply.body.strip_suffix('\n').unwrap_or(&reply.body);
    assert!(
        !text.is_empty() && !text.contains('\n'),
        "reason must be one line: {:?}",
        reply.body
    );
    assert!(
        text.to_ascii_lowercase().contains(reason),
        "reason {text:?} should mention {reason:?}"
    );
}

#[test]
fn malformed_targets_get_400() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    for target in [
        "127.0.0.1",   // no port
        "127.0.0.1:0", // port 0
        "[fd00::1]",   // IPv6 without port
        "a..b:80",     // empty label
        "-bad-:80",    // label starting with a dash
        "host:99999",  // port out of range
        "host:http",   // named port
        // Spellings resolvers read as 127.0.0.1, which would sidestep name-based routing and
        // any address policy as "names".
        "2130706433:80",
        "0x7f.1:80",
        "0177.0.0.1:80",
    ] {
        let reply = ask(&pki, &server, &connect_request(target));
        assert_refusal(&reply, 400, "malformed");
        assert!(reply.body.contains(target), "{target}: {}", reply.body);
    }
}

/// Request targets that are not even URIs (hyper refuses them before the handler runs).
const UNPARSABLE_TARGETS: [&str; 3] = ["%%%garbage", "fd00::1:80", "host name:80"];

#[test]
fn unparsable_targets_get_400() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    for target in UNPARSABLE_TARGETS {
        let reply = ask(&pki, &server, &connect_request(target));
        assert_eq!(reply.status, 400, "{target}: {}{}", reply.head, reply.body);
    }
}

#[test]
fn unparsable_targets_get_400_with_a_reason() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    for target in UNPARSABLE_TARGETS {
        let reply = ask(&pki, &server, &connect_request(target));
        assert_refusal(&reply, 400, "malformed");
    }
}

#[test]
fn methods_other_than_connect_get_405() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    for request in [
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_owned(),
        format!("GET http://{echo}/ HTTP/1.1\r\nHost: {echo}\r\n\r\n"),
        format!("POST http://{echo}/ HTTP/1.1\r\nHost: {echo}\r\nContent-Length: 4\r\n\r\nbody"),
    ] {
        let reply = ask(&pki, &server, &request);
        assert_refusal(&reply, 405, "connect");
        assert_eq!(reply.header("allow"), Some("CONNECT"), "{}", reply.head);
    }
}

#[test]
fn refused_dial_gets_502() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let closed = target::closed_port().unwrap();
    let reply = ask(&pki, &server, &connect_request(&closed.to_string()));
    assert_refusal(&reply, 502, "refused");
}

/// The agent runs on a test host whose resolver is its own loopback, so the failed lookup
/// sends no query off the machine.
#[test]
fn unresolvable_name_gets_502() {
    if !bridgehead_e2e::skip::require_root("unresolvable_name_gets_502") {
        return;
    }
    let mut net = TestNet::new(1).unwrap();
    net.set_hosts(0, &[]).unwrap();
    let pki = Pki::new().unwrap();
    let (server, _agent) = bridgehead_e2e::netns::start_pair_on_host(
        &pki,
        &net,
        0,
        ServerOptions::default(),
        AgentOptions::default(),
    )
    .unwrap();
    let reply = ask(&pki, &server, &connect_request("does-not-exist.invalid:80"));
    assert_refusal(&reply, 502, "does-not-exist.invalid");
    assert!(
        reply.body.contains("name_not_resolved") || reply.body.contains("resolv"),
        "{}",
        reply.body
    );
}

#[test]
fn no_agent_gets_503() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let reply = ask(&pki, &server, &connect_request(&echo.to_string()));
    assert_refusal(&reply, 503, "agent");
}

#[test]
fn dial_timeout_gets_504() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(
        &pki,
        ServerOptions {
            args: vec!["--dial-timeout".into(), "300ms".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let hole = target::black_hole(Duration::from_millis(300)).unwrap();
    let reply = ask(&pki, &server, &connect_request(&hole.addr.to_string()));
    assert_refusal(&reply, 504, &hole.addr.to_string());
}

#[test]
fn client_certificate_from_another_ca_is_refused() {
    let pki = Pki::new().unwrap();
    let other = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let config = tls::config(
        &pki.path("frontend-ca.crt"),
        Some((&other.path("client.crt"), &other.path("client.key"))),
    )
    .unwrap();
    // With TLS 1.3 the client finishes its handshake before the server checked its
    // certificate: the refusal may only show on the first read.
    let result = tls_connect_with(config, server.frontend_addr())
        .and_then(|mut conn| kube_connect(conn.as_mut(), &echo.to_string()));
    assert!(
        result.is_err(),
        "a foreign client certificate was accepted: {result:?}"
    );
    server
        .process
        .wait_log("TLS handshake failed", IO_TIMEOUT)
        .unwrap();
}

#[test]
fn client_without_certificate_is_refused() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let config = tls_config(&pki, None).unwrap();
    let result = tls_connect_with(config, server.frontend_addr())
        .and_then(|mut conn| kube_connect(conn.as_mut(), &echo.to_string()));
    assert!(
        result.is_err(),
        "a client without certificate was accepted: {result:?}"
    );
    server
        .process
        .wait_log("TLS handshake failed", IO_TIMEOUT)
        .unwrap();
}
