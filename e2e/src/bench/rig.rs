//! The processes under test: a server with the mTLS frontend and its agent (agent WebSocket
//! over TLS: the full path), and optionally a second server with the Unix-socket frontend and
//! its own agent.

use std::path::PathBuf;

use crate::{Agent, AgentOptions, Pki, Server, ServerOptions};

use super::route::Route;

/// The mTLS pair, and the Unix-socket pair when asked for.
#[derive(Debug)]
pub struct Rig {
    pub pki: Pki,
    pub server: Server,
    pub agent: Agent,
    pub mtls: Route,
    uds: Option<UdsPair>,
}

#[derive(Debug)]
struct UdsPair {
    server: Server,
    agent: Agent,
    route: Route,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Starts the pair(s) and waits until each agent is registered.
    pub fn start(with_uds: bool) -> anyhow::Result<Rig> {
        let pki = Pki::new()?;
        let server = Server::start(&pki, ServerOptions::default())?;
        let agent = Agent::start(&pki, &server, AgentOptions::default())?;
        server.wait_agents(1)?;
        let mtls = Route::mtls(&pki, server.frontend_addr())?;
        let uds = if with_uds {
            let dir = tempfile::tempdir()?;
            let path: PathBuf = dir.path().join("bridgehead.sock");
            let uds_server = Server::start(
                &pki,
                ServerOptions {
                    uds: Some(path.clone()),
                    ..Default::default()
                },
            )?;
            let uds_agent = Agent::start(&pki, &uds_server, AgentOptions::default())?;
            uds_server.wait_agents(1)?;
            Some(UdsPair {
                server: uds_server,
                agent: uds_agent,
                route: Route::Uds { path },
                _dir: dir,
            })
        } else {
            None
        };
        Ok(Rig {
            pki,
            server,
            agent,
            mtls,
            uds,
        })
    }

    /// The mTLS server's and its agent's process ids: whose memory and CPU count.
    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.process.pid(), self.agent.process.pid()]
    }

    /// Every process of the rig (both pairs): what is not "other load".
    pub fn all_pids(&self) -> Vec<u32> {
        let mut pids = self.pids();
        if let Some(uds) = &self.uds {
            pids.extend([uds.server.process.pid(), uds.agent.process.pid()]);
        }
        pids
    }

    /// Direct, mTLS and (when started) Unix socket.
    pub fn routes(&self) -> Vec<Route> {
        let mut routes = vec![Route::Direct, self.mtls.clone()];
        if let Some(uds) = &self.uds {
            routes.push(uds.route.clone());
        }
        routes
    }
}
