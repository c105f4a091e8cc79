//! A real Prometheus (Debian's, unpacked into `target/prometheus` by `scripts/prometheus.sh`)
//! scraping the test's processes and evaluating deploy/monitoring's rules, and its promtool.
//!
//! Prometheus listens on 127.0.0.1, port 0; its address is read back from the process's
//! listening sockets, since it does not print the port it got.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::process::{wait_until, Process};

/// How long Prometheus may take to open its port.
const STARTUP: Duration = Duration::from_secs(30);

/// The unpacked binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
}

impl Binaries {
    /// The binaries under `target/prometheus/bin`, if `scripts/prometheus.sh` put them there.
    pub fn find() -> Option<Binaries> {
        let bin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/prometheus/bin");
        let binaries = Binaries {
            prometheus: bin.join("prometheus"),
            promtool: bin.join("promtool"),
        };
        (binaries.prometheus.is_file() && binaries.promtool.is_file()).then_some(binaries)
    }
}

/// The binaries, or a loud skip of `test` without them.
pub fn require(test: &str) -> Option<Binaries> {
    let found = Binaries::find();
    if found.is_none() {
        crate::skip::skip(
            test,
            "Prometheus and promtool not unpacked: run scripts/prometheus.sh (needs apt-get)",
        );
    }
    found
}

/// A running Prometheus; killed on drop.
#[derive(Debug)]
pub struct Prometheus {
    pub process: Process,
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Prometheus with `config` (prometheus.yml's text; `rule_files` may name absolute paths).
    pub fn start(binaries: &Binaries, config: &str) -> anyhow::Result<Prometheus> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config)?;
        let mut command = Command::new(&binaries.prometheus);
        command
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .current_dir(dir.path());
        let (process, _) =
            Process::spawn_with_stdin(command, std::process::Stdio::null(), &[], Duration::ZERO)
                .context("starting prometheus")?;
        let pid = process.pid();
        let mut addr = None;
        wait_until(STARTUP, || {
            addr = crate::procfs::listening_v4(pid).into_iter().next();
            addr.is_some()
        })
        .with_context(|| format!("prometheus opened no port:\n{}", process.stderr()))?;
        let addr = addr.context("no address")?;
        Ok(Prometheus {
            process,
            addr,
            _dir: dir,
        })
    }

    /// The result vector of an instant query.
    pub fn query(&self, expr: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let body = get(self.addr, &path)?;
        let answer: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("{expr}: {body}"))?;
        if answer["status"] != "success" {
            bail!("{expr}: {body}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// The body of `GET path`, asked in HTTP/1.0 so that Go's server answers unchunked and closes.
fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(crate::client::IO_TIMEOUT))?;
    write!(tcp, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)?;
    let (_, body) = response
        .split_once("\r\n\r\n")
        .context("no response head")?;
    Ok(body.to_owned())
}

/// `promtool` run with `args` in `dir`: its output, or an error with it.
pub fn promtool(binaries: &Binaries, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(&binaries.promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .context("running promtool")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!("promtool {args:?} failed:\n{text}");
    }
    Ok(text)
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The prometheus-operator release whose CRDs (PodMonitor, PrometheusRule, ServiceMonitor)
/// deploy/monitoring and the chart are validated against.
pub const OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";

/// The folder of [`OPERATOR`]'s CRDs, from its Go module (`go mod download`); `None` when Go is
/// missing.
pub fn operator_crds() -> anyhow::Result<Option<PathBuf>> {
    let download = Command::new("go")
        .args(["mod", "download", "-json", OPERATOR])
        .env("GOFLAGS", "-mod=mod")
        .output();
    let Ok(download) = download else {
        return Ok(None);
    };
    if !download.status.success() {
        bail!(
            "go mod download {OPERATOR}: {}{}",
            String::from_utf8_lossy(&download.stdout),
            String::from_utf8_lossy(&download.stderr)
        );
    }
    let module: serde_json::Value = serde_json::from_slice(&download.stdout)?;
    let dir = module["Dir"]
        .as_str()
        .context("no Dir from go mod download")?;
    Ok(Some(
        PathBuf::from(dir).join("example/prometheus-operator-crd"),
    ))
}

/// [`operator_crds`] applied to `control_plane`, each waited for until established.
pub fn install_operator_crds(
    control_plane: &crate::kubernetes::ControlPlane,
    crds: &Path,
) -> anyhow::Result<()> {
    for kind in ["prometheusrules", "podmonitors", "servicemonitors"] {
        let file = crds.join(format!("monitoring.coreos.com_{kind}.yaml"));
        control_plane
            .kubectl_ok(&["apply", "--server-side", "-f", &file.display().to_string()])
            .with_context(|| format!("{kind} CRD"))?;
        control_plane.kubectl_ok(&[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            &format!("crd/{kind}.monitoring.coreos.com"),
        ])?;
    }
    Ok(())
}
