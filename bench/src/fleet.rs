//! `bench --only fleet`: one server with N agents, simulated (issue 38). Each simulated agent
//! is a real session — TCP, TLS with the agent certificate (or a bearer token from a file),
//! the upgrade with its own `id`/`host`/`ipv4`, pings answered, dials answered by an echo —
//! spread over as few processes as the descriptor limit allows ([`workers`]), each agent
//! coming back after a loss on the agent's own schedule ([`agent`]).
//!
//! Measured, each a row with its target from issue 38: the server's RSS and CPU per 1,000 idle
//! agents; the routing latency of CONNECTs routed by destHost to random agents; the cost of one
//! `/agents` and one `/metrics` request; and the recovery after a restart (SIGKILL, then a new
//! server on the same ports; then the same after SIGTERM): the time until every agent is back,
//! by the server's agent gauge and the simulator's live sessions, and the failed attempts on
//! the way by kind. A trickle of tunnels runs through the restarts. The fleet at rest is
//! measured in `steady`, the restarts in `restart`, the traffic comes from [`probe`].
//!
//! The server runs with its default flags plus what the rig needs: the Unix-socket frontend
//! (the probes' path); `--proxy-strategies=destHost` (the probes route by address; without
//! `default` behind it, a CONNECT for an agent that is not back yet is a 503 rather than a
//! dial sent to another agent, so every dial an agent gets for another's address is a
//! routing error); `--max-sessions-per-identity` above N, since every agent presents the same
//! certificate; no `--cluster-ca-cert` when the agents present tokens alone. `--server-arg`
//! adds more.
//!
//! With tokens and no token file, [`cluster`] starts the control-plane fixture and makes a
//! Node, a Pod and a pod-bound token per agent; each restart then also measures the new
//! server's requests to kube-apiserver ([`kube_load`]). With `--fleet-servers`, [`ha`] runs
//! several servers behind haproxy instead, every agent on each, restarted one after another.

pub mod agent;
pub mod cluster;
pub mod connect;
pub mod counters;
mod ha;
pub mod identity;
pub mod kube_load;
pub mod probe;
mod restart;
pub mod stalled;
mod steady;
pub mod worker;
pub mod workers;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bridgehead_e2e::{procfs, Pki, Server, ServerOptions};
use serde_json::json;

use crate::noise::Noise;
use crate::report::{Check, Outcome, Report};
use crate::rig::ExtraArgs;
use crate::route::Route;
use cluster::TokenCluster;
use kube_load::Sampler;
use probe::Trickle;
use workers::Workers;

/// The gauge of agents with a live session on the server's `/metrics`.
const AGENTS_GAUGE: &str = "bridgehead_server_agents_connected";
/// How often the bench looks whether every agent is back.
const POLL: Duration = Duration::from_millis(100);

/// The size and bounds of one fleet run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub agents: usize,
    /// How the agents authenticate.
    pub auth: Auth,
    /// Bearer tokens, one a line, agent `i` presenting line `i` (for [`Auth::Token`] and
    /// [`Auth::Both`]); without them the bench makes them against the control-plane fixture
    /// ([`cluster`]).
    pub tokens: Option<PathBuf>,
    /// How long the idle fleet's CPU is measured.
    pub idle_window: Duration,
    /// CONNECTs of the routing probe.
    pub probes: usize,
    /// Longest wait for every agent to be back.
    pub recovery_bound: Duration,
    /// One trickle tunnel every this.
    pub trickle_interval: Duration,
    /// Stalled handshakes held on the agent endpoint through each restart.
    pub stalled: usize,
    /// Servers behind haproxy, every agent on each ([`ha`]); 1 for the single server.
    pub servers: usize,
    /// haproxy balances round robin rather than by least connections.
    pub round_robin: bool,
    /// Sessions each agent holds with several servers (`None`: one with each).
    pub sessions_per_agent: Option<usize>,
    /// The servers forward to each other.
    pub peering: bool,
    /// Slow agents: each answers every step of its handshake this late
    /// (`--fleet-client-delay`, `bridgehead_e2e::late`).
    pub lateness: Option<bridgehead_e2e::late::Lateness>,
    /// The simulator runs every agent on one thread of one process, beside the server on the
    /// same cores (`--fleet-shared-cores`).
    pub shared_cores: bool,
}

/// How the simulated agents prove who they are; the server is started to match (its token
/// settings come from `--server-arg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Auth {
    /// The agent certificate, one for all.
    Cert,
    /// A bearer token each and no certificate: the server runs without `--cluster-ca-cert`,
    /// as in konnectivity's documented setup.
    Token,
    /// The certificate and a token each (a server that checks both).
    Both,
}

/// The server under test, the simulator and the probes' route.
#[derive(Debug)]
struct Fleet {
    pki: Pki,
    options: ServerOptions,
    server: Server,
    workers: Workers,
    route: Route,
    agents: usize,
    /// When every agent was last back.
    back_at: Instant,
    /// The control plane the tokens came from, when the bench made them.
    cluster: Option<TokenCluster>,
    _dir: tempfile::TempDir,
}

/// The fleet in a row's first column: its size, and how its agents answer when not at once.
fn fleet_text(plan: &Plan) -> String {
    let mut text = plan.agents.to_string();
    if let Some(lateness) = plan.lateness {
        text.push_str(&format!(", each step {lateness} late"));
    }
    if plan.shared_cores {
        text.push_str(", simulator on one thread");
    }
    text
}

/// Runs every fleet measurement; a failure becomes an ERROR row.
pub fn run(plan: &Plan, extra: &ExtraArgs, runtime: &tokio::runtime::Runtime, report: &mut Report) {
    eprintln!("== fleet: {} simulated agents", fleet_text(plan));
    if let Err(error) = measure(plan, extra, runtime, report) {
        report.failed(
            &format!("fleet, {} agents", plan.agents),
            "every measurement ran",
            &error,
        );
    }
}

fn measure(
    plan: &Plan,
    extra: &ExtraArgs,
    runtime: &tokio::runtime::Runtime,
    report: &mut Report,
) -> anyhow::Result<()> {
    if plan.servers > 1 {
        return ha::run(plan, extra, runtime, report);
    }
    let cluster = match (plan.auth, &plan.tokens) {
        (Auth::Cert, _) => None,
        // Checked before anything starts: each worker reads its own slice again.
        (_, Some(path)) => {
            drop(worker::tokens(path, 0, plan.agents)?);
            None
        }
        (_, None) => Some(TokenCluster::start(plan.agents, runtime)?),
    };
    let (mut fleet, baseline_rss) = Fleet::start(plan, extra, cluster)?;
    first_start(&mut fleet, plan, report)?;
    let mut pids = fleet.workers.pids();
    pids.push(fleet.server.process.pid());
    let noise = Noise::start(&pids);
    steady::idle(&mut fleet, plan, baseline_rss, report)?;
    steady::routing(&mut fleet, plan, runtime, report)?;
    steady::admin_cost(&fleet, report)?;
    crate::record_noise(report, "fleet (idle, routing, admin)", &noise);
    let before_trickle = fleet.workers.stats()?;
    let trickle = Trickle::start(
        runtime.handle(),
        fleet.route.clone(),
        plan.agents,
        plan.trickle_interval,
    );
    // SIGKILL first: it needs sessions past the agent's healthy age, which the phases before
    // give them; a drain does not look at their age.
    let restarts = ["KILL", "TERM"].into_iter().try_for_each(|signal| {
        restart::restart(&mut fleet, signal, plan, runtime.handle(), report)
    });
    let outcomes = runtime.block_on(trickle.stop());
    let misrouted = fleet.workers.stats()?.since(&before_trickle).misrouted;
    eprintln!(
        "  trickle through the restarts: {}; dials misrouted {misrouted}",
        probe::outcomes_text(&outcomes)
    );
    report.record(
        "fleet_trickle",
        json!({ "agents": plan.agents, "outcomes": outcomes, "misrouted": misrouted }),
    )?;
    report.row(
        "Fleet: a trickle of tunnels through both restarts (one every interval, 64 bytes echoed)",
        &[
            "agents",
            "interval",
            "tunnels by outcome",
            "dials misrouted",
        ],
        vec![
            plan.agents.to_string(),
            format!("{:?}", plan.trickle_interval),
            probe::outcomes_text(&outcomes),
            misrouted.to_string(),
        ],
    );
    restarts
}

impl Fleet {
    /// A fresh server (its RSS with no agent returned) and the simulator connecting to it.
    fn start(
        plan: &Plan,
        extra: &ExtraArgs,
        cluster: Option<TokenCluster>,
    ) -> anyhow::Result<(Fleet, u64)> {
        let pki = Pki::new()?;
        let dir = tempfile::tempdir()?;
        let uds = dir.path().join("bridgehead.sock");
        let mut args = vec![
            "--proxy-strategies=destHost".to_owned(),
            format!("--max-sessions-per-identity={}", plan.agents * 2),
        ];
        if let Some(cluster) = &cluster {
            args.extend(cluster.server_args.iter().cloned());
        }
        args.extend(extra.server.iter().cloned());
        let tokens = match &cluster {
            Some(cluster) => Some(cluster.tokens.clone()),
            None => plan.tokens.clone(),
        };
        let options = ServerOptions {
            uds: Some(uds.clone()),
            args,
            without_cluster_ca: plan.auth == Auth::Token,
            ..Default::default()
        };
        let server = Server::start(&pki, options.clone())?;
        // What the server holds before any agent came: its baseline.
        std::thread::sleep(Duration::from_millis(500));
        let baseline = procfs::rss_bytes(server.process.pid())?;
        let spec = worker::Spec {
            server: server.agent_addr,
            ca: pki.path("cluster-ca.crt"),
            certificate: (plan.auth != Auth::Token)
                .then(|| (pki.path("agent.crt"), pki.path("agent.key"))),
            tokens: (plan.auth != Auth::Cert).then_some(tokens).flatten(),
            first: 0,
            count: plan.agents,
            start_within: Duration::from_secs(1),
            sessions_per_agent: 1,
            lateness: plan.lateness.map(|l| (l.min, l.max)),
            one_thread: plan.shared_cores,
        };
        let workers = if plan.shared_cores {
            Workers::start_spread(plan.agents, usize::MAX, |_| spec.clone())?
        } else {
            Workers::start(plan.agents, &spec)?
        };
        let options = ServerOptions {
            agent_port: Some(server.agent_addr.port()),
            ..options
        };
        Ok((
            Fleet {
                pki,
                options,
                server,
                workers,
                route: Route::uds(uds),
                agents: plan.agents,
                back_at: Instant::now(),
                cluster,
                _dir: dir,
            },
            baseline,
        ))
    }

    /// The server's agent gauge.
    fn gauge(&self) -> anyhow::Result<u64> {
        let (status, page) = self.server.get("/metrics")?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        let value = bridgehead_e2e::client::metric_in(&page, AGENTS_GAUGE)
            .with_context(|| format!("no {AGENTS_GAUGE} on /metrics"))?;
        Ok(value as u64)
    }

    /// Waits until every simulated agent holds a live session and the server counts every
    /// agent (bounded poll: neither side can be waited on directly); the time it took. The
    /// server is asked only once the simulator holds them all: a `/metrics` costs the server
    /// CPU in proportion to its agents, which ten a second would add to what is measured.
    /// `kube`, when given, reads the server's requests to kube-apiserver meanwhile.
    fn wait_all_back(
        &mut self,
        bound: Duration,
        mut kube: Option<&mut Sampler>,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let n = self.agents as u64;
        loop {
            if let Some(sampler) = kube.as_deref_mut() {
                sampler.sample(&self.server);
            }
            let up = self.workers.stats()?.up;
            let gauge = if up >= n { self.gauge()? } else { 0 };
            if up >= n && gauge >= n {
                self.back_at = Instant::now();
                return Ok(started.elapsed());
            }
            if started.elapsed() > bound {
                bail!(
                    "after {bound:?}: the simulator holds {up} sessions of {n}, the server counts {}",
                    self.gauge().map_or_else(|e| format!("none ({e:#})"), |g| g.to_string())
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The fleet's first connections: every agent's first attempt at a random moment within a
/// second, as when the agents start together.
fn first_start(fleet: &mut Fleet, plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    let started = Instant::now();
    let waited = fleet.wait_all_back(plan.recovery_bound, None);
    let seen = fleet.workers.stats()?;
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "  first start: {} agents in {elapsed:.1} s, failed attempts {} ({}), simulator pids {:?}",
        plan.agents,
        seen.failed(),
        seen.failures_text(),
        fleet.workers.pids()
    );
    report.record(
        "fleet_start",
        json!({
            "agents": plan.agents,
            "back_s": waited.as_ref().ok().map(Duration::as_secs_f64),
            "failed": seen.failed(),
            "failures": seen.failures,
            "simulator_processes": fleet.workers.pids().len(),
        }),
    )?;
    waited.context("the fleet's first connections")?;
    Ok(())
}
/// Adds a check of a fleet target.
fn check(report: &mut Report, what: String, value: String, target: &str, ok: bool) {
    let _ = report.check(Check {
        what,
        bridgehead: value,
        direct: "-".to_owned(),
        ratio: "-".to_owned(),
        target: target.to_owned(),
        outcome: Outcome::of(ok),
    });
}
