//! Faults between the server and an agent on a test host (a network namespace):
//!
//! - the link cut while a tunnel is open. No packet is refused (they vanish), so only the
//!   keepalive can tell: the tunnel must end as a reset within three keepalive intervals, never
//!   as a clean EOF, the agent must come back once the link does, and neither side may keep
//!   anything of the cut tunnel;
//! - the link lossy and slow (1 % of packets dropped each way, and 50 ms of delay on every
//!   packet the agent's host sends: netem's, or a delay line's where the kernel has no netem):
//!   tunnels deliver every byte, in order, and the agent's session survives it.
//!
//! Needs root (and nftables for the loss); skipped loudly otherwise.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::tunnel::Frontend;
use bridgehead_e2e::client::{kube_connect, tls, tls_connect};
use bridgehead_e2e::netns;
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{Agent, AgentOptions, Pki, ServerOptions};

/// Both ends' `--keepalive-time`: a silent peer is dropped after three.
const KEEPALIVE: Duration = Duration::from_secs(1);

#[test]
fn a_cut_link_resets_the_tunnel_within_the_keepalive_and_the_agent_comes_back() {
    let test = "a_cut_link_resets_the_tunnel_within_the_keepalive_and_the_agent_comes_back";
    netns::with_net(test, 2, Duration::from_secs(120), |mut net| {
        let pki = Pki::new().unwrap();
        let keepalive = format!("{}s", KEEPALIVE.as_secs());
        let (server, agent) = netns::start_pair_on_host(
            &pki,
            &net,
            1,
            ServerOptions {
                args: vec!["--keepalive-time".into(), keepalive.clone()],
                ..Default::default()
            },
            AgentOptions {
                id: Some("cut".into()),
                args: vec!["--keepalive-time".into(), keepalive],
                ..Default::default()
            },
        )
        .unwrap();
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
        // Nothing of the cut tunnel is left on either side.
        assert_eq!(
            server.metric("bridgehead_server_tunnels_open").unwrap(),
            0.0
        );
        assert_eq!(
            agent_metric(&net, &agent, "bridgehead_agent_streams_open"),
            Some(0.0)
        );
    });
}

/// A series of the agent's metrics, read inside host 1's namespace, where its health port is.
fn agent_metric(net: &netns::TestNet, agent: &Agent, series: &str) -> Option<f64> {
    let url = format!("http://{}/metrics", agent.health);
    let page = net.run_in(1, &["curl", "-sf", &url]).ok()?;
    bridgehead_e2e::client::metric_in(&String::from_utf8_lossy(&page.stdout), series)
}

/// Tunnels at once over the lossy link, and the bytes each sends and gets back.
const LOSSY_TUNNELS: usize = 4;
const LOSSY_BYTES: usize = 512 * 1024;

#[test]
fn tunnels_over_a_lossy_slow_agent_link_deliver_every_byte() {
    let test = "tunnels_over_a_lossy_slow_agent_link_deliver_every_byte";
    netns::with_net(test, 2, Duration::from_secs(180), |mut net| {
        let pki = Pki::new().unwrap();
        let (server, agent) = netns::start_pair_on_host(
            &pki,
            &net,
            1,
            ServerOptions::default(),
            AgentOptions {
                id: Some("lossy".into()),
                ..Default::default()
            },
        )
        .unwrap();
        // The echo target on the root side of the host's link: the agent reaches it over the
        // impaired link too, so every byte crosses it twice each way.
        let target = bridgehead_e2e::target::echo(&format!("{}:0", net.root_v4(1))).unwrap();
        let delay = Duration::from_millis(50);
        let applied = net.impair(1, 1, delay).unwrap();
        eprintln!("agent link: {applied}");

        let config = tls::config(
            &pki.path("frontend-ca.crt"),
            Some((&pki.path("client.crt"), &pki.path("client.key"))),
        )
        .unwrap();
        let frontend = Frontend::mtls(server.frontend_addr(), config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        // The delay is there: an echo's round trip crosses the link out of the host twice
        // (agent to target, agent to server), and no packet leaves the host sooner than
        // `delay` after it was sent.
        let round_trip = runtime.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut conn = frontend.open(&target.to_string()).await.unwrap();
            let mut byte = [0u8; 1];
            let sent = Instant::now();
            conn.write_all(b"?").await.unwrap();
            conn.read_exact(&mut byte).await.unwrap();
            assert_eq!(&byte, b"?");
            sent.elapsed()
        });
        eprintln!("one echo's round trip over the impaired link: {round_trip:?}");
        assert!(
            round_trip >= 2 * delay,
            "a round trip of {round_trip:?} over a link that holds each packet out {delay:?}"
        );
        let started = Instant::now();
        runtime.block_on(async {
            let mut tunnels = tokio::task::JoinSet::new();
            for seed in 0..LOSSY_TUNNELS {
                let frontend = frontend.clone();
                tunnels.spawn(async move { echo_all(&frontend, target, seed).await });
            }
            while let Some(done) = tunnels.join_next().await {
                done.unwrap().unwrap();
            }
        });
        let dropped = net.dropped(1).unwrap();
        eprintln!(
            "{LOSSY_TUNNELS} tunnels echoed {} KiB each in {:?}, {dropped} packets dropped",
            LOSSY_BYTES >> 10,
            started.elapsed()
        );
        assert!(
            dropped > 0,
            "the link lost nothing: the test tested nothing"
        );
        // The session rode it out: the same one, never re-established.
        assert_eq!(server.agents().unwrap().len(), 1);
        assert_eq!(
            agent_metric(&net, &agent, "bridgehead_agent_reconnects_total"),
            Some(0.0),
            "the agent reconnected during the loss"
        );
    });
}

/// Sends [`LOSSY_BYTES`] of a stream seeded by `seed` through a tunnel to the echo `target`
/// while reading the echo, ends its direction, and checks every byte came back in order and
/// then a clean end.
async fn echo_all(
    frontend: &Frontend,
    target: std::net::SocketAddr,
    seed: usize,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let byte = move |i: usize| ((i.wrapping_mul(31) ^ (seed * 97)) % 253) as u8;
    let conn = frontend.open(&target.to_string()).await?;
    let (mut reader, mut writer) = tokio::io::split(conn);
    let send = async move {
        let data: Vec<u8> = (0..LOSSY_BYTES).map(byte).collect();
        for chunk in data.chunks(16 * 1024) {
            writer.write_all(chunk).await?;
        }
        writer.shutdown().await?;
        anyhow::Ok(writer)
    };
    let receive = async move {
        let mut got = 0usize;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if let Some(at) = (0..n).find(|&i| buf[i] != byte(got + i)) {
                anyhow::bail!("tunnel {seed}: byte {} differs", got + at);
            }
            got += n;
        }
        anyhow::ensure!(
            got == LOSSY_BYTES,
            "tunnel {seed}: {got} of {LOSSY_BYTES} bytes came back"
        );
        anyhow::Ok(())
    };
    let (sent, received) = tokio::join!(send, receive);
    sent?;
    received
}
