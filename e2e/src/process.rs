//! Starting the binaries and reading what they announce.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::Pki;

/// How long a process may take to announce its listeners.
const STARTUP: Duration = Duration::from_secs(20);
/// How long an agent may take to register with its server.
const REGISTRATION: Duration = Duration::from_secs(20);

/// Blocks until SIGINT (Ctrl-C) or SIGTERM: the by-hand programs (`scripts/control-plane.sh`,
/// `scripts/cluster.sh`) run until then, and clean up after.
pub fn until_interrupted() -> std::io::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                result = tokio::signal::ctrl_c() => result,
                _ = term.recv() => Ok(()),
            }
        })
}

/// The directory holding the workspace's binaries (next to this test executable's `deps/`,
/// or this example's `examples/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    dir
}

/// The path of a workspace binary; fails with a hint when it was not built.
///
/// Under cargo (`cargo test`, `cargo run`: `CARGO` is set), the workspace's binaries are built
/// first, once per process, in the profile of the running executable: a test always runs the
/// binaries of the source it was built from, also in a copy of the tree (cargo-mutants).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    build_binaries()?;
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!(
            "{} not found: run `cargo build --bins` first",
            path.display()
        );
    }
    Ok(path)
}

/// `name` in `bin_dir` when given (built elsewhere, for another platform), else this build's
/// [`binary`].
fn program(bin_dir: Option<&Path>, name: &str) -> anyhow::Result<PathBuf> {
    match bin_dir {
        Some(dir) => Ok(dir.join(name)),
        None => binary(name),
    }
}

/// Removes from `command`'s environment what cargo set for this test process: it describes
/// this package, not a build. Passed on to a cargo that `command` runs, it reaches build
/// scripts (ring's reads CARGO_MANIFEST_DIR) and makes cargo rebuild their crates every time.
pub fn without_package_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let per_package = key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&&*key);
        if per_package {
            command.env_remove(&*key);
        }
    }
}

/// `cargo build --workspace --bins` (but the bench, which the tests never run) once per
/// process, when running under cargo.
fn build_binaries() -> anyhow::Result<()> {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let Some(cargo) = std::env::var_os("CARGO") else {
            return Ok(());
        };
        let mut command = Command::new(cargo);
        command.args(["build", "--quiet", "--workspace", "--bins"]);
        command.args(["--exclude", "bridgehead-bench"]);
        if bin_dir().ends_with("release") {
            command.arg("--release");
        }
        command.current_dir(env!("CARGO_MANIFEST_DIR"));
        without_package_env(&mut command);
        match command.status() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("{command:?} failed: {status}")),
            Err(error) => Err(format!("running {command:?}: {error}")),
        }
    });
    built.clone().map_err(anyhow::Error::msg)
}

/// A command a binary runs under, such as `valgrind --tool=callgrind ...`, and how much more
/// time that gives the binary to start.
#[derive(Debug, Clone, Default)]
pub struct Wrapper {
    /// The program and its arguments; the binary's path and flags follow them.
    pub command: Vec<OsString>,
    /// Startup and registration timeouts are multiplied by this (0 counts as 1).
    pub patience: u32,
}

impl Wrapper {
    /// What startup timeouts are multiplied by under `wrapper` (1 without one).
    fn patience(wrapper: Option<&Wrapper>) -> u32 {
        wrapper.map_or(1, |w| w.patience.max(1))
    }
}

/// What a binary runs under: `ip netns exec NAME` for a namespace, then the wrapper.
fn prefix(netns: Option<&str>, wrapper: Option<&Wrapper>) -> Vec<OsString> {
    let mut prefix: Vec<OsString> = match netns {
        Some(ns) => ["ip", "netns", "exec", ns].map(OsString::from).into(),
        None => Vec::new(),
    };
    if let Some(wrapper) = wrapper {
        prefix.extend(wrapper.command.iter().cloned());
    }
    prefix
}

/// A command running `program` after `prefix` (a wrapper, `ip netns exec NAME`, or nothing).
fn prefixed(prefix: &[OsString], program: PathBuf) -> Command {
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// A child process killed on drop, its stdout announcements collected.
#[derive(Debug)]
pub struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub log: PathBuf,
    _logdir: tempfile::TempDir,
}

impl Process {
    /// Spawns `command` with stderr to a log file and waits until it printed one
    /// `... <what> listening on <addr>` line for each of `wants`; returns them in order.
    pub fn spawn(command: Command, wants: &[&str]) -> anyhow::Result<(Process, Vec<String>)> {
        Process::spawn_within(command, wants, STARTUP)
    }

    /// [`Process::spawn`], waiting at most `startup` for the announcements.
    pub fn spawn_within(
        command: Command,
        wants: &[&str],
        startup: Duration,
    ) -> anyhow::Result<(Process, Vec<String>)> {
        Process::spawn_with_stdin(command, Stdio::null(), wants, startup)
    }

    /// [`Process::spawn_within`] with `stdin` for the child's standard input (a listening
    /// socket handed to haproxy, say).
    pub fn spawn_with_stdin(
        mut command: Command,
        stdin: Stdio,
        wants: &[&str],
        startup: Duration,
    ) -> anyhow::Result<(Process, Vec<String>)> {
        let logdir = tempfile::tempdir()?;
        let log = logdir.path().join("stderr.log");
        command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?);
        // The test's RUST_LOG (debug when unset), unless the command chose its own.
        if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
            command.env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".into()),
            );
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("spawning {command:?}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::sync_channel(64);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let process = Process {
            child,
            lines: rx,
            log,
            _logdir: logdir,
        };
        let mut found = vec![None; wants.len()];
        let deadline = Instant::now() + startup;
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match process.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => bail!(
                    "{:?} did not announce {wants:?} in time; stderr:\n{}",
                    command.get_program(),
                    process.stderr()
                ),
            };
            for (i, what) in wants.iter().enumerate() {
                if let Some((_, addr)) = line.split_once(&format!("{what} listening on ")) {
                    found[i] = Some(addr.trim().to_owned());
                }
            }
        }
        Ok((
            process,
            found.into_iter().map(Option::unwrap_or_default).collect(),
        ))
    }

    /// Spawns `command` with its stdout appended to `stdout` (a program that writes a log
    /// there, such as an access log, rather than announcements) and its stderr to the log
    /// file. Nothing is awaited: [`Process::wait_log`] waits for the readiness line.
    pub fn spawn_logged(mut command: Command, stdout: &Path) -> anyhow::Result<Process> {
        let logdir = tempfile::tempdir()?;
        let log = logdir.path().join("stderr.log");
        let stdout_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stdout)
            .with_context(|| format!("opening {}", stdout.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(stdout_file)
            .stderr(std::fs::File::create(&log)?);
        let child = command
            .spawn()
            .with_context(|| format!("spawning {command:?}"))?;
        // No announcements to read: the sender goes at once.
        let (_, lines) = mpsc::sync_channel(0);
        Ok(Process {
            child,
            lines,
            log,
            _logdir: logdir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Open file descriptors of the process.
    pub fn fd_count(&self) -> usize {
        crate::procfs::fd_count(self.pid())
    }

    /// Sends the signal named `signal` (`TERM`, `INT`, `KILL`, `STOP`, `CONT`, `HUP`).
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        use rustix::process::{kill_process, Pid, Signal};
        let signal = match signal {
            "TERM" => Signal::TERM,
            "INT" => Signal::INT,
            "KILL" => Signal::KILL,
            "STOP" => Signal::STOP,
            "CONT" => Signal::CONT,
            "HUP" => Signal::HUP,
            other => bail!("unknown signal {other:?}"),
        };
        let pid = i32::try_from(self.pid())
            .ok()
            .and_then(Pid::from_raw)
            .context("no pid")?;
        kill_process(pid, signal).with_context(|| format!("kill -{signal:?} {pid:?}"))?;
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("process {} did not exit within {timeout:?}", self.pid());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded poll) until the process logged a line containing `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_until(timeout, || self.stderr().contains(needle))
            .with_context(|| format!("no log line with {needle:?}; log:\n{}", self.stderr()))
    }

    /// Whether the process has exited (and reaps it).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Kills the process at once (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` to its end and collects its output, killing it (SIGKILL) if it runs longer
/// than `timeout`: an error then.
pub fn output_within(mut command: Command, timeout: Duration) -> anyhow::Result<Output> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning")?;
    let pid = rustix::process::Pid::from_child(&child);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = finished.recv_timeout(timeout).is_err();
        if late {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        late
    });
    let output = child.wait_with_output();
    let _ = done.send(());
    let killed = watchdog.join().unwrap_or(false);
    if killed {
        bail!("killed after {timeout:?}");
    }
    Ok(output?)
}

/// Polls `check` until it holds, at most `timeout`: the last resort when nothing can be waited
/// on directly.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !check() {
        if Instant::now() > deadline {
            bail!("condition still false after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Flags for [`Server::start`] beyond the PKI and ephemeral ports.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Serve the frontend on this Unix socket instead of mTLS TCP.
    pub uds: Option<PathBuf>,
    /// Extra flags, e.g. `["--proxy-strategies", "destHost,default"]`.
    pub args: Vec<String>,
    /// Bind addresses (default 127.0.0.1).
    pub bind: Option<String>,
    /// Bind address of the agent endpoint alone (default: `bind`), e.g. an address agents in
    /// network namespaces reach while the frontend and health port stay on loopback.
    pub agent_bind: Option<String>,
    /// Agent endpoint port (default 0, ephemeral), e.g. the port of a server this one replaces.
    pub agent_port: Option<u16>,
    /// TCP frontend port (default 0, ephemeral), e.g. the port of a server this one replaces.
    pub frontend_port: Option<u16>,
    /// Run the server inside this network namespace (`ip netns exec NAME`).
    pub netns: Option<String>,
    /// Run the server under this command (e.g. valgrind).
    pub wrapper: Option<Wrapper>,
    /// Run `bridgehead-server` from this directory instead of this build's (another
    /// platform's binary, under a `wrapper` such as qemu-user).
    pub bin_dir: Option<PathBuf>,
    /// Leave `--cluster-ca-cert` out (agents authenticate by token alone).
    pub without_cluster_ca: bool,
    /// Environment variables for the server (`RUST_LOG`, say).
    pub env: Vec<(String, String)>,
    /// Forward to and from peer servers (`--peer-port`), with the PKI's peer certificate.
    pub peering: Option<Peering>,
}

/// A server's `--peer-*` flags.
#[derive(Debug, Clone, Default)]
pub struct Peering {
    /// `--peer-port` (0: a free one, which [`Server::peer_addr`] tells).
    pub port: u16,
    /// `--peer-host`: the peers' names or addresses.
    pub hosts: Vec<String>,
    /// `--peer-bind-address` (default: the agent endpoint's).
    pub bind: Option<String>,
}

/// A running `bridgehead-server`.
#[derive(Debug)]
pub struct Server {
    pub process: Process,
    /// `127.0.0.1:port`, or `unix:/path` with a UDS frontend.
    pub frontend: String,
    pub agent_addr: SocketAddr,
    pub health: SocketAddr,
    /// The admin port (`/agents`, `/config`).
    pub admin: SocketAddr,
    /// The peer port, with [`ServerOptions::peering`].
    pub peer_addr: Option<SocketAddr>,
    /// Registration timeouts are multiplied by this (the wrapper's patience).
    patience: u32,
}

impl Server {
    pub fn start(pki: &Pki, options: ServerOptions) -> anyhow::Result<Server> {
        let bind = options
            .bind
            .clone()
            .unwrap_or_else(|| "127.0.0.1".to_owned());
        let mut command = prefixed(
            &prefix(options.netns.as_deref(), options.wrapper.as_ref()),
            program(options.bin_dir.as_deref(), "bridgehead-server")?,
        );
        let agent_port = options.agent_port.unwrap_or(0).to_string();
        command.args([
            "--agent-port",
            &agent_port,
            "--health-port",
            "0",
            "--admin-port",
            "0",
        ]);
        let agent_bind = options.agent_bind.as_deref().unwrap_or(&bind);
        command.args([
            "--agent-bind-address",
            agent_bind,
            "--health-bind-address",
            &bind,
            "--admin-bind-address",
            &bind,
        ]);
        command.arg("--cluster-cert").arg(pki.path("cluster.crt"));
        command.arg("--cluster-key").arg(pki.path("cluster.key"));
        if !options.without_cluster_ca {
            command
                .arg("--cluster-ca-cert")
                .arg(pki.path("cluster-ca.crt"));
        }
        match &options.uds {
            Some(path) => {
                command
                    .arg("--uds-name")
                    .arg(path)
                    .args(["--server-port", "0"]);
            }
            None => {
                let port = options.frontend_port.unwrap_or(0).to_string();
                command.args(["--server-port", &port, "--server-bind-address", &bind]);
                command.arg("--server-cert").arg(pki.path("server.crt"));
                command.arg("--server-key").arg(pki.path("server.key"));
                command
                    .arg("--server-ca-cert")
                    .arg(pki.path("frontend-ca.crt"));
            }
        }
        let mut announced = vec!["frontend", "agent endpoint", "health", "admin"];
        if let Some(peering) = &options.peering {
            command.args([
                "--peer-port",
                &peering.port.to_string(),
                "--peer-bind-address",
                peering.bind.as_deref().unwrap_or(agent_bind),
            ]);
            if !peering.hosts.is_empty() {
                command.arg(format!("--peer-host={}", peering.hosts.join(",")));
            }
            command
                .arg("--peer-ca-cert")
                .arg(pki.path("frontend-ca.crt"));
            command.arg("--peer-cert").arg(pki.path("peer.crt"));
            command.arg("--peer-key").arg(pki.path("peer.key"));
            announced.push("peer port");
        }
        command.args(&options.args);
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        let patience = Wrapper::patience(options.wrapper.as_ref());
        let (process, addrs) = Process::spawn_within(command, &announced, STARTUP * patience)?;
        Ok(Server {
            process,
            patience,
            frontend: addrs[0].clone(),
            agent_addr: addrs[1].parse()?,
            health: addrs[2].parse()?,
            admin: addrs[3].parse()?,
            peer_addr: addrs.get(4).map(|a| a.parse()).transpose()?,
        })
    }

    /// `bridgehead-server` with exactly `args` (an operator's command line), nothing added.
    pub fn start_with_args(args: &[String]) -> anyhow::Result<Server> {
        let mut command = Command::new(binary("bridgehead-server")?);
        command.args(args);
        let (process, addrs) = Process::spawn_within(
            command,
            &["frontend", "agent endpoint", "health", "admin"],
            STARTUP,
        )?;
        Ok(Server {
            process,
            patience: 1,
            frontend: addrs[0].clone(),
            agent_addr: addrs[1].parse()?,
            health: addrs[2].parse()?,
            admin: addrs[3].parse()?,
            peer_addr: None,
        })
    }

    /// The frontend's TCP address (panics for a UDS frontend).
    pub fn frontend_addr(&self) -> SocketAddr {
        self.frontend
            .parse()
            .unwrap_or_else(|_| panic!("frontend {} is not TCP", self.frontend))
    }

    /// GET on the health port: (status, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::client::http_get(self.health, path)
    }

    /// Waits (bounded, longer under a slow wrapper) until `GET /agents` lists `n` agents
    /// that are not draining.
    pub fn wait_agents(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + REGISTRATION * self.patience;
        loop {
            let count = self
                .agents()?
                .iter()
                .filter(|a| a["draining"] == false)
                .count();
            if count == n {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "expected {n} agents, have {count}; server log:\n{}",
                    self.process.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `agents` array of `GET /agents` (on the admin port).
    pub fn agents(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let (_, body) = crate::client::http_get(self.admin, "/agents")?;
        let json: serde_json::Value = serde_json::from_str(&body)?;
        Ok(json["agents"].as_array().cloned().unwrap_or_default())
    }

    /// The value of a metric line `name{labels} value` on /metrics (0 when absent).
    pub fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = self.get("/metrics")?;
        Ok(crate::client::metric_in(&body, series).unwrap_or(0.0))
    }

    /// The sum of every series of metric `name` (all its labels), 0 without any.
    pub fn metric_sum(&self, name: &str) -> anyhow::Result<f64> {
        let (_, body) = self.get("/metrics")?;
        let prefix = format!("{name}{{");
        Ok(body
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

/// Starts a server with `options` and one default agent, and waits until the agent is
/// registered.
pub fn start_pair(pki: &Pki, options: ServerOptions) -> anyhow::Result<(Server, Agent)> {
    let server = Server::start(pki, options)?;
    let agent = Agent::start(pki, &server, AgentOptions::default())?;
    server.wait_agents(1)?;
    Ok((server, agent))
}

/// Flags for [`Agent::start`].
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    pub id: Option<String>,
    /// `--agent-identifiers` query.
    pub identifiers: Option<String>,
    pub args: Vec<String>,
    /// Run the agent inside this network namespace (`ip netns exec NAME`).
    pub netns: Option<String>,
    /// Connect to this address instead of the server's agent endpoint.
    pub server: Option<SocketAddr>,
    /// Run the agent under this command (e.g. valgrind), inside the namespace if any.
    pub wrapper: Option<Wrapper>,
    /// Run `bridgehead-agent` from this directory instead of this build's (another
    /// platform's binary, under a `wrapper` such as qemu-user).
    pub bin_dir: Option<PathBuf>,
    /// `--service-account-token-path`.
    pub token: Option<PathBuf>,
    /// The client certificate and key instead of the PKI's `agent.crt`; `Some(None)`: none.
    pub certificate: Option<Option<(PathBuf, PathBuf)>>,
    /// Environment variables for the agent (`RUST_LOG`, say).
    pub env: Vec<(String, String)>,
    /// Where the health port binds (default 127.0.0.1; in a namespace, an address of the
    /// namespace the test reaches).
    pub health_bind: Option<String>,
}

/// A running `bridgehead-agent`.
#[derive(Debug)]
pub struct Agent {
    pub process: Process,
    pub health: SocketAddr,
    /// The admin port (`/status`, `/config`, `PUT /debug/flags/v`).
    pub admin: SocketAddr,
}

impl Agent {
    pub fn start(pki: &Pki, server: &Server, options: AgentOptions) -> anyhow::Result<Agent> {
        let addr = options.server.unwrap_or(server.agent_addr);
        Agent::start_at(pki, addr, options)
    }

    /// An agent connecting to `addr` (a load balancer in front of several servers, say).
    pub fn start_at(pki: &Pki, addr: SocketAddr, options: AgentOptions) -> anyhow::Result<Agent> {
        let mut command = prefixed(
            &prefix(options.netns.as_deref(), options.wrapper.as_ref()),
            program(options.bin_dir.as_deref(), "bridgehead-agent")?,
        );
        command.args(["--proxy-server-host", &addr.ip().to_string()]);
        command.args(["--proxy-server-port", &addr.port().to_string()]);
        command.arg("--ca-cert").arg(pki.path("cluster-ca.crt"));
        let certificate = match &options.certificate {
            Some(chosen) => chosen.clone(),
            None => Some((pki.path("agent.crt"), pki.path("agent.key"))),
        };
        if let Some((cert, key)) = certificate {
            command
                .arg("--agent-cert")
                .arg(cert)
                .arg("--agent-key")
                .arg(key);
        }
        if let Some(token) = &options.token {
            command.arg("--service-account-token-path").arg(token);
        }
        command.args([
            "--health-server-port",
            "0",
            "--health-bind-address",
            options.health_bind.as_deref().unwrap_or("127.0.0.1"),
            "--admin-server-port",
            "0",
        ]);
        command.args([
            "--keepalive-time",
            "1s",
            "--sync-interval",
            "100ms",
            "--sync-interval-cap",
            "1s",
        ]);
        if let Some(id) = &options.id {
            command.args(["--agent-id", id]);
        }
        if let Some(ids) = &options.identifiers {
            command.args(["--agent-identifiers", ids]);
        }
        command.args(&options.args);
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        let startup = STARTUP * Wrapper::patience(options.wrapper.as_ref());
        let (process, addrs) = Process::spawn_within(command, &["health", "admin"], startup)?;
        Ok(Agent {
            process,
            health: addrs[0].parse()?,
            admin: addrs[1].parse()?,
        })
    }

    /// `bridgehead-agent` with exactly `args` (an operator's command line), nothing added.
    pub fn start_with_args(args: &[String]) -> anyhow::Result<Agent> {
        let mut command = Command::new(binary("bridgehead-agent")?);
        command.args(args);
        let (process, addrs) = Process::spawn_within(command, &["health", "admin"], STARTUP)?;
        Ok(Agent {
            process,
            health: addrs[0].parse()?,
            admin: addrs[1].parse()?,
        })
    }

    /// GET on the agent's health port.
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::client::http_get(self.health, path)
    }

    /// The value of a metric line `name{labels} value` on /metrics (0 when absent).
    pub fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = self.get("/metrics")?;
        Ok(crate::client::metric_in(&body, series).unwrap_or(0.0))
    }
}
