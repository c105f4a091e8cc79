//! Processes coming and going: resource hygiene over many tunnels, an agent killed under load,
//! a server replaced, and graceful shutdown of each binary.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{
    echo_round_trip, kube_connect, tls_config, tls_connect, tls_connect_with, tls_shutdown_write,
    tls_stream, Conn, TlsStream, IO_TIMEOUT,
};
use bridgehead_e2e::process::{start_pair, wait_until, Process};
use bridgehead_e2e::{target, Pki, Server, ServerOptions};

/// How long the processes get to settle (close sockets, update gauges) after the clients left.
const SETTLE: Duration = Duration::from_secs(10);

fn open(conn: &mut dyn Conn, target: &str) {
    let reply = kube_connect(conn, target).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(reply.extra.is_empty(), "bytes after the head");
}

/// A tunnel to the counter target that got "before" ahead of a SIGTERM to `process`: it still
/// carries data, `process` waits for it, and exits 0 once the client ended it.
fn finish_after_sigterm(mut tls: TlsStream, process: &mut Process, what: &str) {
    tls.write_all(b" and after SIGTERM").unwrap();
    tls.flush().unwrap();
    assert!(!process.exited(), "the {what} did not wait for the tunnel");
    tls_shutdown_write(&mut tls).unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 24");
    drop(tls);
    let status = process.wait_exit(IO_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(0), "{}", process.stderr());
}

#[test]
fn two_thousand_tunnels_leave_no_descriptor_behind() {
    const CYCLES: usize = 2_000;
    const THREADS: usize = 4;
    const SLACK: usize = 4;
    let pki = Pki::new().unwrap();
    let (server, agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let frontend = server.frontend_addr();
    let cycle = |config: &Arc<rustls::ClientConfig>| {
        let mut conn = tls_connect_with(config.clone(), frontend).unwrap();
        open(conn.as_mut(), &echo);
        echo_round_trip(conn.as_mut(), b"x");
    };
    // Warm up (thread pools, lazily opened files), then take the baseline.
    cycle(&config);
    let settled = |process: &bridgehead_e2e::process::Process, base: usize| {
        wait_until(SETTLE, || process.fd_count().abs_diff(base) <= SLACK).is_ok()
    };
    wait_until(SETTLE, || {
        server.metric("bridgehead_server_tunnels_open").unwrap() == 0.0
    })
    .unwrap();
    let server_base = server.process.fd_count();
    let agent_base = agent.process.fd_count();

    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..CYCLES / THREADS {
                    cycle(&config);
                }
            });
        }
    });

    wait_until(SETTLE, || {
        server.metric("bridgehead_server_tunnels_open").unwrap() == 0.0
    })
    .unwrap_or_else(|_| panic!("tunnels still open:\n{}", server.get("/metrics").unwrap().1));
    assert!(
        settled(&server.process, server_base),
        "server descriptors: {} after, {server_base} before",
        server.process.fd_count()
    );
    assert!(
        settled(&agent.process, agent_base),
        "agent descriptors: {} after, {agent_base} before",
        agent.process.fd_count()
    );
    let ok = server
        .metric("bridgehead_server_dials_total{result=\"ok\"}")
        .unwrap();
    assert_eq!(ok, (CYCLES + 1) as f64);
}

#[test]
fn a_killed_agent_fails_the_tunnel_instead_of_ending_it() {
    let pki = Pki::new().unwrap();
    let (server, mut agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    // Far more than the test will read: the stream is mid-transfer when the agent dies.
    let source = target::source("127.0.0.1:0", 1 << 40).unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    // The target speaks first: its bytes may follow the head in the same read.
    let reply = kube_connect(conn.as_mut(), &source.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = reply.extra.len();
    while read < 1 << 20 {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "EOF from an endless source");
        read += n;
    }

    agent.process.kill();
    let killed = Instant::now();
    let end = loop {
        match conn.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(error) => break Err(error),
        }
    };
    let elapsed = killed.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "the client noticed only after {elapsed:?}"
    );
    let error = end.expect_err("a killed agent ended the tunnel with a clean EOF");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionReset,
        "{error}; server log:\n{}",
        server.process.stderr()
    );
    server.wait_agents(0).unwrap();
    assert!(server.agents().unwrap().is_empty());
}

/// A target that resets its connection: the client gets a reset too, not a clean EOF that
/// would pass for the target's normal end; the bytes sent before it arrive first.
#[test]
fn a_target_reset_reaches_the_client_as_a_reset() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = listener.local_addr().unwrap();
    let resetter = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        socket.read_exact(&mut buf).unwrap();
        std::io::Write::write_all(&mut socket, b"before the reset").unwrap();
        // Give the bytes time to leave before the RST overtakes them in the agent's socket.
        let mut ack = [0u8; 3];
        socket.read_exact(&mut ack).unwrap();
        rustix::net::sockopt::set_socket_linger(&socket, Some(Duration::ZERO)).unwrap();
        drop(socket);
    });
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &target.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    conn.write_all(b"hello").unwrap();
    let mut got = vec![0u8; b"before the reset".len()];
    conn.read_exact(&mut got).unwrap();
    assert_eq!(got, b"before the reset");
    conn.write_all(b"ack").unwrap();
    resetter.join().unwrap();
    assert_reset(conn.as_mut(), "a target reset");
    server
        .process
        .wait_log("ended=reset", Duration::from_secs(10))
        .unwrap();
}

#[test]
fn the_agent_reconnects_to_a_restarted_server() {
    let pki = Pki::new().unwrap();
    let (mut first, agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let port = first.agent_addr.port();
    first.process.kill();
    // The agent notices the session is gone.
    wait_until(IO_TIMEOUT, || matches!(agent.get("/readyz"), Ok((503, _)))).unwrap();

    let second = Server::start(
        &pki,
        ServerOptions {
            agent_port: Some(port),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(second.agent_addr.port(), port);
    second.wait_agents(1).unwrap();
    wait_until(IO_TIMEOUT, || matches!(agent.get("/readyz"), Ok((200, _)))).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&pki, second.frontend_addr()).unwrap();
    open(conn.as_mut(), &echo.to_string());
    echo_round_trip(conn.as_mut(), b"through the new server");
}

#[test]
fn sigterm_lets_the_servers_open_tunnel_finish_then_exits_0() {
    let pki = Pki::new().unwrap();
    let (mut server, _agent) = start_pair(
        &pki,
        ServerOptions {
            args: vec!["--shutdown-grace-period".into(), "10s".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let counter = target::counter("127.0.0.1:0").unwrap();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let mut tls = tls_stream(config, server.frontend_addr()).unwrap();
    open(&mut tls, &counter.to_string());
    tls.write_all(b"before").unwrap();
    tls.flush().unwrap();

    server.process.signal("TERM").unwrap();
    server
        .process
        .wait_log("shutting down: no new connections", IO_TIMEOUT)
        .unwrap();
    // No new clients: the frontend stops listening...
    let frontend = server.frontend_addr();
    wait_until(IO_TIMEOUT, || TcpStream::connect(frontend).is_err())
        .expect("the frontend still accepts connections after SIGTERM");
    // ...but the open tunnel still carries data, and the server waits for it.
    finish_after_sigterm(tls, &mut server.process, "server");
    assert!(
        server
            .process
            .stderr()
            .contains("shutdown complete: every tunnel finished"),
        "{}",
        server.process.stderr()
    );
}

#[test]
fn sigterm_drains_the_agent_then_exits_0() {
    let pki = Pki::new().unwrap();
    let (server, mut agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let counter = target::counter("127.0.0.1:0").unwrap();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let mut tls = tls_stream(config, server.frontend_addr()).unwrap();
    open(&mut tls, &counter.to_string());
    tls.write_all(b"before").unwrap();
    tls.flush().unwrap();

    agent.process.signal("TERM").unwrap();
    // The server hears of the drain and routes nothing new to the agent.
    wait_until(IO_TIMEOUT, || {
        server
            .agents()
            .is_ok_and(|agents| agents.iter().all(|a| a["draining"] == true) && !agents.is_empty())
    })
    .unwrap_or_else(|_| panic!("agent not draining: {:?}", server.agents()));
    assert!(matches!(agent.get("/readyz"), Ok((503, _))));
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &counter.to_string()).unwrap();
    assert_eq!(reply.status, 503, "{}", reply.head);

    // The open tunnel keeps working until the client ends it.
    finish_after_sigterm(tls, &mut agent.process, "agent");
    wait_until(IO_TIMEOUT, || server.agents().is_ok_and(|a| a.is_empty())).unwrap();
}

/// Reads `conn` until it ends; the end must be a reset, not a clean EOF, within `IO_TIMEOUT`.
fn assert_reset(conn: &mut dyn Read, what: &str) {
    let mut buf = [0u8; 4096];
    let end = loop {
        match conn.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(error) => break Err(error),
        }
    };
    let error = end.expect_err(&format!("{what}: the tunnel ended with a clean EOF"));
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::ConnectionReset,
        "{what}: {error}"
    );
}

#[test]
fn a_frozen_agent_is_dropped_within_its_keepalive_and_its_tunnels_fail() {
    let pki = Pki::new().unwrap();
    // Silence for three keepalive intervals is death: 3 s here (15 s by default).
    let keepalive = Duration::from_secs(1);
    let options = ServerOptions {
        args: vec!["--keepalive-time".into(), "1s".into()],
        ..Default::default()
    };
    let (server, agent) = start_pair(&pki, options).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut open_tunnel = tls_connect(&pki, server.frontend_addr()).unwrap();
    open(open_tunnel.as_mut(), &echo);
    echo_round_trip(open_tunnel.as_mut(), b"before the freeze");

    agent.process.signal("STOP").unwrap();
    let frozen = Instant::now();
    // A dial sent to the frozen agent waits for an answer that never comes.
    let pending = std::thread::spawn({
        let (pki_dir, frontend, echo) =
            (pki.dir().to_owned(), server.frontend_addr(), echo.clone());
        move || {
            let config = bridgehead_e2e::client::tls::config(
                &pki_dir.join("frontend-ca.crt"),
                Some((&pki_dir.join("client.crt"), &pki_dir.join("client.key"))),
            )
            .unwrap();
            let mut conn = tls_connect_with(config, frontend).unwrap();
            kube_connect(conn.as_mut(), &echo).unwrap().status
        }
    });
    wait_until(IO_TIMEOUT, || server.agents().is_ok_and(|a| a.is_empty()))
        .expect("the frozen agent stays registered");
    bridgehead_e2e::timing::assert_about(
        "dropping a frozen agent",
        frozen.elapsed(),
        keepalive * 3,
    );
    assert_eq!(pending.join().unwrap(), 502, "the pending dial");
    assert_reset(open_tunnel.as_mut(), "the frozen agent's open tunnel");
    agent.process.signal("CONT").unwrap();
}

#[test]
fn the_servers_grace_period_cuts_the_tunnels_that_outlast_it() {
    let pki = Pki::new().unwrap();
    let grace = Duration::from_secs(1);
    let options = ServerOptions {
        args: vec!["--shutdown-grace-period".into(), "1s".into()],
        ..Default::default()
    };
    let (mut server, _agent) = start_pair(&pki, options).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut tunnel = tls_connect(&pki, server.frontend_addr()).unwrap();
    open(tunnel.as_mut(), &echo);
    echo_round_trip(tunnel.as_mut(), b"still open at SIGTERM");

    server.process.signal("TERM").unwrap();
    let signalled = Instant::now();
    let status = server.process.wait_exit(IO_TIMEOUT).unwrap();
    bridgehead_e2e::timing::assert_about("the shutdown grace period", signalled.elapsed(), grace);
    assert_eq!(status.code(), Some(0), "{}", server.process.stderr());
    assert_reset(
        tunnel.as_mut(),
        "a tunnel cut at the end of the grace period",
    );
    let log = server.process.stderr();
    let cut = log
        .lines()
        .find(|line| line.contains("were cut"))
        .unwrap_or_else(|| panic!("no line about cut tunnels:\n{log}"));
    assert!(cut.contains("tunnels=1"), "{cut}");
}

#[test]
fn the_agents_drain_grace_period_cuts_the_tunnels_that_outlast_it() {
    let pki = Pki::new().unwrap();
    let grace = Duration::from_secs(1);
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let mut agent = bridgehead_e2e::Agent::start(
        &pki,
        &server,
        bridgehead_e2e::AgentOptions {
            args: vec!["--drain-grace-period".into(), "1s".into()],
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap().to_string();
    let mut tunnel = tls_connect(&pki, server.frontend_addr()).unwrap();
    open(tunnel.as_mut(), &echo);
    echo_round_trip(tunnel.as_mut(), b"still open at SIGTERM");

    agent.process.signal("TERM").unwrap();
    let signalled = Instant::now();
    let status = agent.process.wait_exit(IO_TIMEOUT).unwrap();
    bridgehead_e2e::timing::assert_about("the drain grace period", signalled.elapsed(), grace);
    assert_eq!(status.code(), Some(0), "{}", agent.process.stderr());
    assert_reset(tunnel.as_mut(), "a tunnel cut at the end of the drain");
    let log = agent.process.stderr();
    let cut = log
        .lines()
        .find(|line| line.contains("cutting the remaining tunnels"))
        .unwrap_or_else(|| panic!("no line about cut tunnels:\n{log}"));
    assert!(cut.contains("open_streams=1"), "{cut}");
}

#[test]
fn refused_connects_leave_no_descriptor_behind() {
    const EACH: usize = 200;
    const THREADS: usize = 8;
    const SLACK: usize = 4;
    let pki = Pki::new().unwrap();
    // destHost only: a target on no agent's list is a 503 that sends nothing anywhere.
    let server = Server::start(
        &pki,
        ServerOptions {
            args: ["--proxy-strategies", "destHost", "--dial-timeout", "500ms"]
                .map(String::from)
                .into(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = bridgehead_e2e::Agent::start(
        &pki,
        &server,
        bridgehead_e2e::AgentOptions {
            identifiers: Some("ipv4=127.0.0.1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    // Held for the whole test: dropping it frees the port for any other test's listener.
    let closed_port = target::closed_port().unwrap();
    let closed = closed_port.to_string();
    let hole = target::black_hole(Duration::from_millis(300)).unwrap();
    let hole_addr = hole.addr.to_string();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let frontend = server.frontend_addr();
    let kinds: [(&str, String, u16); 5] = [
        (
            "bad target",
            "CONNECT not a target HTTP/1.1\r\n\r\n".into(),
            400,
        ),
        (
            "not CONNECT",
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n".into(),
            405,
        ),
        (
            "refused",
            bridgehead_e2e::client::kube::connect_head(&closed),
            502,
        ),
        (
            "no agent",
            bridgehead_e2e::client::kube::connect_head("192.0.2.1:80"),
            503,
        ),
        (
            "dial timeout",
            bridgehead_e2e::client::kube::connect_head(&hole_addr),
            504,
        ),
    ];
    let refuse_all = |rounds: usize| {
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..rounds.div_ceil(THREADS) {
                        for (what, request, status) in &kinds {
                            let mut conn = tls_connect_with(config.clone(), frontend).unwrap();
                            let reply = bridgehead_e2e::client::request_reply(
                                conn.as_mut(),
                                request.as_bytes(),
                            )
                            .unwrap();
                            assert_eq!(reply.status, *status, "{what}: {}", reply.body);
                        }
                    }
                });
            }
        });
    };
    // Warm up, then take the baseline.
    refuse_all(THREADS);
    let quiet = || {
        server
            .metric("bridgehead_server_dials_pending")
            .unwrap_or(1.0)
            == 0.0
    };
    wait_until(SETTLE, quiet).unwrap();
    let server_base = server.process.fd_count();
    let agent_base = agent.process.fd_count();
    refuse_all(EACH);
    wait_until(SETTLE, quiet).unwrap();
    for (process, base, what) in [
        (&server.process, server_base, "server"),
        (&agent.process, agent_base, "agent"),
    ] {
        let settled = wait_until(SETTLE, || process.fd_count() <= base + SLACK).is_ok();
        assert!(
            settled,
            "{what} descriptors: {} after {} refusals, {base} before",
            process.fd_count(),
            EACH * kinds.len()
        );
    }
}
