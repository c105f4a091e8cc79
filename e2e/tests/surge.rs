//! A node's agent replaced with surge: a DaemonSet rolled with `maxSurge` (docs/operations.md,
//! "Upgrading Bridgehead") starts the new pod while the old one still runs, so the new agent
//! connects under the old one's id and identity while the old one carries tunnels. The new
//! session takes every new tunnel; the old one drains, its open tunnels going on, until its
//! agent is told to stop and ends them.

use std::io::{Read, Write};

use bridgehead_e2e::client::{
    echo_round_trip, kube_connect, tls_config, tls_connect, tls_shutdown_write, tls_stream,
    IO_TIMEOUT,
};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

#[test]
fn a_new_session_of_the_same_agent_takes_new_tunnels_while_the_old_one_finishes_its_own() {
    let pki = Pki::new().unwrap();
    let server = Server::start(&pki, ServerOptions::default()).unwrap();
    // Both with the PKI's agent certificate: one identity, one id.
    let node_a = || AgentOptions {
        id: Some("node-a".into()),
        ..Default::default()
    };
    let mut old = Agent::start(&pki, &server, node_a()).unwrap();
    server.wait_agents(1).unwrap();
    let counter = target::counter("127.0.0.1:0").unwrap();
    let config = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let mut held = tls_stream(config, server.frontend_addr()).unwrap();
    let reply = kube_connect(&mut held, &counter.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    held.write_all(b"before").unwrap();
    held.flush().unwrap();

    let _new = Agent::start(&pki, &server, node_a()).unwrap();
    // The old session stays, draining, beside the new one. (Closed instead, it cut its
    // tunnel, and its agent, still running, came back and replaced the new one in turn.)
    let two = || {
        server.agents().is_ok_and(|agents| {
            agents.len() == 2 && agents.iter().filter(|a| a["draining"] == true).count() == 1
        })
    };
    wait_until(IO_TIMEOUT, two)
        .unwrap_or_else(|_| panic!("not one draining and one new: {:?}", server.agents()));

    // New tunnels go to the new session.
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    echo_round_trip(conn.as_mut(), b"through the new agent");
    let agents = server.agents().unwrap();
    let tunnels: Vec<(bool, u64)> = agents
        .iter()
        .map(|a| {
            (
                a["draining"] == true,
                a["open_tunnels"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert!(
        tunnels.contains(&(true, 1)) && tunnels.contains(&(false, 1)),
        "{agents:?}"
    );

    // The old pod deleted once the new one is ready: the old agent drains; its tunnel still
    // carries data both ways, and it exits 0 once the client ended it.
    old.process.signal("TERM").unwrap();
    held.write_all(b" and after SIGTERM").unwrap();
    held.flush().unwrap();
    tls_shutdown_write(&mut held).unwrap();
    let mut answer = String::new();
    held.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 24");
    drop(held);
    let status = old.process.wait_exit(IO_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(0), "{}", old.process.stderr());
    wait_until(IO_TIMEOUT, || {
        server
            .agents()
            .is_ok_and(|agents| agents.len() == 1 && agents[0]["draining"] == false)
    })
    .unwrap_or_else(|_| panic!("{:?}", server.agents()));
    echo_round_trip(conn.as_mut(), b"the new agent's tunnel still works");
}
