//! A whole test cluster: a control plane, a bridgehead-server beside it (Unix socket or mTLS
//! frontend), and nodes — each a test host with its stand-in ([`NodeStandIn`]) and an agent
//! authenticated by certificate or by a ServiceAccount token bound to a pod on the node.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::node::NodeStandIn;
use super::{Binaries, ControlPlane, Egress};
use crate::netns::TestNet;
use crate::{Agent, AgentOptions, Pki, Server, ServerOptions};

/// Host 0 runs the control plane; nodes are hosts 1, 2, ...
pub const CONTROL_PLANE_HOST: usize = 0;

/// How the cluster's agents authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Client certificates from the Bridgehead PKI.
    Certificates,
    /// ServiceAccount tokens bound to a pod on the agent's node, no certificate; with `bind`,
    /// `--bind-agent-identifiers`.
    Tokens { bind: bool },
}

/// The agents' ServiceAccount, in kube-system as kubeadm's konnectivity setup has it.
pub const AGENT_NAMESPACE: &str = "kube-system";
pub const AGENT_ACCOUNT: &str = "bridgehead-agent";
pub const AUDIENCE: &str = "bridgehead";

/// A whole cluster: the control plane, a Bridgehead server beside it, and nodes with agents.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<NodeStandIn>,
    pub agents: Vec<Agent>,
    pub server: Server,
    pub control_plane: ControlPlane,
    pub pki: Pki,
    pub auth: Auth,
    /// Scratch: the server's socket, agents' token files.
    pub socket_dir: tempfile::TempDir,
    pub net: TestNet,
}

impl Cluster {
    /// `nodes` nodes and the server on a Unix socket.
    pub fn start(binaries: &Binaries, nodes: usize, auth: Auth) -> Cluster {
        Cluster::start_with(binaries, nodes, auth, &[])
    }

    /// [`Cluster::start`] with `server_args` for the server.
    pub fn start_with(
        binaries: &Binaries,
        nodes: usize,
        auth: Auth,
        server_args: &[&str],
    ) -> Cluster {
        Cluster::start_over(binaries, nodes, auth, server_args, false)
    }

    /// With `tcp`, kube-apiserver reaches the server's mTLS frontend (on the root side of the
    /// control plane host's link) instead of its Unix socket; the server then starts first, so
    /// that its port is known, and agents use certificates.
    pub fn start_over(
        binaries: &Binaries,
        nodes: usize,
        auth: Auth,
        server_args: &[&str],
        tcp: bool,
    ) -> Cluster {
        let mut net = TestNet::new(nodes + 1).unwrap();
        let pki = Pki::with_sans(&[net.server_v4().to_string()]).unwrap();
        let socket_dir = tempfile::tempdir().unwrap();
        let socket = socket_dir.path().join("bridgehead.sock");
        let mut args: Vec<String> = ["--proxy-strategies", "destHost,destCIDR"]
            .map(String::from)
            .into();
        args.extend(server_args.iter().map(|s| s.to_string()));
        let mut options = ServerOptions {
            uds: Some(socket.clone()),
            agent_bind: Some(net.server_v4().to_string()),
            without_cluster_ca: auth != Auth::Certificates,
            ..Default::default()
        };
        let (server, control_plane) = if tcp {
            assert_eq!(
                auth,
                Auth::Certificates,
                "token agents need the control plane first"
            );
            options.uds = None;
            options.bind = Some(net.server_v4().to_string());
            options.args = args;
            let server = Server::start(&pki, options).unwrap();
            let egress = Egress::Tcp {
                url: format!("https://{}", server.frontend_addr()),
                ca: pki.path("frontend-ca.crt"),
                cert: pki.path("client.crt"),
                key: pki.path("client.key"),
            };
            let control_plane =
                ControlPlane::start(binaries, &mut net, CONTROL_PLANE_HOST, egress, &[]).unwrap();
            (server, control_plane)
        } else {
            let egress = Egress::Uds(socket);
            let control_plane =
                ControlPlane::start(binaries, &mut net, CONTROL_PLANE_HOST, egress, &[]).unwrap();
            if let Auth::Tokens { bind } = auth {
                args.extend(token_flags(&control_plane, bind));
            }
            options.args = args;
            (Server::start(&pki, options).unwrap(), control_plane)
        };
        let mut cluster = Cluster {
            nodes: Vec::new(),
            agents: Vec::new(),
            server,
            control_plane,
            pki,
            auth,
            socket_dir,
            net,
        };
        for i in 1..=nodes {
            cluster.add_node(i);
        }
        cluster.server.wait_agents(nodes).unwrap();
        cluster
    }

    /// Node `node-<i>` on host `i`: its stand-in, its objects, its agent announcing its own
    /// name, address and pod network.
    pub fn add_node(&mut self, i: usize) {
        let name = format!("node-{i}");
        let stand_in = NodeStandIn::start(&self.control_plane, &self.net, i, &name).unwrap();
        stand_in.register(&self.control_plane).unwrap();
        let identifiers = format!(
            "host={name}&ipv4={}&cidr={}",
            stand_in.node_ip,
            stand_in.pod_cidr()
        );
        self.nodes.push(stand_in);
        let agent = self.start_agent(i, &name, &identifiers);
        self.agents.push(agent);
    }

    /// An agent on host `i` as node `node`, announcing `identifiers`, authenticated as the
    /// cluster's agents are (a token bound to a pod on `node`).
    pub fn start_agent(&self, i: usize, node: &str, identifiers: &str) -> Agent {
        let mut options = AgentOptions {
            id: Some(format!("agent-{i}")),
            identifiers: Some(identifiers.to_owned()),
            args: vec!["--server-name".into(), "127.0.0.1".into()],
            netns: Some(self.net.host(i).ns_name().to_owned()),
            server: Some(self.server.agent_addr),
            ..Default::default()
        };
        if let Auth::Tokens { .. } = self.auth {
            let token = self.agent_token(node);
            let path = self.socket_dir.path().join(format!("token-{i}"));
            std::fs::write(&path, token).unwrap();
            options.token = Some(path);
            options.certificate = Some(None);
        }
        Agent::start(&self.pki, &self.server, options).unwrap()
    }

    /// A token of the agents' ServiceAccount bound to its pod on `node` (made on first use).
    pub fn agent_token(&self, node: &str) -> String {
        let pod = format!("bridgehead-agent-{node}");
        self.control_plane
            .apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {AGENT_NAMESPACE}\nspec:\n  nodeName: {node}\n  serviceAccountName: {AGENT_ACCOUNT}\n  automountServiceAccountToken: false\n  containers:\n  - name: agent\n    image: bridgehead.invalid/agent\n"
            ))
            .unwrap();
        self.control_plane
            .token(AGENT_NAMESPACE, AGENT_ACCOUNT, AUDIENCE, 3600, Some(&pod))
            .unwrap()
    }

    /// `kubectl ARGS` as a child, its stdout piped (for commands that stream).
    pub fn kubectl_command(&self, args: &[&str]) -> std::process::Child {
        Command::new(&self.control_plane.binaries.kubectl)
            .arg(format!(
                "--kubeconfig={}",
                self.control_plane.kubeconfig.display()
            ))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.control_plane.kubectl_ok(args).unwrap_or_else(|error| {
            panic!("{error:#}\nserver log:\n{}", self.server.process.stderr())
        })
    }
}

/// The server's flags for token authentication of agents (and the agents' ServiceAccount).
pub fn token_flags(control_plane: &ControlPlane, bind: bool) -> Vec<String> {
    control_plane
        .apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {AGENT_ACCOUNT}\n  namespace: {AGENT_NAMESPACE}\n"
        ))
        .unwrap();
    let kubeconfig = server_identity(control_plane);
    let mut flags: Vec<String> = [
        "--agent-namespace",
        AGENT_NAMESPACE,
        "--agent-service-account",
        AGENT_ACCOUNT,
        "--authentication-audience",
        AUDIENCE,
        "--token-review-cache-ttl",
        "1s",
    ]
    .map(String::from)
    .into();
    flags.push(format!("--kubeconfig={}", kubeconfig.display()));
    if bind {
        flags.push("--bind-agent-identifiers".into());
    }
    flags
}

/// The server's own identity towards kube-apiserver, with the RBAC docs/kubernetes.md gives
/// it: `system:auth-delegator` (TokenReview) and reading Nodes (identity binding).
pub fn server_identity(control_plane: &ControlPlane) -> PathBuf {
    control_plane
        .apply(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: bridgehead-server:auth-delegator\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: system:auth-delegator\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: bridgehead-server\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: bridgehead-server:nodes\nrules:\n- apiGroups: [\"\"]\n  resources: [nodes]\n  verbs: [get]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: bridgehead-server:nodes\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: bridgehead-server:nodes\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: bridgehead-server\n",
        )
        .unwrap();
    control_plane
        .kubeconfig_for("bridgehead-server", &[])
        .unwrap()
}
