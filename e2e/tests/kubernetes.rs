//! kube-apiserver's own traffic through Bridgehead: a real control plane (etcd and
//! kube-apiserver from their Go modules) whose EgressSelectorConfiguration sends `cluster`
//! traffic to a bridgehead-server, and agents on node test hosts where a kubelet stand-in, a
//! pod, an admission webhook and an aggregated API server run. Each test uses kubectl as a user
//! would. Needs root (network namespaces) and `scripts/k8s-build.sh`; skipped loudly otherwise.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::node::{self, NodeStandIn, NAMESPACE, POD_PORT};
use bridgehead_e2e::kubernetes::{self, Binaries, ControlPlane, Egress};
use bridgehead_e2e::netns::TestNet;
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{Agent, AgentOptions, Pki, Server, ServerOptions};

/// Host 0 runs the control plane; nodes are hosts 1, 2, ...
const CONTROL_PLANE_HOST: usize = 0;

/// A whole cluster: the control plane, a Bridgehead server beside it, and nodes with agents.
struct Cluster {
    nodes: Vec<NodeStandIn>,
    agents: Vec<Agent>,
    server: Server,
    control_plane: ControlPlane,
    pki: Pki,
    _socket_dir: tempfile::TempDir,
    net: TestNet,
}

impl Cluster {
    /// `nodes` nodes, the server on a Unix socket, agents authenticated by certificate.
    fn start(binaries: &Binaries, nodes: usize) -> Cluster {
        let mut net = TestNet::new(nodes + 1).unwrap();
        let pki = Pki::new().unwrap();
        let socket_dir = tempfile::tempdir().unwrap();
        let socket = socket_dir.path().join("bridgehead.sock");
        let server = Server::start(
            &pki,
            ServerOptions {
                uds: Some(socket.clone()),
                args: ["--proxy-strategies", "destHost,destCIDR"]
                    .map(String::from)
                    .into(),
                agent_bind: Some(net.server_v4().to_string()),
                ..Default::default()
            },
        )
        .unwrap();
        let control_plane = ControlPlane::start(
            binaries,
            &mut net,
            CONTROL_PLANE_HOST,
            Egress::Uds(socket),
            &[],
        )
        .unwrap();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            agents: Vec::new(),
            server,
            control_plane,
            pki,
            _socket_dir: socket_dir,
            net,
        };
        for i in 1..=nodes {
            cluster.add_node(i);
        }
        cluster.server.wait_agents(nodes).unwrap();
        cluster
    }

    /// Node `node-<i>` on host `i`: its stand-in, its objects, its agent.
    fn add_node(&mut self, i: usize) {
        let name = format!("node-{i}");
        let stand_in = NodeStandIn::start(&self.control_plane, &self.net, i, &name).unwrap();
        stand_in.register(&self.control_plane).unwrap();
        let identifiers = format!(
            "host={name}&ipv4={}&cidr={}",
            stand_in.node_ip,
            stand_in.pod_cidr()
        );
        let agent = Agent::start(
            &self.pki,
            &self.server,
            AgentOptions {
                id: Some(name),
                identifiers: Some(identifiers),
                args: vec!["--server-name".into(), "127.0.0.1".into()],
                netns: Some(self.net.host(i).ns_name().to_owned()),
                server: Some(self.server.agent_addr),
                ..Default::default()
            },
        )
        .unwrap();
        self.nodes.push(stand_in);
        self.agents.push(agent);
    }

    /// `kubectl ARGS` as a child, its stdout piped (for commands that stream).
    fn kubectl_command(&self, args: &[&str]) -> std::process::Child {
        Command::new(&self.control_plane.binaries.kubectl)
            .arg(format!(
                "--kubeconfig={}",
                self.control_plane.kubeconfig.display()
            ))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.control_plane.kubectl_ok(args).unwrap_or_else(|error| {
            panic!("{error:#}\nserver log:\n{}", self.server.process.stderr())
        })
    }
}

#[test]
fn kube_apiservers_traffic_reaches_every_kind_of_backend_through_bridgehead() {
    let Some(binaries) = kubernetes::require(
        "kube_apiservers_traffic_reaches_every_kind_of_backend_through_bridgehead",
    ) else {
        return;
    };
    let cluster = Cluster::start(&binaries, 2);
    for stand_in in &cluster.nodes {
        let name = &stand_in.name;
        // Node proxy: to the kubelet on the node's InternalIP:10250.
        let answer = cluster.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{name}/proxy/healthz"),
        ]);
        assert_eq!(answer.trim(), format!("kubelet {name}: /healthz"));
        // kubectl logs: the kubelet's containerLogs.
        let logs = cluster.kubectl(&["logs", "-n", NAMESPACE, &stand_in.pod()]);
        assert_eq!(logs.lines().count(), 3, "{logs}");
        assert!(logs.contains(&format!("log line 2 from {name}")), "{logs}");
        // Pod proxy, to the pod IP (routed by the node's pod CIDR).
        let pod = cluster.kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{NAMESPACE}/pods/{}:{POD_PORT}/proxy/hello",
                stand_in.pod()
            ),
        ]);
        assert_eq!(pod.trim(), format!("pod {name}: /hello"));
        // Service proxy, through the Service's endpoints.
        let service = cluster.kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{NAMESPACE}/services/{}:main/proxy/hello",
                node::web_service(name)
            ),
        ]);
        assert_eq!(service.trim(), format!("pod {name}: /hello"));
    }
    // kubectl logs -f: lines arrive while it runs, as the kubelet writes them.
    let stand_in = &cluster.nodes[0];
    let mut follow = cluster.kubectl_command(&["logs", "-f", "-n", NAMESPACE, &stand_in.pod()]);
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let mut arrivals = Vec::new();
    for expected in 0..20 {
        let line = lines.next().expect("kubectl logs -f ended").unwrap();
        assert_eq!(line, format!("log line {expected} from {}", stand_in.name));
        arrivals.push(started.elapsed());
    }
    let _ = follow.kill();
    let _ = follow.wait();
    // The kubelet writes one line every 100 ms: twenty lines cannot come in one burst.
    assert!(
        arrivals[19] - arrivals[0] >= Duration::from_millis(1500),
        "lines were not streamed: {arrivals:?}"
    );
}

#[test]
fn admission_webhooks_and_aggregated_apis_are_reached_through_bridgehead() {
    let Some(binaries) = kubernetes::require(
        "admission_webhooks_and_aggregated_apis_are_reached_through_bridgehead",
    ) else {
        return;
    };
    let cluster = Cluster::start(&binaries, 2);
    let (webhook_node, api_node) = (&cluster.nodes[0], &cluster.nodes[1]);
    let cp = &cluster.control_plane;
    cp.apply(&webhook_node.webhook_yaml(cp).unwrap()).unwrap();
    // kube-apiserver picks the configuration up shortly after it is stored.
    let denial = format!("denied by the webhook on {}", webhook_node.name);
    wait_until(Duration::from_secs(30), || {
        let output = cp
            .kubectl(&["create", "configmap", "denied-probe", "-n", NAMESPACE])
            .unwrap();
        String::from_utf8_lossy(&output.stderr).contains(&denial)
    })
    .unwrap_or_else(|_| {
        panic!(
            "the webhook never answered; server log:\n{}",
            cluster.server.process.stderr()
        )
    });
    cluster.kubectl(&["create", "configmap", "allowed", "-n", NAMESPACE]);

    cp.apply(&api_node.api_service_yaml(cp).unwrap()).unwrap();
    // The availability check (discovery through the tunnel) marks it Available.
    wait_until(Duration::from_secs(60), || {
        cp.kubectl_ok(&[
            "get",
            "apiservice",
            &format!("v1.{}", node::API_GROUP),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])
        .is_ok_and(|status| status.trim() == "True")
    })
    .unwrap_or_else(|_| {
        panic!(
            "the APIService never became Available: {}",
            cluster.kubectl(&[
                "get",
                "apiservice",
                &format!("v1.{}", node::API_GROUP),
                "-o",
                "yaml"
            ])
        )
    });
    let greetings = cluster.kubectl(&[
        "get",
        "--raw",
        &format!("/apis/{}/v1/greetings", node::API_GROUP),
    ]);
    assert!(
        greetings.contains(&format!("hello-from-{}", api_node.name)),
        "{greetings}"
    );
}
