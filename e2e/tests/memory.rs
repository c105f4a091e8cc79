//! The memory budget (`--tunnel-memory-budget`) with real processes: tunnels whose far end
//! stopped reading fill it, past it new CONNECTs get 503 "overloaded" while open tunnels keep
//! moving, and it empties again when the stalled tunnels go. Once on the server (a client
//! that does not read its download), once on the agent (a target that does not read its
//! upload).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{
    echo_round_trip, kube_connect, tls_connect, uds_stream, ConnectReply,
};
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

const BUDGET: u64 = 1024 * 1024;
/// The most one tunnel may hold against the budget: its window, at most the initial 64 KiB
/// (the stalled tunnels never read enough to earn more).
const MOST_PER_TUNNEL: u64 = 64 * 1024;
/// Stalled tunnels opened at most before the budget must be spent (each holds at least the
/// 16 KiB floor window).
const MOST_TUNNELS: usize = (BUDGET / (16 * 1024)) as usize + 8;
const WAIT: Duration = Duration::from_secs(20);

/// Polls `done` until it holds, at most [`WAIT`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect(path: &Path, target: SocketAddr) -> (UnixStream, ConnectReply) {
    let mut conn = uds_stream(path).unwrap();
    let reply = kube_connect(&mut conn, &target.to_string()).unwrap();
    (conn, reply)
}

/// A server on a Unix socket with `server_args` and its agent with `agent_args`.
fn pair(pki: &Pki, path: &Path, server_args: &[&str], agent_args: &[&str]) -> (Server, Agent) {
    let server = Server::start(
        pki,
        ServerOptions {
            uds: Some(path.to_owned()),
            args: server_args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(
        pki,
        &server,
        AgentOptions {
            args: agent_args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    (server, agent)
}

/// The tunnel bytes `server` holds against its budget.
fn server_buffered(server: &Server) -> u64 {
    server
        .metric("bridgehead_server_tunnel_buffered_bytes")
        .unwrap() as u64
}

/// Reads the download on `conn` until `read` (the bytes read so far) reaches `upto`; the
/// download must not end first.
fn read_up_to(conn: &mut UnixStream, read: &mut u64, upto: u64) {
    let mut buf = vec![0u8; 256 * 1024];
    while *read < upto {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the download ended after {read} bytes");
        *read += n as u64;
    }
}

/// Opens tunnels to `target`, each made to stall by `stall` (which returns once it has),
/// until a CONNECT is refused; returns the stalled tunnels and the refusal.
fn stall_until_refused(
    path: &Path,
    target: SocketAddr,
    buffered: impl Fn() -> u64,
    mut stall: impl FnMut(&mut UnixStream),
) -> (Vec<UnixStream>, ConnectReply) {
    let mut stalled = Vec::new();
    loop {
        assert!(
            stalled.len() <= MOST_TUNNELS,
            "{} stalled tunnels and no refusal yet ({} bytes buffered)",
            stalled.len(),
            buffered()
        );
        let (mut conn, reply) = connect(path, target);
        if reply.status != 200 {
            eprintln!(
                "refused after {} stalled tunnels, {} bytes buffered",
                stalled.len(),
                buffered()
            );
            return (stalled, reply);
        }
        stall(&mut conn);
        stalled.push(conn);
    }
}

fn assert_overloaded(reply: &ConnectReply, what: &str) {
    assert_eq!(reply.status, 503, "{what}: {}", reply.head);
    assert!(
        reply.head.contains("overloaded") && reply.head.contains("memory-budget"),
        "{what}: the reason does not say why: {}",
        reply.head
    );
}

#[test]
fn past_the_servers_budget_new_tunnels_get_503_and_open_ones_keep_moving() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, _agent) = pair(&pki, &path, &["--tunnel-memory-budget", "1Mi"], &[]);
    let buffered = || server_buffered(&server);
    assert_eq!(
        server
            .metric("bridgehead_server_tunnel_memory_budget_bytes")
            .unwrap() as u64,
        BUDGET
    );
    let echo = target::echo("127.0.0.1:0").unwrap();
    let (mut reading, reply) = connect(&path, echo);
    assert_eq!(reply.status, 200, "{}", reply.head);
    echo_round_trip(&mut reading, b"before the budget fills");

    // Downloads nobody reads: the server holds what the agent sends until the budget is spent.
    let firehose = target::source("127.0.0.1:0", usize::MAX).unwrap();
    // (Once its first bytes reach the client, after the server's hold, a tunnel streams.)
    let (stalled, refused) = stall_until_refused(&path, firehose, buffered, |conn| {
        wait_until("the firehose's first bytes at the client", || {
            rustix::io::ioctl_fionread(&*conn).unwrap() > 0
        })
    });
    assert_overloaded(&refused, "a CONNECT past the server's budget");
    // The refusal came with the budget spent; by now a stalled tunnel may have passed a few
    // more bytes to its socket, but not many.
    let held = buffered();
    assert!(
        held >= BUDGET - MOST_PER_TUNNEL && held <= BUDGET + stalled.len() as u64 * MOST_PER_TUNNEL,
        "{held} bytes buffered by {} stalled tunnels, budget {BUDGET}",
        stalled.len()
    );
    assert!(
        server
            .metric("bridgehead_server_tunnel_memory_refusals_total")
            .unwrap()
            >= 1.0
    );
    assert!(
        server
            .metric("bridgehead_server_dials_total{result=\"overloaded\"}")
            .unwrap()
            >= 1.0
    );
    // A tunnel that reads still moves, byte for byte, with the budget spent.
    let big: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    echo_round_trip(&mut reading, &big);

    // The stalled tunnels go: their bytes leave the budget, and tunnels open again.
    drop(stalled);
    wait_until("the budget to empty", || buffered() == 0);
    let (_again, reply) = connect(&path, echo);
    assert_eq!(reply.status, 200, "{}", reply.head);
}

/// A target that accepts and never reads, its receive buffer small so the agent's side fills.
fn sink() -> (SocketAddr, Arc<Mutex<Vec<TcpStream>>>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    socket.listen(128).unwrap();
    let listener: TcpListener = socket.into();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            keep.lock().unwrap().push(stream);
        }
    });
    (addr, held)
}

/// Writes into `conn` until its socket takes no more.
fn fill(conn: &mut UnixStream) {
    conn.set_nonblocking(true).unwrap();
    let block = [0x5au8; 64 * 1024];
    loop {
        match conn.write(&block) {
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::WouldBlock => return,
            Err(error) => panic!("filling the tunnel: {error}"),
        }
    }
}

#[test]
fn past_the_agents_budget_its_dials_are_refused_as_overloaded() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, agent) = pair(&pki, &path, &[], &["--tunnel-memory-budget", "1Mi"]);
    let buffered = || {
        agent
            .metric("bridgehead_agent_tunnel_buffered_bytes")
            .unwrap() as u64
    };
    // Uploads the target never reads: the agent holds what the server sends.
    let (sink, held_by_target) = sink();
    let (stalled, refused) = stall_until_refused(&path, sink, buffered, |conn| {
        let before = buffered();
        fill(conn);
        wait_until("the stalled tunnel's bytes to be buffered", || {
            buffered() > before
        });
    });
    assert_overloaded(&refused, "a CONNECT past the agent's budget");
    assert!(
        refused.head.contains("agent") && refused.head.contains("could not dial"),
        "{}",
        refused.head
    );
    assert!(
        agent
            .metric("bridgehead_agent_tunnel_memory_refusals_total")
            .unwrap()
            >= 1.0
    );
    let held = buffered();
    assert!(
        held <= BUDGET + stalled.len() as u64 * MOST_PER_TUNNEL,
        "{held} bytes buffered by {} stalled tunnels",
        stalled.len()
    );
    // The server's own budget is untouched: it was the agent that refused.
    assert_eq!(
        server
            .metric("bridgehead_server_tunnel_memory_refusals_total")
            .unwrap(),
        0.0
    );
    // The clients go, but what they sent is still owed to the target (a tunnel delivers
    // every byte or fails): only the target's end lets the agent's budget go.
    drop(stalled);
    held_by_target.lock().unwrap().clear();
    wait_until("the agent's budget to empty", || buffered() == 0);
    let echo = target::echo("127.0.0.1:0").unwrap();
    let (mut conn, reply) = connect(&path, echo);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let mut back = [0u8; 4];
    conn.write_all(b"ping").unwrap();
    conn.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
}

/// An agent that stopped reading (frozen, its socket buffers full of what the server sent it)
/// cannot hold a dial past `--dial-timeout`: the DIAL waits in the server's queue behind the
/// full socket, but the dial's deadline is the session's own clock, and the client gets 504
/// on time — long before the keepalive would drop the agent.
#[test]
fn a_dial_to_an_agent_that_stopped_reading_times_out_on_time() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let dial_timeout = Duration::from_secs(1);
    // Keepalive death at 3 × 10 s: far past the dial timeout.
    let (server, agent) = pair(
        &pki,
        &path,
        &["--dial-timeout", "1s", "--keepalive-time", "10s"],
        &[],
    );
    let (sink, _held) = sink();
    let mut tunnels: Vec<UnixStream> = (0..64)
        .map(|_| {
            let (conn, reply) = connect(&path, sink);
            assert_eq!(reply.status, 200, "{}", reply.head);
            conn
        })
        .collect();
    agent.process.signal("STOP").unwrap();
    // Every tunnel sends its window's worth towards the frozen agent: the server's queue and
    // the socket to the agent fill.
    for conn in &mut tunnels {
        fill(conn);
    }
    wait_until("the link to the frozen agent to back up", || {
        bridgehead_e2e::procfs::tcp_queued(server.process.pid()).1 >= 1024 * 1024
    });
    let echo = target::echo("127.0.0.1:0").unwrap();
    let started = Instant::now();
    let (_conn, reply) = connect(&path, echo);
    let took = started.elapsed();
    agent.process.signal("CONT").unwrap();
    assert_eq!(reply.status, 504, "{}", reply.head);
    bridgehead_e2e::timing::assert_about("the dial to a frozen agent", took, dial_timeout);
    assert_eq!(
        server
            .metric("bridgehead_server_dials_total{result=\"timed_out\"}")
            .unwrap(),
        1.0
    );
}

/// Clients hammering a server whose one agent stopped answering (kube-apiserver retrying
/// against a wedged node agent): the dials pending on it never pass
/// `--max-pending-dials-per-agent`, everything beyond is answered 503 at once and counted, and
/// once the burst is over the server holds what it held before it: no descriptor, no dial, no
/// memory growth left behind.
#[test]
fn a_connect_burst_against_a_frozen_agent_stays_bounded_and_leaves_nothing_behind() {
    const PENDING: usize = 8;
    const CLIENTS: usize = 24;
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, agent) = pair(
        &pki,
        &path,
        &[
            "--max-pending-dials-per-agent",
            "8",
            "--dial-timeout",
            "1s",
            "--keepalive-time",
            "30s",
        ],
        &[],
    );
    let echo = target::echo("127.0.0.1:0").unwrap();
    let pending = || server.metric("bridgehead_server_dials_pending").unwrap() as usize;
    let burst = |length: Duration| {
        let stop = Instant::now() + length;
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut statuses: HashMap<u16, u64> = HashMap::new();
                    while Instant::now() < stop {
                        let (_conn, reply) = connect(&path, echo);
                        *statuses.entry(reply.status).or_default() += 1;
                    }
                    statuses
                })
            })
            .collect();
        let mut most_pending = 0;
        while threads.iter().any(|t| !t.is_finished()) {
            most_pending = most_pending.max(pending());
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut statuses: HashMap<u16, u64> = HashMap::new();
        for thread in threads {
            for (status, n) in thread.join().unwrap() {
                *statuses.entry(status).or_default() += n;
            }
        }
        (statuses, most_pending)
    };
    agent.process.signal("STOP").unwrap();
    // A first burst settles the server's allocations; the second is measured against it.
    burst(Duration::from_secs(1));
    wait_until("the first burst's dials to end", || pending() == 0);
    let (fds, rss) = (
        server.process.fd_count(),
        bridgehead_e2e::procfs::rss_bytes(server.process.pid()).unwrap(),
    );
    let refused_before = server
        .metric("bridgehead_server_dials_total{result=\"no_agent\"}")
        .unwrap();
    let (statuses, most_pending) = burst(Duration::from_secs(3));
    let total: u64 = statuses.values().sum();
    eprintln!("{total} CONNECTs in 3 s: {statuses:?}, at most {most_pending} dials pending");
    // Every dial the agent was asked for waited out the 1 s timeout, so the 504s show how
    // many it held at once: the bound's worth for each second of the burst, with a second's
    // slack for the edges (unbounded, it would be thousands). The gauge also counts CONNECTs
    // admitted but not yet routed: one per client at most.
    let timed_out = statuses.get(&504).copied().unwrap_or(0);
    assert!(
        timed_out <= PENDING as u64 * 5,
        "{timed_out} dials timed out in 3 s of 1 s dials: more than {PENDING} at once"
    );
    assert!(
        most_pending <= PENDING + CLIENTS,
        "{most_pending} dials pending, bound {PENDING} on the agent + {CLIENTS} being routed"
    );
    assert!(
        statuses.keys().all(|s| *s == 503 || *s == 504),
        "{statuses:?}"
    );
    let refused = statuses.get(&503).copied().unwrap_or(0);
    assert!(refused > 0, "{statuses:?}");
    let counted = server
        .metric("bridgehead_server_dials_total{result=\"no_agent\"}")
        .unwrap()
        - refused_before;
    assert_eq!(counted as u64, refused, "every 503 counted");
    // The burst over, nothing of it is left.
    wait_until("the burst's dials to end", || pending() == 0);
    wait_until("the burst's descriptors to close", || {
        server.process.fd_count() <= fds
    });
    let after = bridgehead_e2e::procfs::rss_bytes(server.process.pid()).unwrap();
    assert!(
        after <= rss + rss / 4 + 4 * 1024 * 1024,
        "the server grew from {} to {} KiB over the burst",
        rss >> 10,
        after >> 10
    );
    agent.process.signal("CONT").unwrap();
    let (_conn, reply) = connect(&path, echo);
    assert_eq!(reply.status, 200, "{}", reply.head);
}

/// `--tunnel-max-window`: a tunnel that keeps reading earns a window of more than 1 MiB,
/// up to the flag's (what one tunnel needs to fill a link with latency), and one that then
/// stops reading holds about that much against the budget, never more.
#[test]
fn a_reading_tunnel_earns_the_window_the_flag_allows() {
    const WINDOW: u64 = 4 << 20;
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, _agent) = pair(&pki, &path, &["--tunnel-max-window", "4Mi"], &[]);
    let buffered = || server_buffered(&server);
    let firehose = target::source("127.0.0.1:0", usize::MAX).unwrap();
    let (mut conn, reply) = connect(&path, firehose);
    assert_eq!(reply.status, 200, "{}", reply.head);
    // A tunnel earns an eighth of what it read: after 48 MiB, the flag's 4 MiB.
    let mut read = reply.extra.len() as u64;
    read_up_to(&mut conn, &mut read, 12 * WINDOW);
    // The client stops reading: the server takes what the agent may still send, more than
    // a window of 1 MiB (the old default) would have let it send.
    wait_until("more than 1 MiB held for the stalled download", || {
        buffered() > 1 << 20
    });
    let held = buffered();
    assert!(
        held <= WINDOW,
        "{held} bytes held, more than the 4 MiB window"
    );
}

/// `tunnel_send_waits_total{reason="window"}`: a download held to a small window by the
/// server (`--tunnel-max-window` at the 64 KiB it starts with) keeps the agent waiting for
/// grants, and the agent counts the waits; the server, whose client sends nothing, counts
/// none. What an operator reads to see that tunnels want a larger window.
#[test]
fn a_download_held_to_a_small_window_counts_the_agents_waits() {
    const BYTES: u64 = 16 << 20;
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, agent) = pair(&pki, &path, &["--tunnel-max-window", "64Ki"], &[]);
    let source = target::source("127.0.0.1:0", BYTES as usize).unwrap();
    let (mut conn, reply) = connect(&path, source);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let mut read = reply.extra.len() as u64;
    read_up_to(&mut conn, &mut read, BYTES);
    let waits = |metric: anyhow::Result<f64>| metric.unwrap() as u64;
    let agent_waits =
        waits(agent.metric("bridgehead_agent_tunnel_send_waits_total{reason=\"window\"}"));
    assert!(
        agent_waits >= 1,
        "the agent never waited for the 64 KiB window"
    );
    // Every wait ends with a grant, and a grant covers at least half the window.
    assert!(
        agent_waits <= BYTES / (32 << 10) + 1,
        "{agent_waits} waits: more than one per grant"
    );
    for reason in ["window", "queue"] {
        let series = format!("bridgehead_server_tunnel_send_waits_total{{reason=\"{reason}\"}}");
        assert_eq!(waits(server.metric(&series)), 0, "{series}");
    }
}

/// `--tunnel-receive-buffer-max`: a download whose client keeps reading earns its target
/// socket a larger receive buffer than `--tunnel-receive-buffer`, doubling at every eight
/// times the buffer it moved, out of a quarter of the agent's budget for all tunnels together;
/// its share comes back when the tunnel ends. Without the earning the metric stays at 0;
/// without the total the socket would earn up to the flag's 4 MiB (3.9 MiB beyond the start).
#[test]
fn a_reading_download_earns_its_target_socket_a_larger_buffer_within_the_budget() {
    const BYTES: u64 = 64 << 20;
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    // A quarter of 2 MiB for all tunnels: 512 KiB beyond the 128 KiB each starts with.
    let (_server, agent) = pair(&pki, &path, &[], &["--tunnel-memory-budget", "2Mi"]);
    let earned = || {
        agent
            .metric("bridgehead_agent_tunnel_earned_receive_buffer_bytes")
            .unwrap() as u64
    };
    assert_eq!(earned(), 0);
    let source = target::source("127.0.0.1:0", BYTES as usize).unwrap();
    let (mut conn, reply) = connect(&path, source);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let mut read = reply.extra.len() as u64;
    // 32 MiB earn 4 MiB, but the total stops the socket at 512 KiB: 128 + 256 KiB beyond its
    // start (the next doubling, 512 KiB more, does not fit).
    read_up_to(&mut conn, &mut read, BYTES / 2);
    assert_eq!(earned(), 384 * 1024, "earned while the tunnel is open");
    read_up_to(&mut conn, &mut read, BYTES);
    drop(conn);
    wait_until("the tunnel's share to come back", || earned() == 0);
}

/// The same on the server: a CONNECT client's TCP socket whose tunnel keeps reading (an
/// upload through the mTLS frontend) earns a larger receive buffer, out of the server's own
/// quarter of its budget, and gives it back when the tunnel ends.
#[test]
fn a_reading_upload_earns_its_client_socket_a_larger_buffer_within_the_budget() {
    const BYTES: usize = 32 << 20;
    let pki = Pki::new().unwrap();
    let server = Server::start(
        &pki,
        ServerOptions {
            args: vec!["--tunnel-memory-budget".into(), "2Mi".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let _agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    let earned = || {
        server
            .metric("bridgehead_server_tunnel_earned_receive_buffer_bytes")
            .unwrap() as u64
    };
    assert_eq!(earned(), 0);
    let counter = target::counter("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(&mut *conn, &counter.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    let block = vec![9u8; 256 * 1024];
    for _ in 0..BYTES / block.len() {
        conn.write_all(&block).unwrap();
    }
    // As on the agent: 128 + 256 KiB beyond the start, the next doubling past the total.
    wait_until("the client socket to earn 384 KiB", || {
        earned() == 384 * 1024
    });
    drop(conn);
    wait_until("the tunnel's share to come back", || earned() == 0);
}

/// Samples `measure` every 100 ms until three samples in a row are equal (what it measures has
/// settled), at most [`WAIT`]; returns the last.
fn settled(what: &str, mut measure: impl FnMut() -> u64) -> u64 {
    let deadline = Instant::now() + WAIT;
    let (mut last, mut same) = (measure(), 0);
    while same < 3 {
        assert!(
            Instant::now() < deadline,
            "{what}: still moving after {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        let now = measure();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// A target that sends `bytes` to the one connection it accepts, then says what size of
/// segment it sent them in: what its peer asked for in the handshake, at most half the largest
/// window the peer offered.
fn segment_probe(bytes: usize) -> (SocketAddr, std::thread::JoinHandle<u32>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let probe = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let block = vec![0x42u8; 64 * 1024];
        for _ in 0..bytes / block.len() {
            stream.write_all(&block).unwrap();
        }
        socket2::SockRef::from(&stream).tcp_mss().unwrap()
    });
    (addr, probe)
}

/// The segment size a 4 MiB download through a fresh tunnel reaches the agent in.
fn download_segment(path: &Path) -> u32 {
    const BYTES: usize = 4 << 20;
    let (probe, sent) = segment_probe(BYTES);
    let (mut conn, reply) = connect(path, probe);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let mut read = reply.extra.len() as u64;
    read_up_to(&mut conn, &mut read, BYTES as u64);
    sent.join().unwrap()
}

/// Tunnels whose clients stopped reading a firehose hold little in the kernel. On the server,
/// each Unix-socket client's send buffer starts small and a stalled one earns nothing
/// (Linux's default lets each hold about 200 KiB its client has not read). On the agent, the
/// target sockets of tunnels asked for while the server's budget is under pressure (a
/// sixteenth of it held) start at a 16 KiB receive buffer and earn nothing either (the usual
/// 128Ki holds about 240 KiB), while those asked for before keep the full buffer (its window
/// scale is fixed at the handshake, and a bulk tunnel needs it). A tunnel that reads beside
/// them still moves every byte. On loopback, whose segments are 64 KiB, a socket that starts
/// small asks for segments of 8 KiB, so that its window, capped at 64 KiB, holds several.
#[test]
fn stalled_readers_hold_little_in_the_kernel() {
    const BUDGET: u64 = 2 << 20;
    const TUNNELS: usize = 40;
    const SMALL_SEGMENT: u32 = 8 * 1024;
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let (server, agent) = pair(&pki, &path, &["--tunnel-memory-budget", "2Mi"], &[]);
    let segment = download_segment(&path);
    assert!(
        segment > SMALL_SEGMENT,
        "a download before the pressure came in {segment}-byte segments"
    );
    wait_until("the budget to empty", || server_buffered(&server) == 0);
    let agent_pid = agent.process.pid();
    let firehose = target::source("127.0.0.1:0", usize::MAX).unwrap();
    let at_agent = || bridgehead_e2e::procfs::tcp_queued_to(agent_pid, firehose.port());
    // One stalled tunnel at a time, each once the agent's socket for it holds bytes it cannot
    // pass on, counting those asked for before the server's pressure began.
    let mut stalled = Vec::new();
    let mut before_pressure = 0;
    for opened in 1..=TUNNELS {
        // (With one tunnel's window to spare: the last one's bytes may still be on the way.)
        if server_buffered(&server) < BUDGET / 16 + MOST_PER_TUNNEL {
            before_pressure += 1;
        }
        let (conn, reply) = connect(&path, firehose);
        assert_eq!(reply.status, 200, "tunnel {opened}: {}", reply.head);
        stalled.push(conn);
        wait_until("the stalled tunnel's target socket to fill", || {
            at_agent().iter().filter(|q| q.0 > 0).count() == opened
        });
    }
    let unread = || {
        stalled
            .iter()
            .map(|conn| rustix::io::ioctl_fionread(conn).unwrap())
            .sum::<u64>()
    };
    let at_clients = settled("the clients' unread bytes", unread);
    settled("the agent's unread bytes", || {
        at_agent().iter().map(|q| q.0).sum()
    });
    let mut per_socket: Vec<u64> = at_agent().iter().map(|q| q.0).collect();
    per_socket.sort_unstable();
    eprintln!(
        "{TUNNELS} stalled tunnels ({before_pressure} asked for before the pressure), {} bytes buffered by the server, {at_clients} unread at the clients; at the agent, per socket {per_socket:?}",
        server_buffered(&server)
    );
    assert!(
        at_clients <= TUNNELS as u64 * 24 * 1024,
        "{at_clients} bytes wait in {TUNNELS} stalled clients' sockets"
    );
    let pressed = TUNNELS - before_pressure;
    assert!(pressed >= TUNNELS / 2, "{pressed} asked for under pressure");
    assert!(
        per_socket[..pressed].iter().all(|&rx| rx <= 16 * 1024),
        "{pressed} of the agent's target sockets should hold at most 16 KiB: {per_socket:?}"
    );
    let segment = download_segment(&path);
    assert!(
        segment <= SMALL_SEGMENT,
        "a download under pressure came in {segment}-byte segments"
    );
    drop(stalled);
    wait_until("the budget to empty", || server_buffered(&server) == 0);
    let echo = target::echo("127.0.0.1:0").unwrap();
    let (mut reading, reply) = connect(&path, echo);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    echo_round_trip(&mut reading, &big);
}
