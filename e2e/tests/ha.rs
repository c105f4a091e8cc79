//! Several servers behind one address: three servers, each on a test host of its own (a
//! network namespace, as a control-plane node), a real load balancer (haproxy, TCP mode, round
//! robin) in front of their agent ports, and agents on test hosts of their own, given only the
//! load balancer's address. Each agent host runs a who-am-i target on its own address, so a
//! tunnel's answer proves which node carried it.
//!
//! These tests need root (namespaces) and haproxy; without them each one is skipped loudly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{tls_config, who_am_i_with};
use bridgehead_e2e::haproxy::{self, Haproxy};
use bridgehead_e2e::netns::{self, TestNet};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::skip::skip;
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};
use rustls::ClientConfig;

/// Every test gives up after this long.
const TEST_TIMEOUT: Duration = Duration::from_secs(150);
/// Servers in the control plane.
const SERVERS: usize = 3;
/// Agents (nodes).
const AGENTS: usize = 4;
/// A client loop's pause after a failed attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// How long agents may take to find every server.
const CONVERGE: Duration = Duration::from_secs(30);

/// Runs `body` on a net with a host per server and per agent, or skips loudly.
fn with_plane(test: &str, body: impl FnOnce(TestNet) + Send + 'static) {
    if !haproxy::available() {
        return skip(test, "needs haproxy (apt-get install haproxy)");
    }
    netns::with_net(test, SERVERS + AGENTS, TEST_TIMEOUT, body);
}

/// The servers, the load balancer and the agents of one test.
struct Plane {
    net: TestNet,
    pki: Pki,
    servers: Vec<Option<Server>>,
    /// Each server's ports, kept for its restart (ports are per namespace: nobody else takes
    /// them meanwhile).
    ports: Vec<(u16, u16)>,
    lb: Option<Haproxy>,
    agents: Vec<Agent>,
    /// The who-am-i port on every host.
    who: u16,
}

impl Plane {
    /// `servers` of [`SERVERS`] started (with `--server-count count`), haproxy in front of all
    /// [`SERVERS`] agent ports, and [`AGENTS`] agents with `agent_args`.
    fn start(mut net: TestNet, servers: usize, count: usize, agent_args: &[&str]) -> Plane {
        let who = net.who_am_i_everywhere().unwrap();
        let sans: Vec<String> = (0..SERVERS).map(|i| net.host(i).v4().to_string()).collect();
        let pki = Pki::with_sans(&sans).unwrap();
        let mut plane = Plane {
            net,
            pki,
            servers: (0..SERVERS).map(|_| None).collect(),
            ports: Vec::new(),
            lb: None,
            agents: Vec::new(),
            who,
        };
        for i in 0..SERVERS {
            let server = plane.start_server(i, count, (0, 0));
            plane
                .ports
                .push((server.agent_addr.port(), server.frontend_addr().port()));
            if i < servers {
                plane.servers[i] = Some(server);
            }
        }
        // Servers beyond `servers` were started only for their ports: they are down until a
        // test brings them up.
        let backends: Vec<SocketAddr> = (0..SERVERS)
            .map(|i| SocketAddr::new(plane.net.host(i).v4().into(), plane.ports[i].0))
            .collect();
        let lb = Haproxy::start(plane.net.server_v4().into(), &backends).unwrap();
        for i in 0..AGENTS {
            let host = plane.net.host(SERVERS + i);
            let mut args = vec!["--server-name".to_owned(), "127.0.0.1".to_owned()];
            args.extend(agent_args.iter().map(|a| (*a).to_owned()));
            let agent = Agent::start_at(
                &plane.pki,
                lb.addr,
                AgentOptions {
                    id: Some(host.name().to_owned()),
                    identifiers: Some(format!("ipv4={}", host.v4())),
                    args,
                    netns: Some(host.ns_name().to_owned()),
                    health_bind: Some(host.v4().to_string()),
                    ..Default::default()
                },
            )
            .unwrap();
            plane.agents.push(agent);
        }
        plane.lb = Some(lb);
        plane
    }

    /// Server `i` on its host, with `--server-id s<i>`, on `ports` (agent, frontend; 0 for
    /// any).
    fn start_server(&self, i: usize, count: usize, ports: (u16, u16)) -> Server {
        let host = self.net.host(i);
        Server::start(
            &self.pki,
            ServerOptions {
                netns: Some(host.ns_name().to_owned()),
                bind: Some(host.v4().to_string()),
                agent_port: Some(ports.0),
                frontend_port: Some(ports.1),
                args: [
                    "--server-id",
                    &format!("s{i}"),
                    "--server-count",
                    &count.to_string(),
                    "--proxy-strategies",
                    "destHost",
                    "--keepalive-time",
                    "1s",
                    "--shutdown-grace-period",
                    "5s",
                ]
                .map(String::from)
                .to_vec(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// (Re)starts server `i` on its ports.
    fn bring_up(&mut self, i: usize, count: usize) {
        let server = self.start_server(i, count, self.ports[i]);
        self.servers[i] = Some(server);
    }

    fn server(&self, i: usize) -> &Server {
        self.servers[i].as_ref().expect("server is up")
    }

    /// The who-am-i target of agent `a`.
    fn target(&self, a: usize) -> String {
        format!("{}:{}", self.net.host(SERVERS + a).v4(), self.who)
    }

    /// The name agent `a`'s host answers.
    fn name(&self, a: usize) -> &'static str {
        self.net.host(SERVERS + a).name()
    }

    /// Waits until server `i`'s `/agents` lists every agent, not draining.
    fn wait_all_agents(&self, i: usize) {
        let server = self.server(i);
        wait_until(CONVERGE, || live_agents(server).len() == AGENTS).unwrap_or_else(|_| {
            panic!(
                "server s{i} lists {:?}; agent logs:\n{}",
                live_agents(server),
                self.agent_logs()
            )
        });
    }

    /// The CONNECT client's TLS configuration (kube-apiserver's client certificate).
    fn client_tls(&self) -> Arc<ClientConfig> {
        tls_config(&self.pki, Some(("client.crt", "client.key"))).unwrap()
    }

    /// Each agent's `bridgehead_agent_reconnects_total`.
    fn attempts(&self) -> Vec<f64> {
        self.agents
            .iter()
            .map(|agent| {
                let (_, metrics) = agent.get("/metrics").unwrap();
                metrics
                    .lines()
                    .find_map(|l| l.strip_prefix("bridgehead_agent_reconnects_total "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0.0)
            })
            .collect()
    }

    fn agent_logs(&self) -> String {
        self.agents
            .iter()
            .map(|a| a.process.stderr())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

/// The ids `/agents` lists as not draining.
fn live_agents(server: &Server) -> Vec<String> {
    server
        .agents()
        .unwrap_or_default()
        .iter()
        .filter(|a| a["draining"] == false)
        .filter_map(|a| a["id"].as_str().map(str::to_owned))
        .collect()
}

/// One tunnel through `frontend` to `target`: the name that answered, or why not.
fn tunnel(tls: &Arc<ClientConfig>, frontend: SocketAddr, target: &str) -> Result<String, String> {
    match who_am_i_with(tls.clone(), frontend, target) {
        Ok(reply) if reply.status == 200 => Ok(reply.text),
        Ok(reply) => Err(format!("{}: {}", reply.status, reply.text)),
        Err(error) => Err(format!("{error:#}")),
    }
}

/// A client tunnelling through one server's frontend until stopped, as a kube-apiserver does:
/// each attempt's time and result. After a failure it pauses a little, as a client retrying.
struct ClientLoop {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, Result<(), String>)>>,
}

/// What a client loop saw.
#[derive(Debug)]
struct Seen {
    attempts: usize,
    failures: Vec<(Instant, String)>,
    successes: Vec<Instant>,
}

impl ClientLoop {
    /// Tunnels to each node's who-am-i in turn through server `server`'s frontend.
    fn start(plane: &Plane, server: usize) -> ClientLoop {
        let frontend = plane.server(server).frontend_addr();
        let expected: Vec<(String, String)> = (0..AGENTS)
            .map(|a| (plane.target(a), plane.name(a).to_owned()))
            .collect();
        let tls = plane.client_tls();
        let mut n = 0;
        ClientLoop::run(move || {
            let (target, name) = &expected[n % expected.len()];
            n += 1;
            match tunnel(&tls, frontend, target) {
                Ok(answer) if answer == *name => Ok(()),
                Ok(answer) => Err(format!("{target} answered {answer}, not {name}")),
                Err(error) => Err(error),
            }
        })
    }

    /// Runs `attempt` until stopped.
    fn run(mut attempt: impl FnMut() -> Result<(), String> + Send + 'static) -> ClientLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut results = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let result = attempt();
                let failed = result.is_err();
                results.push((Instant::now(), result));
                if failed {
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
            results
        });
        ClientLoop { stop, thread }
    }

    /// Stops the loop.
    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.thread.join().unwrap();
        Seen {
            attempts: results.len(),
            failures: results
                .iter()
                .filter_map(|(at, r)| r.as_ref().err().map(|e| (*at, e.clone())))
                .collect(),
            successes: results
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(at, _)| *at)
                .collect(),
        }
    }
}

impl Seen {
    /// From the first failure to the last.
    fn failing_for(&self) -> Duration {
        match (self.failures.first(), self.failures.last()) {
            (Some((first, _)), Some((last, _))) => *last - *first,
            _ => Duration::ZERO,
        }
    }
}

#[test]
fn every_agent_reaches_every_server_and_each_server_routes_to_the_right_node() {
    with_plane(
        "every_agent_reaches_every_server_and_each_server_routes_to_the_right_node",
        |net| {
            let plane = Plane::start(net, SERVERS, SERVERS, &[]);
            for i in 0..SERVERS {
                plane.wait_all_agents(i);
                let json = plane.server(i).agents().unwrap();
                assert_eq!(json.len(), AGENTS, "s{i}: {json:?}");
                let (_, body) =
                    bridgehead_e2e::client::http_get(plane.server(i).admin, "/agents").unwrap();
                assert!(body.contains(&format!("\"server_id\": \"s{i}\"")), "{body}");
            }
            // Through each server's own frontend, each node's target is reached by its own
            // agent.
            for i in 0..SERVERS {
                for a in 0..AGENTS {
                    let frontend = plane.server(i).frontend_addr();
                    assert_eq!(
                        tunnel(&plane.client_tls(), frontend, &plane.target(a)).as_deref(),
                        Ok(plane.name(a)),
                        "through s{i} to agent {a}"
                    );
                }
            }
            // Each agent says how many of how many, and exports the konnectivity series.
            for agent in &plane.agents {
                let (status, body) = agent.get("/readyz").unwrap();
                assert_eq!(status, 200, "{body}");
                assert!(body.contains("connected to 3 of 3 servers"), "{body}");
                let (_, metrics) = agent.get("/metrics").unwrap();
                for line in [
                    "konnectivity_network_proxy_agent_open_server_connections 3\n",
                    "konnectivity_network_proxy_agent_known_server_count 3\n",
                    "bridgehead_agent_server_sessions{state=\"active\"} 3\n",
                ] {
                    assert!(metrics.contains(line), "{line}: {metrics}");
                }
            }
        },
    );
}

#[test]
fn a_killed_server_costs_the_others_nothing_and_agents_return_to_it_spread_out() {
    with_plane(
        "a_killed_server_costs_the_others_nothing_and_agents_return_to_it_spread_out",
        |net| {
            let mut plane = Plane::start(net, SERVERS, SERVERS, &[]);
            for i in 0..SERVERS {
                plane.wait_all_agents(i);
            }
            let loops: Vec<ClientLoop> =
                (1..SERVERS).map(|i| ClientLoop::start(&plane, i)).collect();

            let killed = Instant::now();
            plane.servers[0].as_mut().unwrap().process.kill();
            plane.servers[0] = None;
            // Every agent notices (its keepalive or the connection's end) and says 2 of 3.
            for (a, agent) in plane.agents.iter().enumerate() {
                wait_until(Duration::from_secs(10), || {
                    agent
                        .get("/readyz")
                        .is_ok_and(|(_, body)| body.contains("connected to 2 of 3"))
                })
                .unwrap_or_else(|_| panic!("agent {a}: {:?}", agent.get("/readyz")));
            }
            let noticed = killed.elapsed();
            // Each agent looks for the third server a few times while it is down.
            let before = plane.attempts();
            wait_until(CONVERGE, || {
                plane
                    .attempts()
                    .iter()
                    .zip(&before)
                    .all(|(now, then)| *now >= then + 3.0)
            })
            .unwrap();

            plane.bring_up(0, SERVERS);
            let back = Instant::now();
            let mut seen: BTreeMap<String, Duration> = BTreeMap::new();
            wait_until(CONVERGE, || {
                for id in live_agents(plane.server(0)) {
                    seen.entry(id).or_insert_with(|| back.elapsed());
                }
                seen.len() == AGENTS
            })
            .unwrap_or_else(|_| panic!("back on s0: {seen:?}\n{}", plane.agent_logs()));

            for (i, client) in (1..SERVERS).zip(loops) {
                let seen = client.finish();
                assert!(!seen.successes.is_empty(), "s{i}: {seen:?}");
                assert!(
                    seen.failures.is_empty(),
                    "s{i}: {} of {} tunnels failed while s0 was down: {:?}",
                    seen.failures.len(),
                    seen.attempts,
                    seen.failures
                );
            }
            let times: Vec<Duration> = seen.values().copied().collect();
            let spread = *times.iter().max().unwrap() - *times.iter().min().unwrap();
            eprintln!(
                "agents noticed the kill within {noticed:?}; back on s0 after {times:?} (spread {spread:?})"
            );
            // Not in lockstep: the agents' attempts are jittered independently.
            assert!(spread > Duration::from_millis(5), "{times:?}");
        },
    );
}

#[test]
fn a_rolling_restart_fails_tunnels_only_on_the_server_being_restarted() {
    with_plane(
        "a_rolling_restart_fails_tunnels_only_on_the_server_being_restarted",
        |net| {
            let mut plane = Plane::start(net, SERVERS, SERVERS, &[]);
            for i in 0..SERVERS {
                plane.wait_all_agents(i);
            }
            let mut loops: Vec<Option<ClientLoop>> = (0..SERVERS)
                .map(|i| Some(ClientLoop::start(&plane, i)))
                .collect();
            let mut windows = Vec::new();
            for i in 0..SERVERS {
                let started = Instant::now();
                let mut old = plane.servers[i].take().unwrap();
                old.process.signal("TERM").unwrap();
                let status = old.process.wait_exit(Duration::from_secs(20)).unwrap();
                assert!(status.success(), "s{i} exited with {status}");
                plane.bring_up(i, SERVERS);
                plane.wait_all_agents(i);
                let window = (started, Instant::now());
                windows.push(window);
                // The loop through the restarted server goes on with the new process (same
                // address).
                eprintln!(
                    "s{i} restarted and held every agent after {:?}",
                    window.1 - started
                );
            }
            for (i, client) in loops.iter_mut().enumerate() {
                let seen = client.take().unwrap().finish();
                let (from, to) = windows[i];
                let outside: Vec<_> = seen
                    .failures
                    .iter()
                    .filter(|(at, _)| *at < from || *at > to)
                    .collect();
                assert!(
                    outside.is_empty(),
                    "s{i}: failures outside its own restart: {outside:?}"
                );
                assert!(
                    seen.successes.iter().any(|at| *at > to),
                    "s{i}: no tunnel after its restart: {seen:?}"
                );
                eprintln!(
                    "s{i}: {} of {} tunnels failed, all during its own restart, for {:?}",
                    seen.failures.len(),
                    seen.attempts,
                    seen.failing_for()
                );
            }
        },
    );
}

#[test]
fn agents_find_a_server_added_with_a_larger_count() {
    with_plane("agents_find_a_server_added_with_a_larger_count", |net| {
        // Two servers saying there are two; a third comes with a count of three. Agents that
        // probe forever find it on their own; the others learn the new count when a server
        // they hold is restarted with it.
        let mut plane = Plane::start(net, 2, 2, &[]);
        plane.wait_all_agents(0);
        plane.wait_all_agents(1);
        for agent in &plane.agents {
            let (_, body) = agent.get("/readyz").unwrap();
            assert!(body.contains("connected to 2 of 2"), "{body}");
        }
        plane.bring_up(2, 3);
        // Nobody looks for it yet: each agent holds as many servers as it was told.
        let (_, body) = plane.agents[0].get("/readyz").unwrap();
        assert!(body.contains("of 2"), "{body}");

        let mut old = plane.servers[0].take().unwrap();
        old.process.signal("TERM").unwrap();
        old.process.wait_exit(Duration::from_secs(20)).unwrap();
        plane.bring_up(0, 3);
        for i in 0..SERVERS {
            plane.wait_all_agents(i);
        }
        // A server registers an agent before the agent has its answer: the agent's own count
        // follows a moment later.
        for agent in &plane.agents {
            let mut body = String::new();
            let counted = wait_until(Duration::from_secs(10), || {
                body = agent.get("/readyz").map(|(_, b)| b).unwrap_or_default();
                body.contains("connected to 3 of 3")
            });
            assert!(counted.is_ok(), "{body}");
        }
    });
}

#[test]
fn agents_that_sync_forever_find_a_server_added_without_a_count_change() {
    with_plane(
        "agents_that_sync_forever_find_a_server_added_without_a_count_change",
        |net| {
            let plane = Plane::start(net, 2, 1, &["--sync-forever"]);
            plane.wait_all_agents(0);
            plane.wait_all_agents(1);
            let mut plane = plane;
            plane.bring_up(2, 1);
            plane.wait_all_agents(2);
            for agent in &plane.agents {
                let (_, body) = agent.get("/readyz").unwrap();
                assert!(body.contains("connected to 3 of 1"), "{body}");
            }
        },
    );
}

/// A server restart costs the agents no time: the only server is restarted (same id, same
/// ports) while an idle tunnel through it keeps the old process draining for its whole grace
/// period, as kube-apiserver's idle keep-alive tunnels do. The agent opens a session to the
/// address as soon as the old server announces its drain, reaches the new process, and the
/// old tunnel goes on to the end on the old session. Runs with ANP's default sync interval.
#[test]
fn restarting_the_only_server_costs_the_agent_well_under_a_second() {
    use std::io::{Read, Write};

    use bridgehead_e2e::client::{kube_connect, tls_connect, tls_connect_with};
    use bridgehead_e2e::target;

    let pki = Pki::new().unwrap();
    let options = |agent_port, frontend_port| ServerOptions {
        agent_port,
        frontend_port,
        args: ["--server-id", "cp-1", "--shutdown-grace-period", "30s"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let mut old = Server::start(&pki, options(None, None)).unwrap();
    let agent = Agent::start(
        &pki,
        &old,
        AgentOptions {
            args: ["--sync-interval", "1s", "--sync-interval-cap", "10s"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        },
    )
    .unwrap();
    old.wait_agents(1).unwrap();
    let echo = target::echo("127.0.0.1:0").unwrap();
    let frontend = old.frontend_addr();

    // The idle tunnel that keeps the old server draining.
    let mut idle = tls_connect(&pki, frontend).unwrap();
    assert_eq!(
        kube_connect(idle.as_mut(), &echo.to_string())
            .unwrap()
            .status,
        200
    );

    let tls = tls_config(&pki, Some(("client.crt", "client.key"))).unwrap();
    let echo_target = echo.to_string();
    let client = ClientLoop::run(move || {
        let mut conn = tls_connect_with(tls.clone(), frontend).map_err(|e| e.to_string())?;
        let reply = kube_connect(conn.as_mut(), &echo_target).map_err(|e| e.to_string())?;
        if reply.status != 200 {
            return Err(reply.head.lines().next().unwrap_or_default().to_string());
        }
        conn.write_all(b"ping").map_err(|e| e.to_string())?;
        let mut pong = [0u8; 4];
        conn.read_exact(&mut pong).map_err(|e| e.to_string())?;
        Ok(())
    });
    // Some tunnels through the old server first.
    wait_until(Duration::from_secs(10), || {
        old.metric("bridgehead_server_dials_total{result=\"ok\"}")
            .unwrap_or(0.0)
            >= 3.0
    })
    .unwrap_or(());

    let ports = (old.agent_addr.port(), frontend.port());
    let sigterm = Instant::now();
    old.process.signal("TERM").unwrap();
    // The old process stops listening at once, and drains (the idle tunnel holds it).
    wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(frontend).is_err()
    })
    .unwrap();
    let new = Server::start(&pki, options(Some(ports.0), Some(ports.1))).unwrap();
    let listening = Instant::now();
    new.wait_agents(1).unwrap();
    let back = Instant::now();
    // A few tunnels through the new server, then stop.
    wait_until(Duration::from_secs(10), || {
        new.metric("bridgehead_server_dials_total{result=\"ok\"}")
            .unwrap_or(0.0)
            >= 3.0
    })
    .unwrap();
    let seen = client.finish();

    assert!(
        seen.successes.first().is_some_and(|at| *at < sigterm)
            && seen.successes.last().is_some_and(|at| *at > back),
        "no tunnel on one side of the restart: {seen:?}\nagent:\n{}",
        agent.process.stderr()
    );
    // The outage as the client saw it: the longest time between two tunnels that worked.
    let gap = seen
        .successes
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "restart: old stopped listening and new started {:?} after SIGTERM; agent on the new server {:?} after it listened; client gap {gap:?} ({} of {} tunnels failed)",
        listening - sigterm,
        back - listening,
        seen.failures.len(),
        seen.attempts
    );
    // Without the drain-triggered search, the agent waits for the old server's whole grace
    // period (30 s here) before it looks again.
    assert!(
        back - listening < Duration::from_secs(5),
        "the agent took {:?} to reach the new server; agent log:\n{}",
        back - listening,
        agent.process.stderr()
    );
    // The old tunnel still works, on the old session of the draining server.
    idle.write_all(b"still here").unwrap();
    let mut answer = [0u8; 10];
    idle.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"still here");
    drop(idle);
    let closing = Instant::now();
    let status = old.process.wait_exit(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "{status}");
    eprintln!(
        "old server exited {:?} after its last tunnel closed",
        closing.elapsed()
    );
}
