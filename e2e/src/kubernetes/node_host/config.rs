//! What a node host's containerd, CNI plugins and kubelet read: their configuration files and
//! the node's kubeconfig.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::Context;

use super::super::images::Archive;
use super::super::ControlPlane;

/// Where the node's containerd looks for each registry's `hosts.toml` (`<HOST:PORT>/`), as
/// containerd's documentation sets it up on a node.
pub(super) const CERTS_D: &str = "/etc/containerd/certs.d";

/// containerd's configuration: everything under `dir`, the CRI on overlayfs with runc, the
/// pause image as the sandbox, Debian's CNI plugins, registries as [`CERTS_D`] describes them.
/// `restrict_oom_score_adj`: the test machines lack CAP_SYS_RESOURCE, so runc cannot lower a
/// container's oom_score_adj below its own.
pub(super) fn containerd_config(dir: &Path, socket: &Path, pause: &Archive) -> String {
    let dir = dir.display();
    format!(
        r#"version = 2
root = "{dir}/containerd/root"
state = "{dir}/containerd/state"
[grpc]
  address = "{socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{dir}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{CERTS_D}"
"#,
        socket = socket.display(),
        pause = pause.name,
    )
}

/// A registry a node pulls from, and the CA its certificate is checked against.
#[derive(Debug, Clone)]
pub struct RegistryTrust {
    /// `HOST:PORT`, as image names give it.
    pub host: String,
    /// The CA, PEM.
    pub ca_pem: String,
}

/// `hosts.toml` for `registry`, in `<CERTS_D>/<HOST:PORT>/` beside its `ca.crt`: pulls and
/// resolves over HTTPS, the server's certificate checked against that CA (docs/kubernetes.md
/// shows users the same file).
pub(super) fn hosts_toml(registry: &RegistryTrust) -> String {
    let host = &registry.host;
    format!(
        r#"server = "https://{host}"

[host."https://{host}"]
  capabilities = ["pull", "resolve"]
  ca = "{CERTS_D}/{host}/ca.crt"
"#
    )
}

/// A bridge for the node's pods on `pod_cidr`, the bridge the gateway, masquerading what the
/// pods send off the node (the control plane has no route back to a pod), and host ports.
pub(super) fn cni_config(pod_cidr: &str) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "bridgehead-test", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{pod_cidr}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
]}}
"#
    )
}

/// kubelet's configuration for a test node: serving only on the node's address, to clients
/// with a certificate from the cluster CA (kube-apiserver's) whom kube-apiserver authorizes
/// (webhook), as kubeadm sets a kubelet up; cgroup v1 through cgroupfs under its own root
/// (with per-QoS cgroups: without them kubelet gives the runtime no parent and containerd puts
/// every node's containers under one shared `/k8s.io`), without node allocatable enforcement;
/// no swap check, no kernel-default check, no host resolv.conf; eviction and image garbage
/// collection that never remove the imported images from a shared disk.
pub(super) fn kubelet_config(
    dir: &Path,
    ca: &Path,
    socket: &Path,
    node_ip: Ipv4Addr,
    cgroup_root: &str,
    static_pods: bool,
    cluster_dns: Option<Ipv4Addr>,
) -> String {
    let dir = dir.display();
    let static_pods = if static_pods {
        "staticPodPath: /etc/kubernetes/manifests\nfileCheckFrequency: 1s\n"
    } else {
        ""
    };
    let cluster_dns = match cluster_dns {
        Some(address) => format!("clusterDNS:\n- {address}\nclusterDomain: cluster.local\n"),
        None => String::new(),
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
resolvConf: ""
podLogsDir: {dir}/pod-logs
volumePluginDir: {dir}/volume-plugins
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
{static_pods}{cluster_dns}"#,
        socket = socket.display(),
        ca = ca.display(),
    )
}

/// The node's kubeconfig (`kubeconfig` in `dir`): `system:node:<name>` in `system:nodes`, a
/// client certificate from the control plane's CA, as the Node authorizer expects.
pub(super) fn write_node_kubeconfig(
    control_plane: &ControlPlane,
    name: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let pair =
        control_plane
            .authority()
            .client(&format!("system:node:{name}"), &["system:nodes"], &[])?;
    write(&dir.join("node.crt"), &pair.cert_pem)?;
    write(&dir.join("node.key"), &pair.key_pem)?;
    write(
        &dir.join("kubeconfig"),
        &super::super::control_plane::kubeconfig_text(
            &control_plane.url,
            &control_plane.ca,
            &dir.join("node.crt"),
            &dir.join("node.key"),
        ),
    )
}

pub(super) fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
