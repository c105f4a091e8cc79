//! konnectivity's command lines, run unchanged but for the binary name: the flags of the
//! deployments operators run (kubeadm's "Set up Konnectivity service" task page, ANP's own
//! example manifests as its repository has them, and GCE's configure-helper manifests, k0s,
//! HyperShift and Kubermatic as those projects publish them, reconstructed here without
//! network access to check them line by line), with
//! paths adapted to the test's PKI and files, every port 0 and every listener on loopback (a
//! test binds no fixed port and no other address), `--mode=grpc` turned into
//! `--mode=http-connect` (the one change the migration asks for, with the
//! EgressSelectorConfiguration's `proxyProtocol`). Each pair must start, connect, and carry a
//! tunnel; flags Bridgehead accepts but does not apply must say so in a startup line.
//!
//! Token-authenticated lines need a real kube-apiserver for their TokenReviews; it runs on a
//! test host. Needs root and `scripts/k8s-build.sh`; skipped loudly otherwise.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bridgehead_e2e::client::{echo_round_trip, kube_connect, tls_connect, uds_connect};
use bridgehead_e2e::kubernetes::cluster::server_identity;
use bridgehead_e2e::kubernetes::{self, ControlPlane, Egress};
use bridgehead_e2e::netns;
use bridgehead_e2e::{target, Agent, Pki, Server};

const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// The ServiceAccount and audience the konnectivity manifests use.
const AGENT_ACCOUNT: &str = "konnectivity-agent";
const AUDIENCE: &str = "system:konnectivity-server";

/// One deployment's command lines. `{name}` placeholders are the test's files and ports.
struct Deployment {
    name: &'static str,
    server: &'static [&'static str],
    agent: &'static [&'static str],
    /// Startup lines the server's log must hold (flags accepted and ignored).
    server_says: &'static [&'static str],
    agent_says: &'static [&'static str],
}

/// Listeners on loopback, ephemeral ports: the test's adaptation of every line.
const SERVER_LISTENERS: [&str; 4] = [
    "--agent-bind-address=127.0.0.1",
    "--health-bind-address=127.0.0.1",
    "--admin-bind-address=127.0.0.1",
    "--server-bind-address=127.0.0.1",
];
const AGENT_LISTENERS: [&str; 4] = [
    "--health-server-port=0",
    "--admin-server-port=0",
    "--health-bind-address=127.0.0.1",
    "--admin-bind-address=127.0.0.1",
];

const DEPLOYMENTS: [Deployment; 6] = [
    Deployment {
        name: "kubeadm (kubernetes.io: Set up Konnectivity service)",
        server: &[
            "--logtostderr=true",
            "--uds-name={uds}",
            "--delete-existing-uds-file",
            "--cluster-cert={cluster_cert}",
            "--cluster-key={cluster_key}",
            "--mode=http-connect",
            "--server-port=0",
            "--agent-port=0",
            "--admin-port=0",
            "--health-port=0",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--kubeconfig={kubeconfig}",
            "--authentication-audience=system:konnectivity-server",
        ],
        agent: &[
            "--logtostderr=true",
            "--ca-cert={cluster_ca}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--admin-server-port=0",
            "--health-server-port=0",
            "--service-account-token-path={token}",
        ],
        server_says: &[],
        agent_says: &[],
    },
    Deployment {
        name: "ANP examples/kubernetes (log file, keepalive 1h)",
        server: &[
            "--log-file={log_file}",
            "--logtostderr=false",
            "--log-file-max-size=0",
            "--uds-name={uds}",
            "--cluster-cert={cluster_cert}",
            "--cluster-key={cluster_key}",
            "--server-port=0",
            "--agent-port=0",
            "--health-port=0",
            "--admin-port=0",
            "--keepalive-time=1h",
            "--mode=http-connect",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--kubeconfig={kubeconfig}",
            "--authentication-audience=system:konnectivity-server",
        ],
        agent: &[
            "--logtostderr=true",
            "--ca-cert={cluster_ca}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--service-account-token-path={token}",
        ],
        server_says: &[],
        agent_says: &[],
    },
    Deployment {
        name: "GCE configure-helper (QPS, frontend keepalive, sync forever)",
        server: &[
            "--logtostderr=true",
            "--log-file-max-size=0",
            "--uds-name={uds}",
            "--delete-existing-uds-file",
            "--cluster-cert={cluster_cert}",
            "--cluster-key={cluster_key}",
            "--server-port=0",
            "--agent-port=0",
            "--health-port=0",
            "--admin-port=0",
            "--kubeconfig-qps=75",
            "--kubeconfig-burst=150",
            "--keepalive-time=60s",
            "--frontend-keepalive-time=60s",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--kubeconfig={kubeconfig}",
            "--authentication-audience=system:konnectivity-server",
            "--mode=http-connect",
            "--v=2",
        ],
        agent: &[
            "--logtostderr=true",
            "--ca-cert={cluster_ca}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--health-server-port=0",
            "--admin-server-port=0",
            "--service-account-token-path={token}",
            "--agent-identifiers=ipv4=127.0.0.1",
            "--sync-forever",
            "--probe-interval=5s",
            "--sync-interval=5s",
            "--sync-interval-cap=30s",
            "--v=2",
        ],
        server_says: &[],
        agent_says: &["--probe-interval is accepted and ignored"],
    },
    Deployment {
        name: "k0s (stderrthreshold, -v=1, profiling off)",
        server: &[
            "--uds-name={uds}",
            "--cluster-cert={cluster_cert}",
            "--cluster-key={cluster_key}",
            "--kubeconfig={kubeconfig}",
            "--mode=http-connect",
            "--server-port=0",
            "--agent-port=0",
            "--admin-port=0",
            "--health-port=0",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--authentication-audience=system:konnectivity-server",
            "--logtostderr=true",
            "--stderrthreshold=1",
            "-v=1",
            "--enable-profiling=false",
            "--server-count=1",
        ],
        agent: &[
            "--logtostderr=true",
            "--stderrthreshold=1",
            "-v=1",
            "--ca-cert={cluster_ca}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--admin-server-port=0",
            "--health-server-port=0",
            "--service-account-token-path={token}",
            "--agent-identifiers=host=127.0.0.1",
        ],
        server_says: &["--enable-profiling is accepted and ignored"],
        agent_says: &[],
    },
    Deployment {
        name: "HyperShift (mTLS frontend and agents, cipher suites, default route)",
        server: &[
            "--logtostderr=true",
            "--log-file-max-size=0",
            "--cluster-cert={cluster_cert}",
            "--cluster-key={cluster_key}",
            "--cluster-ca-cert={cluster_ca}",
            "--server-cert={server_cert}",
            "--server-key={server_key}",
            "--server-ca-cert={frontend_ca}",
            "--server-port=0",
            "--agent-port=0",
            "--health-port=0",
            "--admin-port=0",
            "--mode=http-connect",
            "--proxy-strategies=destHost,defaultRoute",
            "--keepalive-time=30s",
            "--frontend-keepalive-time=30s",
            "--server-count=1",
            "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            "--tls-min-version=VersionTLS12",
        ],
        agent: &[
            "--logtostderr=true",
            "--ca-cert={cluster_ca}",
            "--agent-cert={agent_cert}",
            "--agent-key={agent_key}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--health-server-port=0",
            "--agent-identifiers=default-route=true",
            "--keepalive-time=30s",
            "--probe-interval=5s",
            "--sync-interval=5s",
            "--sync-interval-cap=30s",
            "--v=3",
        ],
        server_says: &[],
        agent_says: &[],
    },
    Deployment {
        name: "Kubermatic (-v=3, xfr channels, repeated flag)",
        server: &[
            "--logtostderr=true",
            "-v=3",
            "--cluster-key={cluster_key}",
            "--cluster-cert={cluster_cert}",
            "--uds-name={uds}",
            "--delete-existing-uds-file",
            "--server-port=0",
            "--agent-port=0",
            "--health-port=0",
            "--admin-port=0",
            "--agent-namespace=kube-system",
            "--agent-service-account=konnectivity-agent",
            "--kubeconfig={kubeconfig}",
            "--authentication-audience=system:konnectivity-server",
            "--proxy-strategies=destHost,default",
            "--keepalive-time=1m",
            "--server-count=1",
            "--xfr-channel-size=10",
            "--keepalive-time=30s",
        ],
        agent: &[
            "--logtostderr=true",
            "-v=3",
            "--sync-forever",
            "--ca-cert={cluster_ca}",
            "--proxy-server-host=127.0.0.1",
            "--proxy-server-port={agent_port}",
            "--admin-server-port=0",
            "--health-server-port=0",
            "--agent-identifiers=host=node-1",
            "--keepalive-time=1m",
            "--service-account-token-path={token}",
            "--xfr-channel-size=150",
        ],
        server_says: &["--xfr-channel-size is accepted and ignored"],
        agent_says: &["--xfr-channel-size is accepted and ignored"],
    },
];

/// The test's files, by placeholder name.
struct Files {
    pki: Pki,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Files {
    fn fill(&self, line: &[&str], agent_port: u16) -> Vec<String> {
        let dir = self.dir.path();
        let pairs: [(&str, PathBuf); 11] = [
            ("{uds}", dir.join("konnectivity-server.socket")),
            ("{cluster_cert}", self.pki.path("cluster.crt")),
            ("{cluster_key}", self.pki.path("cluster.key")),
            ("{cluster_ca}", self.pki.path("cluster-ca.crt")),
            ("{server_cert}", self.pki.path("server.crt")),
            ("{server_key}", self.pki.path("server.key")),
            ("{frontend_ca}", self.pki.path("frontend-ca.crt")),
            ("{agent_cert}", self.pki.path("agent.crt")),
            ("{agent_key}", self.pki.path("agent.key")),
            ("{kubeconfig}", self.kubeconfig.clone()),
            ("{token}", dir.join("token")),
        ];
        line.iter()
            .map(|arg| {
                let mut arg = arg.replace("{agent_port}", &agent_port.to_string());
                arg = arg.replace("{log_file}", &path_text(&dir.join("server.log")));
                for (name, path) in &pairs {
                    arg = arg.replace(name, &path_text(path));
                }
                arg
            })
            .collect()
    }
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn konnectivity_command_lines_start_both_binaries_and_tunnel() {
    let test = "konnectivity_command_lines_start_both_binaries_and_tunnel";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, TEST_TIMEOUT, move |mut net| {
        let control_plane = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
        control_plane
            .apply(&format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {AGENT_ACCOUNT}\n  namespace: kube-system\n"
            ))
            .unwrap();
        let files = Files {
            pki: Pki::new().unwrap(),
            dir: tempfile::tempdir().unwrap(),
            kubeconfig: server_identity(&control_plane),
        };
        let token = control_plane
            .token("kube-system", AGENT_ACCOUNT, AUDIENCE, 3600, None)
            .unwrap();
        std::fs::write(files.dir.path().join("token"), token).unwrap();
        let echo = target::echo("127.0.0.1:0").unwrap();

        for deployment in &DEPLOYMENTS {
            let mut server_args = files.fill(deployment.server, 0);
            server_args.extend(SERVER_LISTENERS.map(String::from));
            let server = Server::start_with_args(&server_args)
                .unwrap_or_else(|e| panic!("{}: server: {e:#}", deployment.name));
            let mut agent_args = files.fill(deployment.agent, server.agent_addr.port());
            agent_args.extend(AGENT_LISTENERS.map(String::from));
            let agent = Agent::start_with_args(&agent_args)
                .unwrap_or_else(|e| panic!("{}: agent: {e:#}", deployment.name));
            server.wait_agents(1).unwrap_or_else(|e| {
                panic!(
                    "{}: {e:#}\nagent log:\n{}",
                    deployment.name,
                    agent.process.stderr()
                )
            });

            let mut conn = match server.frontend.strip_prefix("unix:") {
                Some(path) => uds_connect(Path::new(path)).unwrap(),
                None => tls_connect(&files.pki, server.frontend_addr()).unwrap(),
            };
            let reply = kube_connect(&mut *conn, &echo.to_string()).unwrap();
            assert_eq!(reply.status, 200, "{}: {reply:?}", deployment.name);
            echo_round_trip(&mut *conn, deployment.name.as_bytes());
            drop(conn);

            let server_log = server_text(&server, &files, deployment);
            for line in deployment.server_says {
                assert!(
                    server_log.contains(line),
                    "{}: {line}\n{server_log}",
                    deployment.name
                );
            }
            for line in deployment.agent_says {
                let log = agent.process.stderr();
                assert!(log.contains(line), "{}: {line}\n{log}", deployment.name);
            }
        }
    });
}

/// The server's log: its log file when the line asked for one (then stderr holds nothing
/// below error), else stderr.
fn server_text(server: &Server, files: &Files, deployment: &Deployment) -> String {
    let stderr = server.process.stderr();
    if !deployment.server.contains(&"--logtostderr=false") {
        return stderr;
    }
    let text = std::fs::read_to_string(files.dir.path().join("server.log")).unwrap();
    assert!(text.contains("starting"), "{}: {text}", deployment.name);
    assert!(
        !stderr.contains(" INFO "),
        "{}: info lines went to stderr too:\n{stderr}",
        deployment.name
    );
    text
}
