//! `--fleet-servers K`: K servers (`--server-count K`, ids `fleet-s0`..) behind haproxy, every
//! simulated agent holding a session with each, as agents behind a load balancer do
//! (docs/ha.md); then the servers restarted one after another (SIGTERM, a new process on the
//! same port once the old one exited, as a rolling upgrade does), each restart measured until
//! the new server counts every agent again and the simulator holds all K×N sessions.
//!
//! With `--fleet-sessions-per-agent M` (below K) each agent holds M sessions, and with
//! `--fleet-peering` the servers forward to each other (`--peer-port`, on 127.0.0.1..K), so
//! every server still reaches every agent: the two shapes side by side, what each server holds
//! and what a CONNECT costs through it, and a trickle of CONNECTs through every server to
//! random agents while they restart (each restart then waits until every agent holds M
//! sessions again).
//!
//! haproxy balances by least connections: a restarted server, holding none, gets the fleet's
//! reconnections first, where round robin sends two in three of them to a server the agent
//! holds already (a 409, and the agent's sync interval before the next try). A process may
//! hold at most 20,000 descriptors here and haproxy spends two on each connection, so the
//! simulator's workers (at most [`SESSIONS_PER_WORKER`] sessions each) each reach the servers
//! through a haproxy of their own, all with the same backends: one address per worker, as
//! agents spread over a load balancer's several addresses.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bridgehead_e2e::haproxy::{self, Balance, Haproxy};
use bridgehead_e2e::{procfs, Peering, Pki, Server, ServerOptions};
use serde_json::json;

use super::counters::Snapshot;
use super::probe::{self, Trickle};
use super::workers::Workers;
use super::{check, worker, Auth, Plan, AGENTS_GAUGE, POLL};
use crate::noise::Noise;
use crate::report::Report;
use crate::rig::ExtraArgs;
use crate::route::Route;
use crate::summary::Summary;

/// Sessions one worker holds at most (and its haproxy twice as many descriptors).
const SESSIONS_PER_WORKER: usize = 4_000;
/// How long a SIGTERMed server may take to drain and exit.
const EXIT_BOUND: Duration = Duration::from_secs(60);
/// Issue 38's target for each restarted server.
const TARGET_RECOVERY: Duration = Duration::from_secs(20);

/// The servers, their balancers and the simulator.
#[derive(Debug)]
struct Ha {
    pki: Pki,
    servers: Vec<Server>,
    options: Vec<ServerOptions>,
    balancers: Vec<Haproxy>,
    workers: Workers,
    agents: usize,
    /// Sessions each agent holds (M).
    sessions: usize,
    /// Each server's frontend (its Unix socket).
    routes: Vec<Route>,
    /// haproxy's `balance`.
    balance: &'static str,
    _dir: tempfile::TempDir,
}

/// Runs the HA measurement: the first start, then each server restarted in turn.
pub(super) fn run(
    plan: &Plan,
    extra: &ExtraArgs,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> anyhow::Result<()> {
    if plan.auth != Auth::Cert {
        bail!("--fleet-servers is measured with certificates (--fleet-auth cert)");
    }
    if !haproxy::available() {
        bail!("--fleet-servers needs haproxy (apt-get install haproxy)");
    }
    let k = plan.servers;
    let mut ha = Ha::start(plan, extra)?;
    let started = Instant::now();
    let first = ha.wait_all_back(None, plan.recovery_bound);
    let seen = ha.workers.stats()?;
    eprintln!(
        "  first start: {} agents × {} sessions in {:.1} s, failed attempts {} ({}), 409s {}",
        plan.agents,
        ha.sessions,
        started.elapsed().as_secs_f64(),
        seen.failed(),
        seen.failures_text(),
        seen.duplicates
    );
    first.context("the fleet's first connections to every server")?;
    if plan.peering {
        ha.wait_peers(plan.recovery_bound)?;
    }
    shape(&ha, plan, runtime, report)?;
    let trickles: Vec<Trickle> = ha
        .routes
        .iter()
        .map(|route| {
            Trickle::start(
                runtime.handle(),
                route.clone(),
                plan.agents,
                plan.trickle_interval,
            )
        })
        .collect();
    for i in 0..k {
        restart(&mut ha, i, report)?;
    }
    let mut outcomes = probe::Outcomes::new();
    for trickle in trickles {
        for (kind, n) in runtime.block_on(trickle.stop()) {
            *outcomes.entry(kind).or_default() += n;
        }
    }
    during_restarts(&ha, plan, &outcomes, report)
}

/// The shape: sessions and memory per server, and CONNECTs through the first server to
/// random agents (forwarded to a peer when the agent holds no session with it).
fn shape(
    ha: &Ha,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> anyhow::Result<()> {
    let k = ha.servers.len();
    let gauges = (0..k)
        .map(|i| ha.gauge(i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rss = ha
        .servers
        .iter()
        .map(|s| procfs::rss_bytes(s.process.pid()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let forwarded_before = ha.forwarded(0)?;
    let (mut times, failures) = runtime.block_on(async {
        let mut times = Vec::with_capacity(plan.probes);
        let mut failures = probe::Outcomes::new();
        for _ in 0..plan.probes {
            match probe::tunnel(&ha.routes[0], probe::random_target(plan.agents)).await {
                Ok(time) => times.push(time),
                Err(kind) => *failures.entry(kind).or_default() += 1,
            }
        }
        (times, failures)
    });
    let forwarded = ha.forwarded(0)? - forwarded_before;
    let summary = Summary::of(&mut times);
    let mib = |b: &u64| format!("{:.0}", *b as f64 / (1 << 20) as f64);
    let shape = ha.shape_name();
    eprintln!(
        "  shape {shape}: sessions per server {gauges:?}, RSS MiB {:?}; through server 0: p50 {:?} p99 {:?}, forwarded {forwarded} of {}, failed {}",
        rss.iter().map(mib).collect::<Vec<_>>(),
        summary.p50,
        summary.p99,
        summary.n,
        probe::outcomes_text(&failures)
    );
    report.record(
        "fleet_ha_shape",
        json!({
            "agents": ha.agents, "servers": k, "sessions_per_agent": ha.sessions,
            "peering": plan.peering, "sessions_per_server": gauges, "rss_bytes": rss,
            "connects": plan.probes, "ok": summary.n, "forwarded": forwarded,
            "p50_us": summary.p50.as_secs_f64() * 1e6, "p99_us": summary.p99.as_secs_f64() * 1e6,
            "failures": failures,
        }),
    )?;
    report.row(
        "Fleet: several servers, two shapes (every agent on every server; M per agent and forwarding)",
        &["shape", "agents × servers", "sessions per server", "server RSS (MiB)", "CONNECTs via server 0: p50", "p99", "forwarded", "failed"],
        vec![
            shape,
            format!("{} × {k}", ha.agents),
            format!("{gauges:?}"),
            rss.iter().map(mib).collect::<Vec<_>>().join(", "),
            crate::report::micros(summary.p50),
            crate::report::micros(summary.p99),
            format!("{forwarded} of {}", summary.n),
            probe::outcomes_text(&failures),
        ],
    );
    Ok(())
}

/// The trickle through every server while each restarted in turn.
fn during_restarts(
    ha: &Ha,
    plan: &Plan,
    outcomes: &probe::Outcomes,
    report: &mut Report,
) -> anyhow::Result<()> {
    let shape = ha.shape_name();
    eprintln!(
        "  CONNECTs through every server during the restarts ({shape}): {}",
        probe::outcomes_text(outcomes)
    );
    report.record(
        "fleet_ha_trickle",
        json!({ "agents": ha.agents, "servers": ha.servers.len(), "sessions_per_agent": ha.sessions, "peering": plan.peering, "outcomes": outcomes }),
    )?;
    report.row(
        "Fleet: CONNECTs through every server to random agents while the servers restart in turn",
        &[
            "shape",
            "agents × servers",
            "one CONNECT per server every",
            "outcomes",
        ],
        vec![
            shape,
            format!("{} × {}", ha.agents, ha.servers.len()),
            format!("{:?}", plan.trickle_interval),
            probe::outcomes_text(outcomes),
        ],
    );
    Ok(())
}

impl Ha {
    fn start(plan: &Plan, extra: &ExtraArgs) -> anyhow::Result<Ha> {
        let k = plan.servers;
        let m = plan.sessions_per_agent.unwrap_or(k).clamp(1, k);
        let pki = Pki::with_sans(&(2..=k).map(|i| format!("127.0.0.{i}")).collect::<Vec<_>>())?;
        let dir = tempfile::tempdir()?;
        let mut servers = Vec::with_capacity(k);
        let mut options = Vec::with_capacity(k);
        let mut peer_port = 0;
        for i in 0..k {
            let mut args = vec![
                format!("--server-id=fleet-s{i}"),
                format!("--server-count={m}"),
                "--proxy-strategies=destHost".to_owned(),
                format!("--max-sessions-per-identity={}", plan.agents * 2),
            ];
            args.extend(extra.server.iter().cloned());
            let mut option = ServerOptions {
                uds: Some(dir.path().join(format!("bridgehead-{i}.sock"))),
                args,
                peering: plan.peering.then(|| Peering {
                    port: peer_port,
                    hosts: (1..=k).map(|j| format!("127.0.0.{j}")).collect(),
                    bind: Some(format!("127.0.0.{}", i + 1)),
                }),
                ..Default::default()
            };
            let server = Server::start(&pki, option.clone())?;
            option.agent_port = Some(server.agent_addr.port());
            if let (Some(peering), Some(addr)) = (&mut option.peering, server.peer_addr) {
                peering.port = addr.port();
                peer_port = addr.port();
            }
            servers.push(server);
            options.push(option);
        }
        let routes = options
            .iter()
            .filter_map(|o| o.uds.clone())
            .map(Route::uds)
            .collect();
        let backends: Vec<_> = servers.iter().map(|s| s.agent_addr).collect();
        let per_worker = (SESSIONS_PER_WORKER / k).max(1);
        let processes = plan.agents.div_ceil(per_worker).max(1);
        // An agent that holds fewer sessions than there are servers, and holds the server
        // with the fewest connections, would be sent back to it by leastconn every time (a
        // 409, forever): those fleets are balanced round robin.
        let least_connections = !plan.round_robin && m == k;
        let balance = Balance {
            least_connections,
            // Every session of its worker, and each agent's attempt besides.
            max_connections: u32::try_from(SESSIONS_PER_WORKER + per_worker + 256)?,
        };
        let balancers = (0..processes)
            .map(|_| Haproxy::start_balanced(IpAddr::V4(Ipv4Addr::LOCALHOST), &backends, balance))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let spec = worker::Spec {
            server: balancers[0].addr,
            ca: pki.path("cluster-ca.crt"),
            certificate: Some((pki.path("agent.crt"), pki.path("agent.key"))),
            tokens: None,
            first: 0,
            count: plan.agents,
            start_within: Duration::from_secs(1),
            sessions_per_agent: m,
            lateness: plan.lateness.map(|l| (l.min, l.max)),
            one_thread: plan.shared_cores,
        };
        let workers = Workers::start_spread(plan.agents, per_worker, |w| worker::Spec {
            server: balancers[w].addr,
            ..spec.clone()
        })?;
        Ok(Ha {
            pki,
            servers,
            options,
            balancers,
            workers,
            agents: plan.agents,
            sessions: m,
            routes,
            balance: if least_connections {
                "leastconn"
            } else {
                "roundrobin"
            },
            _dir: dir,
        })
    }

    /// A server's agent gauge.
    fn gauge(&self, i: usize) -> anyhow::Result<u64> {
        let (status, page) = self.servers[i].get("/metrics")?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        let value = bridgehead_e2e::client::metric_in(&page, AGENTS_GAUGE)
            .with_context(|| format!("no {AGENTS_GAUGE} on /metrics"))?;
        Ok(value as u64)
    }

    /// Tunnels server `i` forwarded to its peers.
    fn forwarded(&self, i: usize) -> anyhow::Result<f64> {
        self.servers[i].metric_sum("bridgehead_server_tunnels_forwarded_total")
    }

    /// `every agent on every server`, or `M per agent, forwarding` (or `..., no forwarding`).
    fn shape_name(&self) -> String {
        let k = self.servers.len();
        let peering = self.servers.iter().any(|s| s.peer_addr.is_some());
        match (self.sessions == k, peering) {
            (true, false) => "every agent on every server".to_owned(),
            (true, true) => "every agent on every server, forwarding".to_owned(),
            (false, true) => format!("{} per agent, forwarding", self.sessions),
            (false, false) => format!("{} per agent, no forwarding", self.sessions),
        }
    }

    /// Waits until every server holds a session with each of its peers and knows their
    /// agents.
    fn wait_peers(&self, bound: Duration) -> anyhow::Result<()> {
        let k = self.servers.len() as f64;
        let started = Instant::now();
        loop {
            let ready = self.servers.iter().all(|server| {
                server.metric("bridgehead_server_peers_connected").ok() == Some(k - 1.0)
            });
            if ready {
                return Ok(());
            }
            if started.elapsed() > bound {
                bail!("the servers did not all reach each other within {bound:?}");
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the simulator holds every agent's sessions and server `only` (or every
    /// server) counts every agent (when every agent holds a session with every server); the
    /// time it took. Bounded poll, as in the single-server fleet.
    fn wait_all_back(&mut self, only: Option<usize>, bound: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let n = self.agents as u64;
        let sessions = n * self.sessions as u64;
        // Holding fewer sessions than there are servers, an agent may hold any of them.
        let n = if self.sessions < self.servers.len() {
            0
        } else {
            n
        };
        let which: Vec<usize> = match only {
            Some(i) => vec![i],
            None => (0..self.servers.len()).collect(),
        };
        loop {
            let up = self.workers.stats()?.up;
            if up >= sessions {
                let gauges = which
                    .iter()
                    .map(|&i| self.gauge(i))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                if gauges.iter().all(|&g| g >= n) {
                    return Ok(started.elapsed());
                }
            }
            if started.elapsed() > bound {
                let gauges: Vec<String> = which
                    .iter()
                    .map(|&i| {
                        self.gauge(i)
                            .map_or_else(|e| format!("none ({e:#})"), |g| g.to_string())
                    })
                    .collect();
                bail!(
                    "after {bound:?}: the simulator holds {up} sessions of {sessions}, the servers count {}",
                    gauges.join(", ")
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Restarts server `i` (SIGTERM, a new process on its port) and measures the way back.
fn restart(ha: &mut Ha, i: usize, report: &mut Report) -> anyhow::Result<()> {
    let k = ha.servers.len();
    let n = ha.agents;
    eprintln!("  restart: SIGTERM to server {i} of {k}, then a new one on its port");
    let before = ha.workers.stats()?;
    // Everything of the rig but the restarted server, whose new process is subtracted below
    // (its old one's drain counts as other load, as in the single-server restarts).
    let mut pids = ha.workers.pids();
    pids.extend(ha.balancers.iter().map(|b| b.process.pid()));
    pids.extend(
        (0..k)
            .filter(|&j| j != i)
            .map(|j| ha.servers[j].process.pid()),
    );
    let noise = Noise::start(&pids);
    let started = Instant::now();
    ha.servers[i].process.signal("TERM")?;
    ha.servers[i].process.wait_exit(EXIT_BOUND)?;
    let exited = started.elapsed();
    ha.servers[i] = Server::start(&ha.pki, ha.options[i].clone())?;
    let listening = started.elapsed();
    let waited = ha.wait_all_back(Some(i), TARGET_RECOVERY * 6);
    let seen: Snapshot = ha.workers.stats()?.since(&before);
    let (wall, foreign, _) = noise.finish();
    let server_cpu = procfs::cpu_seconds(ha.servers[i].process.pid()).unwrap_or(0.0);
    let foreign = (foreign - server_cpu).max(0.0);
    let refused = seen.failed_of("refused");
    let failed = seen.failed() - refused;
    let back = waited.as_ref().map_or_else(
        |_| "not all back".to_owned(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    );
    eprintln!(
        "  server {i}: old gone after {:.2} s, new one listening after {:.2} s; all back {back} later; failed attempts {failed} ({}); 409s {}; other load {:.2} cores",
        exited.as_secs_f64(),
        listening.as_secs_f64(),
        seen.failures_text(),
        seen.duplicates,
        foreign / wall.max(1e-9)
    );
    report.record(
        "fleet_ha_restart",
        json!({
            "agents": n,
            "servers": k,
            "server": i,
            "balance": ha.balance,
            "signal": "TERM",
            "exited_s": exited.as_secs_f64(),
            "listening_s": listening.as_secs_f64(),
            "back_s": waited.as_ref().ok().map(Duration::as_secs_f64),
            "failed": failed,
            "failures": seen.failures,
            "duplicates": seen.duplicates,
            "attempts": seen.attempts,
            "connected": seen.connected,
            "drained": seen.drained,
            "lost": seen.lost,
            "server_cpu_s": server_cpu,
            "foreign_cpu_s": foreign,
            "wall_s": wall,
            "error": waited.as_ref().err().map(|e| format!("{e:#}")),
        }),
    )?;
    report.row(
        "Fleet: servers behind haproxy, every agent on each, restarted one after another",
        &[
            "agents × servers",
            "balance",
            "restarted",
            "old gone / new listening",
            "all back (from new server)",
            "failed attempts",
            "by kind",
            "409 (server held already)",
            "other load",
        ],
        vec![
            format!("{n} × {k}"),
            ha.balance.to_owned(),
            format!("server {i} (SIGTERM)"),
            format!(
                "{:.2} s / {:.2} s",
                exited.as_secs_f64(),
                listening.as_secs_f64()
            ),
            back.clone(),
            failed.to_string(),
            seen.failures_text(),
            seen.duplicates.to_string(),
            format!("{:.2} cores", foreign / wall.max(1e-9)),
        ],
    );
    check(
        report,
        format!("fleet: {n} agents back on server {i} of {k} after SIGTERM and a new server"),
        back,
        &format!("≤ {} s", TARGET_RECOVERY.as_secs()),
        waited.as_ref().is_ok_and(|d| *d <= TARGET_RECOVERY),
    );
    match waited {
        // The next restart needs the whole fleet back.
        Err(error) => Err(error.context(format!("after restarting server {i}"))),
        Ok(_) => Ok(()),
    }
}
