//! The tunnel end to end: curl and a kube-apiserver-style client through the real binaries.

use std::io::{Read, Write};

use bridgehead_e2e::client::{curl, echo_round_trip, kube_connect, raw_request, tls_connect};
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

struct Setup {
    pki: Pki,
    server: Server,
    _agent: Agent,
}

fn setup(server_args: &[&str]) -> Setup {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: server_args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    Setup {
        pki,
        server,
        _agent: agent,
    }
}

#[test]
fn curl_through_the_mtls_frontend() {
    let s = setup(&[]);
    let web = target::who_am_i(
        "127.0.0.1:0",
        "HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nhello",
    )
    .unwrap();
    let out = curl(&s.pki, &s.server.frontend, &format!("http://{web}/"), &[]).unwrap();
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
}

#[test]
fn kube_apiserver_client_gets_exactly_200_and_nothing_after() {
    let s = setup(&[]);
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&s.pki, s.server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(reply.head.starts_with("HTTP/1.1 200"), "{}", reply.head);
    assert!(
        reply.extra.is_empty(),
        "bytes after the head: {:?}",
        reply.extra
    );
    let lower = reply.head.to_ascii_lowercase();
    assert!(!lower.contains("content-length"), "{}", reply.head);
    assert!(!lower.contains("transfer-encoding"), "{}", reply.head);
    conn.write_all(b"ping through the tunnel").unwrap();
    let mut buf = [0u8; 23];
    conn.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping through the tunnel");
}

#[test]
fn kube_client_reaches_ipv4_ipv6_and_hostname_targets() {
    let s = setup(&[]);
    let v4 = target::echo("127.0.0.1:0").unwrap();
    let v6 = target::echo("[::1]:0").unwrap();
    // `localhost` resolves on the agent; the target listens on IPv4 only, so an agent that
    // tries ::1 first must fall back to 127.0.0.1.
    let targets = [
        v4.to_string(),
        format!("[::1]:{}", v6.port()),
        format!("localhost:{}", v4.port()),
    ];
    for target in &targets {
        let mut conn = tls_connect(&s.pki, s.server.frontend_addr()).unwrap();
        let reply = kube_connect(conn.as_mut(), target).unwrap();
        assert_eq!(reply.status, 200, "{target}: {}", reply.head);
        assert!(reply.extra.is_empty(), "{target}: bytes after the head");
        echo_round_trip(conn.as_mut(), format!("hello {target}").as_bytes());
    }
}

#[test]
fn curl_reaches_ipv4_ipv6_and_hostname_targets() {
    let s = setup(&[]);
    let page = |name: &str| format!("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n{name}");
    let v4 = target::who_am_i("127.0.0.1:0", &page("v4")).unwrap();
    let v6 = target::who_am_i("[::1]:0", &page("v6")).unwrap();
    let urls = [
        (format!("http://{v4}/"), "v4\n"),
        (format!("http://[::1]:{}/", v6.port()), "v6\n"),
        (format!("http://localhost:{}/", v4.port()), "v4\n"),
    ];
    for (url, want) in &urls {
        let out = curl(&s.pki, &s.server.frontend, url, &[]).unwrap();
        assert!(
            out.status.success(),
            "curl {url} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), *want, "{url}");
    }
}

#[test]
fn bytes_sent_with_the_connect_head_belong_to_the_tunnel() {
    let s = setup(&[]);
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&s.pki, s.server.frontend_addr()).unwrap();
    // One write: the head and the first tunnel bytes together.
    let request = format!("CONNECT {echo} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nEARLY");
    let reply = raw_request(conn.as_mut(), request.as_bytes()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    // The echo may arrive in the same read as the head.
    let mut got = reply.extra;
    assert!(got.len() <= 5, "more than the echo after the head: {got:?}");
    let mut rest = vec![0u8; 5 - got.len()];
    conn.read_exact(&mut rest).unwrap();
    got.extend_from_slice(&rest);
    assert_eq!(got, b"EARLY");
    echo_round_trip(conn.as_mut(), b"and later bytes");
}

#[test]
fn http10_connect_without_host_works() {
    // What Python < 3.12 sends.
    let s = setup(&[]);
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&s.pki, s.server.frontend_addr()).unwrap();
    let request = format!("CONNECT {echo} HTTP/1.0\r\n\r\n");
    let reply = raw_request(conn.as_mut(), request.as_bytes()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(reply.extra.is_empty(), "bytes after the head");
    echo_round_trip(conn.as_mut(), b"python says hi");
}

/// A target that speaks first (an SMTP-style greeting) must not glue its bytes to the 200:
/// kube-apiserver fails when anything follows the response head in the same read. The
/// greeting is held until the client speaks, then delivered whole.
#[test]
fn speak_first_target_bytes_never_follow_the_200_in_the_same_read() {
    let s = setup(&[]);
    let greeter = target::who_am_i("127.0.0.1:0", "220 greetings").unwrap();
    for _ in 0..5 {
        let mut conn = tls_connect(&s.pki, s.server.frontend_addr()).unwrap();
        let reply = kube_connect(conn.as_mut(), &greeter.to_string()).unwrap();
        assert_eq!(reply.status, 200, "{}", reply.head);
        assert!(
            reply.extra.is_empty(),
            "greeting glued to the 200: {:?}",
            reply.extra
        );
        conn.write_all(b"EHLO\r\n").unwrap();
        let mut greeting = [0u8; 14];
        conn.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting, b"220 greetings\n");
    }
}

/// A client that waits for a speak-first target still gets the greeting, after the hold.
#[test]
fn speak_first_target_reaches_a_waiting_client() {
    let s = setup(&["--target-bytes-hold", "100ms"]);
    let greeter = target::who_am_i("127.0.0.1:0", "220 greetings").unwrap();
    let out = curl(
        &s.pki,
        &s.server.frontend,
        &format!("telnet://{greeter}"),
        &[],
    )
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "220 greetings\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The hold is real: with a long hold, a speak-first target's greeting does not reach a client
/// that has not spoken (its read times out), and arrives as soon as the client writes.
#[test]
fn target_bytes_wait_until_the_client_speaks() {
    let s = setup(&["--target-bytes-hold", "60s"]);
    let greeter = target::who_am_i("127.0.0.1:0", "220 greetings").unwrap();
    let config =
        bridgehead_e2e::client::tls_config(&s.pki, Some(("client.crt", "client.key"))).unwrap();
    let mut conn = bridgehead_e2e::client::tls_stream(config, s.server.frontend_addr()).unwrap();
    let reply = kube_connect(&mut conn, &greeter.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    conn.sock
        .set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    let mut byte = [0u8; 1];
    let early = conn.read(&mut byte);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the greeting arrived before the client spoke: {early:?}"
    );
    conn.sock
        .set_read_timeout(Some(bridgehead_e2e::client::IO_TIMEOUT))
        .unwrap();
    conn.write_all(b"EHLO\r\n").unwrap();
    conn.flush().unwrap();
    let mut greeting = [0u8; 14];
    conn.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting, b"220 greetings\n");
}

/// `--worker-threads 1` (a single-threaded runtime) on both sides carries tunnels too.
#[test]
fn single_threaded_server_and_agent_carry_tunnels() {
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec!["--worker-threads".into(), "1".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let _agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            args: vec!["--worker-threads".into(), "1".into()],
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    for _ in 0..20 {
        let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
        assert_eq!(
            kube_connect(conn.as_mut(), &echo.to_string())
                .unwrap()
                .status,
            200
        );
        echo_round_trip(conn.as_mut(), b"one thread");
    }
}
