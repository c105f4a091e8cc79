//! The namespaces of a node host: a process tree made with `unshare`, whose first process sets
//! up the mounts and then holds it all until it is told to end, and commands run inside it with
//! `nsenter`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::Network;
use crate::process::Process;

/// How long the host's first process may take to set up its mounts.
const HOST_STARTUP: Duration = Duration::from_secs(20);

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

/// A running host. Ended on drop.
#[derive(Debug)]
pub(super) struct Host {
    /// The host's first process, seen from the test's PID namespace.
    pub(super) holder_pid: u32,
    /// Closing it ends the host.
    holder_stdin: Option<ChildStdin>,
    /// The `unshare` that started the host.
    unshare: Child,
}

impl Host {
    /// Starts a host named `name` for `network` (a worker gets a network namespace of its own,
    /// a control-plane node the control plane's), with its mounts from the folder `dir`
    /// (`etc/upper`, `etc/work`, `etc-kubernetes`, `sysctl/`).
    pub(super) fn start(network: &Network, dir: &Path, name: &str) -> anyhow::Result<Host> {
        // nsenter with only a network namespace to enter execs unshare, so the child it makes
        // is the host's first process in both cases.
        let mut command = match network {
            Network::Worker { .. } => {
                let mut command = Command::new("unshare");
                command.arg("--net");
                command
            }
            Network::ControlPlane { ns, .. } => {
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
            .arg(dir)
            .arg(name)
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
            let _ = unshare.wait();
            bail!("node host {name} did not start: {line:?} {why}");
        }
        let mut host = Host {
            holder_pid: 0,
            holder_stdin,
            unshare,
        };
        host.holder_pid = first_child(host.unshare.id())?;
        Ok(host)
    }

    /// Runs `command` (a program and its arguments) inside the host and waits for it.
    pub(super) fn run(&self, command: &[&str]) -> anyhow::Result<Output> {
        enter(self.holder_pid, command)
    }

    /// Starts `command` inside the host as a [`Process`] (stop it with [`kill_inner`]).
    pub(super) fn spawn(&self, command: &[&str], wants: &[&str]) -> anyhow::Result<Process> {
        let mut nsenter = nsenter(self.holder_pid);
        nsenter.args(command);
        Ok(Process::spawn(nsenter, wants)?.0)
    }

    /// Ends the host: its first process killed, and with it every process of its PID
    /// namespace, and so its mounts and network namespace. Idempotent.
    pub(super) fn end(&mut self) {
        drop(self.holder_stdin.take());
        if let Some(pid) = i32::try_from(self.holder_pid)
            .ok()
            .filter(|pid| *pid > 0)
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.end();
    }
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

/// Runs `command` inside the host whose first process is `pid`, and waits for it.
pub(super) fn enter(pid: u32, command: &[&str]) -> anyhow::Result<Output> {
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
pub(super) fn kill_inner(process: &mut Process) {
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
