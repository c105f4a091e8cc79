//! A real Kubernetes control plane for the tests: etcd and kube-apiserver built from their Go
//! modules (`scripts/k8s-build.sh` puts them in `target/k8s/bin`), started inside a test host's
//! network namespace with a PKI made at test time, kube-apiserver's egress selector pointing
//! its `cluster` traffic at a Bridgehead server; and node stand-ins (a kubelet, pods, a
//! webhook, an aggregated API server) inside the nodes' namespaces.
//!
//! - [`Binaries`]: the built binaries, or a loud skip ([`require`]) where they or root are
//!   missing.
//! - [`control_plane`]: [`ControlPlane`], the running etcd + kube-apiserver and kubectl.
//! - [`node`]: [`node::NodeStandIn`], what kube-apiserver reaches on a node.
//! - [`cluster`]: all of it together, with a bridgehead-server and agents.
//! - [`fleet`]: a simulated fleet's Nodes, Pods and pod-bound tokens, made concurrently.
//! - [`node_host`]: [`node_host::NodeHost`], a real node (containerd and kubelet) on a test
//!   host; [`controllers`]: kube-scheduler and kube-controller-manager beside kube-apiserver;
//!   [`images`]: the images a real node imports; [`workload`]: the test pods behind a Service
//!   (proxy subresources, a webhook, an aggregated API). [`require_nodes`] skips loudly without them.
//!
//! Everything runs in namespaces the test created, on their own addresses; kube-apiserver's
//! resolver is the namespace's loopback, where nothing answers, so no query leaves the test.

pub mod addons;
pub mod agent_shapes;
pub mod carried;
pub mod cluster;
pub mod control_plane;
pub mod controllers;
pub mod drill;
pub mod fleet;
pub mod images;
pub mod konnectivity;
pub mod manifests;
pub mod node;
pub mod node_host;
pub mod real_cluster;
pub mod upstream;
pub mod workload;

use std::path::PathBuf;

pub use control_plane::{Apiserver, ControlPlane, Egress};

/// The Kubernetes binaries `scripts/k8s-build.sh` builds.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
    pub kubelet: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
    /// kube-apiserver's own egress dialer as a command (`e2e/go/k8s/kubeclient`).
    pub kubeclient: PathBuf,
}

impl Binaries {
    /// `target/k8s/bin` beside this executable's target directory, if every binary is there.
    pub fn find() -> Option<Binaries> {
        let bin = crate::process::bin_dir().parent()?.join("k8s/bin");
        let binaries = Binaries {
            kube_apiserver: bin.join("kube-apiserver"),
            kubectl: bin.join("kubectl"),
            etcd: bin.join("etcd"),
            kubelet: bin.join("kubelet"),
            kube_scheduler: bin.join("kube-scheduler"),
            kube_controller_manager: bin.join("kube-controller-manager"),
            kubeclient: bin.join("kubeclient"),
        };
        [
            &binaries.kube_apiserver,
            &binaries.kubectl,
            &binaries.etcd,
            &binaries.kubelet,
            &binaries.kube_scheduler,
            &binaries.kube_controller_manager,
            &binaries.kubeclient,
        ]
        .iter()
        .all(|path| path.exists())
        .then_some(binaries)
    }
}

/// The binaries, when this machine can run a control plane (root for the namespaces, and the
/// binaries built); otherwise skips `test` loudly and returns `None`.
pub fn require(test: &str) -> Option<Binaries> {
    if !crate::skip::require_root(test) {
        return None;
    }
    let found = Binaries::find();
    if found.is_none() {
        crate::skip::skip(
            test,
            "kube-apiserver, etcd and kubectl not built: run scripts/k8s-build.sh (needs Go)",
        );
    }
    found
}

/// What an HA cluster test needs ([`real_cluster::RealCluster::start_ha`]): the nodes'
/// tools and haproxy in front of the control plane; `None` (skipped loudly) without them.
pub fn require_ha(test: &str) -> Option<Binaries> {
    let binaries = require_nodes(test)?;
    if !crate::haproxy::available() {
        crate::skip::skip(test, "needs haproxy (apt-get install haproxy)");
        return None;
    }
    Some(binaries)
}

/// What a real node needs (see [`node_host`]): root, the binaries, the node runtime from
/// the system's packages (`scripts/install-test-deps.sh`), and the registry its image comes
/// from ([`crate::image_registry::missing`]) and what builds that image, the release's
/// ([`crate::release::missing_for`]); otherwise skips `test` loudly and returns `None`.
pub fn require_nodes(test: &str) -> Option<Binaries> {
    let binaries = require(test)?;
    let missing: Vec<String> = [
        "containerd",
        "ctr",
        "runc",
        "unshare",
        "nsenter",
        "iptables",
        "/usr/lib/cni/bridge",
        "/bin/busybox",
        "go",
        "curl",
        "script",
    ]
    .into_iter()
    .filter(|tool| !on_path(tool))
    .chain(crate::image_registry::missing())
    .map(str::to_owned)
    // Bridgehead's image is the release's, linux/amd64 (scripts/image.sh).
    .chain(crate::release::missing_for(&["linux/amd64"]))
    .collect();
    if !missing.is_empty() {
        crate::skip::skip(
            test,
            &format!(
                "real nodes need {}: scripts/install-test-deps.sh (as root) installs the system's packages",
                missing.join(", ")
            ),
        );
        return None;
    }
    Some(binaries)
}

/// Whether `tool` (a command, or an absolute path) exists.
pub(crate) fn on_path(tool: &str) -> bool {
    if tool.starts_with('/') {
        return std::path::Path::new(tool).exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}
