//! Faults between the server and an agent on a test host (a network namespace): the link cut
//! while a tunnel is open. No packet is refused (they vanish), so only the keepalive can tell:
//! the tunnel must end as a reset within three keepalive intervals, never as a clean EOF, and
//! the agent must come back once the link does. Needs root; skipped loudly otherwise.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{kube_connect, tls_connect};
use bridgehead_e2e::netns;
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

/// Both ends' `--keepalive-time`: a silent peer is dropped after three.
const KEEPALIVE: Duration = Duration::from_secs(1);

#[test]
fn a_cut_link_resets_the_tunnel_within_the_keepalive_and_the_agent_comes_back() {
    let test = "a_cut_link_resets_the_tunnel_within_the_keepalive_and_the_agent_comes_back";
    netns::with_net(test, 2, Duration::from_secs(120), |mut net| {
        let pki = Pki::new().unwrap();
        let keepalive = format!("{}s", KEEPALIVE.as_secs());
        let server = Server::start(
            &pki,
            ServerOptions {
                agent_bind: Some(net.server_v4().to_string()),
                args: vec!["--keepalive-time".into(), keepalive.clone()],
                ..Default::default()
            },
        )
        .unwrap();
        let host = net.host(1);
        let _agent = Agent::start(
            &pki,
            &server,
            AgentOptions {
                id: Some("cut".into()),
                args: vec![
                    "--server-name".into(),
                    "127.0.0.1".into(),
                    "--keepalive-time".into(),
                    keepalive,
                ],
                netns: Some(host.ns_name().to_owned()),
                server: Some(server.agent_addr),
                ..Default::default()
            },
        )
        .unwrap();
        server.wait_agents(1).unwrap();
        let target = net
            .who_am_i(1, &format!("{}:0", net.host(1).v4()), "B")
            .unwrap();

        // A tunnel whose target answered and keeps its side open for the client's bytes.
        let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
        let reply = kube_connect(conn.as_mut(), &target.to_string()).unwrap();
        assert_eq!(reply.status, 200, "{}", reply.head);
        let mut name = reply.extra.clone();
        while !name.ends_with(b"\n") {
            let mut buf = [0u8; 16];
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "EOF before the target's name");
            name.extend_from_slice(&buf[..n]);
        }
        assert_eq!(name, b"B\n");

        net.set_link(1, false).unwrap();
        let cut = Instant::now();
        // The client keeps writing; the server must notice the agent is gone and reset the
        // client (a write or read then fails as a reset, never a clean end).
        let failure = loop {
            if let Err(error) = conn.write_all(b"still there?") {
                break error;
            }
            let _ = conn.flush();
            assert!(
                cut.elapsed() < KEEPALIVE * 10,
                "the tunnel still accepted bytes {:?} after the cut",
                cut.elapsed()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let noticed = cut.elapsed();
        assert!(
            matches!(
                failure.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ),
            "{failure}"
        );
        assert!(
            noticed <= KEEPALIVE * 3 + Duration::from_secs(2),
            "noticed after {noticed:?}"
        );
        server
            .process
            .wait_log("ended=reset", Duration::from_secs(10))
            .unwrap();
        server.wait_agents(0).unwrap();
        eprintln!("link cut: the tunnel was reset {noticed:?} after the cut");

        // The link back: the agent reconnects by itself.
        net.set_link(1, true).unwrap();
        wait_until(Duration::from_secs(30), || {
            server.agents().is_ok_and(|a| a.len() == 1)
        })
        .unwrap_or_else(|_| {
            panic!(
                "the agent did not come back; server log:\n{}",
                server.process.stderr()
            )
        });
    });
}
