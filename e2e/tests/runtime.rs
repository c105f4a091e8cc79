//! The runtime follows the CPUs a process may use: an agent pinned to one CPU (as a pod
//! limited to one CPU is) runs single-threaded, and its tunnels work. Logs written to a file
//! carry no color codes.

use bridgehead_e2e::client::{echo_round_trip, kube_connect, tls_connect};
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions, Wrapper};

/// Threads of a process, from /proc.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

#[test]
fn an_agent_on_one_cpu_runs_single_threaded_and_tunnels() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    let pinned = Wrapper {
        command: ["taskset", "-c", "0"].map(Into::into).into(),
        patience: 1,
    };
    let agent = Agent::start(
        &pki,
        &server,
        AgentOptions {
            wrapper: Some(pinned),
            ..AgentOptions::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let log = agent.process.stderr();
    assert!(
        log.contains("runtime: current-thread"),
        "the pinned agent should run single-threaded:\n{log}"
    );
    // The server, free to use every CPU here, picks workers by the CPUs it may use.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server_log = server.process.stderr();
    let expected = if cpus == 1 {
        "runtime: current-thread".to_owned()
    } else {
        format!("workers={cpus}")
    };
    assert!(
        server_log.contains(&expected),
        "{expected} in:\n{server_log}"
    );
    // stderr is a file here, as in a pod: no color codes in it.
    assert!(
        !server_log.contains('\x1b'),
        "escape codes in:\n{server_log}"
    );

    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    echo_round_trip(conn.as_mut(), b"one thread is enough");
    // Main thread only: no worker threads (tokio's blocking pool starts threads only for
    // name lookups, and this tunnel's target is an address).
    assert_eq!(threads(agent.process.pid()), 1, "agent threads");
}
