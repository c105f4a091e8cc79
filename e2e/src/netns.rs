//! Test hosts in network namespaces, so routing tests can prove which agent carried a tunnel.
//!
//! [`TestNet::new`] creates one namespace per host, each joined to the root namespace by a veth
//! pair on its own `/30` in `10.250.<slot>.0/24` (root side `.4i+1`, host side `.4i+2`). The host
//! side also gets `fd00:250:<slot>:<i>::2/64`. `<slot>` is a `/24` no root interface uses yet,
//! so several nets (parallel tests, several test processes) never share an address; namespace and
//! link names carry the test process's pid and a counter (`bh<pid>n<k>`, `bh<pid>v<k>`).
//!
//! Nothing routes beyond the test: a namespace has no default route, only its own link and, for
//! hosts other than the first, a `/32` route to [`TestNet::server_v4`] (the root side of the
//! first host's link), where the server's agent endpoint listens. So an agent can only reach the
//! addresses of its own namespace: a tunnel routed to the wrong agent fails or is answered by
//! the wrong host's [`TestNet::who_am_i`], and the test sees it.
//!
//! Everything is deleted on drop (namespaces, root-side links, `/etc/netns/<ns>/`, target
//! processes). A test process killed with SIGKILL leaves its namespaces behind; list them with
//! `ip netns list | grep '^bh'` and remove them with `ip netns del`. Targets exit by themselves
//! when the test process goes away (their stdin closes).
//!
//! Creating namespaces needs root ([`is_root`]); the routing tests skip without it.

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context};

/// How long a target may take to announce its listener.
const TARGET_STARTUP: Duration = Duration::from_secs(20);

/// The most hosts one net holds (one `/30` each in a `/24`).
const MAX_HOSTS: usize = 64;

/// Names of hosts by index; [`Host::name`].
const NAMES: [&str; 8] = ["A", "B", "C", "D", "E", "F", "G", "H"];

/// Where `ip netns exec` looks for per-namespace files to mount over `/etc`.
const ETC_NETNS: &str = "/etc/netns";

/// Numbers namespaces and links uniquely within this process.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Held while a net picks its `/24` and puts addresses on it, so two nets of this process never
/// pick the same one; and while creating or removing directories in [`ETC_NETNS`].
static SLOTS: Mutex<()> = Mutex::new(());

/// A who-am-i TCP server: binds `argv[2]` (`host:port`, IPv6 in brackets, port 0 for any; `::`
/// accepts IPv4 too), prints `who-am-i listening on ADDR`, then answers every connection with
/// `argv[1]` and a newline, ends its direction and reads until the client closes. Exits when its
/// stdin closes (the test dropped it, or the test process died).
const WHO_AM_I: &str = r#"
import socket, sys, threading
name, spec = sys.argv[1], sys.argv[2]
host, _, port = spec.rpartition(":")
host = host.strip("[]")
if ":" in host:
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
else:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((host, int(port)))
listener.listen(512)
bound = listener.getsockname()
shown = "[%s]:%d" % bound[:2] if ":" in bound[0] else "%s:%d" % bound[:2]
print("who-am-i listening on " + shown, flush=True)

def handle(conn):
    try:
        conn.sendall((name + "\n").encode())
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(4096):
            pass
    except OSError:
        pass
    finally:
        conn.close()

def serve():
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()

threading.Thread(target=serve, daemon=True).start()
sys.stdin.read()
"#;

/// A delay line (see [`TestNet::impair`]): creates the TUN device `argv[1]`, prints `delay
/// line up`, then holds every packet routed into it `argv[2]` seconds and writes it back, in
/// order. Exits when its stdin closes; the device goes with it.
const DELAY_LINE: &str = r#"
import collections, fcntl, os, struct, sys, threading, time
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
name, delay = sys.argv[1], float(sys.argv[2])
fd = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
line = collections.deque()
ready = threading.Condition()

def take():
    while True:
        packet = os.read(fd, 65536)
        with ready:
            line.append((time.monotonic() + delay, packet))
            ready.notify()

def give():
    while True:
        with ready:
            while not line:
                ready.wait()
            due, packet = line.popleft()
        hold = due - time.monotonic()
        if hold > 0:
            time.sleep(hold)
        os.write(fd, packet)

threading.Thread(target=take, daemon=True).start()
threading.Thread(target=give, daemon=True).start()
print("delay line up", flush=True)
sys.stdin.read()
"#;

/// Whether this process runs as root (effective uid 0), which network namespaces need.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            // Uid: real effective saved filesystem
            line.split_whitespace().nth(2).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

/// Runs `body` with a fresh net of `hosts` hosts on a thread of its own, or skips loudly when
/// not root; fails when `body` takes longer than `timeout` (the net is left to the process's
/// end then: the body may still use it).
pub fn with_net(
    test: &str,
    hosts: usize,
    timeout: Duration,
    body: impl FnOnce(TestNet) + Send + 'static,
) {
    if !crate::skip::require_root(test) {
        return;
    }
    let net = match TestNet::new(hosts) {
        Ok(net) => net,
        Err(e) if format!("{e:#}").contains("Operation not permitted") => {
            return crate::skip::skip(test, &format!("needs root for network namespaces: {e:#}"));
        }
        Err(e) => panic!("creating the test net: {e:#}"),
    };
    let (done, finished) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name(test.to_owned())
        .spawn(move || {
            body(net);
            let _ = done.send(());
        })
        .unwrap_or_else(|e| panic!("spawning {test}: {e}"));
    match finished.recv_timeout(timeout) {
        Ok(()) => worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        // The body panicked: rethrow its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{test} took longer than {timeout:?}"),
    }
}

/// A server whose agent endpoint every host of `net` reaches ([`TestNet::server_v4`]), with
/// `server`'s other options, and one agent inside host `host` with `agent`'s, registered. The
/// agent checks the server's certificate for `127.0.0.1`, which it names, not the link address
/// it dials.
pub fn start_pair_on_host(
    pki: &crate::Pki,
    net: &TestNet,
    host: usize,
    server: crate::ServerOptions,
    agent: crate::AgentOptions,
) -> anyhow::Result<(crate::Server, crate::Agent)> {
    let server = crate::Server::start(
        pki,
        crate::ServerOptions {
            agent_bind: Some(net.server_v4().to_string()),
            ..server
        },
    )?;
    let mut args = vec!["--server-name".to_owned(), "127.0.0.1".to_owned()];
    args.extend(agent.args.iter().cloned());
    let agent = crate::Agent::start(
        pki,
        &server,
        crate::AgentOptions {
            args,
            netns: Some(net.host(host).ns_name().to_owned()),
            server: Some(server.agent_addr),
            ..agent
        },
    )?;
    server.wait_agents(1)?;
    Ok((server, agent))
}

/// Runs `ip` with `args`; fails with its stderr.
pub fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One test host: a network namespace linked to the root namespace.
#[derive(Debug)]
pub struct Host {
    index: usize,
    ns: String,
    root_link: String,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    root_v4: Ipv4Addr,
    hosts_dir: Option<PathBuf>,
}

impl Host {
    /// The namespace's name (for `ip netns exec` and [`crate::AgentOptions::netns`]).
    pub fn ns_name(&self) -> &str {
        &self.ns
    }

    /// `A`, `B`, `C`, ... by index: what [`TestNet::who_am_i_everywhere`] answers here.
    pub fn name(&self) -> &'static str {
        NAMES.get(self.index).copied().unwrap_or("?")
    }

    /// The host's IPv4 address (on its end of the link).
    pub fn v4(&self) -> Ipv4Addr {
        self.v4
    }

    /// The host's IPv6 address (on its end of the link).
    pub fn v6(&self) -> Ipv6Addr {
        self.v6
    }
}

/// A target process running inside a namespace.
#[derive(Debug)]
struct Target {
    child: Child,
    /// Closing it makes the target exit.
    stdin: Option<ChildStdin>,
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A few test hosts in network namespaces; deleted on drop.
#[derive(Debug)]
pub struct TestNet {
    hosts: Vec<Host>,
    targets: Vec<Target>,
}

impl TestNet {
    /// Creates `hosts` namespaces (at most 8 get letter names), each linked to the root
    /// namespace, with loopback up.
    pub fn new(hosts: usize) -> anyhow::Result<TestNet> {
        if hosts == 0 || hosts > MAX_HOSTS {
            bail!("a TestNet holds 1 to {MAX_HOSTS} hosts, not {hosts}");
        }
        let mut net = TestNet {
            hosts: Vec::new(),
            targets: Vec::new(),
        };
        let pid = std::process::id();
        let _slots = SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = free_slot()?;
        for index in 0..hosts {
            let k = COUNTER.fetch_add(1, Ordering::Relaxed);
            let ns = format!("bh{pid}n{k}");
            let root_link = format!("bh{pid}v{k}");
            if root_link.len() > 15 {
                bail!("interface name {root_link} is longer than 15 characters");
            }
            let base = u8::try_from(index * 4).context("too many hosts")?;
            let root_v4 = Ipv4Addr::new(10, 250, slot, base + 1);
            let v4 = Ipv4Addr::new(10, 250, slot, base + 2);
            let v6 = Ipv6Addr::new(0xfd00, 0x250, slot.into(), index as u16, 0, 0, 0, 2);
            ip(&["netns", "add", &ns])?;
            net.hosts.push(Host {
                index,
                ns: ns.clone(),
                root_link: root_link.clone(),
                v4,
                v6,
                root_v4,
                hosts_dir: None,
            });
            ip(&[
                "link", "add", &root_link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["addr", "add", &format!("{root_v4}/30"), "dev", &root_link])?;
            ip(&["link", "set", &root_link, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{v4}/30"), "dev", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                "eth0",
                "nodad",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        let server = net.server_v4();
        for host in &net.hosts[1..] {
            ip(&[
                "-n",
                &host.ns,
                "route",
                "add",
                &format!("{server}/32"),
                "via",
                &host.root_v4.to_string(),
                "dev",
                "eth0",
            ])?;
        }
        Ok(net)
    }

    /// Lets the hosts reach each other's addresses (IPv4), through the root namespace: each
    /// host routes the net's `/24` over its link, and the root namespace forwards what comes
    /// in on the net's links only (their own `forwarding` switch; the machine's stays as it
    /// is). Still nothing leaves the net.
    pub fn route_between_hosts(&self) -> anyhow::Result<()> {
        let first = self.hosts[0].v4.octets();
        let net = format!("{}.{}.{}.0/24", first[0], first[1], first[2]);
        for host in &self.hosts {
            let forwarding = format!("/proc/sys/net/ipv4/conf/{}/forwarding", host.root_link);
            std::fs::write(&forwarding, "1").with_context(|| format!("writing {forwarding}"))?;
            let via = host.root_v4.to_string();
            ip(&[
                "-n", &host.ns, "route", "add", &net, "via", &via, "dev", "eth0",
            ])?;
        }
        Ok(())
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Takes host `i`'s link down (`up` false) or up again, on the root side: a partition
    /// between the host and everything outside it, with no packet refused (they vanish).
    pub fn set_link(&self, i: usize, up: bool) -> anyhow::Result<()> {
        let state = if up { "up" } else { "down" };
        ip(&["link", "set", &self.hosts[i].root_link, state])?;
        Ok(())
    }

    /// Makes host `i`'s link lossy and slow: `loss_percent` of the packets dropped at random
    /// each way (nftables `numgen random`, on the host's side of the link), and every packet
    /// the host sends held back `delay` (so a round trip through the link takes `delay`
    /// longer). The delay is `tc netem`'s where the kernel has it; where it does not
    /// (`CONFIG_NET_SCH_NETEM` unset) a delay line does the same in user space: the host's
    /// routes out go through a TUN device, whose packets a process of the test holds for
    /// `delay` each, in order, and writes back, and the host forwards them out of its link
    /// ([`DELAY_LINE`]). Needs `nft` (the nftables package) and `ip`/`tc` (iproute2). Returns
    /// what was applied.
    pub fn impair(
        &mut self,
        i: usize,
        loss_percent: u32,
        delay: Duration,
    ) -> anyhow::Result<String> {
        let ns = self.hosts[i].ns.clone();
        // Postrouting, not output: with the delay line, the host's packets leave its link
        // forwarded from the TUN device.
        let rules = format!(
            "table inet bridgehead_loss {{
               chain in {{ type filter hook input priority 0; iifname \"eth0\" numgen random mod 100 < {loss_percent} counter drop; }}
               chain out {{ type filter hook postrouting priority 0; oifname \"eth0\" numgen random mod 100 < {loss_percent} counter drop; }}
             }}"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft (the nftables package)")?;
        if let Some(mut stdin) = nft.stdin.take() {
            std::io::Write::write_all(&mut stdin, rules.as_bytes())?;
        }
        let out = nft.wait_with_output()?;
        if !out.status.success() {
            bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let millis = format!("{}ms", delay.as_millis());
        let netem = self.run_in(
            i,
            &[
                "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &millis,
            ],
        );
        let delayed = if netem.is_ok() {
            format!("netem delay {millis} on the host's way out")
        } else {
            self.delay_line(i, delay)?;
            format!("no netem in this kernel: a delay line of {millis} on the host's way out")
        };
        Ok(format!(
            "{loss_percent} % loss each way (nftables); {delayed}"
        ))
    }

    /// Routes everything host `i` sends through a [`DELAY_LINE`] of `delay`.
    fn delay_line(&mut self, i: usize, delay: Duration) -> anyhow::Result<()> {
        const DEVICE: &str = "delay0";
        const TABLE: &str = "250";
        let host = &self.hosts[i];
        let (ns, v4, root_v4) = (host.ns.clone(), host.v4.to_string(), host.root_v4);
        let seconds = delay.as_secs_f64().to_string();
        let line = self.start_python(i, DELAY_LINE, &[DEVICE, &seconds], "the delay line")?;
        if line != "delay line up" {
            bail!("the delay line in {ns} said {line:?}");
        }
        // Packets the delay line writes back come in on its device and are forwarded out of
        // the link: forwarding on, and no source check against the host's own address.
        for key in [
            "net.ipv4.ip_forward=1".to_owned(),
            "net.ipv4.conf.all.rp_filter=0".to_owned(),
            "net.ipv4.conf.eth0.rp_filter=0".to_owned(),
            format!("net.ipv4.conf.{DEVICE}.rp_filter=0"),
            format!("net.ipv4.conf.{DEVICE}.accept_local=1"),
        ] {
            self.run_in(i, &["sysctl", "-qw", &key])?;
        }
        let root = root_v4.to_string();
        ip(&["-n", &ns, "link", "set", DEVICE, "up"])?;
        ip(&[
            "-n", &ns, "route", "add", "default", "via", &root, "dev", "eth0", "onlink", "table",
            TABLE,
        ])?;
        ip(&[
            "-n", &ns, "rule", "add", "iif", DEVICE, "lookup", TABLE, "pref", TABLE,
        ])?;
        // The host's routes out: the root side of its link, and the server's address.
        let mut outside = vec![format!("{root}/32")];
        if self.server_v4() != root_v4 {
            outside.push(format!("{}/32", self.server_v4()));
        }
        for dest in &outside {
            ip(&[
                "-n", &ns, "route", "replace", dest, "dev", DEVICE, "src", &v4,
            ])?;
        }
        Ok(())
    }

    /// Packets [`TestNet::impair`] has dropped on host `i`'s link so far, both ways.
    pub fn dropped(&self, i: usize) -> anyhow::Result<u64> {
        let out = self.run_in(i, &["nft", "list", "table", "inet", "bridgehead_loss"])?;
        let listing = String::from_utf8_lossy(&out.stdout);
        let mut words = listing.split_whitespace();
        let mut packets = 0;
        while let Some(word) = words.next() {
            if word == "packets" {
                packets += words.next().unwrap_or("0").parse::<u64>()?;
            }
        }
        Ok(packets)
    }

    /// The root namespace's address on host `i`'s link.
    pub fn root_v4(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].root_v4
    }

    /// The root-namespace address every host reaches: bind the server's agent endpoint here
    /// ([`crate::ServerOptions::agent_bind`]). It is [`TestNet::root_v4`] of host 0.
    pub fn server_v4(&self) -> Ipv4Addr {
        self.hosts[0].root_v4
    }

    /// Runs `command` (a program and its arguments) inside host `i`'s namespace and waits for
    /// it; fails with its stderr when it fails.
    pub fn run_in(&self, i: usize, command: &[&str]) -> anyhow::Result<Output> {
        let (program, args) = command.split_first().context("empty command")?;
        let out = Command::new("ip")
            .args(["netns", "exec", &self.hosts[i].ns, program])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {command:?} in {}", self.hosts[i].ns))?;
        if !out.status.success() {
            bail!(
                "{command:?} in {}: {}",
                self.hosts[i].ns,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// Adds `cidr` (e.g. `10.251.7.9/32`, `fd00:251:7::9/128`) to host `i`'s loopback: an
    /// address that exists only inside that namespace, so several hosts can have the same one.
    pub fn add_local_address(&self, i: usize, cidr: &str) -> anyhow::Result<()> {
        let mut args = vec!["-n", &self.hosts[i].ns, "addr", "add", cidr, "dev", "lo"];
        if cidr.contains(':') {
            args.push("nodad");
        }
        ip(&args)?;
        Ok(())
    }

    /// Writes `/etc/netns/<ns>/hosts` for host `i`: `localhost` plus `entries` (address,
    /// names), and a `resolv.conf` naming the namespace's own loopback. `ip netns exec` mounts
    /// them over `/etc/hosts` and `/etc/resolv.conf`, so processes started afterwards in that
    /// namespace (agents) resolve exactly these names; nothing else sees them.
    pub fn set_hosts(&mut self, i: usize, entries: &[(&str, &str)]) -> anyhow::Result<()> {
        // A resolver on the namespace's own loopback (where nothing listens, unless the test
        // starts one there): a name that is not in these hosts fails inside the namespace,
        // and no query leaves it.
        self.set_hosts_and_resolver(i, entries, "127.0.0.1")
    }

    /// [`TestNet::set_hosts`] with the resolver at `nameserver` (a resolver the test runs in
    /// one of its hosts, reached with [`TestNet::route_between_hosts`]).
    pub fn set_hosts_and_resolver(
        &mut self,
        i: usize,
        entries: &[(&str, &str)],
        nameserver: &str,
    ) -> anyhow::Result<()> {
        let dir = PathBuf::from(ETC_NETNS).join(&self.hosts[i].ns);
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (address, names) in entries {
            text.push_str(&format!("{address} {names}\n"));
        }
        self.hosts[i].hosts_dir = Some(dir.clone());
        let resolv = format!("nameserver {nameserver}\noptions timeout:1 attempts:1\n");
        // Another test process may remove an empty /etc/netns between the two steps: retry.
        let _etc = SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut attempts = 0;
        loop {
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join("hosts"), &text))
                .and_then(|()| std::fs::write(dir.join("resolv.conf"), &resolv));
            match written {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => {
                    attempts += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("writing {}/hosts", dir.display()))
                }
            }
        }
    }

    /// Starts a who-am-i target inside host `i`'s namespace on `addr` (`ip:port`, IPv6 in
    /// brackets; port 0 picks one; `[::]` takes IPv4 too) answering `name` and a newline to
    /// every connection; returns the bound address. It runs until the net is dropped.
    pub fn who_am_i(&mut self, i: usize, addr: &str, name: &str) -> anyhow::Result<SocketAddr> {
        let what = format!("who-am-i {name} on {addr}");
        let line = self.start_python(i, WHO_AM_I, &[name, addr], &what)?;
        match line.strip_prefix("who-am-i listening on ") {
            Some(bound) => Ok(bound.parse()?),
            None => bail!("{what} in {} said {line:?}", self.hosts[i].ns),
        }
    }

    /// Starts `script` under python3 with `args` inside host `i`'s namespace, kept with the
    /// net's targets (it exits when the net is dropped), and returns the first line it prints.
    /// One that prints nothing within [`TARGET_STARTUP`] failed: it is killed and its stderr
    /// is the error.
    fn start_python(
        &mut self,
        i: usize,
        script: &str,
        args: &[&str],
        what: &str,
    ) -> anyhow::Result<String> {
        let ns = &self.hosts[i].ns;
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(python())
            .args(["-c", script])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {what} (python3)"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout")?;
        let mut stderr = child.stderr.take().context("no stderr")?;
        self.targets.push(Target { child, stdin });
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(TARGET_STARTUP).unwrap_or_default();
        if line.trim().is_empty() {
            // It exits on failure; kill it in case it is stuck, then read why.
            if let Some(target) = self.targets.last_mut() {
                let _ = target.child.kill();
            }
            let mut why = String::new();
            let _ = stderr.read_to_string(&mut why);
            bail!("{what} in {}: {why}", self.hosts[i].ns);
        }
        Ok(line.trim().to_owned())
    }

    /// Starts a who-am-i on `[::]` (IPv4 and IPv6, every address of the namespace) in every
    /// host, all on one port, each answering its host's [`Host::name`]; returns the port.
    /// Start it before the agents, so nothing else holds the port in a namespace.
    pub fn who_am_i_everywhere(&mut self) -> anyhow::Result<u16> {
        let mut port = 0;
        for i in 0..self.hosts.len() {
            let name = self.hosts[i].name();
            port = self.who_am_i(i, &format!("[::]:{port}"), name)?.port();
        }
        Ok(port)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        self.targets.clear();
        for host in &self.hosts {
            // Deleting one end of a veth pair deletes both.
            let _ = ip(&["link", "del", &host.root_link]);
            let _ = ip(&["netns", "del", &host.ns]);
            if let Some(dir) = &host.hosts_dir {
                let _etc = SLOTS
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let _ = std::fs::remove_dir_all(dir);
                // Only succeeds once empty: the last net out leaves /etc as it found it.
                let _ = std::fs::remove_dir(ETC_NETNS);
            }
        }
    }
}

/// A `/24` of `10.250.0.0/16` that no interface of the root namespace has an address in. Called
/// with [`SLOTS`] held; other test processes start their search elsewhere (by pid).
fn free_slot() -> anyhow::Result<u8> {
    let start = std::process::id() as usize + COUNTER.load(Ordering::Relaxed) * 17;
    for n in 0..256 {
        let slot = ((start + n) % 256) as u8;
        if ip(&[
            "-4",
            "-o",
            "addr",
            "show",
            "to",
            &format!("10.250.{slot}.0/24"),
        ])?
        .trim()
        .is_empty()
        {
            return Ok(slot);
        }
    }
    bail!("every /24 of 10.250.0.0/16 is in use; stale test namespaces? (ip netns list)")
}

/// The python3 interpreter itself (not a version manager's shim, which would add startup time
/// per target), found once.
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| "python3".to_owned())
    })
}
