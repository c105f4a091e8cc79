//! The server count from Leases, against a real kube-apiserver: servers run
//! `--enable-lease-controller` (each holds a Lease, renews it, deletes other servers' expired
//! ones, deletes its own on shutdown), agents `--count-server-leases`. The servers announce
//! `--server-count 1` on purpose: an agent that found more than one server found them by the
//! Leases.
//!
//! kube-apiserver and etcd run on a test host (a network namespace); the servers listen on the
//! root side of the test net's links (addresses of this test alone), behind haproxy on
//! loopback; the agents run beside them, given haproxy's address and a kubeconfig whose user
//! may only list and watch Leases. Needs root, `scripts/k8s-build.sh` and haproxy; skipped
//! loudly otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use bridgehead_e2e::haproxy::{self, Haproxy};
use bridgehead_e2e::kubernetes::{self, ControlPlane, Egress};
use bridgehead_e2e::netns::{self, TestNet};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::skip::skip;
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

const TEST_TIMEOUT: Duration = Duration::from_secs(240);
const SERVERS: usize = 3;
const AGENTS: usize = 2;
/// The servers' `--lease-duration`: short, so that an expiry is seen within the test.
const LEASE_DURATION: Duration = Duration::from_secs(4);
/// How long agents may take to follow a change of the count.
const CONVERGE: Duration = Duration::from_secs(30);
const NAMESPACE: &str = "kube-system";

/// RBAC as docs/ha.md gives it: the servers manage Leases, the agents list and watch them.
const RBAC: &str = "\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'bridgehead-server:leases', namespace: kube-system}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'bridgehead-server:leases', namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'bridgehead-server:leases'}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bridgehead-server}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: 'bridgehead-agent:leases', namespace: kube-system}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: 'bridgehead-agent:leases', namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: 'bridgehead-agent:leases'}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bridgehead-agent}
";

struct Plane {
    net: TestNet,
    pki: Pki,
    control_plane: ControlPlane,
    server_kubeconfig: std::path::PathBuf,
    /// The agent port, the same on every server's own address.
    agent_port: u16,
    servers: Vec<Option<Server>>,
    agents: Vec<Agent>,
    /// Up once the servers' port is known.
    lb: Option<Haproxy>,
}

impl Plane {
    fn start(mut net: TestNet, binaries: &kubernetes::Binaries) -> Plane {
        let control_plane = ControlPlane::start(binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
        control_plane.apply(RBAC).unwrap();
        let server_kubeconfig = control_plane
            .kubeconfig_for("bridgehead-server", &[])
            .unwrap();
        let agent_kubeconfig = control_plane
            .kubeconfig_for("bridgehead-agent", &[])
            .unwrap();
        let sans: Vec<String> = (0..SERVERS).map(|i| net.root_v4(i).to_string()).collect();
        let pki = Pki::with_sans(&sans).unwrap();
        let mut plane = Plane {
            net,
            pki,
            control_plane,
            server_kubeconfig,
            agent_port: 0,
            servers: (0..SERVERS).map(|_| None).collect(),
            agents: Vec::new(),
            lb: None,
        };
        // The first server picks the port; the others take the same port on their own
        // addresses (nobody else can bind it while the first holds it on any address).
        let first = plane.start_server(0);
        plane.agent_port = first.agent_addr.port();
        plane.servers[0] = Some(first);
        plane.bring_up(1);
        let backends: Vec<SocketAddr> = (0..SERVERS)
            .map(|i| SocketAddr::new(plane.net.root_v4(i).into(), plane.agent_port))
            .collect();
        let lb = Haproxy::start([127, 0, 0, 1].into(), &backends).unwrap();
        for a in 0..AGENTS {
            let agent = Agent::start_at(
                &plane.pki,
                lb.addr,
                AgentOptions {
                    id: Some(format!("agent-{a}")),
                    args: [
                        "--server-name",
                        "127.0.0.1",
                        "--count-server-leases",
                        "--lease-namespace",
                        NAMESPACE,
                        "--kubeconfig",
                        &agent_kubeconfig.display().to_string(),
                        "--keepalive-time",
                        "1s",
                    ]
                    .map(String::from)
                    .to_vec(),
                    ..Default::default()
                },
            )
            .unwrap();
            plane.agents.push(agent);
        }
        plane.lb = Some(lb);
        plane
    }

    fn start_server(&self, i: usize) -> Server {
        let address = self.net.root_v4(i).to_string();
        Server::start(
            &self.pki,
            ServerOptions {
                bind: Some(address),
                agent_port: Some(self.agent_port),
                args: [
                    "--server-id",
                    &format!("s{i}"),
                    "--server-count",
                    "1",
                    "--enable-lease-controller",
                    "--lease-duration",
                    &format!("{}s", LEASE_DURATION.as_secs()),
                    "--kubeconfig",
                    &self.server_kubeconfig.display().to_string(),
                    "--keepalive-time",
                    "1s",
                    "--shutdown-grace-period",
                    "2s",
                ]
                .map(String::from)
                .to_vec(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn bring_up(&mut self, i: usize) {
        let server = self.start_server(i);
        self.servers[i] = Some(server);
    }

    fn server(&self, i: usize) -> &Server {
        self.servers[i].as_ref().expect("server is up")
    }

    /// The server Leases kube-apiserver holds, by name.
    fn leases(&self) -> Vec<String> {
        let out = self
            .control_plane
            .kubectl_ok(&[
                "get",
                "leases",
                "-n",
                NAMESPACE,
                "-l",
                "k8s-app=konnectivity-server",
                "-o",
                "name",
            ])
            .unwrap();
        let mut names: Vec<String> = out
            .lines()
            .filter_map(|l| l.trim().rsplit('/').next().map(str::to_owned))
            .filter(|l| !l.is_empty())
            .collect();
        names.sort();
        names
    }

    /// Each agent's `bridgehead_agent_known_servers`.
    fn known(&self) -> Vec<u64> {
        self.agents
            .iter()
            .map(|agent| {
                metric(
                    &agent.get("/metrics").unwrap().1,
                    "bridgehead_agent_known_servers",
                )
            })
            .collect()
    }

    /// Waits until every agent looks for `n` servers and every server in `up` lists every
    /// agent.
    fn converge(&self, n: u64, up: &[usize]) {
        let done = || {
            self.known().iter().all(|&k| k == n)
                && up.iter().all(|&i| live_agents(self.server(i)) == AGENTS)
        };
        wait_until(CONVERGE, done).unwrap_or_else(|_| {
            panic!(
                "agents know {:?} servers, want {n}; Leases {:?}; servers {up:?} list {:?}\nagent log:\n{}\nserver logs:\n{}",
                self.known(),
                self.leases(),
                up.iter().map(|&i| live_agents(self.server(i))).collect::<Vec<_>>(),
                self.agents[0].process.stderr(),
                self.servers.iter().flatten().map(|s| s.process.stderr()).collect::<Vec<_>>().join("\n----\n"),
            )
        });
    }
}

/// A counter or gauge's value in a Prometheus text page (0 when absent).
fn metric(page: &str, series: &str) -> u64 {
    bridgehead_e2e::client::metric_in(page, series).map_or(0, |v| v as u64)
}

/// Agents `/agents` lists as not draining.
fn live_agents(server: &Server) -> usize {
    server
        .agents()
        .unwrap_or_default()
        .iter()
        .filter(|a| a["draining"] == false)
        .count()
}

#[test]
fn agents_follow_the_server_leases_through_scale_up_shutdown_crash_and_an_api_outage() {
    let test = "agents_follow_the_server_leases_through_scale_up_shutdown_crash_and_an_api_outage";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    if !haproxy::available() {
        return skip(test, "needs haproxy (apt-get install haproxy)");
    }
    netns::with_net(test, SERVERS, TEST_TIMEOUT, move |net| {
        let mut plane = Plane::start(net, &binaries);

        // Two servers, each announcing a count of 1: the agents hold both by the Leases.
        plane.converge(2, &[0, 1]);
        assert_eq!(
            plane.leases(),
            ["bridgehead-server-s0", "bridgehead-server-s1"]
        );
        let renewals = metric(
            &plane.server(0).get("/metrics").unwrap().1,
            "bridgehead_server_lease_renewals_total{result=\"ok\"}",
        );
        assert!(renewals >= 1, "renewals {renewals}");

        // Scale up: the third server's Lease appears and the agents find it.
        plane.bring_up(2);
        plane.converge(3, &[0, 1, 2]);

        // A clean shutdown deletes the server's own Lease at once: right after the exit it is
        // gone, while it would still be valid for most of its duration.
        let mut stopped = plane.servers[2].take().unwrap();
        stopped.process.signal("TERM").unwrap();
        stopped.process.wait_exit(Duration::from_secs(20)).unwrap();
        assert!(
            stopped
                .process
                .stderr()
                .contains("deleted this server's Lease"),
            "{}",
            stopped.process.stderr()
        );
        assert_eq!(
            plane.leases(),
            ["bridgehead-server-s0", "bridgehead-server-s1"]
        );
        plane.converge(2, &[0, 1]);

        // A crash leaves the Lease behind: the agents count it until it expires, then the
        // other servers delete it.
        plane.bring_up(2);
        plane.converge(3, &[0, 1, 2]);
        plane.servers[2].take().unwrap().process.kill();
        plane.converge(2, &[0, 1]);
        wait_until(CONVERGE, || {
            plane.leases() == ["bridgehead-server-s0", "bridgehead-server-s1"]
        })
        .unwrap_or_else(|_| panic!("Leases {:?}", plane.leases()));
        let removed: u64 = (0..2)
            .map(|i| {
                metric(
                    &plane.server(i).get("/metrics").unwrap().1,
                    "bridgehead_server_leases_removed_total",
                )
            })
            .sum();
        assert_eq!(removed, 1, "the expired Lease is deleted once");

        // kube-apiserver gone: the agents keep their last count and their sessions, the
        // servers keep serving and say that renewing fails.
        plane.control_plane.kill_apiserver();
        for agent in &plane.agents {
            agent
                .process
                .wait_log("watching server Leases failed", CONVERGE)
                .unwrap();
        }
        plane
            .server(0)
            .process
            .wait_log("renewing the Lease failed", CONVERGE)
            .unwrap();
        assert_eq!(plane.known(), [2, 2]);
        assert_eq!(live_agents(plane.server(0)), AGENTS);
        assert_eq!(live_agents(plane.server(1)), AGENTS);
        for agent in &plane.agents {
            let (status, body) = agent.get("/readyz").unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
}

/// Servers that forward find each other by their Leases (`--enable-lease-controller`,
/// `--peer-advertise-address`, no `--peer-host`): each writes where its peers reach it on its
/// Lease, and dials what the others' say. An agent on one server is reached through the other.
/// A server whose Lease goes (a clean shutdown) is no longer dialed.
#[test]
fn servers_find_their_peers_by_their_leases() {
    let test = "servers_find_their_peers_by_their_leases";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 2, TEST_TIMEOUT, move |mut net| {
        let control_plane = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
        control_plane.apply(RBAC).unwrap();
        let kubeconfig = control_plane
            .kubeconfig_for("bridgehead-server", &[])
            .unwrap();
        let addresses: Vec<String> = (0..2).map(|i| net.root_v4(i).to_string()).collect();
        let pki = Pki::with_sans(&addresses).unwrap();
        let server = |i: usize| {
            let kubeconfig = kubeconfig.display().to_string();
            Server::start(
                &pki,
                ServerOptions {
                    bind: Some(addresses[i].clone()),
                    args: vec![
                        format!("--server-id=s{i}"),
                        "--enable-lease-controller".into(),
                        format!("--lease-duration={}s", LEASE_DURATION.as_secs()),
                        format!("--kubeconfig={kubeconfig}"),
                        // The port bound is added: a free one, picked at the start.
                        format!("--peer-advertise-address={}", addresses[i]),
                        "--shutdown-grace-period=2s".into(),
                    ],
                    peering: Some(bridgehead_e2e::Peering::default()),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let s0 = server(0);
        let s1 = server(1);
        let _agent = Agent::start(&pki, &s1, AgentOptions::default()).unwrap();
        s1.wait_agents(1).unwrap();
        let knows = |server: &Server, peers: u64, agents: u64| {
            let page = server
                .get("/metrics")
                .map(|(_, page)| page)
                .unwrap_or_default();
            metric(&page, "bridgehead_server_peers_connected") == peers
                && metric(&page, "bridgehead_server_peer_agents") == agents
        };
        wait_until(CONVERGE, || knows(&s0, 1, 1) && knows(&s1, 1, 0)).unwrap_or_else(|_| {
            panic!(
                "the servers never found each other; s0:\n{}",
                s0.process.stderr()
            )
        });
        let annotation = control_plane
            .kubectl_ok(&[
                "get",
                "lease",
                "-n",
                NAMESPACE,
                "bridgehead-server-s1",
                "-o",
                "jsonpath={.metadata.annotations.bridgehead\\.io/peer-address}",
            ])
            .unwrap();
        assert_eq!(annotation.trim(), s1.peer_addr.unwrap().to_string());

        let echo = bridgehead_e2e::target::echo("127.0.0.1:0").unwrap();
        let mut conn = bridgehead_e2e::client::tls_connect(&pki, s0.frontend_addr()).unwrap();
        let reply = bridgehead_e2e::client::kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
        assert_eq!(reply.status, 200, "{}", reply.head);
        let forwarded = "bridgehead_server_tunnels_forwarded_total{server=\"s1\"}";
        assert_eq!(metric(&s0.get("/metrics").unwrap().1, forwarded), 1);
        // A shutdown waits for the tunnels the server carries, forwarded ones too.
        drop(conn);

        // s1 shuts down cleanly: its Lease goes, and s0 stops dialing it.
        let mut s1 = s1;
        s1.process.signal("TERM").unwrap();
        s1.process.wait_exit(CONVERGE).unwrap();
        wait_until(CONVERGE, || knows(&s0, 0, 0)).unwrap();
        let leases = control_plane
            .kubectl_ok(&["get", "leases", "-n", NAMESPACE, "-o", "name"])
            .unwrap();
        assert!(!leases.contains("bridgehead-server-s1"), "{leases}");
        drop(s0);
        drop(control_plane);
    });
}
