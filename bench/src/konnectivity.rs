//! konnectivity (ANP's proxy-server and proxy-agent, built by `scripts/anp-build.sh` into
//! `target/anp/bin`) run beside Bridgehead: an HTTP-CONNECT server with the mTLS frontend and
//! its agent, and one with the Unix-socket frontend and its agent, on the same PKI shape
//! (two CAs), started by the e2e harness (`bridgehead_e2e::konnectivity`).

use std::path::{Path, PathBuf};

use bridgehead_e2e::konnectivity::{self as anp, Frontend, AGENTS};
use bridgehead_e2e::process::Process;
use bridgehead_e2e::Pki;

use crate::route::Route;

/// ANP's two binaries, when built.
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    anp::binaries()
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
    let pair = anp::start_pair(pki, (server_bin, agent_bin), uds, &format!("bench-{name}"))?;
    let route = match &pair.frontend {
        Frontend::Unix(socket) => Route::peer_uds("konnectivity-uds", socket.clone()),
        Frontend::Mtls(frontend) => Route::peer_mtls("konnectivity-mtls", pki, *frontend)?,
    };
    Ok(Pair {
        server: pair.server,
        agent: pair.agent,
        route,
    })
}
