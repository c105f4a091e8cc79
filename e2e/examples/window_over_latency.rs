//! One tunnel's upload over an agent link with latency, at the default `--tunnel-max-window`
//! and at a larger one: what the window costs a tunnel once the link is not loopback.
//!
//! ```sh
//! sudo cargo run --release -p bridgehead-e2e --example window_over_latency -- 25 4Mi
//! ```
//!
//! The agent runs in a test host (network namespace) whose every packet out waits the given
//! milliseconds ([`bridgehead_e2e::netns::TestNet::impair`]: netem, or a delay line where the
//! kernel has none), so the agent's window grants reach the server that much later. The
//! target is a sink on the far side of that link. Each setting runs twice, alternated; the
//! rate is printed per 32 MiB, so the ramp while the window is earned shows apart from the
//! steady state. Needs root; the release binaries are built first.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{kube_connect, tls_connect};
use bridgehead_e2e::netns;
use bridgehead_e2e::{AgentOptions, Pki, ServerOptions};

const TOTAL: u64 = 192 << 20;
const MARK: u64 = 32 << 20;

fn main() {
    let mut args = std::env::args().skip(1);
    let delay: u64 = match args.next() {
        None => 25,
        Some(arg) => arg.parse().unwrap_or_else(|_| {
            eprintln!(
                "usage: window_over_latency [DELAY_MS] [WINDOW]; {arg:?} is not milliseconds"
            );
            std::process::exit(2)
        }),
    };
    let window = args.next().unwrap_or_else(|| "4Mi".to_owned());
    for setting in [None, Some(window.clone()), None, Some(window)] {
        run(Duration::from_millis(delay), setting);
    }
}

fn run(delay: Duration, window: Option<String>) {
    netns::with_net(
        "window_over_latency",
        2,
        Duration::from_secs(600),
        move |mut net| {
            let pki = Pki::new().unwrap();
            let args: Vec<String> = window
                .iter()
                .flat_map(|w| ["--tunnel-max-window".to_owned(), w.clone()])
                .collect();
            let (server, _agent) = netns::start_pair_on_host(
                &pki,
                &net,
                1,
                ServerOptions {
                    args: args.clone(),
                    ..Default::default()
                },
                AgentOptions {
                    id: Some("far".into()),
                    args,
                    ..Default::default()
                },
            )
            .unwrap();
            let sink = std::net::TcpListener::bind(format!("{}:0", net.root_v4(1))).unwrap();
            let addr = sink.local_addr().unwrap();
            std::thread::spawn(move || {
                let (mut socket, _) = sink.accept().unwrap();
                let mut buf = vec![0u8; 1 << 20];
                while socket.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
            let applied = net.impair(1, 0, delay).unwrap();
            let mut conn = tls_connect(&pki, server.frontend_addr()).unwrap();
            let reply = kube_connect(conn.as_mut(), &addr.to_string()).unwrap();
            assert_eq!(reply.status, 200, "{}", reply.head);
            let chunk = vec![7u8; 64 * 1024];
            let started = Instant::now();
            let (mut sent, mut last) = (0u64, started);
            let mut steps = Vec::new();
            while sent < TOTAL {
                conn.write_all(&chunk).unwrap();
                sent += chunk.len() as u64;
                if sent % MARK == 0 {
                    let now = Instant::now();
                    steps.push(format!("{:.1}", mib(MARK) / (now - last).as_secs_f64()));
                    last = now;
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            println!(
            "{applied}; --tunnel-max-window {}: {} MiB in {seconds:.1} s, {:.1} MiB/s; per 32 MiB: {}",
            window.as_deref().unwrap_or("default (1Mi)"),
            TOTAL >> 20,
            mib(TOTAL) / seconds,
            steps.join(", ")
        );
        },
    );
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
