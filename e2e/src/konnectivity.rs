//! konnectivity (ANP's proxy-server and proxy-agent, built from its Go module by
//! `scripts/anp-build.sh` into `target/anp/bin`) in HTTP-CONNECT mode: a server with its mTLS
//! or Unix-socket frontend and one agent, on the same PKI shape as Bridgehead's (two CAs), at
//! ANP's defaults but for the addresses and `-v=0`. The bench runs it side by side; the
//! migration tests run Bridgehead in front of it (`--fallback-proxy`).
//!
//! ANP refuses port 0 for its listeners and does not print addresses, so each listener gets a
//! loopback address of its own and a port found free there (bound and released: a race in
//! principle, on addresses nothing else uses); `/proc` then confirms it listens.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::client::http_get;
use crate::process::Process;
use crate::procfs;
use crate::Pki;

/// How long ANP's server and agent may take to listen and connect.
const STARTUP: Duration = Duration::from_secs(30);
/// The loopback addresses of the server's listeners (mTLS frontend, agent port, health,
/// admin); the agent's health and admin.
const FRONTEND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// Where ANP's agent port listens: the PKI's cluster certificate must name it.
pub const AGENTS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const HEALTH: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const ADMIN: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);

/// ANP's two binaries (server, agent), when built.
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    let bin = crate::process::bin_dir().parent()?.join("anp/bin");
    let (server, agent) = (bin.join("proxy-server"), bin.join("proxy-agent"));
    (server.exists() && agent.exists()).then_some((server, agent))
}

/// Where an ANP server takes CONNECTs.
#[derive(Debug, Clone)]
pub enum Frontend {
    Mtls(SocketAddr),
    Unix(PathBuf),
}

/// One ANP server and its agent; killed on drop.
#[derive(Debug)]
pub struct Pair {
    pub server: Process,
    pub agent: Process,
    pub frontend: Frontend,
    /// The server's health port (`/metrics`, `/readyz`).
    pub health: SocketAddr,
}

impl Pair {
    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid(), self.agent.pid()]
    }
}

/// A port nothing listens on at `ip` right now.
fn free_port(ip: Ipv4Addr) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind((ip, 0))
        .with_context(|| format!("binding {ip}: is all of 127.0.0.0/8 on lo?"))?;
    Ok(listener.local_addr()?.port())
}

/// `pid`'s listener on `ip`, waiting for it to appear.
fn listener_on(pid: u32, ip: Ipv4Addr, deadline: Instant) -> anyhow::Result<SocketAddr> {
    loop {
        if let Some(addr) = procfs::listening_v4(pid)
            .into_iter()
            .find(|a| a.ip() == IpAddr::V4(ip))
        {
            return Ok(addr);
        }
        if Instant::now() > deadline {
            bail!("process {pid} did not listen on {ip} within {STARTUP:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts ANP's server (on the Unix socket `uds`, or its mTLS frontend) and one agent, and
/// waits until the server has it. `pki`'s cluster certificate must name [`AGENTS`].
pub fn start_pair(
    pki: &Pki,
    (server_bin, agent_bin): (&Path, &Path),
    uds: Option<&Path>,
    name: &str,
) -> anyhow::Result<Pair> {
    let path = |f: &str| pki.path(f).display().to_string();
    let mut command = Command::new(server_bin);
    command.args(["--mode=http-connect", "-v=0", "--logtostderr=true"]);
    match uds {
        Some(socket) => {
            command
                .arg(format!("--uds-name={}", socket.display()))
                .arg("--server-port=0");
        }
        None => {
            command
                .arg(format!("--server-cert={}", path("server.crt")))
                .arg(format!("--server-key={}", path("server.key")))
                .arg(format!("--server-ca-cert={}", path("frontend-ca.crt")))
                .arg(format!("--server-bind-address={FRONTEND}"))
                .arg(format!("--server-port={}", free_port(FRONTEND)?));
        }
    }
    command
        .arg(format!("--cluster-cert={}", path("cluster.crt")))
        .arg(format!("--cluster-key={}", path("cluster.key")))
        .arg(format!("--cluster-ca-cert={}", path("cluster-ca.crt")))
        .arg(format!("--agent-bind-address={AGENTS}"))
        .arg(format!("--agent-port={}", free_port(AGENTS)?))
        .arg(format!("--health-bind-address={HEALTH}"))
        .arg(format!("--health-port={}", free_port(HEALTH)?))
        .arg(format!("--admin-bind-address={ADMIN}"))
        .arg(format!("--admin-port={}", free_port(ADMIN)?))
        .arg(format!("--server-id=anp-{name}"));
    let (server, _) = Process::spawn(command, &[]).context("starting ANP's proxy-server")?;
    let deadline = Instant::now() + STARTUP;
    let agents = listener_on(server.pid(), AGENTS, deadline)?;
    let health = listener_on(server.pid(), HEALTH, deadline)?;

    let mut command = Command::new(agent_bin);
    command
        .args(["-v=0", "--logtostderr=true"])
        .arg(format!("--proxy-server-host={AGENTS}"))
        .arg(format!("--proxy-server-port={}", agents.port()))
        .arg(format!("--ca-cert={}", path("cluster-ca.crt")))
        .arg(format!("--agent-cert={}", path("agent.crt")))
        .arg(format!("--agent-key={}", path("agent.key")))
        .arg(format!("--agent-id=anp-{name}"))
        .arg(format!("--health-server-host={HEALTH}"))
        .arg(format!("--health-server-port={}", free_port(HEALTH)?))
        .arg(format!("--admin-bind-address={ADMIN}"))
        .arg(format!("--admin-server-port={}", free_port(ADMIN)?));
    let (agent, _) = Process::spawn(command, &[]).context("starting ANP's proxy-agent")?;
    // The server is ready once it has a backend.
    loop {
        if let Ok((200, _)) = http_get(health, "/readyz") {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "ANP's server ({name}) did not get its agent within {STARTUP:?}\nserver:\n{}\nagent:\n{}",
                server.stderr(),
                agent.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let frontend = match uds {
        Some(socket) => Frontend::Unix(socket.to_owned()),
        None => Frontend::Mtls(listener_on(server.pid(), FRONTEND, deadline)?),
    };
    Ok(Pair {
        server,
        agent,
        frontend,
        health,
    })
}
