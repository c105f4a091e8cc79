//! konnectivity (ANP's proxy-server and proxy-agent, built by `scripts/anp-build.sh` into
//! `target/anp/bin`) run beside Bridgehead: an HTTP-CONNECT server with the mTLS frontend and
//! its agent, and one with the Unix-socket frontend and its agent, on the same PKI shape
//! (two CAs), at ANP's defaults but for the addresses and `-v=0` (its quietest logging; the
//! bench runs Bridgehead at `info`).
//!
//! ANP refuses port 0 for its listeners and does not print addresses, so each listener gets a
//! loopback address of its own and a port the bench found free there (bound and released:
//! a race in principle, on addresses nothing else uses); `/proc` then confirms it listens.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bridgehead_e2e::client::http_get;
use bridgehead_e2e::process::Process;
use bridgehead_e2e::procfs;
use bridgehead_e2e::Pki;

use crate::route::Route;

/// How long ANP's server and agent may take to listen and connect.
const STARTUP: Duration = Duration::from_secs(30);
/// The loopback addresses of the server's listeners (mTLS frontend, agent port, health,
/// admin); the agent's health and admin.
const FRONTEND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const AGENTS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const HEALTH: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const ADMIN: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);

/// ANP's two binaries, when built.
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    let bin = bridgehead_e2e::process::bin_dir().parent()?.join("anp/bin");
    let (server, agent) = (bin.join("proxy-server"), bin.join("proxy-agent"));
    (server.exists() && agent.exists()).then_some((server, agent))
}

/// One ANP server and its agent.
#[derive(Debug)]
pub struct Pair {
    pub server: Process,
    pub agent: Process,
    pub route: Route,
}

impl Pair {
    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid(), self.agent.pid()]
    }
}

/// The mTLS pair and the Unix-socket pair.
#[derive(Debug)]
pub struct Konnectivity {
    pub mtls: Pair,
    pub uds: Pair,
    _pki: Pki,
    _dir: tempfile::TempDir,
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

impl Konnectivity {
    /// Starts both pairs and waits until each server has its agent.
    pub fn start(server: &Path, agent: &Path) -> anyhow::Result<Konnectivity> {
        // The agents verify the cluster certificate for the agent port's address.
        let pki = Pki::with_sans(&[AGENTS.to_string()])?;
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("konnectivity.sock");
        let mtls = start_pair(&pki, server, agent, None, "mtls")?;
        let uds = start_pair(&pki, server, agent, Some(&socket), "uds")?;
        Ok(Konnectivity {
            mtls,
            uds,
            _pki: pki,
            _dir: dir,
        })
    }

    /// Every process: what is not "other load".
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = self.mtls.pids();
        pids.extend(self.uds.pids());
        pids
    }
}

fn start_pair(
    pki: &Pki,
    server_bin: &Path,
    agent_bin: &Path,
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
        .arg(format!("--server-id=bench-{name}"));
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
        .arg(format!("--agent-id=bench-{name}"))
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
    let route = match uds {
        Some(socket) => Route::peer_uds("konnectivity-uds", socket.to_owned()),
        None => {
            let frontend = listener_on(server.pid(), FRONTEND, deadline)?;
            Route::peer_mtls("konnectivity-mtls", pki, frontend)?
        }
    };
    Ok(Pair {
        server,
        agent,
        route,
    })
}
