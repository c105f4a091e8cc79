//! etcd and kube-apiserver in a test host's network namespace, with a PKI made at test time,
//! service-account signing keys, an admin kubeconfig and an EgressSelectorConfiguration whose
//! `cluster` selection goes through a Bridgehead server.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bridgehead_certs::{Authority, CertKey};

use super::Binaries;
use crate::netns::TestNet;
use crate::process::Process;

/// How long kube-apiserver may take to become ready (about 3 s on an idle machine).
const STARTUP: Duration = Duration::from_secs(90);
/// kube-apiserver's port inside its namespace (nothing else listens there).
pub const APISERVER_PORT: u16 = 6443;
/// The `kubernetes` Service's ClusterIP: the first address of `--service-cluster-ip-range`.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The service-account issuer, and so the default audience of tokens.
pub const ISSUER: &str = "https://kubernetes.default.svc";

/// Where kube-apiserver's `cluster` traffic goes.
#[derive(Debug, Clone)]
pub enum Egress {
    /// Nowhere special: no EgressSelectorConfiguration.
    Direct,
    /// `proxyProtocol: HTTPConnect` over this Unix socket.
    Uds(PathBuf),
    /// `proxyProtocol: GRPC` over this Unix socket: konnectivity's default mode, which
    /// Bridgehead does not speak (the migration's starting point).
    GrpcUds(PathBuf),
    /// `proxyProtocol: HTTPConnect` over mTLS to `url` (`https://host:port`).
    Tcp {
        url: String,
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
    },
}

/// One more kube-apiserver of a [`ControlPlane`] ([`ControlPlane::add_apiserver`]); stopped
/// on drop.
#[derive(Debug)]
pub struct Apiserver {
    pub process: Process,
    /// An admin kubeconfig for this kube-apiserver.
    pub kubeconfig: PathBuf,
    /// Its namespace and arguments, to start it again ([`ControlPlane::start_again`]).
    command: (String, Vec<std::ffi::OsString>),
}

impl Apiserver {
    /// Stops it as kubelet stops a static pod: SIGTERM, SIGKILL after `grace`. How long it
    /// took to exit.
    pub fn stop(&mut self, grace: Duration) -> Duration {
        stop_within(&mut self.process, grace)
    }
}

/// SIGTERM, SIGKILL after `grace`; how long `process` took to exit.
fn stop_within(process: &mut Process, grace: Duration) -> Duration {
    let started = Instant::now();
    let _ = process.signal("TERM");
    if process.wait_exit(grace).is_err() {
        process.kill();
    }
    started.elapsed()
}

/// A running control plane. Stopped and removed on drop.
#[derive(Debug)]
pub struct ControlPlane {
    pub binaries: Binaries,
    /// `https://ADDRESS:6443`.
    pub url: String,
    /// The address kube-apiserver serves on (its host's).
    pub address: Ipv4Addr,
    /// An admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// The cluster CA (serving certificate, client certificates).
    pub ca: PathBuf,
    authority: Authority,
    apiserver: Process,
    /// kube-apiserver's namespace and arguments, to start it again.
    apiserver_command: (String, Vec<std::ffi::OsString>),
    _etcd: Process,
    dir: tempfile::TempDir,
}

/// The cluster's CA and kube-apiserver's certificates (serving, admin, front proxy, kubelet
/// client) and service-account keys, written into `dir`.
/// `others`: the addresses of the control plane's other kube-apiservers, named in the serving
/// certificate too (they share it, as kubeadm's control-plane nodes share the CA: each has its
/// own pair for the same names).
fn write_pki(dir: &Path, address: Ipv4Addr, others: &[Ipv4Addr]) -> anyhow::Result<Authority> {
    let path = |file: &str| dir.join(file);
    let authority = Authority::new("kubernetes-ca")?;
    write(&path("ca.crt"), &authority.ca.cert_pem)?;
    let mut names: Vec<String> = vec![
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        // The `kubernetes` Service's ClusterIP (the first of the service range), which
        // pods' in-cluster configuration dials, as kubeadm's certificate names it.
        KUBERNETES_SERVICE_IP.into(),
        "127.0.0.1".into(),
        address.to_string(),
    ];
    names.extend(others.iter().map(ToString::to_string));
    let serving = authority.server("kube-apiserver", &names)?;
    write_pair(dir, "apiserver", &serving)?;
    let admin = authority.client("kubernetes-admin", &["system:masters"], &[])?;
    write_pair(dir, "admin", &admin)?;
    let front_proxy = authority.client("front-proxy-client", &[], &[])?;
    write_pair(dir, "front-proxy", &front_proxy)?;
    // What kube-apiserver shows kubelets (as kubeadm's apiserver-kubelet-client): real
    // nodes authenticate it against the cluster CA and authorize it by webhook.
    let kubelet_client =
        authority.client("kube-apiserver-kubelet-client", &["system:masters"], &[])?;
    write_pair(dir, "apiserver-kubelet-client", &kubelet_client)?;
    let signing = rcgen::KeyPair::generate().context("service-account key")?;
    write(&path("sa.key"), &signing.serialize_pem())?;
    write(&path("sa.pub"), &signing.public_key_pem())?;

    Ok(authority)
}

/// etcd in namespace `ns`, its data in `data`, clients on 127.0.0.1:2379, and on `shared`'s
/// 2379 too when given (the address the other control-plane nodes' kube-apiservers dial).
fn spawn_etcd(
    ns: &str,
    binaries: &Binaries,
    data: &Path,
    shared: Option<Ipv4Addr>,
) -> anyhow::Result<Process> {
    let mut etcd = in_namespace(ns, &binaries.etcd);
    let clients = match shared {
        Some(address) => format!("http://127.0.0.1:2379,http://{address}:2379"),
        None => "http://127.0.0.1:2379".to_owned(),
    };
    etcd.arg("--name=test")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={clients}"))
        .args([
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=test=http://127.0.0.1:2380",
            "--listen-metrics-urls=",
            "--log-level=warn",
        ]);
    let (etcd, _) = Process::spawn(etcd, &[])?;
    Ok(etcd)
}

/// kube-apiserver's command in namespace `ns`, its files in `dir`, advertising `address`,
/// with the egress selector `egress` asks for.
fn apiserver_command(
    ns: &str,
    binaries: &Binaries,
    dir: &Path,
    address: Ipv4Addr,
    egress: &Egress,
) -> anyhow::Result<Command> {
    let path = |file: &str| dir.join(file);
    let mut apiserver = in_namespace(ns, &binaries.kube_apiserver);
    let file = |flag: &str, name: &str| format!("--{flag}={}", path(name).display());
    apiserver
        .args([
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=0.0.0.0",
            &format!("--secure-port={APISERVER_PORT}"),
            &format!("--advertise-address={address}"),
            "--endpoint-reconciler-type=none",
            &format!("--service-account-issuer={ISSUER}"),
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/12",
            // Webhooks and aggregated APIs are dialed at their endpoints' IPs (through the
            // egress selector), not at a service DNS name no agent could resolve.
            "--enable-aggregator-routing=true",
            "--kubelet-preferred-address-types=InternalIP",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        ])
        .arg(file("tls-cert-file", "apiserver.crt"))
        .arg(file("tls-private-key-file", "apiserver.key"))
        .arg(file("client-ca-file", "ca.crt"))
        .arg(file("requestheader-client-ca-file", "ca.crt"))
        .arg(file("proxy-client-cert-file", "front-proxy.crt"))
        .arg(file("proxy-client-key-file", "front-proxy.key"))
        .arg(file(
            "kubelet-client-certificate",
            "apiserver-kubelet-client.crt",
        ))
        .arg(file("kubelet-client-key", "apiserver-kubelet-client.key"))
        .arg(file("service-account-key-file", "sa.pub"))
        .arg(file("service-account-signing-key-file", "sa.key"))
        .arg(file("cert-dir", "apiserver-certs"));
    if let Some(config) = egress_config(egress) {
        write(&path("egress.yaml"), &config)?;
        apiserver.arg(file("egress-selector-config-file", "egress.yaml"));
    }
    Ok(apiserver)
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver on host `host` of `net` and waits until kube-apiserver
    /// is ready. `extra` flags go to kube-apiserver.
    pub fn start(
        binaries: &Binaries,
        net: &mut TestNet,
        host: usize,
        egress: Egress,
        extra: &[&str],
    ) -> anyhow::Result<ControlPlane> {
        ControlPlane::start_first_of(binaries, net, host, egress, extra, &[])
    }

    /// [`ControlPlane::start`] as the first control-plane node of several, whose other
    /// kube-apiservers ([`ControlPlane::add_apiserver_on`]) serve at `others`: the serving
    /// certificate names them too, etcd (the one member, shared) also serves on this host's
    /// address, and every kube-apiserver keeps its own address in the `kubernetes` Service's
    /// endpoints (`--endpoint-reconciler-type=lease`, as kubeadm's HA control planes run).
    pub fn start_first_of(
        binaries: &Binaries,
        net: &mut TestNet,
        host: usize,
        egress: Egress,
        extra: &[&str],
        others: &[Ipv4Addr],
    ) -> anyhow::Result<ControlPlane> {
        let dir = tempfile::tempdir()?;
        let path = |file: &str| dir.path().join(file);
        let address = net.host(host).v4();
        // Nothing kube-apiserver looks up leaves its namespace.
        net.set_hosts(host, &[])?;
        let ns = net.host(host).ns_name().to_owned();

        let authority = write_pki(dir.path(), address, others)?;
        let shared = (!others.is_empty()).then_some(address);
        let etcd = spawn_etcd(&ns, binaries, &path("etcd"), shared)?;
        let mut apiserver = apiserver_command(&ns, binaries, dir.path(), address, &egress)?;
        if shared.is_some() {
            // A later flag wins: this replaces `none`.
            apiserver.arg("--endpoint-reconciler-type=lease");
        }
        apiserver.args(extra);
        // After `ip netns exec NS PROGRAM`: the arguments.
        let apiserver_command = (
            ns.clone(),
            apiserver
                .get_args()
                .skip(4)
                .map(ToOwned::to_owned)
                .collect(),
        );
        let (apiserver, _) = Process::spawn(apiserver, &[])?;

        let url = format!("https://{address}:{APISERVER_PORT}");
        let kubeconfig = admin_kubeconfig(dir.path(), &url, "admin.kubeconfig")?;
        let control_plane = ControlPlane {
            binaries: binaries.clone(),
            url,
            address,
            kubeconfig,
            ca: path("ca.crt"),
            authority,
            apiserver,
            apiserver_command,
            _etcd: etcd,
            dir,
        };
        control_plane.wait_ready()?;
        Ok(control_plane)
    }

    /// Another kube-apiserver of this control plane on `port` of the same host (the same
    /// etcd, certificates and keys), its `cluster` traffic going where `egress` says: an HA
    /// control plane's second or third kube-apiserver, each with a Bridgehead server of its
    /// own. Ready when returned.
    pub fn add_apiserver(&self, egress: &Egress, port: u16) -> anyhow::Result<Apiserver> {
        let (ns, _) = &self.apiserver_command;
        self.spawn_apiserver(ns, self.address, port, egress)
    }

    /// Another kube-apiserver of this control plane in namespace `ns` (another control-plane
    /// node's), serving on `address:6443` and advertising it, its storage this control plane's
    /// etcd (at [`ControlPlane::address`]), its `cluster` traffic going where `egress` says.
    /// The control plane must have been started with `address` among its `others`
    /// ([`ControlPlane::start_first_of`]). Ready when returned.
    pub fn add_apiserver_on(
        &self,
        ns: &str,
        address: Ipv4Addr,
        egress: &Egress,
    ) -> anyhow::Result<Apiserver> {
        self.spawn_apiserver(ns, address, APISERVER_PORT, egress)
    }

    /// A kube-apiserver with this one's flags but for its namespace, address, port and egress.
    fn spawn_apiserver(
        &self,
        ns: &str,
        address: Ipv4Addr,
        port: u16,
        egress: &Egress,
    ) -> anyhow::Result<Apiserver> {
        let config = egress_config(egress).context("another kube-apiserver has an egress")?;
        let stem = format!("{address}-{port}");
        let egress_file = self.dir.path().join(format!("egress-{stem}.yaml"));
        write(&egress_file, &config)?;
        let args: Vec<std::ffi::OsString> = self
            .apiserver_command
            .1
            .iter()
            .map(|arg| {
                let text = arg.to_string_lossy();
                if text.starts_with("--secure-port=") {
                    format!("--secure-port={port}").into()
                } else if text.starts_with("--egress-selector-config-file=") {
                    format!("--egress-selector-config-file={}", egress_file.display()).into()
                } else if text.starts_with("--advertise-address=") {
                    format!("--advertise-address={address}").into()
                } else if text.starts_with("--etcd-servers=") && address != self.address {
                    format!("--etcd-servers=http://{}:2379", self.address).into()
                } else {
                    arg.clone()
                }
            })
            .collect();
        let mut command = in_namespace(ns, &self.binaries.kube_apiserver);
        command.args(&args);
        let (process, _) = Process::spawn(command, &[])?;
        let url = format!("https://{address}:{port}");
        let kubeconfig =
            admin_kubeconfig(self.dir.path(), &url, &format!("admin-{stem}.kubeconfig"))?;
        let apiserver = Apiserver {
            process,
            kubeconfig,
            command: (ns.to_owned(), args),
        };
        self.wait_ready_at(&apiserver.kubeconfig, &apiserver.process)?;
        Ok(apiserver)
    }

    /// Points [`ControlPlane::url`] and [`ControlPlane::kubeconfig`] at `url` (a load balancer
    /// in front of the kube-apiservers, as a kubeadm HA cluster's `controlPlaneEndpoint`), and
    /// waits until kube-apiserver answers ready there; returns the kubeconfig of this
    /// control plane's own kube-apiserver, which it stops using. What is given the kubeconfig
    /// from here on (controllers, kubelets, the tests' kubectl) goes through `url`.
    pub fn use_endpoint(&mut self, url: &str) -> anyhow::Result<PathBuf> {
        let direct = self.kubeconfig.clone();
        self.kubeconfig = admin_kubeconfig(self.dir.path(), url, "admin-endpoint.kubeconfig")?;
        self.url = url.to_owned();
        self.wait_ready()?;
        Ok(direct)
    }

    /// kubectl with `kubeconfig`, its output piped, running.
    pub fn kubectl_child(&self, kubeconfig: &Path, args: &[&str]) -> std::process::Child {
        Command::new(&self.binaries.kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl")
    }

    /// Starts `apiserver` (one of [`ControlPlane::add_apiserver_on`]'s, stopped) again with
    /// the flags it ran with, and waits until it is ready at its own address.
    pub fn start_again(&self, apiserver: &mut Apiserver) -> anyhow::Result<()> {
        let (ns, args) = &apiserver.command;
        let mut command = in_namespace(ns, &self.binaries.kube_apiserver);
        command.args(args);
        apiserver.process = Process::spawn(command, &[])?.0;
        self.wait_ready_at(&apiserver.kubeconfig, &apiserver.process)
    }

    /// Stops this control plane's own kube-apiserver as [`Apiserver::stop`] does; how long
    /// it took to exit.
    pub fn stop_own_apiserver(&mut self, grace: Duration) -> Duration {
        stop_within(&mut self.apiserver, grace)
    }

    /// Starts this control plane's own kube-apiserver again with the flags it ran with (its
    /// egress file as it is), and waits until it is ready as `kubeconfig` reaches it (its own
    /// address, not a load balancer's, which another kube-apiserver may answer).
    pub fn start_own_apiserver_again(&mut self, kubeconfig: &Path) -> anyhow::Result<()> {
        let (ns, args) = &self.apiserver_command;
        let mut command = in_namespace(ns, &self.binaries.kube_apiserver);
        command.args(args);
        self.apiserver = Process::spawn(command, &[])?.0;
        self.wait_ready_at(kubeconfig, &self.apiserver)
    }

    /// Polls `/readyz` (bounded: nothing else tells when kube-apiserver is ready).
    fn wait_ready(&self) -> anyhow::Result<()> {
        self.wait_ready_at(&self.kubeconfig, &self.apiserver)
    }

    /// [`ControlPlane::wait_ready`] of the kube-apiserver `kubeconfig` names, `process`.
    fn wait_ready_at(&self, kubeconfig: &Path, process: &Process) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let output = self.kubectl_as(kubeconfig, &["get", "--raw=/readyz"], None)?;
            if output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == "ok" {
                tracing_line(&format!(
                    "kube-apiserver ready ({}) after {:?}",
                    kubeconfig.display(),
                    started.elapsed()
                ));
                return Ok(());
            }
            if started.elapsed() > STARTUP {
                bail!(
                    "kube-apiserver not ready after {STARTUP:?}: {}\nlog:\n{}",
                    String::from_utf8_lossy(&output.stderr),
                    process.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What kube-apiserver logged so far.
    pub fn log(&self) -> String {
        self.apiserver.stderr()
    }

    /// Kills kube-apiserver (SIGKILL): the API is gone, etcd stays.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.kill();
    }

    /// Stops kube-apiserver (SIGTERM, SIGKILL after 10 s as a short grace period would), writes
    /// its EgressSelectorConfiguration anew for `egress`, starts it again with the same flags
    /// and waits until it is ready: what an operator's edit of the egress file and restart does.
    pub fn restart_apiserver(&mut self, egress: &Egress) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.start_apiserver(egress)
    }

    /// Stops kube-apiserver (SIGTERM, SIGKILL after 10 s), as kubelet stops its static pod
    /// when its manifest is moved away; [`ControlPlane::start_apiserver`] brings it back.
    pub fn stop_apiserver(&mut self) {
        stop_within(&mut self.apiserver, Duration::from_secs(10));
    }

    /// Starts kube-apiserver again with the flags it started with and its egress file written
    /// anew for `egress`, and waits until it is ready.
    pub fn start_apiserver(&mut self, egress: &Egress) -> anyhow::Result<()> {
        let config = egress_config(egress).context("a restart keeps an egress selector")?;
        write(&self.dir.path().join("egress.yaml"), &config)?;
        let (ns, args) = &self.apiserver_command;
        let mut command = in_namespace(ns, &self.binaries.kube_apiserver);
        command.args(args);
        let (apiserver, _) = Process::spawn(command, &[])?;
        self.apiserver = apiserver;
        self.wait_ready()
    }

    /// kube-apiserver's arguments (its program aside), as it runs now.
    pub fn apiserver_args(&self) -> Vec<String> {
        self.apiserver_command
            .1
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect()
    }

    /// Stops kube-apiserver, and starts it again with its arguments and `flags` after them
    /// (a later flag wins), and waits until it is ready: what kubelet does when an operator
    /// adds flags to kube-apiserver's static pod manifest.
    pub fn restart_apiserver_adding(&mut self, flags: &[String]) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.apiserver_command
            .1
            .extend(flags.iter().map(std::ffi::OsString::from));
        let (ns, args) = &self.apiserver_command;
        let mut command = in_namespace(ns, &self.binaries.kube_apiserver);
        command.args(args);
        let (apiserver, _) = Process::spawn(command, &[])?;
        self.apiserver = apiserver;
        self.wait_ready()
    }

    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.kubectl_as(&self.kubeconfig, args, None)
    }

    /// Runs kubectl with `kubeconfig`, `stdin` fed to it if given.
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> anyhow::Result<Output> {
        let mut command = Command::new(&self.binaries.kubectl);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=30s")
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().context("running kubectl")?;
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .context("kubectl stdin")?
                .write_all(input.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// kubectl with the admin kubeconfig; its stdout, or an error with its stderr.
    /// kube-apiserver's own count of requests for `resource` with `verb`
    /// (`apiserver_request_total`), e.g. to show that something asked nothing.
    pub fn requests(&self, resource: &str, verb: &str) -> anyhow::Result<f64> {
        let metrics = self.kubectl_ok(&["get", "--raw", "/metrics"])?;
        let (resource, verb) = (
            format!("resource=\"{resource}\""),
            format!("verb=\"{verb}\""),
        );
        Ok(metrics
            .lines()
            .filter(|line| line.starts_with("apiserver_request_total{"))
            .filter(|line| line.contains(&resource) && line.contains(&verb))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = self.kubectl(args)?;
        if !output.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        let output = self.kubectl_as(&self.kubeconfig, &["apply", "-f", "-"], Some(yaml))?;
        if !output.status.success() {
            bail!(
                "kubectl apply: {}\n{yaml}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A kubeconfig for user `user` in `groups`, authenticated by a client certificate from
    /// the cluster CA (what RBAC then allows is the test's business).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let pair = self.authority.client(user, groups, &[])?;
        let stem = format!("user-{user}").replace(':', "_");
        write_pair(self.dir.path(), &stem, &pair)?;
        let path = self.dir.path().join(format!("{stem}.kubeconfig"));
        let file = |name: String| self.dir.path().join(name);
        write(
            &path,
            &kubeconfig_text(
                &self.url,
                &self.ca,
                &file(format!("{stem}.crt")),
                &file(format!("{stem}.key")),
            ),
        )?;
        Ok(path)
    }

    /// A fresh token for service account `namespace/account` (TokenRequest), for `audience`,
    /// valid `seconds`, bound to pod `bound_pod` when given.
    pub fn token(
        &self,
        namespace: &str,
        account: &str,
        audience: &str,
        seconds: u32,
        bound_pod: Option<&str>,
    ) -> anyhow::Result<String> {
        let duration = format!("--duration={seconds}s");
        let audience = format!("--audience={audience}");
        let mut args = vec![
            "create", "token", account, "-n", namespace, &audience, &duration,
        ];
        let pod;
        if let Some(name) = bound_pod {
            pod = format!("--bound-object-name={name}");
            args.extend(["--bound-object-kind=Pod", &pod]);
        }
        Ok(self.kubectl_ok(&args)?.trim().to_owned())
    }

    /// The scratch directory (certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a certificate from the cluster CA (for stand-ins whose TLS kube-apiserver
    /// checks against a `caBundle` of this CA).
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// The EgressSelectorConfiguration kube-apiserver reads, as the docs show it.
fn egress_config(egress: &Egress) -> Option<String> {
    let protocol = match egress {
        Egress::GrpcUds(_) => "GRPC",
        _ => "HTTPConnect",
    };
    let transport = match egress {
        Egress::Direct => return None,
        Egress::Uds(path) | Egress::GrpcUds(path) => {
            format!("uds:\n        udsName: {}", path.display())
        }
        Egress::Tcp {
            url,
            ca,
            cert,
            key,
        } => format!(
            "tcp:\n        url: {url}\n        tlsConfig:\n          caBundle: {}\n          clientCert: {}\n          clientKey: {}",
            ca.display(),
            cert.display(),
            key.display()
        ),
    };
    Some(format!(
        "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: {protocol}\n    transport:\n      {transport}\n"
    ))
}

/// Writes `dir/file`, an admin kubeconfig (`system:masters`) for the kube-apiserver at `url`;
/// its path.
fn admin_kubeconfig(dir: &Path, url: &str, file: &str) -> anyhow::Result<PathBuf> {
    let path = |name: &str| dir.join(name);
    let kubeconfig = path(file);
    let text = kubeconfig_text(url, &path("ca.crt"), &path("admin.crt"), &path("admin.key"));
    write(&kubeconfig, &text)?;
    Ok(kubeconfig)
}

pub(crate) fn kubeconfig_text(url: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {}\nusers:\n- name: user\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
        ca.display(),
        cert.display(),
        key.display()
    )
}

/// `ip netns exec NS program`.
fn in_namespace(ns: &str, program: &Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_pair(dir: &Path, stem: &str, pair: &CertKey) -> anyhow::Result<()> {
    write(&dir.join(format!("{stem}.crt")), &pair.cert_pem)?;
    write(&dir.join(format!("{stem}.key")), &pair.key_pem)
}

/// A line on the terminal past the test harness's capture (how long the control plane took).
fn tracing_line(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
