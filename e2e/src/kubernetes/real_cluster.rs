//! A real cluster, installed as docs/migrating.md and deploy/ tell an operator: a control plane
//! (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) whose `cluster` egress goes
//! to the Unix socket of deploy/server-static-pod's EgressSelectorConfiguration; a
//! control-plane node whose kubelet runs bridgehead-server from that static pod manifest,
//! rendered (`kubectl kustomize`, for deploy/image's image) into its
//! `/etc/kubernetes/manifests` (only its `image:` line pointed at the registry); worker nodes;
//! and the agents as deploy/agent's DaemonSet (`kubectl apply -k` of an overlay that sets only
//! `--proxy-server-host` and the image, as its kustomization says to). Each node is a
//! [`NodeHost`] running the release's image of the tree under test (`scripts/image.sh`),
//! pushed to a registry on the control plane's host ([`Registry`], CNCF Distribution over TLS)
//! and pulled from there by each node's containerd, as a user's nodes pull from theirs. Or,
//! for docs/install.md and the chart, the same cluster with nothing installed
//! ([`Install::Nothing`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::controllers::Controllers;
use super::images::Images;
use super::konnectivity::Mode;
use super::node_host::RegistryTrust;
use super::node_host::{Network, NodeHost, NodeOptions};
use super::{Binaries, ControlPlane, Egress};
use crate::image_registry::Registry;
use crate::netns::TestNet;

mod ha;
pub use ha::{
    control_plane_name, next_version, ControlPlaneNode, Endpoint, ReleaseImage,
    AGENT_ENDPOINT_PORT, ENDPOINT_PORT, PEER_PORT,
};

/// The control plane's test host in [`RealCluster::net`].
pub const CONTROL_PLANE_HOST: usize = 0;
/// The control-plane node's name.
pub const CONTROL_PLANE_NODE: &str = "control-plane";
/// Where deploy/server-static-pod's EgressSelectorConfiguration puts the server's socket.
const SOCKET: &str = "/etc/kubernetes/konnectivity-server/konnectivity-server.socket";
/// The repository of Bridgehead's image in the registry.
pub const REPOSITORY: &str = "bridgehead/bridgehead";
/// The image deploy/ names, which an operator points at their registry.
const DEPLOY_IMAGE: &str = "bridgehead";
/// How long the agents' DaemonSet may take to have a Ready pod on every node.
const ROLLOUT: Duration = Duration::from_secs(120);

/// Which proxy the cluster starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// Bridgehead from deploy/: the server's static pod and the agents' DaemonSet.
    Bridgehead,
    /// konnectivity as kubernetes.io sets it up ([`super::konnectivity`]), in this mode, on
    /// the same socket: where docs/migrating.md starts. deploy/rbac is applied too.
    Konnectivity(Mode),
    /// Nothing: kube-apiserver without an egress selector, no RBAC, server or agent; the
    /// control-plane node labelled and tainted, and its `/etc/kubernetes` holding what
    /// `kubeadm init` leaves there ([`kubeadm_files`]): where docs/install.md starts.
    Nothing,
}

/// The running cluster. Torn down on drop, nodes first.
#[derive(Debug)]
pub struct RealCluster {
    /// `worker-1`, `worker-2`, ...
    pub workers: Vec<NodeHost>,
    /// An HA cluster's control-plane nodes past the first ([`RealCluster::start_ha`]).
    pub others: Vec<ControlPlaneNode>,
    pub control_plane_node: NodeHost,
    pub controllers: Controllers,
    /// An HA cluster's load balancer, which every kubeconfig names; dropped after the nodes,
    /// which delete their Node through it.
    pub endpoint: Option<Endpoint>,
    pub control_plane: ControlPlane,
    /// Where the nodes pull Bridgehead's image from: on the control plane's host, which every
    /// node reaches.
    pub registry: Registry,
    /// The tag of Bridgehead's image (the workspace's version, as `scripts/image.sh` tags it).
    pub version: String,
    pub net: TestNet,
    /// The control-plane node's `/etc/kubernetes`.
    etc_kubernetes: tempfile::TempDir,
}

impl RealCluster {
    /// Starts the control plane, the control-plane node with the server's static pod, `workers`
    /// worker nodes and the agents' DaemonSet, and waits until an agent is Ready on every node.
    pub fn start(binaries: &Binaries, workers: u8) -> anyhow::Result<RealCluster> {
        RealCluster::start_with(binaries, workers, Install::Bridgehead)
    }

    /// [`RealCluster::start`] with `install` as its proxy.
    pub fn start_with(
        binaries: &Binaries,
        workers: u8,
        install: Install,
    ) -> anyhow::Result<RealCluster> {
        let images = match install {
            Install::Bridgehead | Install::Nothing => Images::get()?,
            Install::Konnectivity(_) => Images::with_konnectivity()?,
        };
        let mut net = TestNet::new(1)?;
        let etc_kubernetes = tempfile::Builder::new().prefix("bh-etc-k8s-").tempdir()?;
        let socket = etc_kubernetes
            .path()
            .join(SOCKET.trim_start_matches("/etc/kubernetes/"));
        // kube-apiserver reads the EgressSelectorConfiguration deploy/ ships, with the socket
        // where the control-plane node's /etc/kubernetes really is.
        let egress = std::fs::read_to_string(
            deploy().join("server-static-pod/egress-selector-configuration.yaml"),
        )?;
        if !egress.contains(SOCKET) {
            bail!(
                "deploy/server-static-pod's EgressSelectorConfiguration no longer names {SOCKET}"
            );
        }
        let control_plane = ControlPlane::start(
            binaries,
            &mut net,
            CONTROL_PLANE_HOST,
            match install {
                Install::Konnectivity(Mode::Grpc) => Egress::GrpcUds(socket),
                Install::Nothing => Egress::Direct,
                _ => Egress::Uds(socket),
            },
            &[],
        )?;
        let (registry, version, trust) = publish(
            &images,
            control_plane.address.into(),
            net.host(CONTROL_PLANE_HOST).ns_name(),
        )?;
        let controllers = Controllers::start(&control_plane, &net, CONTROL_PLANE_HOST)?;
        let manifest = match install {
            Install::Bridgehead => Some(pulled_from(
                &static_pod_manifest(&binaries.kubectl)?,
                &registry,
                &version,
            )?),
            Install::Konnectivity(mode) => Some(super::konnectivity::server_manifest(
                &images
                    .konnectivity
                    .as_ref()
                    .context("no konnectivity image")?
                    .name,
                mode,
            )),
            Install::Nothing => None,
        };
        match &manifest {
            Some(manifest) => {
                control_plane.kubectl_ok(&[
                    "apply",
                    "-k",
                    &deploy().join("rbac").to_string_lossy(),
                ])?;
                install_server_files(&control_plane, etc_kubernetes.path(), manifest)?;
            }
            None => kubeadm_files(&control_plane, etc_kubernetes.path())?,
        }
        let ns = net.host(CONTROL_PLANE_HOST).ns_name().to_owned();
        let control_plane_node = NodeHost::start(
            &control_plane,
            &images,
            NodeOptions {
                name: CONTROL_PLANE_NODE.into(),
                network: Network::ControlPlane {
                    ns: ns.clone(),
                    address: control_plane.address,
                    index: 0,
                },
                etc_kubernetes: Some(etc_kubernetes.path().to_owned()),
                registry: Some(trust.clone()),
                cluster_dns: None,
            },
        )?;
        let mut nodes = Vec::new();
        for index in 1..=workers {
            nodes.push(NodeHost::start(
                &control_plane,
                &images,
                NodeOptions {
                    name: format!("worker-{index}"),
                    network: Network::Worker {
                        ns: ns.clone(),
                        index,
                    },
                    etc_kubernetes: None,
                    registry: Some(trust.clone()),
                    cluster_dns: None,
                },
            )?);
        }
        let cluster = RealCluster {
            workers: nodes,
            others: Vec::new(),
            control_plane_node,
            controllers,
            endpoint: None,
            control_plane,
            registry,
            version,
            net,
            etc_kubernetes,
        };
        match install {
            Install::Bridgehead => cluster.install_agents(&[])?,
            Install::Nothing => {
                // As `kubeadm init` marks its node; the server's DaemonSet selects the label
                // and tolerates the taint.
                let cp = &cluster.control_plane;
                cp.kubectl_ok(&[
                    "label",
                    "node",
                    CONTROL_PLANE_NODE,
                    "node-role.kubernetes.io/control-plane=",
                ])?;
                cp.kubectl_ok(&[
                    "taint",
                    "node",
                    CONTROL_PLANE_NODE,
                    "node-role.kubernetes.io/control-plane:NoSchedule",
                ])?;
            }
            Install::Konnectivity(_) => {
                let image = &images
                    .konnectivity
                    .as_ref()
                    .context("no konnectivity image")?
                    .name;
                cluster
                    .control_plane
                    .apply(&super::konnectivity::agent_manifests(
                        image,
                        &cluster.control_plane.address.to_string(),
                    ))?;
                cluster.rollout("konnectivity-agent", ROLLOUT)?;
            }
        }
        Ok(cluster)
    }

    /// deploy/agent through an overlay that points `--proxy-server-host` at the control
    /// plane's address and the image at the registry (kustomize's `images:`, as
    /// docs/kubernetes.md tells an operator), and replaces each of `args` (`--flag=value`)
    /// that the DaemonSet already gives with that value; waits for the rollout.
    pub fn install_agents(&self, args: &[&str]) -> anyhow::Result<()> {
        self.install_agents_from("agent", args, "")
    }

    /// [`RealCluster::install_agents`] from deploy/`base` (deploy/agent or an overlay of it
    /// that keeps its arguments' places), adding `patch` (JSON patch operations of the
    /// DaemonSet, indented as an item of the overlay's patch list) after the overlay's own.
    pub fn install_agents_from(
        &self,
        base: &str,
        args: &[&str],
        patch: &str,
    ) -> anyhow::Result<()> {
        let overlay = tempfile::Builder::new()
            .prefix("bh-agent-overlay-")
            .tempdir()?;
        // kustomize takes a base only by a relative path.
        let agent = relative_to(overlay.path(), &deploy().join(base).canonicalize()?);
        let daemonset = std::fs::read_to_string(deploy().join("agent/daemonset.yaml"))?;
        let given: Vec<&str> = daemonset
            .lines()
            .filter_map(|line| line.trim().strip_prefix("- --"))
            .collect();
        let mut replaced = String::new();
        for arg in args {
            let flag = arg.trim_start_matches("--").split('=').next().unwrap_or("");
            let index = given
                .iter()
                .position(|given| given.split('=').next() == Some(flag))
                .with_context(|| format!("deploy/agent gives no --{flag}"))?;
            replaced.push_str(&format!(
                "    - op: replace\n      path: /spec/template/spec/containers/0/args/{index}\n      value: {arg}\n"
            ));
        }
        std::fs::write(
            overlay.path().join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {agent}\nimages:\n- name: {DEPLOY_IMAGE}\n  newName: {image}\n  newTag: \"{version}\"\npatches:\n- target:\n    kind: DaemonSet\n    name: bridgehead-agent\n  patch: |-\n    - op: test\n      path: /spec/template/spec/containers/0/args/1\n      value: --proxy-server-host=control-plane.example.internal\n    - op: replace\n      path: /spec/template/spec/containers/0/args/1\n      value: --proxy-server-host={address}\n{replaced}{patch}",
                agent = agent.display(),
                address = self.control_plane.address,
                image = self.registry.image(REPOSITORY),
                version = self.version,
            ),
        )?;
        self.control_plane
            .kubectl_ok(&["apply", "-k", &overlay.path().to_string_lossy()])?;
        self.rollout("bridgehead-agent", ROLLOUT)
    }

    /// Waits until DaemonSet `name` in kube-system has rolled out, at most `within`.
    /// `kubectl rollout status` in rounds shorter than the `--request-timeout` (30 s) every
    /// kubectl here runs with: one long call failed with nothing on stderr after about that
    /// long, while an old agent took its 40 s grace period to terminate.
    pub fn rollout(&self, name: &str, within: Duration) -> anyhow::Result<()> {
        self.rollout_of(&format!("daemonset/{name}"), within)
    }

    /// [`RealCluster::rollout`] of `resource` (`daemonset/NAME`, `deployment/NAME`) in
    /// kube-system.
    pub fn rollout_of(&self, resource: &str, within: Duration) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        loop {
            let rollout = self.control_plane.kubectl(&[
                "rollout",
                "status",
                "-n",
                "kube-system",
                resource,
                "--timeout=20s",
            ])?;
            if rollout.status.success() {
                return Ok(());
            }
            if started.elapsed() > within {
                bail!(
                    "{resource} did not roll out within {within:?}: {}{}\n{}",
                    String::from_utf8_lossy(&rollout.stdout),
                    String::from_utf8_lossy(&rollout.stderr),
                    self.describe_pods("kube-system")
                );
            }
        }
    }

    /// `kubectl get pods -o wide` and their events, for a failure's message.
    pub fn describe_pods(&self, namespace: &str) -> String {
        let pods = self
            .control_plane
            .kubectl(&["get", "pods", "-o", "wide", "-n", namespace])
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let events = self
            .control_plane
            .kubectl(&["get", "events", "-n", namespace])
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let mut logs = self.control_plane_node.container_logs();
        for other in &self.others {
            logs.push_str(&other.node.container_logs());
        }
        for worker in &self.workers {
            logs.push_str(&worker.container_logs());
        }
        format!("pods:\n{pods}\nevents:\n{events}\ncontainer logs:\n{logs}")
    }

    /// GETs `path` from the server's health port (8134 on the control-plane node, from
    /// deploy/server-static-pod) inside the control plane's namespace.
    pub fn server_health(&self, path: &str) -> anyhow::Result<String> {
        self.control_plane_get(8134, path)
    }

    /// GETs `path` from `127.0.0.1:port` inside the control plane's namespace (a static
    /// pod's health or admin port).
    pub fn control_plane_get(&self, port: u16, path: &str) -> anyhow::Result<String> {
        let out = self.net.run_in(
            CONTROL_PLANE_HOST,
            &[
                "curl",
                "-sS",
                "--max-time",
                "10",
                &format!("http://127.0.0.1:{port}{path}"),
            ],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `manifest` (deploy/'s static pod, or a revision of it) with its image pulled from the
    /// registry, as an operator edits the manifest for theirs.
    pub fn pulled_from_registry(&self, manifest: &str) -> anyhow::Result<String> {
        pulled_from(manifest, &self.registry, &self.version)
    }

    /// The control-plane node's `/etc/kubernetes`, seen from the test.
    pub fn etc_kubernetes(&self) -> &Path {
        self.etc_kubernetes.path()
    }
}

/// `manifest` with deploy/'s `image: bridgehead:<version>` replaced by the image in
/// `registry`; an error if the manifest names no such image.
/// Starts the registry on `address` in the namespace `ns` and pushes Bridgehead's image to it,
/// as a user's release pipeline does: the registry, the image's version (its tag) and what a
/// node needs to trust the registry.
fn publish(
    images: &Images,
    address: std::net::IpAddr,
    ns: &str,
) -> anyhow::Result<(Registry, String, RegistryTrust)> {
    let registry = Registry::start(address, Some(ns))?;
    let version = images
        .bridgehead
        .name
        .rsplit_once(':')
        .map(|(_, tag)| tag.to_owned())
        .context("Bridgehead's image has no tag")?;
    registry.push(&images.bridgehead.path, &format!("{REPOSITORY}:{version}"))?;
    let trust = RegistryTrust {
        host: registry.host.clone(),
        ca_pem: registry.ca_pem.clone(),
    };
    Ok((registry, version, trust))
}

fn pulled_from(manifest: &str, registry: &Registry, version: &str) -> anyhow::Result<String> {
    let deployed = format!("image: {DEPLOY_IMAGE}:{version}\n");
    if !manifest.contains(&deployed) {
        bail!("the manifest names no {deployed:?}");
    }
    let image = registry.image(&format!("{REPOSITORY}:{version}"));
    Ok(manifest.replace(&deployed, &format!("image: {image}\n")))
}

/// `target` as a path relative to the folder `from` (both absolute, `target` canonical).
fn relative_to(from: &Path, target: &Path) -> PathBuf {
    let mut relative = PathBuf::new();
    for _ in from.components().skip(1) {
        relative.push("..");
    }
    relative.join(target.strip_prefix("/").unwrap_or(target))
}

/// The workspace's deploy/.
pub fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// deploy/server-static-pod rendered by `kubectl` (`kubectl kustomize`: the image comes from
/// deploy/image), as docs/install.md has an operator write it into `/etc/kubernetes/manifests`.
pub fn static_pod_manifest(kubectl: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy().join("server-static-pod"))
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize deploy/server-static-pod: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// What `kubeadm init` leaves in a control-plane node's `/etc/kubernetes` that docs/install.md
/// uses: the cluster CA's pair and kube-apiserver's serving pair in `pki/` (keys 0600),
/// `admin.conf`, and in `manifests/` a `kube-apiserver.yaml` whose command is the running
/// kube-apiserver's (this kube-apiserver is a process of the test, not a static pod: kubelet
/// finds the manifest's image nowhere and leaves it be; the test runs what an edit of the
/// manifest asks for, [`ControlPlane::restart_apiserver_adding`]).
pub fn kubeadm_files(control_plane: &ControlPlane, etc: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for folder in ["pki", "manifests"] {
        std::fs::create_dir_all(etc.join(folder))?;
    }
    let cp = control_plane.dir();
    let ca = &control_plane.authority().ca;
    let pki = etc.join("pki");
    std::fs::write(pki.join("ca.crt"), &ca.cert_pem)?;
    std::fs::write(pki.join("ca.key"), &ca.key_pem)?;
    std::fs::copy(cp.join("apiserver.crt"), pki.join("apiserver.crt"))?;
    std::fs::copy(cp.join("apiserver.key"), pki.join("apiserver.key"))?;
    for key in ["ca.key", "apiserver.key"] {
        std::fs::set_permissions(pki.join(key), std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::copy(&control_plane.kubeconfig, etc.join("admin.conf"))?;
    std::fs::set_permissions(
        etc.join("admin.conf"),
        std::fs::Permissions::from_mode(0o600),
    )?;
    let mut manifest = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n  namespace: kube-system\n  labels:\n    component: kube-apiserver\n    tier: control-plane\nspec:\n  hostNetwork: true\n  priorityClassName: system-node-critical\n  containers:\n  - name: kube-apiserver\n    image: kube-apiserver.invalid/kube-apiserver:test\n    command:\n    - kube-apiserver\n",
    );
    for arg in control_plane.apiserver_args() {
        manifest.push_str(&format!("    - {}\n", serde_json::to_string(&arg)?));
    }
    manifest.push_str(
        "    volumeMounts:\n    - name: k8s-certs\n      mountPath: /etc/kubernetes/pki\n      readOnly: true\n  volumes:\n  - name: k8s-certs\n    hostPath:\n      path: /etc/kubernetes/pki\n      type: DirectoryOrCreate\n",
    );
    std::fs::write(etc.join("manifests/kube-apiserver.yaml"), manifest)?;
    Ok(())
}

/// What a kubeadm control-plane node holds for the server's static pod: the kube-apiserver's
/// serving pair in `pki/` (the server's agent endpoint uses it, so agents verify it with the
/// cluster CA of their ServiceAccount volume), `konnectivity-server.conf` (a kubeconfig for
/// `system:konnectivity-server`), and the manifest in `manifests/` (deploy/'s copied
/// unchanged, or konnectivity's). Keys are 0600 as kubeadm
/// writes them.
fn install_server_files(
    control_plane: &ControlPlane,
    etc: &Path,
    manifest: &str,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for folder in ["pki", "manifests", "konnectivity-server"] {
        std::fs::create_dir_all(etc.join(folder))?;
    }
    let cp = control_plane.dir();
    std::fs::copy(cp.join("apiserver.crt"), etc.join("pki/apiserver.crt"))?;
    std::fs::copy(cp.join("apiserver.key"), etc.join("pki/apiserver.key"))?;
    std::fs::set_permissions(
        etc.join("pki/apiserver.key"),
        std::fs::Permissions::from_mode(0o600),
    )?;
    let pair = control_plane
        .authority()
        .client("system:konnectivity-server", &[], &[])?;
    let ca = std::fs::read(&control_plane.ca)?;
    let conf = etc.join("konnectivity-server.conf");
    std::fs::write(
        &conf,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: system:konnectivity-server\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: konnectivity-server\n  context:\n    cluster: kubernetes\n    user: system:konnectivity-server\ncurrent-context: konnectivity-server\n",
            url = control_plane.url,
            ca = base64(&ca),
            cert = base64(pair.cert_pem.as_bytes()),
            key = base64(pair.key_pem.as_bytes()),
        ),
    )?;
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600))?;
    std::fs::write(etc.join("manifests/konnectivity-server.yaml"), manifest)
        .context("writing the server's static pod manifest")?;
    Ok(())
}

fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The sum of every sample of `name` in Prometheus text whose labels contain each of
/// `labels` (`result="ok"`); 0 when there is none.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let matches = (rest.is_empty() || rest.starts_with('{'))
                && labels.iter().all(|label| rest.contains(label));
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        // A fold from +0: an empty f64 sum is -0, which prints as "-0".
        .fold(0.0, |sum, value| sum + value)
}

/// How long a pod of the tests may take to become Ready.
pub const POD_READY: Duration = Duration::from_secs(120);
