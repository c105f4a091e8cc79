//! Bad and slow peers get a clear error or a clean close, never a hang: slow or silent CONNECT
//! clients, oversized heads, and agents with bad identifiers, no protocol version, a foreign
//! certificate or garbage frames. The server keeps serving others throughout.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{agent_tls_config, kube_connect, tls_connect, Conn, IO_TIMEOUT};
use bridgehead_e2e::late::{Late, Lateness};
use bridgehead_e2e::process::start_pair;
use bridgehead_e2e::{target, Pki, Server, ServerOptions};
use bridgehead_test_support::bounded;
use futures_util::{SinkExt, StreamExt};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

fn server_with(pki: &Pki, args: &[&str]) -> Server {
    Server::start(
        pki,
        ServerOptions {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Reads until the server closes; fails if it is still open when `IO_TIMEOUT` passes.
fn assert_closed_by_server(conn: &mut dyn Read) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return start.elapsed(),
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the server never closed the connection")
            }
            Err(_) => return start.elapsed(),
        }
    }
}

#[test]
fn a_client_that_never_finishes_its_head_is_cut_off() {
    let pki = Pki::new().unwrap();
    let server = server_with(&pki, &["--handshake-timeout", "300ms"]);
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    conn.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    conn.flush().unwrap();
    assert!(assert_closed_by_server(conn.as_mut()) < IO_TIMEOUT);
}

#[test]
fn a_client_that_never_starts_tls_is_cut_off() {
    let pki = Pki::new().unwrap();
    let server = server_with(&pki, &["--handshake-timeout", "300ms"]);
    let mut tcp = TcpStream::connect(server.frontend_addr()).unwrap();
    tcp.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    assert!(assert_closed_by_server(&mut tcp) < IO_TIMEOUT);
}

#[test]
fn an_oversized_head_gets_431_and_the_server_keeps_serving() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let filler = "a".repeat(20_000);
    let request = format!("CONNECT 127.0.0.1:9 HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n");
    let reply = bridgehead_e2e::client::raw_request(conn.as_mut(), request.as_bytes()).unwrap();
    assert_eq!(reply.status, 431, "{}", reply.head);
    // Others are unaffected.
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &echo.to_string())
            .unwrap()
            .status,
        200
    );
}

/// A hand-driven agent's session.
type AgentWs = tokio_tungstenite::WebSocketStream<
    tokio_rustls::client::TlsStream<Late<tokio::net::TcpStream>>,
>;

/// Opens the agent endpoint as an agent would, with `cert` (file names in the PKI), and the
/// given query and subprotocol; returns the WebSocket or the handshake error.
async fn agent_upgrade(
    pki: &Pki,
    server: &Server,
    cert: (&str, &str),
    query: &str,
    protocol: Option<&str>,
) -> Result<AgentWs, WsError> {
    late_agent_upgrade(pki, server, cert, query, protocol, None).await
}

/// [`agent_upgrade`] by an agent that answers each step of its handshake (ClientHello, its
/// TLS answer, the upgrade request) `lateness` late.
async fn late_agent_upgrade(
    pki: &Pki,
    server: &Server,
    cert: (&str, &str),
    query: &str,
    protocol: Option<&str>,
    lateness: Option<Lateness>,
) -> Result<AgentWs, WsError> {
    let mut config = (*agent_tls_config(pki, Some(cert)).unwrap()).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.agent_addr)
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(server.agent_addr.ip().into());
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, Late::new(tcp, lateness))
        .await
        .map_err(WsError::Io)?;
    // The upgrade request is a step of its own: late too.
    tls.get_mut().0.arm();
    let url = format!("wss://{}/connect?{query}", server.agent_addr);
    let mut request = url.into_client_request().unwrap();
    if let Some(protocol) = protocol {
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocol.parse().unwrap());
    }
    let (mut ws, _) = tokio_tungstenite::client_async(request, tls).await?;
    ws.get_mut().get_mut().0.release();
    Ok(ws)
}

fn refusal(result: Result<impl std::fmt::Debug, WsError>) -> (u16, String) {
    match result {
        Err(WsError::Http(response)) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            (response.status().as_u16(), body)
        }
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn agents_with_bad_identifiers_or_no_protocol_version_are_refused_with_a_reason() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(&pki, &[]);
        let agent = ("agent.crt", "agent.key");

        let (status, body) = refusal(
            agent_upgrade(
                &pki,
                &server,
                agent,
                "id=a&ipv4=10.0.0.999",
                Some("bridgehead.v1"),
            )
            .await,
        );
        assert_eq!(status, 400);
        assert!(
            body.contains("10.0.0.999") && body.contains("ipv4"),
            "{body}"
        );

        let (status, body) = refusal(agent_upgrade(&pki, &server, agent, "id=a", None).await);
        assert_eq!(status, 400);
        assert!(body.contains("bridgehead.v1"), "{body}");

        let (status, _) =
            refusal(agent_upgrade(&pki, &server, agent, "id=a", Some("bridgehead.v0")).await);
        assert_eq!(status, 400);

        // Unknown keys (a newer agent) are ignored, not refused.
        let ws = agent_upgrade(
            &pki,
            &server,
            agent,
            "id=a&zone=eu-1&host=n1",
            Some("bridgehead.v1"),
        )
        .await
        .unwrap();
        drop(ws);
    })
    .await
}

#[tokio::test]
async fn an_agent_certificate_from_another_ca_is_refused() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let other = Pki::new().unwrap();
        let server = server_with(&pki, &[]);
        // The other PKI's agent certificate, trusting this PKI's CA for the server.
        let foreign = tempfile::tempdir().unwrap();
        std::fs::copy(pki.path("cluster-ca.crt"), foreign.path().join("ca.crt")).unwrap();
        std::fs::write(foreign.path().join("agent.crt"), &other.pki.agent.cert_pem).unwrap();
        std::fs::write(foreign.path().join("agent.key"), &other.pki.agent.key_pem).unwrap();
        let config = bridgehead_e2e::client::tls::config(
            &foreign.path().join("ca.crt"),
            Some((
                &foreign.path().join("agent.crt"),
                &foreign.path().join("agent.key"),
            )),
        )
        .unwrap();
        let tcp = tokio::net::TcpStream::connect(server.agent_addr)
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(server.agent_addr.ip().into());
        let result = async {
            let tls = TlsConnector::from(config).connect(name, tcp).await?;
            let request = format!("wss://{}/connect?id=x", server.agent_addr)
                .into_client_request()
                .unwrap();
            tokio_tungstenite::client_async(request, tls)
                .await
                .map_err(std::io::Error::other)
        }
        .await;
        assert!(result.is_err(), "a foreign agent certificate was accepted");
        assert!(server.agents().unwrap().is_empty());
    })
    .await
}

#[tokio::test]
async fn garbage_frames_end_only_that_agents_session() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
        let agent = ("agent.crt", "agent.key");
        let mut ws = agent_upgrade(&pki, &server, agent, "id=rogue", Some("bridgehead.v1"))
            .await
            .unwrap();
        server.wait_agents(2).unwrap();
        // A frame of an unknown type.
        ws.send(Message::Binary(vec![0xEE, 0, 0, 0, 1, 0, 0, 0, 0].into()))
            .await
            .unwrap();
        let close = tokio::time::timeout(IO_TIMEOUT, async {
            while let Some(message) = ws.next().await {
                if let Ok(Message::Close(frame)) = message {
                    return frame;
                }
            }
            None
        })
        .await
        .expect("the server closes the session");
        let frame = close.expect("with a close frame");
        assert_eq!(u16::from(frame.code), 1002, "{frame:?}");
        server.wait_agents(1).unwrap();
        // The well-behaved agent still carries tunnels.
        let echo = target::echo("127.0.0.1:0").unwrap();
        tokio::task::spawn_blocking(move || {
            let mut conn: Box<dyn Conn> = tls_connect(&pki, server.frontend_addr()).unwrap();
            assert_eq!(
                kube_connect(conn.as_mut(), &echo.to_string())
                    .unwrap()
                    .status,
                200
            );
        })
        .await
        .unwrap();
    })
    .await
}

/// A hostile agent: the DIAL it is sent, after its upgrade.
async fn next_dial(ws: &mut AgentWs) -> u32 {
    loop {
        match ws.next().await.expect("session open").expect("a message") {
            Message::Binary(bytes) => {
                for frame in bridgehead_proto::Frame::decode_all(bytes) {
                    if let bridgehead_proto::Frame::Dial { stream, .. } = frame.unwrap() {
                        return stream;
                    }
                }
            }
            _ => continue,
        }
    }
}

/// Sends `frame` on the hostile agent's WebSocket.
async fn send_frame(ws: &mut AgentWs, frame: bridgehead_proto::Frame) {
    let mut buf = bytes::BytesMut::new();
    frame.encode(&mut buf);
    ws.send(Message::Binary(buf.freeze())).await.unwrap();
}

/// An agent's words reach a log line or a client's answer only escaped: a dial error with a
/// newline and terminal escapes forges no log line.
#[tokio::test]
async fn an_agents_dial_error_cannot_forge_a_log_line() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(&pki, &[]);
        let agent = ("agent.crt", "agent.key");
        let mut ws = agent_upgrade(&pki, &server, agent, "id=liar", Some("bridgehead.v1"))
            .await
            .unwrap();
        server.wait_agents(1).unwrap();
        let (pki, frontend) = (Arc::new(pki), server.frontend_addr());
        let client = {
            let pki = pki.clone();
            tokio::task::spawn_blocking(move || {
                let mut conn = tls_connect(&pki, frontend).unwrap();
                bridgehead_e2e::client::request_reply(
                    conn.as_mut(),
                    bridgehead_e2e::client::kube::connect_head("10.1.2.3:80").as_bytes(),
                )
                .unwrap()
            })
        };
        let stream = next_dial(&mut ws).await;
        let forged =
            "refused\n2026-12-01T00:00:00.000000Z  INFO agent connected identity=forged\x1b[2J";
        send_frame(
            &mut ws,
            bridgehead_proto::Frame::DialErr {
                stream,
                code: bridgehead_proto::ErrorCode::Refused,
                message: forged.to_owned(),
            },
        )
        .await;
        let reply = client.await.unwrap();
        assert_eq!(reply.status, 502, "{}{}", reply.head, reply.body);
        assert!(reply.body.contains("refused\\n2026"), "{}", reply.body);
        assert!(
            !reply.head.contains('\x1b') && !reply.body.contains('\x1b'),
            "{reply:?}"
        );
        let log = server.process.stderr();
        assert!(
            log.contains("refused\\n2026"),
            "the refusal is logged, escaped:\n{log}"
        );
        assert!(!log.contains("identity=forged\u{1b}"), "{log}");
        assert!(
            !log.lines()
                .any(|line| line.starts_with("2026-12-01T00:00:00.000000Z")),
            "a forged line:\n{log}"
        );
    })
    .await
}

/// An agent that grants more credit than the protocol allows gets the stream reset; one that
/// grants the most and then stops reading its WebSocket holds the server to the bounded
/// transmit queue, however much the client sends.
#[tokio::test]
async fn a_greedy_agent_cannot_grow_the_server() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(&pki, &[]);
        let agent = ("agent.crt", "agent.key");
        let mut ws = agent_upgrade(&pki, &server, agent, "id=greedy", Some("bridgehead.v1"))
            .await
            .unwrap();
        server.wait_agents(1).unwrap();
        let (pki, frontend) = (Arc::new(pki), server.frontend_addr());
        let connect = |pki: Arc<Pki>| {
            tokio::task::spawn_blocking(move || {
                let mut conn = tls_connect(&pki, frontend).unwrap();
                let reply = kube_connect(conn.as_mut(), "10.1.2.3:80").unwrap();
                (reply.status, conn)
            })
        };
        // Credit beyond the protocol's bound: the dial fails.
        let client = connect(pki.clone());
        let stream = next_dial(&mut ws).await;
        let max = u32::try_from(bridgehead_proto::session::MAX_CREDIT).unwrap();
        send_frame(
            &mut ws,
            bridgehead_proto::Frame::DialOk {
                stream,
                window: max + 1,
            },
        )
        .await;
        assert_eq!(client.await.unwrap().0, 502);
        // The most credit allowed on several streams, then silence: the clients' uploads
        // stall, and the server holds its bounded transmit queue and the socket buffers, not
        // the uploads (four streams' credit would be 64 MiB).
        let mut conns = Vec::new();
        for _ in 0..4 {
            let client = connect(pki.clone());
            let stream = next_dial(&mut ws).await;
            send_frame(
                &mut ws,
                bridgehead_proto::Frame::DialOk {
                    stream,
                    window: max,
                },
            )
            .await;
            let (status, conn) = client.await.unwrap();
            assert_eq!(status, 200);
            conns.push(conn);
        }
        let pid = server.process.pid();
        let before = bridgehead_e2e::procfs::rss_bytes(pid).unwrap();
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writers: Vec<_> = conns
            .into_iter()
            .map(|mut conn| {
                let counter = written.clone();
                std::thread::spawn(move || {
                    let block = vec![0x42u8; 64 * 1024];
                    // Stops when the server stops reading (the write times out) or at 64 MiB.
                    for _ in 0..1024 {
                        if conn.write_all(&block).is_err() {
                            break;
                        }
                        counter.fetch_add(block.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Until the uploads have stalled: no progress for a second.
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = written.load(std::sync::atomic::Ordering::Relaxed);
            if now == last {
                break;
            }
            last = now;
        }
        let grown = bridgehead_e2e::procfs::rss_bytes(pid)
            .unwrap()
            .saturating_sub(before);
        assert!(
            grown < 24 << 20,
            "the server grew by {grown} bytes (the clients sent {last})"
        );
        drop(ws);
        let _ = tokio::task::spawn_blocking(move || {
            writers.into_iter().for_each(|writer| {
                let _ = writer.join();
            })
        })
        .await;
    })
    .await
}

/// A tarpit agent (it takes every DIAL and never answers) beside an honest one, both behind
/// `destHost`: the tarpit holds at most its per-agent share of pending dials, and one client
/// at most its per-client share.
#[tokio::test]
async fn a_tarpit_agent_or_a_greedy_client_cannot_take_every_dial() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(
            &pki,
            &[
                "--proxy-strategies",
                "destHost",
                "--max-pending-dials-per-agent",
                "4",
                "--max-pending-dials-per-client",
                "6",
                "--dial-timeout",
                "60s",
            ],
        );
        let agent = ("agent.crt", "agent.key");
        let mut tarpit = agent_upgrade(
            &pki,
            &server,
            agent,
            "id=tarpit&ipv4=10.255.0.1",
            Some("bridgehead.v1"),
        )
        .await
        .unwrap();
        // It reads (so its pongs keep the session alive) and answers no DIAL.
        let _tarpit = tokio::spawn(async move { while tarpit.next().await.is_some() {} });
        let _honest = bridgehead_e2e::Agent::start(
            &pki,
            &server,
            bridgehead_e2e::AgentOptions {
                id: Some("honest".into()),
                identifiers: Some("ipv4=127.0.0.1".into()),
                ..Default::default()
            },
        )
        .unwrap();
        server.wait_agents(2).unwrap();
        let echo = target::echo("127.0.0.1:0").unwrap().to_string();
        let pki = Arc::new(pki);
        let frontend = server.frontend_addr();
        let pending = Arc::new(std::sync::Mutex::new(Vec::new()));
        // Opens a CONNECT and leaves it waiting (the tarpit never answers).
        let hang = |config: Arc<rustls::ClientConfig>| {
            let pending = pending.clone();
            move || {
                let mut conn = bridgehead_e2e::client::tls_connect_with(config, frontend).unwrap();
                conn.write_all(
                    bridgehead_e2e::client::kube::connect_head("10.255.0.1:80").as_bytes(),
                )
                .unwrap();
                conn.flush().unwrap();
                pending.lock().unwrap().push(conn);
            }
        };
        let ask = |config: Arc<rustls::ClientConfig>, target: String| {
            tokio::task::spawn_blocking(move || {
                let mut conn = bridgehead_e2e::client::tls_connect_with(config, frontend).unwrap();
                bridgehead_e2e::client::request_reply(
                    conn.as_mut(),
                    bridgehead_e2e::client::kube::connect_head(&target).as_bytes(),
                )
                .unwrap()
            })
        };
        // Only the status: a tunnel to the echo target stays open.
        let status = |config: Arc<rustls::ClientConfig>, target: String| {
            tokio::task::spawn_blocking(move || {
                let mut conn = bridgehead_e2e::client::tls_connect_with(config, frontend).unwrap();
                kube_connect(conn.as_mut(), &target).unwrap().status
            })
        };
        let client_a =
            bridgehead_e2e::client::tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
        let other = pki.pki.issue_client("another-apiserver").unwrap();
        std::fs::write(pki.dir().join("b.crt"), &other.cert_pem).unwrap();
        std::fs::write(pki.dir().join("b.key"), &other.key_pem).unwrap();
        let client_b = bridgehead_e2e::client::tls_config(&pki, Some(("b.crt", "b.key"))).unwrap();
        // A bounded poll of the gauge (blocking this test's own thread only).
        let wait_pending = |n: f64| {
            bridgehead_e2e::process::wait_until(IO_TIMEOUT, || {
                server
                    .metric("bridgehead_server_dials_pending")
                    .unwrap_or(-1.0)
                    == n
            })
            .unwrap_or_else(|_| panic!("{n} dials pending"))
        };
        // Client A fills the tarpit's share.
        for _ in 0..4 {
            tokio::task::spawn_blocking(hang(client_a.clone()))
                .await
                .unwrap();
        }
        wait_pending(4.0);
        let reply = ask(client_a.clone(), "10.255.0.1:80".into()).await.unwrap();
        assert_eq!(reply.status, 503, "{}{}", reply.head, reply.body);
        assert!(
            reply.body.contains("limit of 4 dials pending"),
            "{}",
            reply.body
        );
        // The honest agent still serves.
        assert_eq!(status(client_a.clone(), echo.clone()).await.unwrap(), 200);
        // Client A at its own limit (4 pending + 2 more that the honest agent holds open).
        let slow = tokio::task::spawn_blocking(|| target::black_hole(Duration::from_millis(300)))
            .await
            .unwrap()
            .unwrap();
        for _ in 0..2 {
            let pending = pending.clone();
            let config = client_a.clone();
            let target = slow.addr.to_string();
            tokio::task::spawn_blocking(move || {
                let mut conn = bridgehead_e2e::client::tls_connect_with(config, frontend).unwrap();
                conn.write_all(bridgehead_e2e::client::kube::connect_head(&target).as_bytes())
                    .unwrap();
                pending.lock().unwrap().push(conn);
            })
            .await
            .unwrap();
        }
        wait_pending(6.0);
        let reply = ask(client_a.clone(), echo.clone()).await.unwrap();
        assert_eq!(reply.status, 503, "{}{}", reply.head, reply.body);
        assert!(
            reply.body.contains("this client has its limit of 6"),
            "{}",
            reply.body
        );
        // Another client is not affected.
        assert_eq!(status(client_b, echo).await.unwrap(), 200);
    })
    .await
}

/// A reconnect storm far larger than the agent endpoint's handshake places: every agent gets
/// its session and no handshake is cut, since none of them stalls (the places only decide
/// who waits in the listen backlog).
#[tokio::test]
async fn a_reconnect_storm_past_the_handshake_places_loses_no_handshake() {
    const AGENTS: usize = 100;
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(&pki, &["--max-agent-handshakes", "4"]);
        let storm = (0..AGENTS).map(|i| {
            let (pki, server) = (&pki, &server);
            async move {
                let query = format!("id=storm-{i}&host=node-{i}");
                let agent = ("agent.crt", "agent.key");
                agent_upgrade(
                    pki,
                    server,
                    agent,
                    &query,
                    Some(bridgehead_proto::SUBPROTOCOL),
                )
                .await
                .map_err(|error| format!("agent {i}: {error}"))
            }
        });
        let sessions: Vec<_> = futures_util::future::join_all(storm)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(sessions.len(), AGENTS);
        let connected = server
            .metric("konnectivity_network_proxy_server_ready_backend_connections")
            .unwrap();
        let cut = server
            .metric("bridgehead_server_handshakes_refused_total{listener=\"agent\"}")
            .unwrap();
        assert_eq!(connected, AGENTS as f64);
        assert_eq!(cut, 0.0, "handshakes that were moving were cut");
        let ok = server
            .metric("bridgehead_server_agent_handshakes_total{result=\"ok\"}")
            .unwrap();
        assert_eq!(ok, AGENTS as f64);
    })
    .await;
}

/// Connections that never speak hold every handshake place, and the handshake timeout is far
/// away: an honest agent still gets in, because a place whose peer stalls is taken back when
/// a newcomer needs it.
#[tokio::test]
async fn connections_that_never_speak_cannot_keep_an_agent_out() {
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(
            &pki,
            &[
                "--max-agent-handshakes",
                "8",
                "--agent-handshake-stall",
                "300ms",
                "--agent-handshake-timeout",
                "10m",
            ],
        );
        let mut silent = Vec::new();
        for _ in 0..16 {
            silent.push(
                tokio::net::TcpStream::connect(server.agent_addr)
                    .await
                    .unwrap(),
            );
        }
        let agent = ("agent.crt", "agent.key");
        let query = "id=honest&host=node-1";
        let ws = agent_upgrade(
            &pki,
            &server,
            agent,
            query,
            Some(bridgehead_proto::SUBPROTOCOL),
        )
        .await
        .unwrap();
        let cut = server
            .metric("bridgehead_server_handshakes_refused_total{listener=\"agent\"}")
            .unwrap();
        assert!(cut >= 1.0, "no stalled handshake was cut ({cut})");
        // Counted by the cut connection's own task, which may run after this one's.
        bridgehead_e2e::process::wait_until(IO_TIMEOUT, || {
            server
                .metric("bridgehead_server_agent_handshakes_total{result=\"stalled\"}")
                .is_ok_and(|stalled| stalled >= 1.0)
        })
        .unwrap();
        drop((ws, silent));
    })
    .await;
}

/// The longest an agent's handshake could take before issue 49 (`--agent-handshake-timeout`'s
/// old default): a slow agent past it was cut although it kept answering.
const OLD_HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// An agent on a busy node or a long, lossy link answers each step of its handshake late but
/// answers: three steps of 2.5 s each take it past the old 5 s deadline while it never owes
/// the server bytes for the stall time. The server's defaults let it in (only the stall time is
/// raised above its steps: the stall rule is what cuts a slowloris, not this agent).
#[tokio::test]
async fn an_agent_that_answers_each_step_late_is_let_in() {
    const STEP: Duration = Duration::from_millis(2500);
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(&pki, &["--agent-handshake-stall", "4s"]);
        let started = Instant::now();
        let agent = ("agent.crt", "agent.key");
        let ws = late_agent_upgrade(
            &pki,
            &server,
            agent,
            "id=slow&host=node-1",
            Some(bridgehead_proto::SUBPROTOCOL),
            Some(Lateness::fixed(STEP)),
        )
        .await
        .expect("a slow agent that kept answering was let in");
        let took = started.elapsed();
        assert!(
            took > OLD_HANDSHAKE_DEADLINE,
            "the handshake took {took:?}: not past the old deadline, so this shows nothing"
        );
        // Counted by the handshake's task once the `101` is out, maybe after this one read it.
        bridgehead_e2e::process::wait_until(IO_TIMEOUT, || {
            server
                .metric("bridgehead_server_agent_handshakes_total{result=\"ok\"}")
                .is_ok_and(|ok| ok == 1.0)
        })
        .unwrap();
        let timed_out = server
            .metric("bridgehead_server_agent_handshakes_total{result=\"timed_out\"}")
            .unwrap();
        assert_eq!(timed_out, 0.0);
        drop(ws);
    })
    .await;
}

/// A fleet whose every step comes later than the stall time given (1 s), more of it than
/// there are handshake places: once the server has seen the fleet answer that late, it keeps
/// their handshakes while a newcomer waits, rather than cutting them as stalled (issue 49).
#[tokio::test]
async fn a_slow_fleet_past_the_handshake_places_is_not_cut_for_room() {
    const STEP: Duration = Duration::from_millis(1300);
    bounded(async {
        let pki = Pki::new().unwrap();
        let server = server_with(
            &pki,
            &[
                "--max-agent-handshakes",
                "2",
                "--agent-handshake-stall",
                "1s",
            ],
        );
        let slow = |i: usize| {
            let (pki, server) = (&pki, &server);
            async move {
                let query = format!("id=slow-{i}&host=node-{i}");
                let agent = ("agent.crt", "agent.key");
                let lateness = Some(Lateness::fixed(STEP));
                late_agent_upgrade(
                    pki,
                    server,
                    agent,
                    &query,
                    Some(bridgehead_proto::SUBPROTOCOL),
                    lateness,
                )
                .await
                .map_err(|error| format!("agent {i}: {error}"))
            }
        };
        // One agent of the fleet alone: the server sees how late its steps come.
        let first = slow(0).await.unwrap();
        // Then three at once for two places: one waits in the listen backlog while the other
        // two owe the server bytes past the stall time given, step after step.
        let sessions = futures_util::future::join_all((1..4).map(slow)).await;
        let cut = server
            .metric("bridgehead_server_handshakes_refused_total{listener=\"agent\"}")
            .unwrap();
        assert_eq!(cut, 0.0, "slow agents that kept answering were cut");
        for session in sessions {
            session.unwrap();
        }
        drop(first);
    })
    .await;
}
