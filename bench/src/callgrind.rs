//! Instruction counts of the server and the agent under callgrind (`--callgrind DIR`): fixed
//! workloads (counts, not time), so two runs agree however busy or fast the machine is.
//!
//! Every process of the rig runs under `valgrind --tool=callgrind` from its start. Before a
//! workload the bench waits until the processes are idle and zeroes their counters (`vgdb
//! --pid=PID zero`, what `callgrind_control --zero` sends); after it, waits until they are
//! idle again and dumps them (`vgdb --pid=PID dump LABEL`), renaming each dump to
//! `DIR/<workload>-<server|agent>.<pid>.out` for `callgrind_annotate`. A figure so holds the
//! workload's own work and none of startup, registration, health polls or warm-up, which is
//! why it is stable where whole-process counts minus an idle baseline are not (the number of
//! registration polls alone depends on how long valgrind takes to start). At the end the
//! processes get SIGTERM, drain and exit, and callgrind writes the rest (the shutdown) to
//! `DIR/<process>.<pid>.out`; a SIGKILLed process would write nothing.
//!
//! Callgrind counts the instructions the processes execute in user space (`Ir`): syscalls
//! and the kernel's TCP work are not in them (`--perf` sees those). Threads are serialised
//! under valgrind, so the counts include tokio's own scheduling as this interleaving makes it.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use tokio::runtime::Runtime;

use crate::report::Report;
use crate::rig::{ExtraArgs, Rig};
use crate::throughput::{self, Direction};
use bridgehead_e2e::procfs;

use crate::{latency, setup};
use bridgehead_e2e::Wrapper;

/// glibc's `memcpy` and `memset` switch to `rep movsb`/`rep stosb` above 2 KiB, which valgrind
/// counts once per byte (a 16 KiB copy would weigh 16,384 instructions, some 20 times its
/// cycles); with these thresholds out of reach they run their AVX2 loops, whose instruction
/// counts track cycles like the rest of the code's.
const GLIBC_TUNABLES: &str = "GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1099511627776:\
    glibc.cpu.x86_rep_stosb_threshold=1099511627776";
/// Startup and registration may take this many times longer under valgrind.
const PATIENCE: u32 = 10;
/// Bound of one workload (valgrind slows the processes down some 50 times).
const WORKLOAD_LIMIT: Duration = Duration::from_secs(300);
/// The processes count as idle when they used at most this much CPU in one window.
const IDLE_CPU: f64 = 0.02;
/// Length of that window.
const IDLE_WINDOW: Duration = Duration::from_millis(500);
/// Waiting for idle processes gives up after this.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);
/// `vgdb` writing a dump or zeroing may take this long.
const VGDB_LIMIT: Duration = Duration::from_secs(60);
/// SIGTERM to exit, for all processes together (each drains, callgrind writes its file).
const EXIT_LIMIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

/// Sizes of the workloads.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// Bytes of each bulk run (one tunnel).
    pub bulk_bytes: u64,
    /// Tunnels opened and closed per setup run, one at a time.
    pub setups: usize,
    /// 64-byte round trips on one open tunnel.
    pub round_trips: usize,
}

impl Counts {
    /// The documented run.
    pub fn full() -> Counts {
        Counts {
            bulk_bytes: 64 * MIB,
            setups: 200,
            round_trips: 2_000,
        }
    }

    /// A smoke run of the mode itself.
    pub fn quick() -> Counts {
        Counts {
            bulk_bytes: 8 * MIB,
            setups: 25,
            round_trips: 250,
        }
    }
}

/// Where the callgrind files go.
#[derive(Debug, Clone)]
pub struct Callgrind {
    dir: PathBuf,
}

/// A process being measured: its role in the workload and its id.
#[derive(Debug, Clone, Copy)]
struct Measured {
    role: &'static str,
    pid: u32,
}

/// Instructions each measured process executed during one workload.
#[derive(Debug, Clone)]
struct Dumped {
    role: &'static str,
    instructions: u64,
    file: PathBuf,
}

impl Callgrind {
    /// Files go to `dir`; fails when valgrind or vgdb is missing.
    pub fn new(dir: PathBuf) -> anyhow::Result<Callgrind> {
        for (tool, flag) in [("valgrind", "--version"), ("vgdb", "--help")] {
            let ok = Command::new(tool)
                .arg(flag)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                bail!("`{tool}` not found (apt-get install -y valgrind)");
            }
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        Ok(Callgrind { dir })
    }

    /// Runs a process called `name` under callgrind, its output in `DIR/<name>.<pid>.out`
    /// (`env` keeps the pid: it execs valgrind, which execs the tool).
    pub fn wrapper(&self, name: &str) -> Wrapper {
        let mut out_file = OsString::from("--callgrind-out-file=");
        out_file.push(self.dir.join(format!("{name}.%p.out")));
        let mut log_file = OsString::from("--log-file=");
        log_file.push(self.dir.join(format!("{name}.%p.valgrind.log")));
        Wrapper {
            command: vec![
                "env".into(),
                GLIBC_TUNABLES.into(),
                "valgrind".into(),
                "--tool=callgrind".into(),
                // Every dump names its functions in full: with name compression, a dump
                // refers to names defined in earlier dumps, and `callgrind_annotate` of one
                // dump file shows only `clone`.
                "--compress-strings=no".into(),
                "--compress-pos=no".into(),
                out_file,
                log_file,
            ],
            patience: PATIENCE,
        }
    }

    /// Zeroes the counters of `processes` once they are idle.
    fn zero(&self, processes: &[Measured]) -> anyhow::Result<()> {
        settle(processes)?;
        for process in processes {
            vgdb(process.pid, &["zero"])?;
        }
        Ok(())
    }

    /// Dumps the counters of `processes` once they are idle, as `DIR/<label>-<role>.<pid>.out`.
    fn dump(&self, label: &str, processes: &[Measured]) -> anyhow::Result<Vec<Dumped>> {
        settle(processes)?;
        let mut dumped = Vec::new();
        for process in processes {
            let before = self.newest_dump(process.pid)?;
            vgdb(process.pid, &["dump", label])?;
            let (_, path) = self
                .newest_dump(process.pid)?
                .filter(|(n, _)| before.as_ref().is_none_or(|(b, _)| n > b))
                .with_context(|| format!("callgrind wrote no dump for pid {}", process.pid))?;
            let file = self
                .dir
                .join(format!("{label}-{}.{}.out", process.role, process.pid));
            std::fs::rename(&path, &file)
                .with_context(|| format!("renaming {}", path.display()))?;
            let instructions = total_instructions(&file)?;
            dumped.push(Dumped {
                role: process.role,
                instructions,
                file,
            });
        }
        Ok(dumped)
    }

    /// The highest-numbered dump `<name>.<pid>.out.<n>` of `pid` in the directory.
    fn newest_dump(&self, pid: u32) -> anyhow::Result<Option<(u32, PathBuf)>> {
        let infix = format!(".{pid}.out.");
        let mut newest: Option<(u32, PathBuf)> = None;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(n) = name
                .split_once(&infix)
                .and_then(|(_, n)| n.parse::<u32>().ok())
            else {
                continue;
            };
            if newest.as_ref().is_none_or(|(m, _)| n > *m) {
                newest = Some((n, path));
            }
        }
        Ok(newest)
    }
}

/// One workload: its name, size and unit.
#[derive(Debug, Clone, Copy)]
enum Workload {
    BulkUpload,
    BulkDownload,
    SetupMtls,
    SetupUds,
    RoundTrips,
}

impl Workload {
    const ALL: [Workload; 5] = [
        Workload::BulkUpload,
        Workload::BulkDownload,
        Workload::SetupMtls,
        Workload::SetupUds,
        Workload::RoundTrips,
    ];

    fn label(self) -> &'static str {
        match self {
            Workload::BulkUpload => "bulk-upload",
            Workload::BulkDownload => "bulk-download",
            Workload::SetupMtls => "setup-mtls",
            Workload::SetupUds => "setup-uds",
            Workload::RoundTrips => "rtt-mtls",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Workload::BulkUpload => "bulk upload, one mTLS tunnel",
            Workload::BulkDownload => "bulk download, one mTLS tunnel",
            Workload::SetupMtls => "tunnel setup + close, mTLS frontend (full handshake)",
            Workload::SetupUds => "tunnel setup + close, Unix-socket frontend",
            Workload::RoundTrips => "64-byte round trip, open mTLS tunnel",
        }
    }

    /// How many units the workload does, the unit, and its plural.
    fn size(self, counts: &Counts) -> (u64, &'static str, &'static str) {
        match self {
            Workload::BulkUpload | Workload::BulkDownload => {
                (counts.bulk_bytes / MIB, "MiB", "MiB")
            }
            Workload::SetupMtls | Workload::SetupUds => (counts.setups as u64, "tunnel", "tunnels"),
            Workload::RoundTrips => (counts.round_trips as u64, "round trip", "round trips"),
        }
    }
}

/// Starts the rig under callgrind, runs every workload, and adds the instruction counts to
/// the report.
pub fn run(
    callgrind: &Callgrind,
    runtime: &Runtime,
    target: SocketAddr,
    counts: &Counts,
    extra: &ExtraArgs,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!(
        "== callgrind instruction counts into {} (server and agent under valgrind: slow)",
        callgrind.dir.display()
    );
    let started = Instant::now();
    let mut rig = Rig::start_under(true, extra, |name| Some(callgrind.wrapper(name)))?;
    eprintln!("  rig up after {:.1} s", started.elapsed().as_secs_f64());
    let mut totals = [0u64; 2];
    for workload in Workload::ALL {
        let begun = Instant::now();
        let dumped = runtime
            .block_on(measure(callgrind, &rig, target, counts, workload))
            .with_context(|| format!("callgrind workload {}", workload.label()))?;
        let [server, agent] = report_workload(report, workload, counts, &dumped, begun)?;
        totals[0] += server;
        totals[1] += agent;
    }
    report_totals(report, totals)?;
    match rig.terminate(EXIT_LIMIT) {
        Ok(()) => eprintln!(
            "  processes exited; shutdown counts in {}",
            callgrind.dir.display()
        ),
        Err(error) => eprintln!("  warning: the rig did not exit cleanly: {error:#}"),
    }
    Ok(())
}

/// One workload's instructions, per process and per unit of work: the log line, the JSON
/// line and the table row. Returns the server's and the agent's counts.
fn report_workload(
    report: &mut Report,
    workload: Workload,
    counts: &Counts,
    dumped: &[Dumped],
    begun: Instant,
) -> anyhow::Result<[u64; 2]> {
    let (units, unit, units_name) = workload.size(counts);
    let of_role = |role: &str| {
        dumped
            .iter()
            .find(|d| d.role == role)
            .map_or(0, |d| d.instructions)
    };
    let (server, agent) = (of_role("server"), of_role("agent"));
    let per = |count: u64| count as f64 / units.max(1) as f64;
    eprintln!(
        "  {}: server {server} Ir, agent {agent} Ir; per {unit}: server {}, agent {} ({:.0} s)",
        workload.label(),
        instructions(per(server)),
        instructions(per(agent)),
        begun.elapsed().as_secs_f64()
    );
    let files: Vec<String> = dumped
        .iter()
        .map(|d| d.file.display().to_string())
        .collect();
    report.record(
        "callgrind",
        json!({
            "workload": workload.label(),
            "count": units,
            "unit": unit,
            "server_ir": server,
            "agent_ir": agent,
            "server_ir_per_unit": per(server),
            "agent_ir_per_unit": per(agent),
            "files": files,
        }),
    )?;
    report.row(
        "Instructions executed (callgrind Ir, user space) per unit of work",
        &[
            "workload",
            "work",
            "per",
            "server",
            "agent",
            "server + agent",
        ],
        vec![
            workload.describe().to_owned(),
            format!("{units} {units_name}"),
            unit.to_owned(),
            instructions(per(server)),
            instructions(per(agent)),
            instructions(per(server + agent)),
        ],
    );
    Ok([server, agent])
}

/// Every workload's instructions together: what two runs are compared by.
fn report_totals(report: &mut Report, [server, agent]: [u64; 2]) -> anyhow::Result<()> {
    eprintln!(
        "  totals: server {server} Ir, agent {agent} Ir, together {} Ir",
        server + agent
    );
    report.record(
        "callgrind_totals",
        json!({
            "server_ir": server,
            "agent_ir": agent,
            "total_ir": server + agent,
        }),
    )?;
    report.row(
        "Totals over all workloads (compare runs with these)",
        &["server", "agent", "server + agent"],
        vec![
            server.to_string(),
            agent.to_string(),
            (server + agent).to_string(),
        ],
    );
    Ok(())
}

/// Prepares `workload` (opens its tunnel, warms the path), zeroes, runs it, dumps.
async fn measure(
    callgrind: &Callgrind,
    rig: &Rig,
    target: SocketAddr,
    counts: &Counts,
    workload: Workload,
) -> anyhow::Result<Vec<Dumped>> {
    let mtls_pids = rig.pids();
    let (route, pids) = match workload {
        Workload::SetupUds => {
            let (route, pids) = rig.uds().context("the rig has no Unix-socket pair")?;
            (route.clone(), pids.to_vec())
        }
        _ => (rig.mtls.clone(), mtls_pids),
    };
    let processes = [
        Measured {
            role: "server",
            pid: pids[0],
        },
        Measured {
            role: "agent",
            pid: pids[1],
        },
    ];
    let zero = || tokio::task::block_in_place(|| callgrind.zero(&processes));
    let dump = || tokio::task::block_in_place(|| callgrind.dump(workload.label(), &processes));
    match workload {
        Workload::BulkUpload | Workload::BulkDownload => {
            let direction = match workload {
                Workload::BulkUpload => Direction::Upload,
                _ => Direction::Download,
            };
            // A warm-up of a sixteenth, so buffers have grown and code paths have run once.
            let warm = throughput::open(&route, target, 1).await?;
            throughput::transfer(warm, direction, counts.bulk_bytes / 16, WORKLOAD_LIMIT, &[])
                .await?;
            let conns = throughput::open(&route, target, 1).await?;
            zero()?;
            let bulk =
                throughput::transfer(conns, direction, counts.bulk_bytes, WORKLOAD_LIMIT, &[])
                    .await?;
            let dumped = dump()?;
            if bulk.bytes != counts.bulk_bytes {
                bail!(
                    "moved {} of {} bytes within {WORKLOAD_LIMIT:?}",
                    bulk.bytes,
                    counts.bulk_bytes
                );
            }
            Ok(dumped)
        }
        Workload::SetupMtls | Workload::SetupUds => {
            let warm = (counts.setups / 20).max(1);
            check_setups(
                &setup::setup(&route, target, 1, warm, WORKLOAD_LIMIT).await,
                warm,
            )?;
            zero()?;
            let run = setup::setup(&route, target, 1, counts.setups, WORKLOAD_LIMIT).await;
            let dumped = dump()?;
            check_setups(&run, counts.setups)?;
            Ok(dumped)
        }
        Workload::RoundTrips => {
            let mut conn = latency::echo_tunnel(&route, target, WORKLOAD_LIMIT).await?;
            zero()?;
            let samples = latency::exchanges(&mut conn, counts.round_trips, WORKLOAD_LIMIT).await;
            let dumped = dump()?;
            let samples = samples?;
            if samples.len() != counts.round_trips {
                bail!(
                    "{} of {} round trips within {WORKLOAD_LIMIT:?}",
                    samples.len(),
                    counts.round_trips
                );
            }
            Ok(dumped)
        }
    }
}

/// Fails unless a setup run opened `want` tunnels without an error.
fn check_setups(run: &setup::SetupRun, want: usize) -> anyhow::Result<()> {
    if run.opened != want || run.errors != 0 {
        bail!(
            "opened {} of {want} tunnels, {} errors{}",
            run.opened,
            run.errors,
            run.first_error_note()
        );
    }
    Ok(())
}

/// Waits until `processes` together used at most [`IDLE_CPU`] in an [`IDLE_WINDOW`] (at most
/// [`SETTLE_LIMIT`]): what a workload left behind (closing tunnels) is then done.
fn settle(processes: &[Measured]) -> anyhow::Result<()> {
    let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut before = procfs::cpu_sample(&pids)?;
    loop {
        std::thread::sleep(IDLE_WINDOW);
        let now = procfs::cpu_sample(&pids)?;
        if now.seconds_since(&before) <= IDLE_CPU {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("processes {pids:?} still busy after {SETTLE_LIMIT:?}");
        }
        before = now;
    }
}

/// Sends a monitor command to the valgrind gdbserver of `pid` and waits for it (bounded).
fn vgdb(pid: u32, command: &[&str]) -> anyhow::Result<()> {
    let mut child = Command::new("vgdb")
        .arg(format!("--pid={pid}"))
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting vgdb")?;
    let deadline = Instant::now() + VGDB_LIMIT;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            let mut message = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut message);
            }
            bail!("vgdb --pid={pid} {command:?} failed: {}", message.trim());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("vgdb --pid={pid} {command:?} did not finish within {VGDB_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The total `Ir` of a callgrind output file (its `summary:` line, else `totals:`).
fn total_instructions(path: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    field("summary:")
        .or_else(|| field("totals:"))
        .with_context(|| format!("no summary or totals line in {}", path.display()))
}

/// An instruction count with a unit prefix: `812 k`, `3.41 M`, `1.27 G`.
fn instructions(count: f64) -> String {
    match count {
        c if c >= 1e9 => format!("{:.2} G", c / 1e9),
        c if c >= 1e6 => format!("{:.2} M", c / 1e6),
        c if c >= 1e3 => format!("{:.1} k", c / 1e3),
        c => format!("{c:.0}"),
    }
}
