//! The tunnel end to end: curl and a kube-apiserver-style client through the real binaries.

use std::io::{Read, Write};

use bridgehead_e2e::client::{curl, kube_connect, tls_connect};
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
