//! `--fleet-servers K`: K servers (`--server-count K`, ids `fleet-s0`..) behind haproxy, every
//! simulated agent holding a session with each, as agents behind a load balancer do
//! (docs/ha.md); then the servers restarted one after another (SIGTERM, a new process on the
//! same port once the old one exited, as a rolling upgrade does), each restart measured until
//! the new server counts every agent again and the simulator holds all K×N sessions.
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
use bridgehead_e2e::{procfs, Pki, Server, ServerOptions};
use serde_json::json;

use super::counters::Snapshot;
use super::workers::Workers;
use super::{check, worker, Auth, Plan, AGENTS_GAUGE, POLL};
use crate::noise::Noise;
use crate::report::Report;
use crate::rig::ExtraArgs;

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
    /// haproxy's `balance`.
    balance: &'static str,
    _dir: tempfile::TempDir,
}

/// Runs the HA measurement: the first start, then each server restarted in turn.
pub(super) fn run(plan: &Plan, extra: &ExtraArgs, report: &mut Report) -> anyhow::Result<()> {
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
        "  first start: {} agents × {k} servers in {:.1} s, failed attempts {} ({}), 409s {}",
        plan.agents,
        started.elapsed().as_secs_f64(),
        seen.failed(),
        seen.failures_text(),
        seen.duplicates
    );
    first.context("the fleet's first connections to every server")?;
    for i in 0..k {
        restart(&mut ha, i, report)?;
    }
    Ok(())
}

impl Ha {
    fn start(plan: &Plan, extra: &ExtraArgs) -> anyhow::Result<Ha> {
        let k = plan.servers;
        let pki = Pki::new()?;
        let dir = tempfile::tempdir()?;
        let mut servers = Vec::with_capacity(k);
        let mut options = Vec::with_capacity(k);
        for i in 0..k {
            let mut args = vec![
                format!("--server-id=fleet-s{i}"),
                format!("--server-count={k}"),
                "--proxy-strategies=destHost".to_owned(),
                format!("--max-sessions-per-identity={}", plan.agents * 2),
            ];
            args.extend(extra.server.iter().cloned());
            let mut option = ServerOptions {
                uds: Some(dir.path().join(format!("bridgehead-{i}.sock"))),
                args,
                ..Default::default()
            };
            let server = Server::start(&pki, option.clone())?;
            option.agent_port = Some(server.agent_addr.port());
            servers.push(server);
            options.push(option);
        }
        let backends: Vec<_> = servers.iter().map(|s| s.agent_addr).collect();
        let per_worker = (SESSIONS_PER_WORKER / k).max(1);
        let processes = plan.agents.div_ceil(per_worker).max(1);
        let balance = Balance {
            least_connections: !plan.round_robin,
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
            sessions_per_agent: k,
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
            balance: if plan.round_robin {
                "roundrobin"
            } else {
                "leastconn"
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

    /// Waits until the simulator holds every agent's session with every server and server
    /// `only` (or every server) counts every agent; the time it took. Bounded poll, as in the
    /// single-server fleet.
    fn wait_all_back(&mut self, only: Option<usize>, bound: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let n = self.agents as u64;
        let sessions = n * self.servers.len() as u64;
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
