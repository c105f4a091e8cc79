//! The peer port's edge (`--peer-port`): who may come in (a peer's certificate, never a
//! CONNECT client's), what it holds before a peer has proved who it is, and what it speaks
//! (`bridgehead-peer.v1`, never the agents' protocol). What a peer may make it hold once in:
//! `server/src/peering/tests.rs`. Forwarding itself: `forwarding.rs`.

use std::net::TcpStream;

use bridgehead_e2e::client::{
    raw_request, request_reply, tls_config, tls_stream_named, websocket_upgrade, ErrorReply,
    IO_TIMEOUT,
};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::procfs::fd_count;
use bridgehead_e2e::{Peering, Pki, Server, ServerOptions};
use rustls::pki_types::ServerName;

/// The peer port's places for connections in their handshake (`PEER_HANDSHAKES`).
const PEER_HANDSHAKES: usize = 16;
/// The peer sessions it serves at once (`PEER_SESSIONS`).
const PEER_SESSIONS: usize = 64;

/// A server with a peer port (its only peer address its own) and `--allowed-clients` naming
/// kube-apiserver's certificate, `client.crt`.
fn server(pki: &Pki, args: &[&str]) -> Server {
    let mut all = vec!["--allowed-clients=bridgehead-client".to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    Server::start(
        pki,
        ServerOptions {
            args: all,
            peering: Some(Peering {
                port: 0,
                hosts: vec!["127.0.0.1".into()],
                bind: None,
            }),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Writes `pki`'s frontend CA's client certificate for `name` as `<file>.crt`/`.key`.
fn frontend_client(pki: &Pki, name: &str, file: &str) {
    let issued = pki.pki.issue_client(name).unwrap();
    std::fs::write(pki.path(&format!("{file}.crt")), &issued.cert_pem).unwrap();
    std::fs::write(pki.path(&format!("{file}.key")), &issued.key_pem).unwrap();
}

/// `GET /peer` as a peer server named `id` asks, with the certificate in `file`.
fn peer_upgrade(pki: &Pki, server: &Server, file: &str, id: &str) -> ErrorReply {
    let (crt, key) = (format!("{file}.crt"), format!("{file}.key"));
    let config = tls_config(pki, Some((&crt, &key))).unwrap();
    websocket_upgrade(
        config,
        server.peer_addr.unwrap(),
        "/peer",
        bridgehead_proto::PEER_SUBPROTOCOL,
        &format!("bridgehead-server-id: {id}\r\n"),
    )
    .unwrap()
}

/// Issue 49, finding 1: a frontend client certificate that the frontend refuses (not among
/// `--allowed-clients`) got `101` on the peer port, and with it every agent's identifiers
/// and a tunnel to any of them. Now only a peer's certificate is a peer's: a client
/// certificate is refused with 403 and the reason, whether the frontend lets it in or not.
#[test]
fn a_connect_client_certificate_is_never_a_peers() {
    let pki = Pki::new().unwrap();
    let server = server(&pki, &[]);
    frontend_client(&pki, "curl-on-a-laptop", "curl");
    for (file, says) in [
        // Refused by the frontend (403, not among --allowed-clients)...
        ("curl", "serverAuth"),
        // ...and let in by it: kube-apiserver's own certificate.
        ("client", "never a peer's"),
    ] {
        let reply = peer_upgrade(&pki, &server, file, "impostor");
        assert_eq!(reply.status, 403, "{file}: {}{}", reply.head, reply.body);
        assert!(reply.body.contains(says), "{file}: {}", reply.body);
    }
    // The peer certificate is let in.
    let reply = peer_upgrade(&pki, &server, "peer", "s2");
    assert_eq!(reply.status, 101, "{}{}", reply.head, reply.body);
}

/// `--allowed-peers` narrows the peer port to named peer certificates; naming a CONNECT
/// client there is refused at startup.
#[test]
fn allowed_peers_name_the_peer_certificates() {
    let pki = Pki::new().unwrap();
    let server = server(&pki, &["--allowed-peers=cp-peer"]);
    let reply = peer_upgrade(&pki, &server, "peer", "s2");
    assert_eq!(reply.status, 403, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("CN=bridgehead-peer") && reply.body.contains("--allowed-peers"),
        "{}",
        reply.body
    );
    let refused = Server::start(
        &pki,
        ServerOptions {
            args: vec![
                "--allowed-clients=bridgehead-client".into(),
                "--allowed-peers=bridgehead-peer,bridgehead-client".into(),
            ],
            peering: Some(Peering {
                port: 0,
                hosts: vec!["127.0.0.1".into()],
                bind: None,
            }),
            ..Default::default()
        },
    );
    let error = format!("{:#}", refused.unwrap_err());
    assert!(error.contains("never a peer's"), "{error}");
}

/// Issue 49, finding 2: 2,000 silent connections to the peer port held 2,000 server
/// descriptors. Now at most a few are in their handshake, the rest wait in the listen
/// backlog, a place whose peer stalled is given to a waiting connection, and a real peer
/// still gets in.
#[test]
fn silent_connections_hold_a_few_places_and_keep_no_peer_out() {
    let pki = Pki::new().unwrap();
    let server = server(
        &pki,
        &[
            "--agent-handshake-stall=300ms",
            "--agent-handshake-timeout=10m",
        ],
    );
    let pid = server.process.pid();
    let before = fd_count(pid);
    let silent: Vec<TcpStream> = (0..4 * PEER_HANDSHAKES)
        .map(|_| TcpStream::connect(server.peer_addr.unwrap()).unwrap())
        .collect();
    // Behind every silent connection in the backlog: let in once they stalled.
    let reply = peer_upgrade(&pki, &server, "peer", "s2");
    assert_eq!(reply.status, 101, "{}{}", reply.head, reply.body);
    let held = fd_count(pid).saturating_sub(before);
    assert!(
        held <= PEER_HANDSHAKES + 4,
        "{held} more descriptors for {} silent connections",
        silent.len()
    );
    let cut = server
        .metric("bridgehead_server_handshakes_refused_total{listener=\"peer\"}")
        .unwrap();
    assert!(cut >= 1.0, "no stalled handshake was cut ({cut})");
    drop(silent);
}

/// Issue 49, finding 7: the peer port read its upgrade request itself and checked no
/// `Upgrade`, `Connection` or `Sec-WebSocket-Version`. It now reads it as the agent port does.
#[test]
fn the_peer_port_checks_the_websocket_headers_as_the_agent_port_does() {
    let pki = Pki::new().unwrap();
    let server = server(&pki, &[]);
    let request = format!(
        "GET /peer HTTP/1.1\r\nhost: bridgehead\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-protocol: {}\r\nbridgehead-server-id: s2\r\n\r\n",
        bridgehead_proto::PEER_SUBPROTOCOL
    );
    let config = tls_config(&pki, Some(("peer.crt", "peer.key"))).unwrap();
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut tls = tls_stream_named(config, server.peer_addr.unwrap(), name).unwrap();
    let reply = request_reply(&mut tls, request.as_bytes()).unwrap();
    assert_eq!(reply.status, 400, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("not a WebSocket upgrade"),
        "{}",
        reply.body
    );
}

/// Issue 49, finding 7: peers speak a protocol of their own on the peer port
/// (`bridgehead-peer.v1`, whose first stream is the view), and agents theirs on the agent
/// port, unchanged: neither port takes the other's.
#[test]
fn each_port_speaks_its_own_protocol() {
    let pki = Pki::new().unwrap();
    let server = server(&pki, &[]);
    let config = tls_config(&pki, Some(("peer.crt", "peer.key"))).unwrap();
    let id = "bridgehead-server-id: s2\r\n";
    let agents = bridgehead_proto::SUBPROTOCOL;
    let reply = websocket_upgrade(config, server.peer_addr.unwrap(), "/peer", agents, id).unwrap();
    assert_eq!(reply.status, 400, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("this server speaks bridgehead-peer.v1"),
        "{}",
        reply.body
    );
    let agent = bridgehead_e2e::client::agent_tls_config(&pki, Some(("agent.crt", "agent.key")));
    let peers = bridgehead_proto::PEER_SUBPROTOCOL;
    let reply = websocket_upgrade(
        agent.unwrap(),
        server.agent_addr,
        "/connect?id=a",
        peers,
        "",
    )
    .unwrap();
    assert_eq!(reply.status, 400, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("this server speaks bridgehead.v1"),
        "{}",
        reply.body
    );
}

/// The same rule on the dialing side: a server whose peer address leads to a certificate of
/// the peer CA that is not a peer's (here another server's frontend, `server.crt`: the right
/// CA and address, `serverAuth` only) does not take it for a peer, and says why.
#[test]
fn a_dialing_server_takes_only_a_peer_for_a_peer() {
    let pki = Pki::new().unwrap();
    let frontend = Server::start(&pki, ServerOptions::default()).unwrap();
    let dialing = Server::start(
        &pki,
        ServerOptions {
            peering: Some(Peering {
                port: 0,
                hosts: vec![frontend.frontend.clone()],
                bind: None,
            }),
            ..Default::default()
        },
    )
    .unwrap();
    dialing
        .process
        .wait_log("lacks clientAuth", bridgehead_e2e::client::IO_TIMEOUT)
        .unwrap_or_else(|_| panic!("log:\n{}", dialing.process.stderr()));
    let (_, metrics) = dialing.get("/metrics").unwrap();
    assert!(
        metrics.contains("bridgehead_server_peers_connected 0"),
        "{metrics}"
    );
}

/// Each peer session holds a view and its tunnels: the peer port serves a bounded number at
/// once, and answers the next 503 until one ends.
#[test]
fn the_peer_port_serves_a_bounded_number_of_sessions() {
    let pki = Pki::new().unwrap();
    // Sessions that never answer a ping live a minute: longer than this test.
    let server = server(&pki, &["--keepalive-time=1m"]);
    let config = tls_config(&pki, Some(("peer.crt", "peer.key"))).unwrap();
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let open = |id: usize| {
        let mut tls =
            tls_stream_named(config.clone(), server.peer_addr.unwrap(), name.clone()).unwrap();
        let request = format!(
            "GET /peer HTTP/1.1\r\nhost: bridgehead\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-protocol: {}\r\nbridgehead-server-id: s{id}\r\n\r\n",
            bridgehead_proto::PEER_SUBPROTOCOL
        );
        let reply = raw_request(&mut tls, request.as_bytes()).unwrap();
        (reply, tls)
    };
    let mut sessions = Vec::new();
    for id in 0..PEER_SESSIONS {
        let (reply, tls) = open(id);
        assert_eq!(reply.status, 101, "session {id}: {}", reply.head);
        sessions.push(tls);
    }
    let (reply, _) = open(PEER_SESSIONS);
    assert_eq!(reply.status, 503, "{}", reply.head);
    assert!(
        reply.head.contains("64 peer sessions already"),
        "{}",
        reply.head
    );
    // One ends: its place is free again.
    drop(sessions.pop());
    wait_until(IO_TIMEOUT, || open(PEER_SESSIONS).0.status == 101).unwrap();
}
