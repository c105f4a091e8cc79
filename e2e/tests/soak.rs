//! The soak, shortened for CI (`bench --only soak` runs it at scale): tunnels held through the
//! mTLS frontend with a trickle of traffic on each and a steady turnover, every echo correct,
//! the server's and agent's resident memory and descriptors flat once steady, and everything
//! given back when the tunnels go.

use std::time::Duration;

use bridgehead_e2e::client::tls;
use bridgehead_e2e::client::tunnel::Frontend;
use bridgehead_e2e::process::{start_pair, wait_until};
use bridgehead_e2e::soak::{self, Plan};
use bridgehead_e2e::target::bulk::Target;
use bridgehead_e2e::{procfs, Pki, ServerOptions};

/// Flat: no sample after the settling time deviates more than this from the one at it.
const FLAT: f64 = 0.05;

#[test]
fn tunnels_held_with_traffic_and_turnover_keep_memory_and_descriptors_flat() {
    let pki = Pki::new().unwrap();
    let (server, agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = runtime.block_on(Target::start()).unwrap();
    let config = tls::config(
        &pki.path("frontend-ca.crt"),
        Some((&pki.path("client.crt"), &pki.path("client.key"))),
    )
    .unwrap();
    let frontend = Frontend::mtls(server.frontend_addr(), config);
    let pids = [server.process.pid(), agent.process.pid()];
    let baseline = pids.map(procfs::fd_count);
    // A tenth of the tunnels turn over every second, ten times the full soak's share, so a
    // short run still replaces each tunnel a few times.
    let plan = Plan {
        tunnels: 300,
        duration: Duration::from_secs(30),
        trickle: Duration::from_secs(1),
        lifetime: Duration::from_secs(10),
        sample_every: Duration::from_secs(1),
        settle: Duration::from_secs(10),
    };
    let outcome = runtime
        .block_on(soak::run(&frontend, target.addr, &pids, &plan))
        .unwrap();

    assert_eq!(outcome.errors, 0, "errors: {:?}", outcome.first_errors);
    // Every slot echoed on schedule and turned over on schedule (a stall would show here).
    let periods = |period: Duration| (plan.duration.as_secs_f64() / period.as_secs_f64()) as u64;
    let tunnels = plan.tunnels as u64;
    assert!(
        outcome.echoes >= tunnels * (periods(plan.trickle) - 2),
        "{} echoes",
        outcome.echoes
    );
    assert!(
        outcome.reopens >= tunnels * (periods(plan.lifetime) - 1),
        "{} reopens",
        outcome.reopens
    );
    for (index, name) in ["server", "agent"].into_iter().enumerate() {
        let (rss, fds) = outcome.drift(plan.settle, index);
        let series: Vec<(u64, u64, usize)> = outcome
            .samples
            .iter()
            .map(|s| (s.at.as_secs(), s.rss[index] >> 10, s.fds[index]))
            .collect();
        assert!(
            rss <= FLAT && fds <= FLAT,
            "{name}: RSS drifted {rss:.3}, descriptors {fds:.3} (s, KiB, fds): {series:?}"
        );
    }
    // Closed: every descriptor and tunnel given back. At most the baseline: a connection that
    // was still closing when the baseline was read (a health poll's) may be gone now.
    wait_until(Duration::from_secs(10), || {
        let fds = pids.map(procfs::fd_count);
        server.metric("bridgehead_server_tunnels_open").ok() == Some(0.0)
            && fds.iter().zip(&baseline).all(|(now, before)| now <= before)
    })
    .unwrap_or_else(|_| {
        panic!(
            "after the soak: descriptors {:?} (baseline {baseline:?}), {:?} tunnels open",
            pids.map(procfs::fd_count),
            server.metric("bridgehead_server_tunnels_open")
        )
    });
}
