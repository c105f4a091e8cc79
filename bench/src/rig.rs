//! The processes under test: a server with the mTLS frontend and its agent (agent WebSocket
//! over TLS: the full path), and optionally a second server with the Unix-socket frontend and
//! its own agent.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions, Wrapper};

use crate::route::Route;

/// Extra flags for every server and every agent the bench starts (`--server-arg`,
/// `--agent-arg`): to compare settings, say `--agent-arg=--worker-threads=1`.
#[derive(Debug, Clone, Default)]
pub struct ExtraArgs {
    pub server: Vec<String>,
    pub agent: Vec<String>,
}

/// The mTLS pair, and the Unix-socket pair when asked for.
#[derive(Debug)]
pub struct Rig {
    pub pki: Pki,
    pub server: Server,
    pub agent: Agent,
    pub mtls: Route,
    uds: Option<UdsPair>,
}

/// One frontend's route and the server and agent behind it.
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    pub route: &'a Route,
    pub server: &'a Server,
    pub agent: &'a Agent,
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
    pub fn start(with_uds: bool, extra: &ExtraArgs) -> anyhow::Result<Rig> {
        Rig::start_under(with_uds, extra, |_| None)
    }

    /// [`Rig::start`], each process run under the wrapper `wrap` gives for its name
    /// (`server`, `agent`, `uds-server`, `uds-agent`), such as valgrind.
    pub fn start_under(
        with_uds: bool,
        extra: &ExtraArgs,
        wrap: impl Fn(&str) -> Option<Wrapper>,
    ) -> anyhow::Result<Rig> {
        let pki = Pki::new()?;
        let server_options = ServerOptions {
            wrapper: wrap("server"),
            args: extra.server.clone(),
            ..Default::default()
        };
        let server = Server::start(&pki, server_options)?;
        let agent_options = AgentOptions {
            wrapper: wrap("agent"),
            args: extra.agent.clone(),
            ..Default::default()
        };
        let agent = Agent::start(&pki, &server, agent_options)?;
        server.wait_agents(1)?;
        let mtls = Route::mtls(&pki, server.frontend_addr())?;
        let uds = if with_uds {
            let dir = tempfile::tempdir()?;
            let path: PathBuf = dir.path().join("bridgehead.sock");
            let uds_server = Server::start(
                &pki,
                ServerOptions {
                    uds: Some(path.clone()),
                    wrapper: wrap("uds-server"),
                    args: extra.server.clone(),
                    ..Default::default()
                },
            )?;
            let agent_options = AgentOptions {
                wrapper: wrap("uds-agent"),
                args: extra.agent.clone(),
                ..Default::default()
            };
            let uds_agent = Agent::start(&pki, &uds_server, agent_options)?;
            uds_server.wait_agents(1)?;
            Some(UdsPair {
                server: uds_server,
                agent: uds_agent,
                route: Route::uds(path),
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

    /// The Unix-socket route and its server's and agent's process ids, when started.
    pub fn uds(&self) -> Option<(&Route, [u32; 2])> {
        self.uds.as_ref().map(|uds| {
            let pids = [uds.server.process.pid(), uds.agent.process.pid()];
            (&uds.route, pids)
        })
    }

    /// Sends SIGTERM to every process of the rig and waits (at most `timeout` in all) until
    /// each has exited: the graceful drain, after which a profiler wrapping them writes its
    /// output. Processes still running afterwards are killed on drop.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let mut processes = vec![&mut self.server.process, &mut self.agent.process];
        if let Some(uds) = &mut self.uds {
            processes.extend([&mut uds.server.process, &mut uds.agent.process]);
        }
        for process in &processes {
            process.signal("TERM")?;
        }
        let deadline = Instant::now() + timeout;
        for process in processes {
            let left = deadline.saturating_duration_since(Instant::now());
            process.wait_exit(left)?;
        }
        Ok(())
    }

    /// The mTLS frontend's route with its server and agent.
    pub fn mtls_pair(&self) -> Pair<'_> {
        Pair {
            route: &self.mtls,
            server: &self.server,
            agent: &self.agent,
        }
    }

    /// The Unix-socket frontend's route with its server and agent, when started.
    pub fn uds_pair(&self) -> Option<Pair<'_>> {
        self.uds.as_ref().map(|uds| Pair {
            route: &uds.route,
            server: &uds.server,
            agent: &uds.agent,
        })
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
