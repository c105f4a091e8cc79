//! Every limit and timeout flag, seen doing what it says: a timeout fires between its value
//! and a small multiple of it (an ignored flag falls back to a default many times larger), a
//! limit refuses exactly the request past it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{
    kube_connect, request_reply, tls_connect, Conn, ErrorReply, IO_TIMEOUT,
};
use bridgehead_e2e::process::{start_pair, wait_until};
use bridgehead_e2e::timing::assert_about;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

/// The value the timeout tests set: a tenth of every default.
const TIMEOUT: Duration = Duration::from_secs(1);

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn connect_request(target: &str) -> String {
    bridgehead_e2e::client::kube::connect_head(target)
}

/// Sends a CONNECT for `target` on a fresh mTLS connection and reads the whole answer.
fn ask(pki: &Pki, server: &Server, target: &str) -> ErrorReply {
    let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
    request_reply(conn.as_mut(), connect_request(target).as_bytes()).unwrap()
}

/// How long until the peer closed `conn` (EOF or reset); fails if it never does.
fn time_to_close(conn: &mut dyn Read) -> Duration {
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

fn raw_tcp(addr: std::net::SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    tcp
}

#[test]
fn dial_timeout_sets_when_a_silent_dial_gets_504() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--dial-timeout", "1s"]),
        ..Default::default()
    };
    let (server, _agent) = start_pair(&pki, options).unwrap();
    let hole = target::black_hole(Duration::from_millis(300)).unwrap();
    let started = Instant::now();
    let reply = ask(&pki, &server, &hole.addr.to_string());
    assert_eq!(reply.status, 504, "{}{}", reply.head, reply.body);
    assert_about("the dial timeout", started.elapsed(), TIMEOUT);
}

#[test]
fn handshake_timeout_cuts_a_client_that_never_starts_tls() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--handshake-timeout", "1s"]),
        ..Default::default()
    };
    let server = Server::start(&pki, options).unwrap();
    let mut tcp = raw_tcp(server.frontend_addr());
    assert_about(
        "the frontend's TLS handshake timeout",
        time_to_close(&mut tcp),
        TIMEOUT,
    );
}

#[test]
fn handshake_timeout_cuts_a_client_that_never_finishes_its_head() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--handshake-timeout", "1s"]),
        ..Default::default()
    };
    let server = Server::start(&pki, options).unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    conn.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    conn.flush().unwrap();
    assert_about(
        "the CONNECT head timeout",
        time_to_close(conn.as_mut()),
        TIMEOUT,
    );
}

#[test]
fn agent_handshake_timeout_cuts_an_agent_that_never_starts_tls() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--agent-handshake-timeout", "1s"]),
        ..Default::default()
    };
    let server = Server::start(&pki, options).unwrap();
    let mut tcp = raw_tcp(server.agent_addr);
    assert_about(
        "the agent endpoint's handshake timeout",
        time_to_close(&mut tcp),
        TIMEOUT,
    );
}

#[test]
fn max_pending_dials_refuses_the_dial_past_the_limit() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--max-pending-dials", "2", "--dial-timeout", "30s"]),
        ..Default::default()
    };
    let (server, _agent) = start_pair(&pki, options).unwrap();
    let hole = target::black_hole(Duration::from_millis(300)).unwrap();
    // Two dials that hang at the agent take both slots.
    let mut pending: Vec<Box<dyn Conn>> = Vec::new();
    for _ in 0..2 {
        let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
        conn.write_all(connect_request(&hole.addr.to_string()).as_bytes())
            .unwrap();
        conn.flush().unwrap();
        pending.push(conn);
    }
    wait_until(IO_TIMEOUT, || {
        server
            .metric("bridgehead_server_dials_pending")
            .unwrap_or(0.0)
            == 2.0
    })
    .expect("two dials pending");
    let echo = target::echo("127.0.0.1:0").unwrap();
    let reply = ask(&pki, &server, &echo.to_string());
    assert_eq!(reply.status, 503, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("2 dials already pending"),
        "{}",
        reply.body
    );
    // A freed slot admits the next dial.
    drop(pending);
    wait_until(IO_TIMEOUT, || {
        server
            .metric("bridgehead_server_dials_pending")
            .unwrap_or(1.0)
            == 0.0
    })
    .expect("the dials of the clients that left are released");
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    assert_eq!(
        kube_connect(conn.as_mut(), &echo.to_string())
            .unwrap()
            .status,
        200
    );
}

#[test]
fn max_tunnels_per_agent_refuses_the_tunnel_past_the_limit() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--max-tunnels-per-agent", "2"]),
        ..Default::default()
    };
    let (server, _agent) = start_pair(&pki, options).unwrap();
    fill_to_the_limit(&pki, &server, 2, "limit of 2 tunnels");
}

#[test]
fn the_agents_max_tunnels_refuses_the_dial_past_its_own_limit() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let _agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            args: args(&["--max-tunnels", "2"]),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    fill_to_the_limit(&pki, &server, 2, "too_many_streams");
}

/// Opens `limit` tunnels through `server`, checks the next is refused with 503 and `reason`
/// in its body, and that closing one makes room again.
fn fill_to_the_limit(pki: &Pki, server: &Server, limit: usize, reason: &str) {
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut open = Vec::new();
    for _ in 0..limit {
        let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
        let reply = kube_connect(conn.as_mut(), &echo).unwrap();
        assert_eq!(reply.status, 200, "{}", reply.head);
        open.push(conn);
    }
    let reply = ask(pki, server, &echo);
    assert_eq!(reply.status, 503, "{}{}", reply.head, reply.body);
    assert!(reply.body.contains(reason), "{}", reply.body);
    // Closing one makes room again.
    open.pop();
    wait_until(IO_TIMEOUT, || {
        let mut conn = tls_connect(pki, server.frontend_addr()).unwrap();
        kube_connect(conn.as_mut(), &echo).is_ok_and(|reply| reply.status == 200)
    })
    .expect("a closed tunnel frees its place");
}

/// Threads named by tokio's runtime for its workers (and its blocking pool, unused at startup).
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "tokio-rt-worker")
        .count()
}

#[test]
fn worker_threads_sets_the_runtimes_threads() {
    let pki = Pki::new().unwrap();
    for (flag, workers) in [("3", 3), ("1", 0)] {
        let options = ServerOptions {
            args: args(&["--worker-threads", flag]),
            ..Default::default()
        };
        let server = Server::start(&pki, options).unwrap();
        // The runtime's threads name themselves as they start, which may be just after the
        // server announced its listeners.
        let pid = server.process.pid();
        let started = wait_until(IO_TIMEOUT, || runtime_workers(pid) >= workers);
        assert!(
            started.is_ok(),
            "--worker-threads {flag}: {}",
            runtime_workers(pid)
        );
        assert_eq!(runtime_workers(pid), workers, "--worker-threads {flag}");
    }
}

/// A flood of connections that never start TLS, with the server's descriptors capped: past
/// each listener's handshake limit they are closed at once, so an honest CONNECT still gets
/// through quickly instead of waiting for descriptors the flood holds.
#[test]
fn a_flood_of_stalled_handshakes_leaves_room_for_an_honest_connect() {
    const FLOOD: usize = 1500;
    bridgehead_runtime::limits::raise_nofile_to(Some(FLOOD as u64 * 2 + 512));
    let pki = Pki::new().unwrap();
    let capped = bridgehead_e2e::Wrapper {
        command: ["sh", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\""]
            .map(Into::into)
            .into(),
        patience: 1,
    };
    let (server, _agent) = start_pair(
        &pki,
        ServerOptions {
            args: args(&["--max-handshakes", "128", "--max-agent-handshakes", "128"]),
            wrapper: Some(capped),
            ..Default::default()
        },
    )
    .unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut flood = Vec::new();
    for i in 0..FLOOD {
        let addr = if i % 2 == 0 {
            server.frontend_addr()
        } else {
            server.agent_addr
        };
        if let Ok(tcp) = TcpStream::connect(addr) {
            flood.push(tcp);
        }
    }
    let started = Instant::now();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo).unwrap();
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(
        took < Duration::from_secs(2),
        "an honest CONNECT took {took:?} in the flood"
    );
    let refused = server
        .metric("bridgehead_server_handshakes_refused_total{listener=\"frontend\"}")
        .unwrap()
        + server
            .metric("bridgehead_server_handshakes_refused_total{listener=\"agent\"}")
            .unwrap();
    assert!(refused > 0.0, "the flood was not refused");
    // The refusals are logged a few a second, not one line each.
    let lines = server
        .process
        .stderr()
        .lines()
        .filter(|line| line.contains("in their handshake: the oldest was closed"))
        .count();
    assert!(lines < 100, "{lines} refusal lines for {refused} refusals");
    drop(flood);
}

/// A peer that sends a byte more often than the stall time never counts as stalled, so the
/// stall rule never cuts it: `--agent-handshake-timeout`, the backstop, still does.
#[test]
fn agent_handshake_timeout_cuts_an_agent_that_trickles_its_hello() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&[
            "--agent-handshake-timeout",
            "1s",
            "--agent-handshake-stall",
            "500ms",
        ]),
        ..Default::default()
    };
    let server = Server::start(&pki, options).unwrap();
    let mut tcp = raw_tcp(server.agent_addr);
    let mut trickle = tcp.try_clone().unwrap();
    // A ClientHello's record header promising 512 bytes, then zeros: a byte every 200 ms, as
    // a slowloris paces itself, until the server closes.
    let paced = std::thread::spawn(move || {
        let hello = [0x16u8, 0x03, 0x01, 0x02, 0x00];
        for byte in hello.into_iter().chain(std::iter::repeat(0)) {
            if trickle.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    assert_about(
        "the agent endpoint's handshake backstop",
        time_to_close(&mut tcp),
        TIMEOUT,
    );
    drop(tcp);
    paced.join().unwrap();
}

/// A handshake is not work a shutdown waits for (the agent has proved nothing yet): with a
/// silent connection accepted on the agent port and the handshake bound far away, SIGTERM
/// ends the server at once, not when the handshake's bound or the close timeout comes.
#[test]
fn a_shutdown_does_not_wait_for_an_agent_handshake() {
    let pki = Pki::new().unwrap();
    let options = ServerOptions {
        args: args(&["--agent-handshake-timeout", "10m"]),
        ..Default::default()
    };
    let mut server = Server::start(&pki, options).unwrap();
    let pid = server.process.pid();
    let before = bridgehead_e2e::procfs::fd_count(pid);
    let _silent = raw_tcp(server.agent_addr);
    // Accepted once the server holds a descriptor for it.
    wait_until(IO_TIMEOUT, || {
        bridgehead_e2e::procfs::fd_count(pid) > before
    })
    .unwrap();
    let started = Instant::now();
    server.process.signal("TERM").unwrap();
    server.process.wait_exit(IO_TIMEOUT).unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the server took {took:?} to exit with one handshake open"
    );
}
