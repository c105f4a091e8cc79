//! A real Kubernetes node on a test host: containerd (CRI, overlayfs, runc) and kubelet built
//! from the pinned module, inside namespaces of their own, registered with the test control
//! plane under a `system:node:<name>` client certificate from its CA.
//!
//! The host is a process tree made with `unshare` (mount, PID, UTS, IPC and, for a worker, net
//! namespaces), entered with `nsenter` rather than `ip netns exec` (which remounts /sys and
//! hides the cgroup hierarchies). Inside it:
//! - tmpfs over /run, /var/lib and /var/log (kubelet, containerd's shims and the CNI plugins
//!   write there whatever their flags say), an overlay over /etc whose changes land in the
//!   test's folder, and the test's folder for `/etc/kubernetes`;
//! - files bind-mounted over the sysctls kubelet sets (`vm.overcommit_memory`, `kernel.panic`,
//!   ...), so the machine keeps its own values;
//! - a worker's link: a veth to the control plane's namespace, the node's address
//!   ([`NodeHost::node_ip`], where kubelet serves) on its loopback and its pods on a bridge
//!   (`10.244.<index>.0/24`, masqueraded on the way out), routed to every other node host
//!   through the control plane's namespace (host-gw style: any agent reaches any pod), whose
//!   own processes are refused the workers' pods and have no route to a kubelet, so
//!   kube-apiserver reaches the node only through Bridgehead; a TCP connection to where a host
//!   has no route is refused at once (a reset), on every host; the `kubernetes` Service's
//!   ClusterIP translated to kube-apiserver's address, as kube-proxy would;
//! - containerd with its own root, state and socket in the test's folder, pulling Bridgehead's
//!   image from the test's registry as a user's node pulls from theirs (`config_path`, and
//!   `/etc/containerd/certs.d/<HOST:PORT>/hosts.toml` naming its CA, in the host's `/etc`);
//!   the test-only images (pause, busybox, testserver, konnectivity: [`super::images`])
//!   imported, as no registry serves them; kubelet on cgroupfs (cgroup v1 is what these
//!   machines have) under a cgroup root of its own.
//!
//! Dropped, it stops kubelet, deletes its Node, kills the host's first process (the kernel then
//! kills every process of its PID namespace: containerd, shims, containers), so its mounts and
//! network namespace go with it, and removes the cgroups made under its root. A test process
//! killed with SIGKILL leaves those cgroups behind (`/sys/fs/cgroup/*/bh<pid>c<k>`, empty).
//!
//! Parts: `host` (the namespaces and running commands in them), `network` (the link, and
//! refusing what has no route), `config` (containerd's, CNI's and kubelet's files),
//! `cgroups` (the cgroup root, made and removed).

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

mod cgroups;
mod config;
mod host;
mod network;

use cgroups::Cgroups;
pub use config::RegistryTrust;
use config::{
    cni_config, containerd_config, hosts_toml, kubelet_config, write, write_node_kubeconfig,
    CERTS_D,
};
use host::{kill_inner, Host};
use network::{kubernetes_service, link, refuse_elsewhere};

use super::images::Images;
use super::ControlPlane;
use crate::process::{wait_until, Process};

/// How long containerd may take to answer on its socket.
const CONTAINERD_STARTUP: Duration = Duration::from_secs(30);
/// How long kubelet may take from start to a Ready Node.
const NODE_READY: Duration = Duration::from_secs(120);
/// How long the kernel may take to end the host's processes once its first one is killed.
const TEARDOWN: Duration = Duration::from_secs(20);

/// Numbers links and cgroup roots uniquely within this process.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The sysctls kubelet writes (`setupKernelTunables`): each gets a file of the host's own,
/// holding the machine's value, mounted over it.
const SYSCTLS: [&str; 6] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// How a node host is networked.
#[derive(Debug, Clone)]
pub enum Network {
    /// Its own network namespace, linked by a veth to the control plane's namespace (named
    /// `ns`); `index` (1 to 250, one per node of a cluster) picks its addresses.
    Worker { ns: String, index: u8 },
    /// A control plane's own network namespace (named `ns`), as on a control-plane node:
    /// its pods on `hostNetwork` (the static pods) sit beside kube-apiserver, which serves on
    /// `address` (the Node's address too). `index` (0 for the first control-plane node, 1 to 5
    /// for the others of an HA control plane) picks its pod network.
    ControlPlane {
        ns: String,
        address: Ipv4Addr,
        index: u8,
    },
}

/// What a node host runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The Node's name (and the host's host name).
    pub name: String,
    pub network: Network,
    /// A folder to serve as `/etc/kubernetes` inside the host (static pod manifests in
    /// `manifests/`, which kubelet then runs); a fresh empty one when `None`.
    pub etc_kubernetes: Option<PathBuf>,
    /// The registry its containerd pulls from (Bridgehead's image), trusted in its `certs.d`.
    pub registry: Option<RegistryTrust>,
    /// The cluster DNS kubelet gives pods (`clusterDNS`, with `clusterDomain: cluster.local`),
    /// where the cluster runs one ([`super::addons`]); none otherwise, as before a DNS add-on.
    pub cluster_dns: Option<Ipv4Addr>,
}

/// A running node. Torn down on drop (see the module's doc).
#[derive(Debug)]
pub struct NodeHost {
    pub name: String,
    /// Where kubelet serves (the Node's InternalIP); on a worker, reachable only from inside.
    pub node_ip: Ipv4Addr,
    /// Where the node's own connections into the control plane's network (to kube-apiserver,
    /// to the registry) come from: a worker's end of its link; kube-apiserver's address on the
    /// control-plane node.
    pub link_ip: Ipv4Addr,
    /// The node's pod network (what its CNI bridge hands out).
    pub pod_cidr: String,
    /// The namespaces; ended on drop, before the cgroups are removed.
    host: Host,
    kubelet: Option<Process>,
    kubelet_command: Vec<String>,
    containerd: Process,
    /// Removed on drop, after the host's processes ([`NodeHost`]'s `Drop` ends them).
    cgroups: Cgroups,
    kubectl: PathBuf,
    admin_kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

/// The node host's files: its folders, the sysctls it gets its own copy of, `/etc/hosts`,
/// the CNI, containerd and kubelet configurations, the registry's `hosts.toml` and CA, and
/// kubelet's kubeconfig.
fn write_files(
    dir: &Path,
    control_plane: &ControlPlane,
    options: &NodeOptions,
    images: &Images,
    (node_ip, pod_cidr): (Ipv4Addr, &str),
    cgroup_root: &str,
) -> anyhow::Result<()> {
    let path = |file: &str| dir.join(file);
    for folder in [
        "etc/upper",
        "etc/work",
        "sysctl",
        "cni",
        "containerd",
        "kubelet",
    ] {
        std::fs::create_dir_all(path(folder))?;
    }
    match &options.etc_kubernetes {
        Some(folder) => std::os::unix::fs::symlink(folder, path("etc-kubernetes"))?,
        None => std::fs::create_dir_all(path("etc-kubernetes"))?,
    }
    for sysctl in SYSCTLS {
        let live = PathBuf::from("/proc/sys").join(sysctl.replace('.', "/"));
        let value = std::fs::read_to_string(&live)
            .with_context(|| format!("reading {}", live.display()))?;
        write(&path(&format!("sysctl/{sysctl}")), &value)?;
    }
    write(
        &path("etc/upper/hosts"),
        &format!(
            "127.0.0.1 localhost\n::1 localhost\n{node_ip} {}\n",
            options.name
        ),
    )?;
    if let Some(registry) = &options.registry {
        // The host's /etc is an overlay whose upper layer is `etc/upper`.
        let in_etc = CERTS_D
            .strip_prefix("/etc/")
            .context("containerd's certs.d is not under /etc")?;
        let certs_d = path(&format!("etc/upper/{in_etc}/{host}", host = registry.host));
        std::fs::create_dir_all(&certs_d)?;
        write(&certs_d.join("hosts.toml"), &hosts_toml(registry))?;
        write(&certs_d.join("ca.crt"), &registry.ca_pem)?;
    }
    write(
        &path("cni/10-bridgehead-test.conflist"),
        &cni_config(pod_cidr),
    )?;
    let socket = path("containerd.sock");
    write(
        &path("containerd.toml"),
        &containerd_config(dir, &socket, &images.pause),
    )?;
    let static_pods = matches!(options.network, Network::ControlPlane { .. });
    write(
        &path("kubelet/config.yaml"),
        &kubelet_config(
            dir,
            &control_plane.ca,
            &socket,
            node_ip,
            cgroup_root,
            static_pods,
            options.cluster_dns,
        ),
    )?;
    write_node_kubeconfig(control_plane, &options.name, &path("kubelet"))?;
    Ok(())
}

/// Starts containerd in `host` with `config`, waits until it answers on `socket`, and
/// imports the test-only images (Bridgehead's own comes from the registry).
fn start_containerd(
    host: &Host,
    socket: &Path,
    config: &Path,
    images: &Images,
) -> anyhow::Result<Process> {
    let containerd = spawn_containerd(host, socket, config)?;
    let ctr = |args: &[&str]| ctr_command(socket, args);
    let archives = [
        Some(&images.pause),
        Some(&images.busybox),
        Some(&images.testserver),
        images.konnectivity.as_ref(),
    ];
    for archive in archives.into_iter().flatten() {
        let out = host.run(&strs(&ctr(&[
            "-n",
            "k8s.io",
            "images",
            "import",
            &archive.path.to_string_lossy(),
        ])))?;
        if !out.status.success() {
            bail!(
                "importing {}: {}",
                archive.path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(containerd)
}

/// `ctr --address SOCKET ARGS`.
fn ctr_command(socket: &Path, args: &[&str]) -> Vec<String> {
    let mut command = vec![
        "ctr".to_owned(),
        "--address".to_owned(),
        socket.to_string_lossy().into_owned(),
    ];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    command
}

/// Starts containerd in `host` with `config` and waits until it answers on `socket`.
fn spawn_containerd(host: &Host, socket: &Path, config: &Path) -> anyhow::Result<Process> {
    let containerd = host.spawn(&["containerd", "--config", &config.to_string_lossy()], &[])?;
    let ctr = |args: &[&str]| ctr_command(socket, args);
    wait_until(CONTAINERD_STARTUP, || {
        host.run(&strs(&ctr(&["version"])))
            .is_ok_and(|out| out.status.success())
    })
    .with_context(|| format!("containerd did not start:\n{}", containerd.stderr()))?;
    Ok(containerd)
}

impl NodeHost {
    /// Starts the host, containerd (with `images` imported) and kubelet, and waits until the
    /// Node is Ready in `control_plane`.
    pub fn start(
        control_plane: &ControlPlane,
        images: &Images,
        options: NodeOptions,
    ) -> anyhow::Result<NodeHost> {
        let started = Instant::now();
        let k = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let dir = tempfile::Builder::new().prefix("bh-node-").tempdir()?;
        let path = |file: &str| dir.path().join(file);
        let (node_ip, link_ip, pod_cidr) = match &options.network {
            Network::Worker { index, .. } => (
                Ipv4Addr::new(10, 202, *index, 1),
                network::link_far_end(*index),
                format!("10.244.{index}.0/24"),
            ),
            Network::ControlPlane { address, index, .. } => {
                (*address, *address, control_plane_pod_cidr(*index)?)
            }
        };
        let cgroup_root = format!("bh{pid}c{k}");
        // Declared before the host, so dropped after it: removed once its processes are gone.
        let cgroups = Cgroups::make(&cgroup_root)?;
        let socket = path("containerd.sock");
        write_files(
            dir.path(),
            control_plane,
            &options,
            images,
            (node_ip, &pod_cidr),
            &cgroup_root,
        )?;

        let host = Host::start(&options.network, dir.path(), &options.name)?;

        if let Network::Worker { ns, index } = &options.network {
            link(
                host.holder_pid,
                ns,
                *index,
                k,
                control_plane.address,
                node_ip,
            )?;
        }
        refuse_elsewhere(host.holder_pid)?;
        kubernetes_service(
            host.holder_pid,
            control_plane.address,
            super::control_plane::APISERVER_PORT,
        )?;

        let containerd = start_containerd(&host, &socket, &path("containerd.toml"), images)?;

        let kubelet_command = vec![
            control_plane
                .binaries
                .kubelet
                .to_string_lossy()
                .into_owned(),
            format!("--config={}", path("kubelet/config.yaml").display()),
            format!("--kubeconfig={}", path("kubelet/kubeconfig").display()),
            format!("--root-dir={}", path("kubelet/root").display()),
            format!("--cert-dir={}", path("kubelet/pki").display()),
            format!("--hostname-override={}", options.name),
            format!("--node-ip={node_ip}"),
        ];
        let kubelet = host.spawn(&strs(&kubelet_command), &[])?;
        let node = NodeHost {
            name: options.name.clone(),
            node_ip,
            link_ip,
            pod_cidr,
            host,
            kubelet: Some(kubelet),
            kubelet_command,
            containerd,
            cgroups,
            kubectl: control_plane.binaries.kubectl.clone(),
            admin_kubeconfig: control_plane.kubeconfig.clone(),
            dir,
        };
        node.wait_ready(control_plane, NODE_READY)?;
        let _ = writeln!(
            std::io::stderr(),
            "node {} Ready after {:?}",
            node.name,
            started.elapsed()
        );
        Ok(node)
    }

    /// Waits (bounded poll: kubelet has no readiness line to read) until the Node reports
    /// Ready.
    fn wait_ready(&self, control_plane: &ControlPlane, timeout: Duration) -> anyhow::Result<()> {
        let jsonpath = "{.status.conditions[?(@.type==\"Ready\")].status}";
        let deadline = Instant::now() + timeout;
        loop {
            let out = control_plane.kubectl(&[
                "get",
                "node",
                &self.name,
                "-o",
                &format!("jsonpath={jsonpath}"),
            ])?;
            if String::from_utf8_lossy(&out.stdout).trim() == "True" {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} not Ready after {timeout:?}; kubelet log:\n{}",
                    self.name,
                    self.kubelet_log()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Kills kubelet (SIGKILL) and starts it again with the same flags; its pods keep running
    /// under containerd meanwhile, as on a real node.
    pub fn restart_kubelet(&mut self) -> anyhow::Result<()> {
        self.start_kubelet()
    }

    /// Kills kubelet (SIGKILL), its pods left running; [`NodeHost::start_kubelet`] brings it
    /// back.
    pub fn kill_kubelet(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kill_inner(&mut kubelet);
        }
    }

    /// Starts kubelet with its flags (after [`NodeHost::kill_kubelet`]; a kubelet still
    /// running is killed first).
    pub fn start_kubelet(&mut self) -> anyhow::Result<()> {
        self.kill_kubelet();
        self.kubelet = Some(self.host.spawn(&strs(&self.kubelet_command), &[])?);
        Ok(())
    }

    /// Restarts containerd: killed (SIGKILL, as a crash or the OOM killer ends it; the shims,
    /// and so the containers, go on) and started again with its configuration, answering on
    /// its socket. Images and containers are where it left them (its root is the node's).
    pub fn restart_containerd(&mut self) -> anyhow::Result<()> {
        kill_inner(&mut self.containerd);
        let socket = self.dir.path().join("containerd.sock");
        // The killed process's socket file: nothing answers on it any more.
        let _ = std::fs::remove_file(&socket);
        let config = self.dir.path().join("containerd.toml");
        self.containerd = spawn_containerd(&self.host, &socket, &config)?;
        Ok(())
    }

    /// What kubelet logged so far.
    pub fn kubelet_log(&self) -> String {
        self.kubelet
            .as_ref()
            .map(Process::stderr)
            .unwrap_or_default()
    }

    /// The last lines of every container log on this node (kubelet's `podLogsDir`), each under
    /// its file's name: what `crictl logs` would show an operator on the node, also when
    /// `kubectl logs` cannot reach it.
    pub fn container_logs(&self) -> String {
        let mut text = String::new();
        let mut folders = vec![self.dir.path().join("pod-logs")];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if let Ok(log) = std::fs::read_to_string(&path) {
                    let lines: Vec<&str> = log.lines().collect();
                    let tail = &lines[lines.len().saturating_sub(20)..];
                    text.push_str(&format!("== {}\n{}\n", path.display(), tail.join("\n")));
                }
            }
        }
        text
    }

    /// `ctr -n k8s.io ARGS` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<Output> {
        let socket = self.dir.path().join("containerd.sock");
        let socket = socket.to_string_lossy();
        let mut command = vec!["ctr", "--address", &socket, "-n", "k8s.io"];
        command.extend_from_slice(args);
        self.run(&command)
    }

    /// Runs `command` (a program and its arguments) inside the host and waits for it.
    pub fn run(&self, command: &[&str]) -> anyhow::Result<Output> {
        self.host.run(command)
    }

    /// The cgroup under which kubelet and runc put everything of this node, in every
    /// hierarchy (`/sys/fs/cgroup/*/<root>`).
    pub fn cgroup_root(&self) -> &str {
        &self.cgroups.root
    }

    /// The test's folder for this host.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for NodeHost {
    fn drop(&mut self) {
        // kubelet first, so that it does not register the Node again.
        if let Some(mut kubelet) = self.kubelet.take() {
            kill_inner(&mut kubelet);
        }
        let _ = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .args(["--request-timeout=5s", "delete", "node", &self.name])
            .args(["--wait=false", "--ignore-not-found"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.host.end();
    }
}

/// A control-plane node's pod network: `10.244.0.0/24` for the first (the one the workers'
/// routes lead to, [`network`]), `10.244.<250 + index>.0/24` for the others, past every
/// worker's (`index` 1 to 250): their pods (the agents' DaemonSet tolerates the control plane's
/// taint) reach out masqueraded as their node, and nothing routes to them.
fn control_plane_pod_cidr(index: u8) -> anyhow::Result<String> {
    match index {
        0 => Ok("10.244.0.0/24".to_owned()),
        1..=5 => Ok(format!("10.244.{}.0/24", 250 + u16::from(index))),
        _ => bail!("a control-plane node's index is 0 to 5, not {index}"),
    }
}

fn strs(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}
