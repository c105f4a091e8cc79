//! Other proxies an operator might run instead (wstunnel, squid, ...), given to the bench by
//! command (`--peer NAME=CMD`) when someone has built them by hand: the bench never builds or
//! downloads them.
//!
//! `CMD` is a shell command (run with `sh -c`, in the foreground, in a process group of its
//! own) that serves plain HTTP CONNECT on TCP at the address the bench chose, and tunnels
//! however it likes behind that: wstunnel's client with its `-L http://` listener in front of
//! its server, say. The address is in `{listen}` (`127.0.0.1:PORT`) and `{port}`; `{spare}`
//! and `{spare2}` are two more free ports on the same address for the command's inner legs;
//! the same values are in the environment as `PEER_LISTEN`, `PEER_PORT`, `PEER_SPARE` and
//! `PEER_SPARE2`. The bench waits until the address accepts a tunnel to its target, counts
//! the CPU and memory of every process in the group, and kills the group at the end.
//!
//! A peer's path is compared with Bridgehead's Unix-socket path: both take plain CONNECT and
//! cross one TLS leg (the floor counts two AES passes for both).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use bridgehead_e2e::client::tunnel::Frontend;

use crate::route::Route;

/// How long a peer may take to accept its first tunnel.
const STARTUP: Duration = Duration::from_secs(30);
/// The loopback address peers listen on (konnectivity's are 127.0.0.1–4 on other ports).
const LISTEN: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);

/// `--peer NAME=CMD`, parsed.
#[derive(Debug, Clone)]
pub struct PeerSpec {
    pub name: String,
    pub command: String,
}

impl std::str::FromStr for PeerSpec {
    type Err = String;

    fn from_str(value: &str) -> Result<PeerSpec, String> {
        let Some((name, command)) = value.split_once('=') else {
            return Err("expected NAME=CMD".to_owned());
        };
        let name = name.trim();
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
        if name.is_empty() || !name.chars().all(valid) {
            return Err(format!(
                "peer name {name:?}: letters, digits, '-', '_' and '.' only"
            ));
        }
        if command.trim().is_empty() {
            return Err(format!("peer {name}: empty command"));
        }
        Ok(PeerSpec {
            name: name.to_owned(),
            command: command.to_owned(),
        })
    }
}

/// A running peer.
#[derive(Debug)]
pub struct Peer {
    pub route: Route,
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

/// A port nothing listens on at [`LISTEN`] right now.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind((LISTEN, 0))
        .with_context(|| format!("binding {LISTEN}: is all of 127.0.0.0/8 on lo?"))?;
    Ok(listener.local_addr()?.port())
}

impl Peer {
    /// Starts `spec` and waits until it opens a tunnel to `target`.
    pub async fn start(spec: &PeerSpec, target: SocketAddr) -> anyhow::Result<Peer> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("output.log");
        let (port, spare, spare2) = (free_port()?, free_port()?, free_port()?);
        let listen = SocketAddr::from((LISTEN, port));
        let command = spec
            .command
            .replace("{listen}", &listen.to_string())
            .replace("{port}", &port.to_string())
            .replace("{spare}", &spare.to_string())
            .replace("{spare2}", &spare2.to_string());
        let output = std::fs::File::create(&log)?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("PEER_LISTEN", listen.to_string())
            .env("PEER_PORT", port.to_string())
            .env("PEER_SPARE", spare.to_string())
            .env("PEER_SPARE2", spare2.to_string())
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting peer {}: {command}", spec.name))?;
        let label: &'static str = Box::leak(spec.name.clone().into_boxed_str());
        let mut peer = Peer {
            route: Route::Peer {
                label,
                frontend: Frontend::Tcp { addr: listen },
            },
            child,
            log,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + STARTUP;
        loop {
            let error = match peer.route.open(target).await {
                Ok(_) => return Ok(peer),
                Err(error) => error,
            };
            if let Some(status) = peer.child.try_wait()? {
                bail!(
                    "peer {} exited ({status}) before serving:\n{}",
                    spec.name,
                    peer.output()
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "peer {} opened no tunnel on {listen} within {STARTUP:?} ({error:#}):\n{}",
                    spec.name,
                    peer.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every process of the peer's group (the shell and what it started).
    pub fn pids(&self) -> Vec<u32> {
        group_members(self.child.id())
    }

    /// What the peer printed (the end of it).
    pub fn output(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }
}

impl Drop for Peer {
    /// Kills the group and waits (a few seconds at most) until none of it runs, so the
    /// measurements after it do not share the CPU with a dying peer.
    fn drop(&mut self) {
        let group = self.child.id();
        if let Some(pid) = rustix::process::Pid::from_raw(group as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
        let _ = bridgehead_e2e::process::wait_until(Duration::from_secs(5), || {
            group_members(group).is_empty()
        });
    }
}

/// The live processes whose process group is `group` (field 5 of `/proc/<pid>/stat`; zombies,
/// state `Z`, are dead).
fn group_members(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![group];
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // After the command name, which may hold spaces, in parentheses.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let mut fields = after.split_whitespace();
            let state = fields.next();
            state != Some("Z") && fields.nth(1) == Some(&group.to_string())
        })
        .collect();
    pids.sort_unstable();
    pids
}
