//! Several servers without a load balancer, as issue 42 asks for them: three servers on three
//! test hosts, found by agents and by each other through one DNS name (dnsmasq in a host of
//! its own), forwarding to each other; three kube-apiservers of one control plane, each with
//! its own server over a Unix socket, as an HA control plane runs them; three nodes (a kubelet
//! stand-in and an agent each). While `kubectl logs -f` runs through every kube-apiserver and a
//! CONNECT loop through every server to every node, the fleet grows from two servers to three
//! by DNS alone, then each server restarts in turn (SIGTERM, a new process on the same
//! address). No CONNECT gets a 503 or reaches the wrong node, no log stream loses or reorders
//! a line, and the only failures are those of a restarting server itself: connections to it
//! while it is down, and the log streams it carried (its kube-apiserver's, or one forwarded
//! to it), cut at the end of its grace period and started again.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bridgehead_e2e::client::{kube_connect, read_to_end, uds_connect, IO_TIMEOUT};
use bridgehead_e2e::dns::Resolver;
use bridgehead_e2e::kubernetes::node::{NodeStandIn, NAMESPACE};
use bridgehead_e2e::kubernetes::{self, Apiserver, ControlPlane, Egress};
use bridgehead_e2e::netns::TestNet;
use bridgehead_e2e::{Agent, AgentOptions, Peering, Pki, Server, ServerOptions};

const NAME: &str = "servers.bridgehead.test";
/// The agents' `--sync-interval` (their default).
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Test hosts: the servers', the nodes', the resolver's, the control plane's.
const SERVER_HOSTS: [usize; 3] = [0, 1, 2];
const NODE_HOSTS: [usize; 3] = [3, 4, 5];
const DNS_HOST: usize = 6;
const CONTROL_PLANE_HOST: usize = 7;

#[test]
fn servers_found_by_dns_scale_and_restart_in_turn_without_a_503() {
    let test = "servers_found_by_dns_scale_and_restart_in_turn_without_a_503";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    if !Resolver::available() {
        return bridgehead_e2e::skip::skip(test, "needs dnsmasq (Debian's dnsmasq-base)");
    }
    bridgehead_e2e::netns::with_net(test, 8, Duration::from_secs(420), move |mut net| {
        scale_and_restart(&binaries, &mut net);
    });
}

fn scale_and_restart(binaries: &kubernetes::Binaries, net: &mut TestNet) {
    net.route_between_hosts().unwrap();
    let dns_ip = net.host(DNS_HOST).v4();
    for host in 0..8 {
        net.set_hosts_and_resolver(host, &[], &dns_ip.to_string())
            .unwrap();
    }
    let server_ips: Vec<Ipv4Addr> = SERVER_HOSTS.iter().map(|&i| net.host(i).v4()).collect();
    let mut sans: Vec<String> = server_ips.iter().map(ToString::to_string).collect();
    sans.push(NAME.to_owned());
    let pki = Pki::with_sans(&sans).unwrap();
    let dns = Resolver::start(net, DNS_HOST, dns_ip, NAME, &server_ips[..2]).unwrap();
    dns.wait_answer(net, 0, &server_ips[..2]).unwrap();

    // Three kube-apiservers, each sending its `cluster` traffic to its own server's socket.
    let sockets = tempfile::tempdir().unwrap();
    let socket = |i: usize| sockets.path().join(format!("s{}.sock", i + 1));
    let control_plane = ControlPlane::start(
        binaries,
        net,
        CONTROL_PLANE_HOST,
        Egress::Uds(socket(0)),
        &[],
    )
    .unwrap();
    let more: Vec<Apiserver> = [1, 2]
        .iter()
        .map(|&i| {
            let port = kubernetes::control_plane::APISERVER_PORT + i as u16;
            control_plane
                .add_apiserver(&Egress::Uds(socket(i)), port)
                .unwrap()
        })
        .collect();
    let kubeconfigs: Vec<PathBuf> = std::iter::once(control_plane.kubeconfig.clone())
        .chain(more.iter().map(|a| a.kubeconfig.clone()))
        .collect();
    let stand_ins: Vec<NodeStandIn> = NODE_HOSTS
        .iter()
        .map(|&host| {
            let stand_in =
                NodeStandIn::start(&control_plane, net, host, &format!("node-{host}")).unwrap();
            stand_in.register(&control_plane).unwrap();
            stand_in
        })
        .collect();

    // The first server picks the ports; the others, each in its own namespace, take the same.
    let mut fleet = Fleet::new(net, &pki, &socket);
    fleet.start(0, Ports::default());
    let ports = fleet.ports(0);
    fleet.start(1, ports);
    let _agents: Vec<Agent> = NODE_HOSTS
        .iter()
        .map(|&host| {
            let ip = net.host(host).v4();
            let options = AgentOptions {
                id: Some(format!("node-{host}")),
                netns: Some(net.host(host).ns_name().to_owned()),
                health_bind: Some(ip.to_string()),
                identifiers: Some(format!("ipv4={ip}")),
                args: vec![format!("--proxy-server-host={NAME}")],
                ..Default::default()
            };
            Agent::start_at(&pki, fleet.agent_addr(0), options).unwrap()
        })
        .collect();
    for i in 0..2 {
        fleet.wait_agents(i, 3);
    }
    let targets: Vec<(SocketAddr, String)> = NODE_HOSTS
        .iter()
        .map(|&host| {
            let name = format!("node-{host}");
            let ip = net.host(host).v4();
            (net.who_am_i(host, &format!("{ip}:0"), &name).unwrap(), name)
        })
        .collect();

    let board = Arc::new(Board::default());
    for i in 0..2 {
        board.set(i, socket(i));
    }
    let looping = {
        let board = board.clone();
        std::thread::spawn(move || connect_loop(&board, &targets))
    };
    // `kubectl logs -f` through kube-apiserver i, of node i's pod: through server i.
    let follow = |i: usize| Follow::start(&control_plane, &kubeconfigs[i], &stand_ins[i].pod());
    let mut follows: Vec<Vec<Follow>> = vec![vec![follow(0)], vec![follow(1)], vec![]];
    board.wait_rounds(2);

    // A third server: in the loop as soon as it listens, while no agent can know of it (its
    // record is not there yet), so it forwards every CONNECT and its kube-apiserver's log
    // stream to its peers, found by the name.
    fleet.start(2, ports);
    board.set(2, socket(2));
    follows[2].push(follow(2));
    board.wait_rounds(2);
    follows[2][0].wait_lines(5);
    assert!(fleet.server(2).agents().unwrap().is_empty());
    let forwarded = fleet.forwarded(2);
    assert!(forwarded >= 3.0, "s3 forwarded {forwarded} tunnels");
    // Then its record: the agents find it by DNS alone, within their sync interval.
    let announced = Instant::now();
    dns.set(&server_ips).unwrap();
    fleet.wait_agents(2, 3);
    let found = announced.elapsed();
    eprintln!("a server added by DNS alone held every agent {found:?} after its record");
    assert!(found < SYNC_INTERVAL * 3, "found after {found:?}");
    board.wait_rounds(3);

    let mut windows = Vec::new();
    for i in 0..3 {
        let started = Instant::now();
        board.restarting(i, true);
        fleet.stop(i);
        fleet.start(i, ports);
        board.restarting(i, false);
        windows.push((i, started, Instant::now()));
        // The streams it carried were cut with it (its kube-apiserver's, and one forwarded
        // through it): `kubectl logs -f` again.
        for (k, runs) in follows.iter_mut().enumerate() {
            if runs.last().is_some_and(Follow::ended) {
                runs.push(follow(k));
            }
        }
        board.wait_rounds(3);
        for stream in &follows {
            stream.last().unwrap().wait_lines(5);
        }
    }
    board.stop();
    let outcomes = looping.join().unwrap();
    eprintln!("{} CONNECTs through the servers", outcomes.total);
    assert!(outcomes.total > 100, "only {} CONNECTs", outcomes.total);
    assert!(
        outcomes.refused.is_empty(),
        "CONNECTs that failed: {:#?}",
        outcomes.refused
    );
    for (i, runs) in follows.into_iter().enumerate() {
        check_follows(i, runs, &windows);
    }
    drop((fleet, dns));
}

/// Every `kubectl logs -f` run through kube-apiserver `i` got its lines in order, without a
/// gap, and ended only while a server restarted (or runs still): its own, or the peer its
/// server forwarded it to while the agent was still finding the new server (a tunnel is cut
/// with every server that carries it).
fn check_follows(i: usize, runs: Vec<Follow>, windows: &[(usize, Instant, Instant)]) {
    for (n, run) in runs.into_iter().enumerate() {
        let (lines, ended, stderr) = run.finish();
        assert!(
            !lines.is_empty(),
            "kubectl logs -f run {n} through s{} got nothing: {stderr}",
            i + 1
        );
        for (k, line) in lines.iter().enumerate() {
            assert!(
                line.starts_with(&format!("log line {k} from ")),
                "run {n} through s{}: line {k} is {line:?}",
                i + 1
            );
        }
        if let Some(ended) = ended {
            let during = windows
                .iter()
                .find(|&&(_, from, to)| ended >= from && ended <= to + Duration::from_secs(1));
            match during {
                Some((server, ..)) => eprintln!(
                    "kubectl logs -f run {n} through s{} ended while s{} restarted, after {} lines",
                    i + 1,
                    server + 1,
                    lines.len()
                ),
                None => panic!(
                    "kubectl logs -f run {n} through s{} ended while no server restarted: {stderr}",
                    i + 1
                ),
            }
        }
    }
}

/// A stream's lines so far and when it ended, and the signal of either.
type Seen = Arc<(Mutex<(Vec<String>, Option<Instant>)>, Condvar)>;

/// One `kubectl logs -f`: its lines as they come, and when it ended.
struct Follow {
    child: std::process::Child,
    seen: Seen,
    reader: std::thread::JoinHandle<()>,
}

impl Follow {
    fn start(control_plane: &ControlPlane, kubeconfig: &Path, pod: &str) -> Follow {
        let mut child =
            control_plane.kubectl_child(kubeconfig, &["logs", "-f", "-n", NAMESPACE, pod]);
        let stdout = child.stdout.take().unwrap();
        let seen: Seen = Arc::default();
        let reader = {
            let seen = seen.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    seen.0.lock().unwrap().0.push(line);
                    seen.1.notify_all();
                }
                seen.0.lock().unwrap().1 = Some(Instant::now());
                seen.1.notify_all();
            })
        };
        Follow {
            child,
            seen,
            reader,
        }
    }

    fn ended(&self) -> bool {
        self.seen.0.lock().unwrap().1.is_some()
    }

    /// Waits until `n` more lines came (or the stream ended, which the check reports).
    fn wait_lines(&self, n: usize) {
        let state = self.seen.0.lock().unwrap();
        let until = state.0.len() + n;
        let (state, waited) = self
            .seen
            .1
            .wait_timeout_while(state, IO_TIMEOUT, |s| s.0.len() < until && s.1.is_none())
            .unwrap();
        assert!(
            !waited.timed_out(),
            "kubectl logs -f stalled at {} lines",
            state.0.len()
        );
    }

    /// Stops it (when it still runs): its lines, when it had ended by itself, its stderr.
    fn finish(mut self) -> (Vec<String>, Option<Instant>, String) {
        let ended = self.seen.0.lock().unwrap().1;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.reader.join();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let lines = std::mem::take(&mut self.seen.0.lock().unwrap().0);
        (lines, ended, stderr)
    }
}

/// The ports every server of [`Fleet`] listens on (each in its own namespace); 0 picks one.
#[derive(Debug, Clone, Copy, Default)]
struct Ports {
    agent: u16,
    peer: u16,
}

/// Servers s1..s3, server `i` in test host `i` with its frontend on a Unix socket, all given
/// [`NAME`] for their peers.
struct Fleet<'a> {
    pki: &'a Pki,
    hosts: Vec<(String, Ipv4Addr, PathBuf)>,
    servers: Vec<Option<Server>>,
}

impl<'a> Fleet<'a> {
    fn new(net: &TestNet, pki: &'a Pki, socket: &dyn Fn(usize) -> PathBuf) -> Fleet<'a> {
        let hosts = SERVER_HOSTS
            .iter()
            .map(|&i| {
                (
                    net.host(i).ns_name().to_owned(),
                    net.host(i).v4(),
                    socket(i),
                )
            })
            .collect();
        Fleet {
            pki,
            hosts,
            servers: (0..3).map(|_| None).collect(),
        }
    }

    fn start(&mut self, i: usize, ports: Ports) {
        let (ns, ip, socket) = &self.hosts[i];
        let options = ServerOptions {
            netns: Some(ns.clone()),
            bind: Some(ip.to_string()),
            uds: Some(socket.clone()),
            agent_port: Some(ports.agent),
            args: vec![
                format!("--server-id=s{}", i + 1),
                "--proxy-strategies=destHost".into(),
                "--shutdown-grace-period=2s".into(),
            ],
            peering: Some(Peering {
                port: ports.peer,
                hosts: vec![NAME.to_owned()],
                bind: None,
            }),
            ..Default::default()
        };
        self.servers[i] = Some(Server::start(self.pki, options).unwrap());
    }

    fn server(&self, i: usize) -> &Server {
        self.servers[i].as_ref().expect("a running server")
    }

    fn ports(&self, i: usize) -> Ports {
        let server = self.server(i);
        Ports {
            agent: server.agent_addr.port(),
            peer: server.peer_addr.unwrap().port(),
        }
    }

    /// SIGTERM, and the exit.
    fn stop(&mut self, i: usize) {
        let mut server = self.servers[i].take().expect("a running server");
        server.process.signal("TERM").unwrap();
        server.process.wait_exit(IO_TIMEOUT).unwrap();
    }

    fn agent_addr(&self, i: usize) -> SocketAddr {
        self.server(i).agent_addr
    }

    fn wait_agents(&self, i: usize, n: usize) {
        self.server(i).wait_agents(n).unwrap();
    }

    /// Tunnels server `i` forwarded to its peers, all peers together.
    fn forwarded(&self, i: usize) -> f64 {
        self.server(i)
            .metric_sum("bridgehead_server_tunnels_forwarded_total")
            .unwrap()
    }
}

/// What the CONNECT loop goes through, and how far it got.
#[derive(Default)]
struct Board {
    state: Mutex<Round>,
    turned: Condvar,
}

#[derive(Default)]
struct Round {
    /// Each server's frontend socket, once started.
    frontends: [Option<PathBuf>; 3],
    /// Bumped when a server starts restarting and when it is back: odd while it restarts.
    epochs: [u64; 3],
    rounds: u64,
    stop: bool,
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.state.lock().unwrap()
    }

    fn set(&self, i: usize, frontend: PathBuf) {
        self.lock().frontends[i] = Some(frontend);
    }

    fn restarting(&self, i: usize, restarting: bool) {
        let mut round = self.lock();
        assert_eq!(round.epochs[i] % 2 == 1, !restarting);
        round.epochs[i] += 1;
    }

    fn epoch(&self, i: usize) -> u64 {
        self.lock().epochs[i]
    }

    /// Waits until the loop went through every server `n` more times.
    fn wait_rounds(&self, n: u64) {
        let round = self.lock();
        let until = round.rounds + n;
        let (round, waited) = self
            .turned
            .wait_timeout_while(round, IO_TIMEOUT * 6, |round| round.rounds < until)
            .unwrap();
        drop(round);
        assert!(!waited.timed_out(), "the CONNECT loop stalled");
    }

    fn stop(&self) {
        self.lock().stop = true;
    }
}

/// What the loop saw: how many CONNECTs, and each that failed where it must not have.
#[derive(Debug, Default)]
struct Outcomes {
    total: usize,
    refused: Vec<String>,
}

/// Until stopped: a CONNECT through every server's socket to every node, in turn. A failure
/// is excused only for a server that was restarting when it began or ended; a 503 or an
/// answer from the wrong node never is.
fn connect_loop(board: &Board, targets: &[(SocketAddr, String)]) -> Outcomes {
    let mut outcomes = Outcomes::default();
    loop {
        let (frontends, stop) = {
            let round = board.lock();
            (round.frontends.clone(), round.stop)
        };
        if stop {
            return outcomes;
        }
        for (i, frontend) in frontends.iter().enumerate() {
            let Some(frontend) = frontend else {
                continue;
            };
            for (target, name) in targets {
                let before = board.epoch(i);
                let answer = who_am_i(frontend, &target.to_string());
                let excused = before % 2 == 1 || board.epoch(i) != before;
                outcomes.total += 1;
                let problem = match answer {
                    Ok((200, text)) if text == *name => continue,
                    Ok((503, text)) => format!("503: {text}"),
                    Ok((200, text)) => format!("reached {text}"),
                    _ if excused => continue,
                    Ok((status, text)) => format!("{status}: {text}"),
                    Err(error) => format!("{error:#}"),
                };
                outcomes
                    .refused
                    .push(format!("s{} to {name}: {problem}", i + 1));
            }
        }
        board.lock().rounds += 1;
        board.turned.notify_all();
    }
}

/// A CONNECT through the Unix socket `frontend` to a who-am-i `target`: the status and the
/// target's answer (or the refusal's body).
fn who_am_i(frontend: &Path, target: &str) -> anyhow::Result<(u16, String)> {
    let mut conn = uds_connect(frontend)?;
    let reply = kube_connect(conn.as_mut(), target)?;
    let mut bytes = reply.extra;
    bytes.extend(read_to_end(conn.as_mut()).unwrap_or_default());
    Ok((
        reply.status,
        String::from_utf8_lossy(&bytes).trim().to_owned(),
    ))
}
