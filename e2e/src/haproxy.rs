//! A real load balancer in front of several servers: haproxy (Debian's package) in TCP mode,
//! round robin, as operators put one in front of the servers' agent ports.
//!
//! The test binds the listening socket itself (port 0) and hands it to haproxy as its standard
//! input (`bind fd@0`), so no port is fixed and the address is known before haproxy runs.
//! [`Haproxy::start_in`] runs one inside a test host's network namespace instead, with a
//! frontend per service at fixed ports of that host's own address (the namespace is the
//! test's: nothing else binds there), as kubeadm's HA guide runs haproxy on the control-plane
//! nodes in front of every kube-apiserver.
//! Backends are health-checked (a TCP connect every [`CHECK_INTERVAL`], or an HTTPS `GET` of a
//! readiness path where the frontend asks for it, as kubeadm's HA guide checks kube-apiserver);
//! a connection to a backend that refuses is retried and redispatched to another, as `option
//! redispatch` does in production configurations. A namespaced haproxy also serves its runtime
//! API on a Unix socket ([`Haproxy::set_state`]): how an operator drains a backend before a
//! planned restart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::process::Process;

/// How often haproxy checks each backend.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// A running haproxy; killed on drop.
#[derive(Debug)]
pub struct Haproxy {
    pub process: Process,
    /// Where clients (agents) connect.
    pub addr: SocketAddr,
    /// The runtime API's socket ([`Haproxy::start_in`] only).
    admin: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

/// What the runtime API may set a backend server to (`set server B/S state ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Takes new connections (when its check passes).
    Ready,
    /// Takes no new connection; the ones it holds go on: a planned restart's first step.
    Drain,
}

/// Whether haproxy is installed.
pub fn available() -> bool {
    Command::new("haproxy")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// How haproxy picks a backend, and how many connections it holds.
#[derive(Debug, Clone, Copy)]
pub struct Balance {
    /// `leastconn` rather than `roundrobin`: a new connection goes to the backend with the
    /// fewest, so a restarted server (none) gets the fleet's reconnections first.
    pub least_connections: bool,
    /// `maxconn`: each connection costs haproxy two descriptors.
    pub max_connections: u32,
}

impl Default for Balance {
    fn default() -> Balance {
        Balance {
            least_connections: false,
            max_connections: 4096,
        }
    }
}

impl Haproxy {
    /// haproxy listening on `ip` (an ephemeral port), balancing over `backends` round robin.
    pub fn start(ip: std::net::IpAddr, backends: &[SocketAddr]) -> anyhow::Result<Haproxy> {
        Haproxy::start_balanced(ip, backends, Balance::default())
    }

    /// haproxy as [`Haproxy::start`], balancing as `balance` says.
    pub fn start_balanced(
        ip: std::net::IpAddr,
        backends: &[SocketAddr],
        balance: Balance,
    ) -> anyhow::Result<Haproxy> {
        let listener = TcpListener::bind((ip, 0)).context("binding haproxy's listener")?;
        let addr = listener.local_addr()?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("haproxy.cfg");
        std::fs::write(&config, config_text(backends, balance))?;
        check(&config, &listener)?;
        let mut command = Command::new("haproxy");
        command.arg("-db").arg("-f").arg(&config);
        command.env("RUST_LOG", "off");
        let stdin = Stdio::from(OwnedFd::from(listener));
        let (process, _) = Process::spawn_with_stdin(command, stdin, &[], Duration::ZERO)
            .context("starting haproxy")?;
        Ok(Haproxy {
            process,
            addr,
            admin: None,
            _dir: dir,
        })
    }
}

/// One frontend of [`Haproxy::start_in`]: what it listens on and balances over.
#[derive(Debug, Clone)]
pub struct Frontend {
    /// Names its sections in the configuration (a word).
    pub name: &'static str,
    pub bind: SocketAddr,
    pub backends: Vec<SocketAddr>,
    pub balance: Balance,
    /// Checks each backend with an HTTPS `GET` of this path (200 passes, the certificate is
    /// not verified) rather than a TCP connect: a kube-apiserver that listens but is not ready
    /// (`/readyz`) gets no request.
    pub ready_check: Option<&'static str>,
}

impl Haproxy {
    /// haproxy in network namespace `ns` with `frontends`, each bound to its own address
    /// there. Returns once the configuration parsed; [`Haproxy::addr`] is the first
    /// frontend's. Whether a frontend answers is the caller's to wait for (a kube-apiserver
    /// ready through it, an agent connected).
    pub fn start_in(ns: &str, frontends: &[Frontend]) -> anyhow::Result<Haproxy> {
        let first = frontends.first().context("haproxy needs a frontend")?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("haproxy.cfg");
        let max_connections = frontends
            .iter()
            .map(|frontend| frontend.balance.max_connections)
            .max()
            .unwrap_or_default();
        let admin = dir.path().join("admin.sock");
        let mut text = header(max_connections).replacen(
            "global\n",
            &format!(
                "global\n  stats socket {} mode 600 level admin\n",
                admin.display()
            ),
            1,
        );
        for frontend in frontends {
            text.push_str(&section(
                frontend.name,
                &frontend.bind.to_string(),
                &frontend.backends,
                frontend.balance,
                frontend.ready_check,
            ));
        }
        std::fs::write(&config, text)?;
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "haproxy", "-c", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .output()
            .context("running haproxy -c")?;
        anyhow::ensure!(
            out.status.success(),
            "haproxy -c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", ns, "haproxy", "-db", "-f"])
            .arg(&config);
        let (process, _) = Process::spawn_with_stdin(command, Stdio::null(), &[], Duration::ZERO)
            .context("starting haproxy")?;
        Ok(Haproxy {
            process,
            addr: first.bind,
            admin: Some(admin),
            _dir: dir,
        })
    }

    /// Sets server `server` (its index among the backends) of frontend `frontend`'s backend to
    /// `state` through the runtime API, as `echo "set server ..." | socat` does.
    pub fn set_state(
        &self,
        frontend: &str,
        server: usize,
        state: ServerState,
    ) -> anyhow::Result<()> {
        let state = match state {
            ServerState::Ready => "ready",
            ServerState::Drain => "drain",
        };
        let answer = self.runtime(&format!(
            "set server {frontend}-servers/s{server} state {state}"
        ))?;
        // The command answers nothing when it worked, a reason when not.
        anyhow::ensure!(
            answer.trim().is_empty(),
            "haproxy: set server {frontend}-servers/s{server} state {state}: {answer}"
        );
        Ok(())
    }

    /// One runtime API command; haproxy's answer.
    fn runtime(&self, command: &str) -> anyhow::Result<String> {
        let admin = self
            .admin
            .as_ref()
            .context("this haproxy serves no runtime API")?;
        let mut socket = UnixStream::connect(admin)
            .with_context(|| format!("haproxy's runtime API at {}", admin.display()))?;
        socket.set_read_timeout(Some(RUNTIME_TIMEOUT))?;
        socket.write_all(format!("{command}\n").as_bytes())?;
        // Without `prompt`, haproxy answers one command and closes.
        let mut answer = String::new();
        socket.read_to_string(&mut answer)?;
        Ok(answer)
    }
}

/// How long a runtime API command may take.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(5);

/// `haproxy -c` with the listener as its standard input, as the real run has it: the
/// configuration parses and the socket is usable (its errors name the line).
fn check(config: &Path, listener: &TcpListener) -> anyhow::Result<()> {
    let socket = OwnedFd::from(listener.try_clone()?);
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(config)
        .stdin(Stdio::from(socket))
        .output()
        .context("running haproxy -c")?;
    anyhow::ensure!(
        out.status.success(),
        "haproxy -c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// TCP mode, round robin (or least connections), health checks, retries with redispatch; long
/// idle timeouts (agent sessions are long-lived, kept alive by WebSocket pings).
fn config_text(backends: &[SocketAddr], balance: Balance) -> String {
    let mut text = header(balance.max_connections);
    text.push_str(&section("agents", "fd@0", backends, balance, None));
    text
}

/// The `global` and `defaults` sections.
fn header(max_connections: u32) -> String {
    format!(
        "global\n  maxconn {max_connections}\n\ndefaults\n  mode tcp\n  maxconn {max_connections}\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\n\n"
    )
}

/// A frontend `name` on `bind` and its backend over `backends`, each checked by a TCP connect
/// or, with `ready_check`, by an HTTPS `GET` of that path expecting 200, the certificate
/// unverified (kube-apiserver's is the cluster CA's; kubeadm's HA guide checks it the same way).
fn section(
    name: &str,
    bind: &str,
    backends: &[SocketAddr],
    balance: Balance,
    ready_check: Option<&str>,
) -> String {
    let mut text = format!(
        "frontend {name}\n  bind {bind}\n  default_backend {name}-servers\n\nbackend {name}-servers\n  balance {}\n",
        if balance.least_connections {
            "leastconn"
        } else {
            "roundrobin"
        },
    );
    let interval = CHECK_INTERVAL.as_millis();
    match ready_check {
        Some(path) => text.push_str(&format!(
            "  option httpchk GET {path}\n  http-check expect status 200\n  default-server check check-ssl verify none inter {interval}ms fall 2 rise 1\n"
        )),
        None => text.push_str(&format!(
            "  default-server check inter {interval}ms fall 2 rise 1\n"
        )),
    }
    for (i, backend) in backends.iter().enumerate() {
        text.push_str(&format!("  server s{i} {backend}\n"));
    }
    text.push('\n');
    text
}
