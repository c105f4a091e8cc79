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
//!   (`10.244.<index>.0/24`, masqueraded on the way out): the control plane's namespace has
//!   no route to either, so kube-apiserver reaches the node only through Bridgehead; a TCP
//!   connection to where a host has no route is refused at once (a reset), on every host;
//! - containerd with its own root, state and socket in the test's folder; the pause, busybox
//!   and Bridgehead images imported ([`super::images`]); kubelet on cgroupfs (cgroup v1 is what
//!   these machines have) under a cgroup root of its own.
//!
//! Dropped, it stops kubelet, deletes its Node, kills the host's first process (the kernel then
//! kills every process of its PID namespace: containerd, shims, containers), so its mounts and
//! network namespace go with it, and removes the cgroups made under its root. A test process
//! killed with SIGKILL leaves those cgroups behind (`/sys/fs/cgroup/*/bh<pid>c<k>`, empty).

use std::io::{BufRead, BufReader, Write as _};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::images::Images;
use super::ControlPlane;
use crate::netns::ip;
use crate::process::{wait_until, Process};

/// How long the host's first process may take to set up its mounts.
const HOST_STARTUP: Duration = Duration::from_secs(20);
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

/// The host's first process: sets up its mounts and host name, prints `ready`, then holds the
/// namespaces until its standard input closes (the test dropped the host, or died).
const HOLDER: &str = r#"
set -e
dir=$1
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /var/log
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$dir/etc/upper,workdir=$dir/etc/work" /etc
mkdir -p /etc/kubernetes
mount --bind "$dir/etc-kubernetes" /etc/kubernetes
for file in "$dir"/sysctl/*; do
  mount --bind "$file" "/proc/sys/$(basename "$file" | tr . /)"
done
hostname "$2"
ip link set lo up
echo ready
while read -r _; do :; done
"#;

/// How a node host is networked.
#[derive(Debug, Clone)]
pub enum Network {
    /// Its own network namespace, linked by a veth to the control plane's namespace (named
    /// `ns`); `index` (1 to 250, one per node of a cluster) picks its addresses.
    Worker { ns: String, index: u8 },
    /// The control plane's own network namespace (named `ns`), as on a control-plane node:
    /// its pods on `hostNetwork` (the static pods) sit beside kube-apiserver.
    ControlPlane { ns: String },
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
}

/// A running node. Torn down on drop (see the module's doc).
#[derive(Debug)]
pub struct NodeHost {
    pub name: String,
    /// Where kubelet serves (the Node's InternalIP); on a worker, reachable only from inside.
    pub node_ip: Ipv4Addr,
    /// The node's pod network (what its CNI bridge hands out).
    pub pod_cidr: String,
    /// The host's first process, seen from the test's PID namespace.
    holder_pid: u32,
    /// Closing it ends the host.
    holder_stdin: Option<ChildStdin>,
    /// The `unshare` that started the host.
    unshare: Child,
    kubelet: Option<Process>,
    kubelet_command: Vec<String>,
    _containerd: Process,
    /// Removed on drop, after the host's processes ([`NodeHost`]'s `Drop` ends them).
    cgroups: Cgroups,
    kubectl: PathBuf,
    admin_kubeconfig: PathBuf,
    dir: tempfile::TempDir,
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
        let (node_ip, pod_cidr) = match &options.network {
            Network::Worker { index, .. } => (
                Ipv4Addr::new(10, 202, *index, 1),
                format!("10.244.{index}.0/24"),
            ),
            Network::ControlPlane { .. } => (control_plane.address, "10.244.0.0/24".to_owned()),
        };
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
        write(
            &path("cni/10-bridgehead-test.conflist"),
            &cni_config(&pod_cidr),
        )?;
        let socket = path("containerd.sock");
        write(
            &path("containerd.toml"),
            &containerd_config(dir.path(), &socket, &images.pause),
        )?;
        let cgroup_root = format!("bh{pid}c{k}");
        // Declared before the host, so dropped after it: removed once its processes are gone.
        let cgroups = Cgroups::make(&cgroup_root)?;
        let static_pods = matches!(options.network, Network::ControlPlane { .. });
        write(
            &path("kubelet/config.yaml"),
            &kubelet_config(
                dir.path(),
                &control_plane.ca,
                &socket,
                node_ip,
                &cgroup_root,
                static_pods,
            ),
        )?;
        write_node_kubeconfig(control_plane, &options.name, &path("kubelet"))?;

        // The host's first process: unshare, in the control plane's network namespace for a
        // control-plane node (nsenter with only a network namespace to enter execs it).
        let mut command = match &options.network {
            Network::Worker { .. } => {
                let mut command = Command::new("unshare");
                command.arg("--net");
                command
            }
            Network::ControlPlane { ns } => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net=/run/netns/{ns}"))
                    .args(["--", "unshare"]);
                command
            }
        };
        command
            .args([
                "--mount",
                "--uts",
                "--ipc",
                "--pid",
                "--fork",
                "--mount-proc",
            ])
            .args([
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                HOLDER,
                "holder",
            ])
            .arg(dir.path())
            .arg(&options.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut unshare = command
            .spawn()
            .context("starting the node host (unshare)")?;
        let holder_stdin = unshare.stdin.take();
        let stdout = unshare.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(HOST_STARTUP).unwrap_or_default();
        if line.trim() != "ready" {
            let _ = unshare.kill();
            let mut why = String::new();
            if let Some(mut stderr) = unshare.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut why);
            }
            bail!("node host {} did not start: {line:?} {why}", options.name);
        }
        let holder_pid = first_child(unshare.id())?;
        let mut host = Host {
            holder_pid,
            holder_stdin,
            unshare: Some(unshare),
        };

        if let Network::Worker { ns, index } = &options.network {
            link(&host, ns, *index, k, control_plane.address, node_ip)?;
        }
        refuse_elsewhere(&host)?;

        let containerd = host.spawn(
            &[
                "containerd",
                "--config",
                &path("containerd.toml").to_string_lossy(),
            ],
            &[],
        )?;
        let ctr = |args: &[&str]| {
            let mut command = vec![
                "ctr".to_owned(),
                "--address".to_owned(),
                socket.to_string_lossy().into_owned(),
            ];
            command.extend(args.iter().map(|a| (*a).to_owned()));
            command
        };
        wait_until(CONTAINERD_STARTUP, || {
            host.run(&ctr(&["version"]))
                .is_ok_and(|out| out.status.success())
        })
        .with_context(|| format!("containerd did not start:\n{}", containerd.stderr()))?;
        for archive in [&images.pause, &images.busybox, &images.bridgehead] {
            let out = host.run(&ctr(&[
                "-n",
                "k8s.io",
                "images",
                "import",
                &archive.path.to_string_lossy(),
            ]))?;
            if !out.status.success() {
                bail!(
                    "importing {}: {}",
                    archive.path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }

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
            pod_cidr,
            holder_pid: host.holder_pid,
            holder_stdin: host.holder_stdin.take(),
            unshare: host.unshare.take().context("no unshare")?,
            kubelet: Some(kubelet),
            kubelet_command,
            _containerd: containerd,
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
        if let Some(mut kubelet) = self.kubelet.take() {
            kill_inner(&mut kubelet);
        }
        let mut command = nsenter(self.holder_pid);
        command.args(&self.kubelet_command);
        self.kubelet = Some(Process::spawn(command, &[])?.0);
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
        enter(self.holder_pid, command)
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
        end_host(self.holder_pid, &mut self.holder_stdin, &mut self.unshare);
    }
}

/// The host while it starts: torn down if starting fails half-way.
struct Host {
    holder_pid: u32,
    holder_stdin: Option<ChildStdin>,
    unshare: Option<Child>,
}

impl Host {
    fn run(&self, command: &[String]) -> anyhow::Result<Output> {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        enter(self.holder_pid, &command)
    }

    /// Starts `command` inside the host as a [`Process`] (killed on drop: see
    /// [`kill_inner`]).
    fn spawn(&self, command: &[&str], wants: &[&str]) -> anyhow::Result<Process> {
        let mut nsenter = nsenter(self.holder_pid);
        nsenter.args(command);
        Ok(Process::spawn(nsenter, wants)?.0)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut unshare) = self.unshare.take() {
            end_host(self.holder_pid, &mut self.holder_stdin, &mut unshare);
        }
    }
}

fn strs(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}

/// `nsenter` into every namespace of the host whose first process is `pid`.
fn nsenter(pid: u32) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg("-t")
        .arg(pid.to_string())
        .args(["-m", "-u", "-i", "-n", "-p", "--"]);
    command
}

fn enter(pid: u32, command: &[&str]) -> anyhow::Result<Output> {
    nsenter(pid)
        .args(command)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {command:?} in node host {pid}"))
}

/// The one child of `pid` (nsenter and unshare fork the program they run).
fn first_child(pid: u32) -> anyhow::Result<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?;
    children
        .split_whitespace()
        .next()
        .context("no child process")?
        .parse()
        .context("child pid")
}

/// Kills the program an `nsenter` [`Process`] runs (killing nsenter alone would leave it to the
/// host's first process), then nsenter.
fn kill_inner(process: &mut Process) {
    if let Ok(inner) = first_child(process.pid()) {
        if let Some(pid) = i32::try_from(inner)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    process.kill();
}

/// Ends a host: its first process killed, and with it every process of its PID namespace, and
/// so its mounts and network namespace.
fn end_host(holder_pid: u32, holder_stdin: &mut Option<ChildStdin>, unshare: &mut Child) {
    drop(holder_stdin.take());
    if let Some(pid) = i32::try_from(holder_pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    let _ = unshare.kill();
    let _ = unshare.wait();
}

/// A node's cgroup root in every hierarchy, and everything kubelet and runc make under it;
/// removed on drop.
#[derive(Debug)]
struct Cgroups {
    root: String,
}

impl Cgroups {
    /// Makes the root in every hierarchy (kubelet requires its `cgroupRoot` to exist); a cpuset
    /// cgroup starts with the machine's CPUs and memory nodes, which its children inherit.
    fn make(root: &str) -> anyhow::Result<Cgroups> {
        let cgroups = Cgroups {
            root: root.to_owned(),
        };
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
            let dir = hierarchy.path().join(root);
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
            if hierarchy.file_name() == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(hierarchy.path().join(file))?;
                    std::fs::write(dir.join(file), value)?;
                }
            }
        }
        Ok(cgroups)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // A cgroup can be removed once the kernel has ended its last process.
        let _ = wait_until(TEARDOWN, || remove_cgroups(&self.root));
    }
}

/// Removes every cgroup under `/sys/fs/cgroup/<hierarchy>/<root>`, deepest first; true when
/// none is left.
fn remove_cgroups(root: &str) -> bool {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return true;
    };
    let mut clean = true;
    for hierarchy in hierarchies.flatten() {
        let top = hierarchy.path().join(root);
        if top.exists() && !remove_tree(&top) {
            clean = false;
        }
    }
    clean
}

fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok()
}

/// The worker's veth: `eth0` (`10.201.<index>.2/30`) in the host, its peer
/// (`10.201.<index>.1/30`) in the control plane's namespace `ns`; the node's address on the
/// host's loopback; a route from the host to kube-apiserver's address over the link. The
/// control plane gets no route to the node's address or its pods.
fn link(
    host: &Host,
    ns: &str,
    index: u8,
    k: usize,
    apiserver: Ipv4Addr,
    node_ip: Ipv4Addr,
) -> anyhow::Result<()> {
    if index == 0 || index > 250 {
        bail!("a worker's index is 1 to 250, not {index}");
    }
    let peer = format!("bh{}k{k}", std::process::id());
    if peer.len() > 15 {
        bail!("interface name {peer} is longer than 15 characters");
    }
    let holder = host.holder_pid.to_string();
    let (near, far) = (
        Ipv4Addr::new(10, 201, index, 1),
        Ipv4Addr::new(10, 201, index, 2),
    );
    ip(&[
        "link", "add", &peer, "type", "veth", "peer", "name", "eth0", "netns", &holder,
    ])?;
    ip(&["link", "set", &peer, "netns", ns])?;
    ip(&["-n", ns, "addr", "add", &format!("{near}/30"), "dev", &peer])?;
    ip(&["-n", ns, "link", "set", &peer, "up"])?;
    for command in [
        vec!["ip", "addr", "add", &format!("{far}/30"), "dev", "eth0"],
        vec!["ip", "link", "set", "eth0", "up"],
        vec!["ip", "addr", "add", &format!("{node_ip}/32"), "dev", "lo"],
        vec![
            "ip",
            "route",
            "add",
            &format!("{apiserver}/32"),
            "via",
            &near.to_string(),
        ],
    ] {
        let command: Vec<&str> = command.iter().map(|s| s.as_ref()).collect();
        let out = enter(host.holder_pid, &command)?;
        if !out.status.success() {
            bail!(
                "{command:?} in the node host: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Makes a connection to an address this host has no route to fail at once, as a firewall's
/// reset would, rather than vanish: a default route into an interface that leads nowhere (one
/// end of a veth pair whose other end is in the same host; the kernels here have no dummy
/// interfaces), where TCP is answered with a reset. Without it, an agent asked to dial a node it cannot reach (a tunnel
/// the `default` strategy gave it while the node's own agent is being replaced) waits for the
/// dial timeout whenever the kernel's rate limit holds back the ICMP unreachable.
fn refuse_elsewhere(host: &Host) -> anyhow::Result<()> {
    for command in [
        "ip link add nowhere type veth peer name nowhere-peer",
        "ip link set nowhere-peer up",
        "ip link set nowhere up",
        "ip route add default dev nowhere",
        "iptables -A FORWARD -o nowhere -p tcp -j REJECT --reject-with tcp-reset",
        "iptables -A FORWARD -o nowhere -j DROP",
        "iptables -A OUTPUT -o nowhere -p tcp -j REJECT --reject-with tcp-reset",
        "iptables -A OUTPUT -o nowhere -j DROP",
    ] {
        let command: Vec<&str> = command.split(' ').collect();
        let out = enter(host.holder_pid, &command)?;
        if !out.status.success() {
            bail!(
                "{command:?} in the node host: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// containerd's configuration: everything under `dir`, the CRI on overlayfs with runc, the
/// pause image as the sandbox, Debian's CNI plugins. `restrict_oom_score_adj`: the test
/// machines lack CAP_SYS_RESOURCE, so runc cannot lower a container's oom_score_adj below its
/// own.
fn containerd_config(dir: &Path, socket: &Path, pause: &super::images::Archive) -> String {
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
"#,
        socket = socket.display(),
        pause = pause.name,
    )
}

/// A bridge for the node's pods on `pod_cidr`, the bridge the gateway, masquerading what the
/// pods send off the node (the control plane has no route back to a pod), and host ports.
fn cni_config(pod_cidr: &str) -> String {
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
/// (webhook), as kubeadm sets a kubelet up; cgroup v1
/// through cgroupfs under its own root (with per-QoS cgroups: without them kubelet gives the
/// runtime no parent and containerd puts every node's containers under one shared `/k8s.io`),
/// without node allocatable enforcement; no swap check, no kernel-default check, no host resolv.conf; eviction and
/// image garbage collection that never remove the imported images from a shared disk.
fn kubelet_config(
    dir: &Path,
    ca: &Path,
    socket: &Path,
    node_ip: Ipv4Addr,
    cgroup_root: &str,
    static_pods: bool,
) -> String {
    let dir = dir.display();
    let static_pods = if static_pods {
        "staticPodPath: /etc/kubernetes/manifests\nfileCheckFrequency: 1s\n"
    } else {
        ""
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
{static_pods}"#,
        socket = socket.display(),
        ca = ca.display(),
    )
}

/// The node's kubeconfig (`kubeconfig` in `dir`): `system:node:<name>` in `system:nodes`, a
/// client certificate from the control plane's CA, as the Node authorizer expects.
fn write_node_kubeconfig(
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
        &super::control_plane::kubeconfig_text(
            &control_plane.url,
            &control_plane.ca,
            &dir.join("node.crt"),
            &dir.join("node.key"),
        ),
    )
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
