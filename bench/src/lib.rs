//! The benchmark tool behind `cargo run --release -p bridgehead-bench`: the real
//! release binaries on loopback (mTLS frontend, agent WebSocket over TLS), measured side by
//! side with direct loopback TCP in the same run, against the targets of the performance
//! issue.
//!
//! - [`budget`]: sizes and time bounds (full run, `--quick`); [`machine`]: what was measured on.
//! - [`route`]: how the client reaches a target (direct, mTLS frontend, Unix socket).
//! - the target: the harness's load target (`bridgehead_e2e::target::bulk`).
//! - [`rig`]: the server/agent processes under test.
//! - Measurements: [`throughput`] (and CPU per GiB), [`setup`], [`latency`] (round trips),
//!   [`memory`] (idle tunnels), [`stall`] (stalled neighbour), [`stalled`] (memory under
//!   stalled readers); only when named: [`soak`] (many tunnels for minutes) and [`burst`]
//!   (a minute of paced CONNECTs against a slow agent); in `--quick` and when named:
//!   [`fleet`] (thousands of simulated agents: restarts, idle cost, routing);
//!   [`summary`] percentiles.
//! - [`report`] (tables, JSON lines, PASS/MISS), [`plot`] (SVG), [`profile`] (`perf record`)
//!   with [`flamegraph`] (SVG flame graphs of the recordings).
//! - [`callgrind`]: instruction counts of fixed workloads, the measure that does not depend on
//!   machine load (`--callgrind DIR`, instead of the timed measurements).
//!
//! The processes, PKI, CONNECT client and targets are the e2e harness's (`bridgehead-e2e`); this
//! crate adds only the measuring, so the test build compiles no plotting or profiling code.
//!
//! Every load loop is bounded in count and in time. The client's own CPU is not counted;
//! on a small machine it competes with the server and agent, as it does with the target in
//! the direct runs.

pub mod budget;
pub mod burst;
pub mod callgrind;
pub mod flamegraph;
pub mod fleet;
pub mod floor;
pub mod konnectivity;
pub mod latency;
pub mod machine;
pub mod memory;
pub mod noise;
pub mod peer;
pub mod plot;
pub mod profile;
pub mod report;
pub mod rig;
pub mod route;
pub mod setup;
pub mod side_by_side;
pub mod soak;
pub mod stall;
pub mod stalled;
pub mod summary;
pub mod throughput;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;

use bridgehead_e2e::target::bulk::Target;
pub use budget::Budget;
use machine::Machine;
use noise::Noise;
use profile::Profiler;
use report::Report;
use rig::{ExtraArgs, Rig};

/// Command line of the `bench` binary.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "bench",
    about = "Benchmarks Bridgehead against direct loopback TCP",
    long_about = "Benchmarks Bridgehead against direct loopback TCP. Needs the release \
                  binaries: run `cargo build --release --bins` first."
)]
pub struct Options {
    /// Small sizes and short bounds: a smoke run for CI (under a minute).
    #[arg(long)]
    pub quick: bool,
    /// Run only these measurements (repeatable, or comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Measurement>,
    /// JSON lines output, one object per measurement [default: <out-dir>/results.jsonl].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for the SVG plots [default: target/bench, or the --perf directory].
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Record the server and agent with `perf record` during the one-tunnel bulk runs and the
    /// mTLS setup run at concurrency 1, into this directory, with a flame graph (SVG) of each
    /// recording (slows those runs down).
    #[arg(long)]
    pub perf: Option<PathBuf>,
    /// Instead of the timed measurements, run the server and agent under callgrind through
    /// fixed workloads and report instructions per MiB, per tunnel setup and per round trip;
    /// the callgrind files go to this directory (needs valgrind; takes a few minutes).
    #[arg(long, conflicts_with_all = ["perf", "only", "replot"])]
    pub callgrind: Option<PathBuf>,
    /// The frontend `throughput` (and `--perf`) runs over: the mTLS frontend (a TLS leg from
    /// the client, as kube-apiserver dials over TCP) or the Unix socket (plain CONNECT in, as
    /// kube-apiserver on the same node usually dials; the path issue 14 compares with
    /// one-socket-per-tunnel proxies).
    #[arg(long, value_enum, default_value_t = Frontend::Mtls)]
    pub frontend: Frontend,
    /// Keep the idle tunnels of the memory measurement open this many seconds at the
    /// baseline and at each count, to inspect the server and agent (heaptrack -p, smaps).
    #[arg(long, default_value_t = 0)]
    pub idle_hold: u64,
    /// Measure nothing: re-render the plots of an earlier run from its JSON lines into
    /// --out-dir.
    #[arg(long)]
    pub replot: Option<PathBuf>,
    /// An extra flag for every server the bench starts (repeatable), e.g.
    /// `--server-arg=--worker-threads=1`.
    #[arg(long = "server-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// An extra flag for every agent the bench starts (repeatable), e.g.
    /// `--agent-arg=--worker-threads=1`.
    #[arg(long = "agent-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Rounds of the side-by-side bulk and round-trip rows: the paths take turns this many
    /// times and each path's median counts, so a burst of load in one turn does not decide a
    /// check (default 1).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub rounds: Option<usize>,
    /// Tunnel counts of the bulk rows of `throughput` and `side-by-side`, comma-separated,
    /// instead of their own (1,4,16,64 and 1,16,64): `--tunnels 1` for the one-tunnel rows
    /// issue 14's targets name, in a fraction of the time.
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub tunnels: Vec<usize>,
    /// Stalled readers of `--only stalled-readers` (default 5,000; 300 with --quick).
    #[arg(long, value_name = "N")]
    pub stalled_readers: Option<usize>,
    /// Tunnels of `--only soak` (default 10,000; 300 with --quick).
    #[arg(long, value_name = "N")]
    pub soak_tunnels: Option<usize>,
    /// Seconds of `--only soak` (default 600; 20 with --quick).
    #[arg(long, value_name = "SECS")]
    pub soak_seconds: Option<u64>,
    /// CONNECTs per second of `--only burst` (default 2,000).
    #[arg(long, value_name = "N")]
    pub burst_rate: Option<u32>,
    /// Seconds of `--only burst` (default 60; 3 with --quick).
    #[arg(long, value_name = "SECS")]
    pub burst_seconds: Option<u64>,
    /// Another proxy to run beside Bridgehead in the side-by-side and stalled-readers
    /// measurements (repeatable): NAME=CMD, CMD a shell command serving plain HTTP CONNECT on
    /// TCP at `{listen}` (also `$PEER_LISTEN`; `{spare}`, `{spare2}`: free ports for its inner
    /// legs), e.g. `wstunnel=wstunnel server ws://127.0.0.1:{spare} & exec wstunnel client -L
    /// http://{listen} ws://127.0.0.1:{spare}`. Built by hand: the bench never builds one.
    #[arg(long = "peer", value_name = "NAME=CMD")]
    pub peers: Vec<peer::PeerSpec>,
    /// Simulated agents of `--only fleet` (default 10,000; 300 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=fleet::identity::MAX_AGENTS as u64))]
    pub agents: Option<usize>,
    /// `--only fleet`: a file of bearer tokens, one a line; simulated agent i presents line i
    /// in `Authorization: Bearer`. Without it, `--fleet-auth token` makes them: it starts the
    /// control-plane fixture (root, scripts/k8s-build.sh), a Node, a Pod and a pod-bound token
    /// per agent, and runs the server with token authentication and --bind-agent-identifiers.
    #[arg(long, value_name = "FILE")]
    pub fleet_tokens: Option<PathBuf>,
    /// `--only fleet`: how the simulated agents authenticate [default: token with
    /// --fleet-tokens, else cert]; with `token` the server runs without --cluster-ca-cert, and
    /// its token flags come from --server-arg.
    #[arg(long, value_enum, value_name = "AUTH")]
    pub fleet_auth: Option<fleet::Auth>,
    /// `--only fleet`: stalled handshakes (a slowloris: the start of a TLS record, then
    /// nothing) held on the agent endpoint through each restart [default: 0].
    #[arg(long, value_name = "N")]
    pub fleet_stalled: Option<usize>,
    /// `--only fleet`: servers behind haproxy (`--server-count N`), every simulated agent
    /// holding a session with each, restarted one after another [default: 1, no haproxy].
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub fleet_servers: Option<usize>,
    /// `--only fleet --fleet-servers N`: haproxy balances round robin instead of by least
    /// connections (to compare the two).
    #[arg(long)]
    pub fleet_round_robin: bool,
    /// `--only fleet --fleet-servers N`: sessions each simulated agent holds [default: N,
    /// every server]; fewer need --fleet-peering for every server to reach every agent.
    #[arg(long, value_name = "M")]
    pub fleet_sessions_per_agent: Option<usize>,
    /// `--only fleet --fleet-servers N`: the servers forward to each other (`--peer-port`).
    #[arg(long)]
    pub fleet_peering: bool,
    /// `--only fleet`: slow agents: each simulated agent answers every step of its handshake
    /// (ClientHello, its TLS answer, the upgrade request) late by a random delay in MIN..MAX
    /// (e.g. `1s..4s`; one duration for a fixed delay) [default: at once].
    #[arg(long, value_name = "MIN..MAX")]
    pub fleet_client_delay: Option<bridgehead_e2e::late::Lateness>,
    /// `--only fleet`: the simulator runs every agent on one thread of one process (as a
    /// simulator with one event loop does), sharing the server's cores: its answers also wait
    /// for each other's TLS work.
    #[arg(long)]
    pub fleet_shared_cores: bool,
    /// Internal: be a fleet simulator process (its spec and commands on stdin).
    #[arg(long, hide = true)]
    pub fleet_worker: bool,
    /// Internal: serve the bench target in this process (the memory measurement's child).
    #[arg(long, hide = true)]
    pub serve_target: bool,
    /// Internal: the served target's send buffer.
    #[arg(long, hide = true)]
    pub target_send_buffer: Option<u32>,
}

impl Options {
    /// `--server-arg` and `--agent-arg`.
    fn extra_args(&self) -> ExtraArgs {
        ExtraArgs {
            server: self.server_args.clone(),
            agent: self.agent_args.clone(),
        }
    }
}

/// The frontend of the bulk throughput runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Frontend {
    Mtls,
    Uds,
}

/// A measurement `--only` can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Measurement {
    /// Bulk throughput at 1/4/16/64 tunnels each way, with server+agent CPU per GiB.
    Throughput,
    /// Tunnel setup rate and latency at concurrency 1 and 16.
    Setup,
    /// 64-byte round trips on an open tunnel.
    Rtt,
    /// Server+agent memory with 1,000 and 10,000 idle tunnels.
    Memory,
    /// A bulk tunnel's throughput beside a stalled one.
    Stall,
    /// Server+agent memory, the machine's TCP memory and a bulk tunnel's speed with 5,000
    /// tunnels whose clients never read.
    StalledReaders,
    /// Bridgehead and konnectivity (built by scripts/anp-build.sh) side by side on both
    /// frontends: bulk, CPU per GiB, setup, round trips.
    SideBySide,
    /// 10,000 tunnels for 10 minutes with a trickle of traffic and 1 % replaced every second:
    /// errors, RSS and descriptors over time. Only when named: it is not part of a full run.
    Soak,
    /// 2,000 CONNECTs per second for a minute on the Unix socket against a slow agent (awake
    /// 1 s in 5): pending dials bounded, 503s counted, nothing left after. Only when named.
    Burst,
    /// 10,000 simulated agents (--agents) on one server: recovery after SIGKILL and SIGTERM
    /// restarts, server RSS and CPU per idle agent, routing latency by destHost, `/agents`
    /// and `/metrics` cost. In --quick (300 agents) and when named; a full run leaves it out.
    Fleet,
}

/// Starts every `--peer`, each serving a tunnel to `target` before it is returned.
async fn start_peers(
    specs: &[peer::PeerSpec],
    target: std::net::SocketAddr,
) -> anyhow::Result<Vec<peer::Peer>> {
    let mut peers = Vec::new();
    for spec in specs {
        let peer = peer::Peer::start(spec, target).await?;
        eprintln!("peer {}: pids {:?}", spec.name, peer.pids());
        peers.push(peer);
    }
    Ok(peers)
}

/// Runs the selected measurements, prints the tables and writes the JSON lines and plots.
/// Returns whether every target was met.
pub fn run(options: &Options) -> anyhow::Result<bool> {
    if let Some(done) = run_mode(options)? {
        return Ok(done);
    }
    // A profiled run's numbers are skewed by perf: keep them apart from the real results.
    let out_dir = options
        .out_dir
        .clone()
        .or_else(|| options.perf.clone())
        .unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let json_path = options
        .json
        .clone()
        .unwrap_or_else(|| out_dir.join("results.jsonl"));
    let mut report = Report::create(&json_path, options.quick)?;
    let bench = Bench::start(options, &mut report)?;
    bench.paths(&mut report)?;
    if bench.selected(Measurement::SideBySide) {
        bench.side_by_side(&mut report)?;
    }
    if bench.selected(Measurement::StalledReaders) {
        bench.stalled_readers(&mut report)?;
    }
    if bench.selected(Measurement::Memory) {
        bench.memory(&mut report)?;
    }
    if bench.selected(Measurement::Soak) {
        bench.soak(&mut report)?;
    }
    if bench.selected(Measurement::Burst) {
        bench.burst(&mut report)?;
    }
    if bench.selected(Measurement::Fleet) {
        bench.fleet(&mut report);
    }
    plot::write_all(&report.throughput, &report.setup, &out_dir)?;
    plot::side_by_side(&json_path, &out_dir)?;
    let load_end = Machine::read().load;
    report.record("end", json!({ "loadavg_end": load_end }))?;
    let machine = &bench.machine;
    println!(
        "## Bridgehead benchmark{}\n\nmachine: {} x {}, kernel {}, TCP {}; load average at start {}, at end {}\n",
        if options.quick { " (--quick)" } else { "" },
        machine.nproc,
        machine.cpu,
        machine.kernel,
        machine.tcp,
        machine.load,
        load_end
    );
    println!("{}", report.markdown());
    eprintln!("results: {}", report.json_path().display());
    Ok(report.all_passed())
}

/// The modes that are not a measured run (a target process, a fleet worker, `--replot`,
/// `--callgrind`), and the check that the binaries are built. `Some(passed)` when one ran.
fn run_mode(options: &Options) -> anyhow::Result<Option<bool>> {
    if options.serve_target {
        Target::serve_standalone(options.target_send_buffer)?;
        return Ok(Some(true));
    }
    if options.fleet_worker {
        fleet::worker::serve()?;
        return Ok(Some(true));
    }
    if let Some(results) = &options.replot {
        let out_dir = options.out_dir.clone().unwrap_or_else(default_out_dir);
        std::fs::create_dir_all(&out_dir)?;
        plot::replot(results, &out_dir)?;
        return Ok(Some(true));
    }
    for name in ["bridgehead-server", "bridgehead-agent"] {
        let path = bridgehead_e2e::process::bin_dir().join(name);
        if !path.exists() {
            bail!(
                "{} not found: run `cargo build --release --bins` first",
                path.display()
            );
        }
    }
    match &options.callgrind {
        Some(dir) => run_callgrind(options, dir).map(Some),
        None => Ok(None),
    }
}

/// One measured run: what every measurement reads.
struct Bench<'a> {
    options: &'a Options,
    budget: Budget,
    extra: ExtraArgs,
    machine: Machine,
    /// The open-files limit the bench raised itself to.
    nofile: u64,
    soak_plan: bridgehead_e2e::soak::Plan,
    runtime: tokio::runtime::Runtime,
    /// The echo and bulk target in the bench's own process.
    target: Target,
    crypto: floor::Crypto,
    profiler: Option<Profiler>,
}

impl<'a> Bench<'a> {
    /// The budget, the open-files limit, the machine's description, the runtime, the target
    /// and (for the bulk rows) the crypto floor; the machine recorded in `report`.
    fn start(options: &'a Options, report: &mut Report) -> anyhow::Result<Bench<'a>> {
        let mut budget = if options.quick {
            Budget::quick()
        } else {
            Budget::full()
        };
        if let Some(rounds) = options.rounds {
            budget.side_by_side_rounds = rounds;
        }
        if !options.tunnels.is_empty() {
            budget.bulk_tunnels = Some(options.tunnels.clone());
        }
        let soak_plan = soak::plan(
            options.soak_tunnels.unwrap_or(budget.soak_tunnels),
            options.soak_seconds.unwrap_or(budget.soak_seconds),
        );
        let most_idle = budget.idle.last().copied().unwrap_or(0);
        let most_held = most_idle.max(if selected(options, Measurement::Soak) {
            soak_plan.tunnels
        } else {
            0
        });
        let want_fds = most_held as u64 + memory::FD_SLACK;
        let nofile = bridgehead_runtime::limits::raise_nofile_to(Some(want_fds.max(65_536)))
            .unwrap_or(u64::MAX);
        let machine = Machine::read();
        eprintln!(
            "machine: {} x {}, kernel {}, TCP {}, load {}; RLIMIT_NOFILE {nofile}",
            machine.nproc, machine.cpu, machine.kernel, machine.tcp, machine.load
        );
        let extra = options.extra_args();
        report.record(
            "machine",
            json!({
                "nproc": machine.nproc,
                "cpu": machine.cpu,
                "kernel": machine.kernel,
                "tcp": machine.tcp,
                "loadavg_start": machine.load,
                "nofile": nofile,
                "server_args": extra.server,
                "agent_args": extra.agent,
            }),
        )?;
        let profiler = options.perf.clone().map(Profiler::new).transpose()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let target = runtime.block_on(Target::start())?;
        let crypto = if selected(options, Measurement::Throughput)
            || selected(options, Measurement::SideBySide)
        {
            let crypto = floor::Crypto::measure()?;
            eprintln!(
                "AES-128-GCM (ring, 16 KiB records): {:.3} CPU s/GiB per pass, the floor's crypto",
                crypto.seconds_per_gib
            );
            report.record(
                "crypto",
                json!({ "aes_128_gcm_s_per_gib_per_pass": crypto.seconds_per_gib }),
            )?;
            crypto
        } else {
            floor::Crypto {
                seconds_per_gib: f64::NAN,
            }
        };
        Ok(Bench {
            options,
            budget,
            extra,
            machine,
            nofile,
            soak_plan,
            runtime,
            target,
            crypto,
            profiler,
        })
    }

    fn selected(&self, measurement: Measurement) -> bool {
        selected(self.options, measurement)
    }

    /// Throughput, setup, round trips and the stalled neighbour, on one rig.
    fn paths(&self, report: &mut Report) -> anyhow::Result<()> {
        let path_measurements = [
            Measurement::Throughput,
            Measurement::Setup,
            Measurement::Rtt,
            Measurement::Stall,
        ];
        if !path_measurements.into_iter().any(|m| self.selected(m)) {
            return Ok(());
        }
        let rig = Rig::start(
            self.selected(Measurement::Setup)
                || self.selected(Measurement::Rtt)
                || self.options.frontend == Frontend::Uds,
            &self.extra,
        )?;
        eprintln!(
            "server pid {}, agent pid {} (frontend {})",
            rig.server.process.pid(),
            rig.agent.process.pid(),
            rig.server.frontend
        );
        let pids = rig.all_pids();
        match self.runtime.block_on(rig.mtls.negotiated()) {
            Ok(Some(tls)) => {
                eprintln!("frontend TLS: {tls}");
                report.record("frontend_tls", json!({ "negotiated": tls }))?;
            }
            Ok(None) => {}
            Err(error) => eprintln!("frontend TLS handshake failed: {error:#}"),
        }
        let (target, budget, profiler) = (self.target.addr, &self.budget, self.profiler.as_ref());
        self.runtime.block_on(async {
            if self.selected(Measurement::Throughput) {
                let noise = Noise::start(&pids);
                let frontend = self.options.frontend;
                throughput::run(
                    &rig,
                    frontend,
                    target,
                    budget,
                    self.crypto,
                    report,
                    profiler,
                )
                .await;
                record_noise(report, "throughput", &noise);
            }
            if self.selected(Measurement::Setup) {
                let noise = Noise::start(&pids);
                setup::run(&rig, target, budget, report, profiler).await;
                record_noise(report, "setup", &noise);
            }
            if self.selected(Measurement::Rtt) {
                let noise = Noise::start(&pids);
                latency::run(&rig, target, budget, report).await;
                record_noise(report, "rtt", &noise);
            }
            if self.selected(Measurement::Stall) {
                let noise = Noise::start(&pids);
                stall::run(&rig, &self.target, budget, report).await;
                record_noise(report, "stall", &noise);
            }
        });
        Ok(())
    }

    /// Bridgehead, konnectivity (when built) and every `--peer` on fresh processes.
    fn side_by_side(&self, report: &mut Report) -> anyhow::Result<()> {
        let konnectivity = match konnectivity::binaries() {
            Some((server, agent)) => Some(konnectivity::Konnectivity::start(&server, &agent)?),
            None => {
                eprintln!(
                    "== side by side: konnectivity is not built (scripts/anp-build.sh): without it"
                );
                report.record(
                    "side_by_side",
                    json!({ "skipped": "konnectivity not built: run scripts/anp-build.sh" }),
                )?;
                None
            }
        };
        let rig = Rig::start(true, &self.extra)?;
        let peers = self
            .runtime
            .block_on(start_peers(&self.options.peers, self.target.addr))?;
        let mut pids = rig.all_pids();
        pids.extend(konnectivity.iter().flat_map(|k| k.pids()));
        pids.extend(peers.iter().flat_map(|p| p.pids()));
        let noise = Noise::start(&pids);
        self.runtime.block_on(side_by_side::run(
            &rig,
            konnectivity.as_ref(),
            &peers,
            &self.target,
            &self.budget,
            self.crypto,
            report,
        ));
        record_noise(report, "side_by_side", &noise);
        Ok(())
    }

    /// Stalled readers on both of Bridgehead's frontends, then on konnectivity (when built)
    /// and every peer.
    fn stalled_readers(&self, report: &mut Report) -> anyhow::Result<()> {
        let count = self
            .options
            .stalled_readers
            .unwrap_or(self.budget.stalled_readers);
        let (target, budget) = (self.target.addr, &self.budget);
        // Fresh processes and a target of its own, its sockets' send buffers small.
        let rig = Rig::start(true, &self.extra)?;
        let (target_process, firehose) = spawn_target_with(Some(stalled::TARGET_SEND_BUFFER))?;
        let mut pids = rig.all_pids();
        pids.push(target_process.pid());
        let noise = Noise::start(&pids);
        // Both frontends: kube-apiserver dials the Unix socket on its own node, or mTLS.
        for pair in [Some(rig.mtls_pair()), rig.uds_pair()]
            .into_iter()
            .flatten()
        {
            self.runtime
                .block_on(stalled::run(pair, firehose, target, count, budget, report));
        }
        record_noise(report, "stalled_readers", &noise);
        drop(rig);
        // konnectivity under the same stalled readers, when built.
        if let Some((server, agent)) = konnectivity::binaries() {
            let peer = konnectivity::Konnectivity::start(&server, &agent)?;
            let (route, pids) = (&peer.mtls.route, peer.mtls.pids());
            self.runtime.block_on(stalled::peer(
                route, &pids, firehose, target, count, budget, report,
            ));
        }
        // And every peer.
        for peer in self
            .runtime
            .block_on(start_peers(&self.options.peers, target))?
        {
            self.runtime.block_on(stalled::peer(
                &peer.route,
                &peer.pids(),
                firehose,
                target,
                count,
                budget,
                report,
            ));
        }
        Ok(())
    }

    /// Idle tunnels at each count the open-files limit allows.
    fn memory(&self, report: &mut Report) -> anyhow::Result<()> {
        let counts: Vec<usize> = self
            .budget
            .idle
            .iter()
            .copied()
            .filter(|&count| match memory::check_fds(self.nofile, count) {
                Ok(()) => true,
                Err(error) => {
                    report.failed(
                        &format!("{count} idle tunnels"),
                        "all open, no error",
                        &error,
                    );
                    false
                }
            })
            .collect();
        // Fresh processes, so the baseline is not inflated by the runs before; the target in
        // its own process, so its descriptors do not count against the bench's limit.
        let rig = Rig::start(false, &self.extra)?;
        let (target_process, idle_target) = spawn_target()?;
        let hold = Duration::from_secs(self.options.idle_hold);
        let mut pids = rig.pids();
        pids.push(target_process.pid());
        let noise = Noise::start(&pids);
        self.runtime
            .block_on(memory::run(&rig, idle_target, &counts, hold, report));
        record_noise(report, "memory", &noise);
        Ok(())
    }

    fn soak(&self, report: &mut Report) -> anyhow::Result<()> {
        let plan = &self.soak_plan;
        if let Err(error) = memory::check_fds(self.nofile, plan.tunnels) {
            report.failed("soak", "zero errors", &error);
            return Ok(());
        }
        // Fresh processes; the echo target in a process of its own, as for the idle tunnels.
        // The tunnels sit at the default caps of 10,000 per agent; a replaced tunnel's close
        // reaches the server a moment after its successor's CONNECT, which the caps would
        // refuse. The soak is of the tunnels, not the caps: twice the room.
        let room = plan.tunnels * 2;
        let mut extra = self.extra.clone();
        extra.server.push(format!("--max-tunnels-per-agent={room}"));
        extra.agent.push(format!("--max-tunnels={room}"));
        let rig = Rig::start(false, &extra)?;
        let (target_process, echo_target) = spawn_target()?;
        let mut pids = rig.pids();
        pids.push(target_process.pid());
        let noise = Noise::start(&pids);
        self.runtime
            .block_on(soak::run(&rig, echo_target, plan, report));
        record_noise(report, "soak", &noise);
        Ok(())
    }

    fn burst(&self, report: &mut Report) -> anyhow::Result<()> {
        let plan = burst::Plan {
            rate: self.options.burst_rate.unwrap_or(2_000),
            duration: Duration::from_secs(
                self.options
                    .burst_seconds
                    .unwrap_or(self.budget.burst_seconds),
            ),
        };
        let pair = burst::Pair::start(&self.extra)?;
        let noise = Noise::start(&pair.pids());
        self.runtime
            .block_on(burst::run(&pair, self.target.addr, plan, report));
        record_noise(report, "burst", &noise);
        Ok(())
    }

    fn fleet(&self, report: &mut Report) {
        let options = self.options;
        let budget = &self.budget;
        let plan = fleet::Plan {
            agents: options.agents.unwrap_or(budget.fleet.agents),
            auth: options
                .fleet_auth
                .unwrap_or(if options.fleet_tokens.is_some() {
                    fleet::Auth::Token
                } else {
                    fleet::Auth::Cert
                }),
            tokens: options.fleet_tokens.clone(),
            stalled: options.fleet_stalled.unwrap_or(budget.fleet.stalled),
            servers: options.fleet_servers.unwrap_or(budget.fleet.servers),
            round_robin: options.fleet_round_robin,
            sessions_per_agent: options.fleet_sessions_per_agent,
            peering: options.fleet_peering,
            lateness: options.fleet_client_delay,
            shared_cores: options.fleet_shared_cores,
            ..budget.fleet.clone()
        };
        fleet::run(&plan, &self.extra, &self.runtime, report);
    }
}

/// Whether `options` select `m`. The soak and the burst take minutes: they run only when
/// named. So does the fleet at its full size; its quick size is part of the smoke run.
fn selected(options: &Options, m: Measurement) -> bool {
    options.only.contains(&m)
        || (options.only.is_empty()
            && ![Measurement::Soak, Measurement::Burst].contains(&m)
            && (m != Measurement::Fleet || options.quick))
}

/// The `--callgrind DIR` mode: instruction counts instead of timings.
fn run_callgrind(options: &Options, dir: &std::path::Path) -> anyhow::Result<bool> {
    let callgrind = callgrind::Callgrind::new(dir.to_owned())?;
    let json_path = options
        .json
        .clone()
        .unwrap_or_else(|| dir.join("results.jsonl"));
    let extra = options.extra_args();
    let counts = if options.quick {
        callgrind::Counts::quick()
    } else {
        callgrind::Counts::full()
    };
    let machine = Machine::read();
    let mut report = Report::create(&json_path, options.quick)?;
    report.record(
        "machine",
        json!({ "nproc": machine.nproc, "cpu": machine.cpu, "kernel": machine.kernel }),
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let target = runtime.block_on(Target::start())?;
    callgrind::run(
        &callgrind,
        &runtime,
        target.addr,
        &counts,
        &extra,
        &mut report,
    )?;
    println!(
        "## Bridgehead instruction counts (callgrind){}\n\nmachine: {} x {}, kernel {}\n",
        if options.quick { " (--quick)" } else { "" },
        machine.nproc,
        machine.cpu,
        machine.kernel,
    );
    println!("{}", report.markdown());
    eprintln!("results: {}", report.json_path().display());
    Ok(true)
}

/// Starts this binary with `--serve-target` ([`Target::serve_standalone`]) in a child process,
/// killed on drop.
fn spawn_target() -> anyhow::Result<(bridgehead_e2e::process::Process, std::net::SocketAddr)> {
    spawn_target_with(None)
}

/// [`spawn_target`], the target's sockets' send buffer set to `send_buffer` bytes.
fn spawn_target_with(
    send_buffer: Option<u32>,
) -> anyhow::Result<(bridgehead_e2e::process::Process, std::net::SocketAddr)> {
    // /proc/self/exe still runs when a rebuild replaced the binary during the run.
    let mut command = std::process::Command::new("/proc/self/exe");
    command.arg("--serve-target");
    if let Some(size) = send_buffer {
        command.arg(format!("--target-send-buffer={size}"));
    }
    let (process, addrs) = bridgehead_e2e::process::Process::spawn(command, &["bench target"])?;
    Ok((process, addrs[0].parse()?))
}

/// Adds how much CPU other work took during a measurement to the report.
fn record_noise(report: &mut Report, measurement: &str, noise: &Noise) {
    let (wall, foreign, stolen) = noise.finish();
    let share = foreign / wall.max(1e-9);
    if share > 0.1 {
        eprintln!(
            "warning: other processes used {foreign:.1} CPU s during the {measurement} runs ({share:.2} of a core on average): noisy"
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stolen_share = noise::stolen_share(stolen, wall, cpus);
    let stolen_noisy = noise::stolen_is_noisy(stolen, wall, cpus);
    if stolen_noisy {
        eprintln!(
            "warning: the hypervisor took {stolen:.1} CPU s during the {measurement} runs ({:.0} % of the machine's {:.0} CPU s): their rates are not comparable with another run's",
            stolen_share * 100.0,
            wall * cpus as f64
        );
    }
    let _ = report.record(
        "noise",
        json!({
            "during": measurement,
            "wall_s": wall,
            "foreign_cpu_s": foreign,
            "stolen_cpu_s": stolen,
            "stolen_share": stolen_share,
            "noisy": share > 0.1 || stolen_noisy,
        }),
    );
    report.row(
        "Other load on the machine during the runs (CPU not used by the bench, server, agent or target)",
        &["measurement", "wall time", "foreign CPU", "average cores", "stolen (hypervisor)"],
        vec![
            measurement.to_owned(),
            format!("{wall:.1} s"),
            format!("{foreign:.1} s"),
            format!("{share:.2}"),
            format!("{stolen:.1} s ({:.1} %)", stolen_share * 100.0),
        ],
    );
}

/// `target/bench` next to the binaries' `target/release`.
fn default_out_dir() -> PathBuf {
    let bin = bridgehead_e2e::process::bin_dir();
    bin.parent()
        .map_or_else(|| PathBuf::from("target/bench"), |t| t.join("bench"))
}
