//! An image registry on the test's own network: CNCF Distribution's `registry`, built from its
//! Go module by `scripts/registry-build.sh` into `target/registry/bin`, serving HTTPS with a
//! certificate from a CA made at test time, on an ephemeral port of an address the test owns
//! (loopback, or a test host's namespace, where the real cluster's nodes reach it), its
//! storage in a temporary folder. No login: the test network is the test's alone.
//!
//! Images go in with `scripts/push-image.sh` (skopeo, a real client, verifying the
//! certificate); they come out to whoever pulls, and the registry's access log says who asked
//! for what ([`Registry::requests`]): the proof that a node pulled rather than imported.
//!
//! Left out: authentication (htpasswd or tokens), which the nodes' containerd would need as
//! pull secrets; what the tests prove is the path from registry to node, which a login does
//! not change.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use bridgehead_certs::Authority;

use crate::process::Process;

/// How long the registry may take to say it listens.
const STARTUP: Duration = Duration::from_secs(30);
/// How long one push may take (skopeo unpacks the archive, then uploads every blob).
const PUSH: Duration = Duration::from_secs(120);
/// How long one request of the test's own to the registry's API may take.
const REQUEST: Duration = Duration::from_secs(30);

/// What the registry's API answers for a manifest, an image index included (OCI's and Docker's
/// media types, as containerd asks).
const MANIFEST_TYPES: [&str; 4] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The registry binary, where `scripts/registry-build.sh` puts it.
pub fn binary() -> PathBuf {
    crate::process::bin_dir()
        .parent()
        .map(|target| target.join("registry/bin/registry"))
        .unwrap_or_default()
}

/// What a registry test needs besides root: the registry built and skopeo installed. The name
/// of each one missing, with how to get it.
pub fn missing() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !binary().exists() {
        missing.push("the registry (scripts/registry-build.sh)");
    }
    let skopeo = Command::new("skopeo")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !skopeo {
        missing.push("skopeo (scripts/install-test-deps.sh)");
    }
    missing
}

/// One line of the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Where the request came from.
    pub client: IpAddr,
    pub method: String,
    /// The request target (`/v2/<repository>/manifests/<reference>`, ...).
    pub path: String,
    pub status: u16,
}

impl Request {
    /// One line of the registry's access log, in Apache's combined format:
    /// `CLIENT - USER [TIME] "METHOD PATH PROTOCOL" STATUS SIZE "REFERER" "AGENT"`.
    pub fn parse(line: &str) -> Option<Request> {
        let (client, rest) = line.split_once(' ')?;
        let (_, rest) = rest.split_once('"')?;
        let (request, rest) = rest.split_once('"')?;
        let mut request = request.split(' ');
        let (method, path) = (request.next()?, request.next()?);
        let status = rest.split_whitespace().next()?.parse().ok()?;
        Some(Request {
            client: client.parse().ok()?,
            method: method.to_owned(),
            path: path.to_owned(),
            status,
        })
    }
}

/// A running registry; killed on drop, its storage removed.
#[derive(Debug)]
pub struct Registry {
    /// `HOST:PORT`: how image references, skopeo and containerd's `certs.d` name it.
    pub host: String,
    /// The CA that signed its certificate, PEM.
    pub ca_pem: String,
    /// A folder holding only that CA, as `ca.crt`: what skopeo's `--dest-cert-dir` and
    /// `scripts/push-image.sh --cert-dir` take.
    pub cert_dir: PathBuf,
    process: Process,
    access_log: PathBuf,
    /// Configuration, certificates, storage; removed on drop.
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Starts the registry on `ip` (an ephemeral port), inside network namespace `netns` when
    /// given, with a certificate for `ip`, and waits until it listens.
    pub fn start(ip: IpAddr, netns: Option<&str>) -> anyhow::Result<Registry> {
        let dir = tempfile::Builder::new().prefix("bh-registry-").tempdir()?;
        let path = |file: &str| dir.path().join(file);
        let authority = Authority::new("bridgehead-test-registry-ca")?;
        let serving = authority.server("registry", &[ip.to_string()])?;
        std::fs::create_dir_all(path("certs"))?;
        std::fs::write(path("certs/ca.crt"), &authority.ca.cert_pem)?;
        std::fs::write(path("registry.crt"), &serving.cert_pem)?;
        std::fs::write(path("registry.key"), &serving.key_pem)?;
        std::fs::write(
            path("config.yml"),
            config_text(dir.path(), SocketAddr::new(ip, 0)),
        )?;
        let binary = binary();
        let mut command = match netns {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns]).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        command
            .arg("serve")
            .arg(path("config.yml"))
            // Distribution exports traces over OTLP (to localhost) unless told not to.
            .env("OTEL_TRACES_EXPORTER", "none");
        let access_log = path("access.log");
        let process = Process::spawn_logged(command, &access_log)
            .with_context(|| format!("starting {}", binary.display()))?;
        // Its readiness line: `msg="listening on ADDR, tls"`.
        process.wait_log("listening on ", STARTUP)?;
        let log = process.stderr();
        let host = log
            .split_once("listening on ")
            .and_then(|(_, rest)| rest.split([',', '"']).next())
            .context("the registry's listening line")?
            .to_owned();
        Ok(Registry {
            host,
            ca_pem: authority.ca.cert_pem.clone(),
            cert_dir: path("certs"),
            process,
            access_log,
            _dir: dir,
        })
    }

    /// `HOST:PORT/<name>`: how a pod names image `name` (`bridgehead/bridgehead:0.1.0`) here.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.host)
    }

    /// Pushes the OCI archive `archive` as `name` (`REPOSITORY:TAG`) with
    /// `scripts/push-image.sh`, every platform it holds; returns `HOST:PORT/REPOSITORY@DIGEST`.
    pub fn push(&self, archive: &Path, name: &str) -> anyhow::Result<String> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/push-image.sh");
        let mut command = Command::new(&script);
        command
            .arg(archive)
            .arg(self.image(name))
            .arg("--cert-dir")
            .arg(&self.cert_dir);
        let out = crate::process::output_within(command, PUSH)
            .with_context(|| format!("{} {}", script.display(), archive.display()))?;
        if !out.status.success() {
            bail!(
                "pushing {} as {name}: {}\nregistry log:\n{}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// GETs `path` from the registry's API (curl, verifying its certificate), accepting any
    /// manifest type; the status and the body.
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let ca = self.cert_dir.join("ca.crt");
        let mut command = Command::new("curl");
        command
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(&ca)
            .args(["-w", "\n%{http_code}"]);
        for media_type in MANIFEST_TYPES {
            command.args(["-H", &format!("Accept: {media_type}")]);
        }
        command.arg(format!("https://{}{path}", self.host));
        let out = crate::process::output_within(command, REQUEST)?;
        if !out.status.success() {
            bail!("GET {path}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut body = out.stdout;
        let at = body
            .iter()
            .rposition(|&b| b == b'\n')
            .context("curl's status")?;
        let status = String::from_utf8_lossy(&body[at + 1..]).parse()?;
        body.truncate(at);
        Ok((status, body))
    }

    /// The manifest `reference` (a tag or a digest) of `repository`, parsed.
    pub fn manifest(&self, repository: &str, reference: &str) -> anyhow::Result<serde_json::Value> {
        let (status, body) = self.get(&format!("/v2/{repository}/manifests/{reference}"))?;
        if status != 200 {
            bail!(
                "GET manifest {repository}:{reference}: {status} {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// The blobs a node of this machine's platform fetches to run `repository:reference`:
    /// the config's digest, then each layer's, of its manifest (the one for
    /// `linux/<this architecture>` where the reference names an index).
    pub fn pulled_blobs(&self, repository: &str, reference: &str) -> anyhow::Result<Vec<String>> {
        let mut manifest = self.manifest(repository, reference)?;
        if let Some(entries) = manifest["manifests"].as_array() {
            let arch = oci_architecture();
            let entry = entries
                .iter()
                .find(|entry| {
                    entry["platform"]["os"] == "linux" && entry["platform"]["architecture"] == arch
                })
                .with_context(|| format!("{repository}:{reference} has no linux/{arch} image"))?;
            let digest = entry["digest"].as_str().context("a digest")?.to_owned();
            manifest = self.manifest(repository, &digest)?;
        }
        let mut blobs = vec![manifest["config"]["digest"]
            .as_str()
            .context("the config's digest")?
            .to_owned()];
        for layer in manifest["layers"].as_array().context("layers")? {
            blobs.push(layer["digest"].as_str().context("a digest")?.to_owned());
        }
        Ok(blobs)
    }

    /// Every request the registry served so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        std::fs::read_to_string(&self.access_log)
            .unwrap_or_default()
            .lines()
            .filter_map(Request::parse)
            .collect()
    }

    /// What the registry logged (its own log, not the access log).
    pub fn log(&self) -> String {
        self.process.stderr()
    }
}

/// This machine's architecture as OCI names it (`GOARCH`).
pub fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The registry's configuration: filesystem storage in `dir`, TLS on `addr`, deletes allowed
/// (a test may remove what it pushed), no upload purging or storage health check running in
/// the background, the access log on stdout.
fn config_text(dir: &Path, addr: SocketAddr) -> String {
    let dir = dir.display();
    format!(
        r#"version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: {dir}/storage
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: "{addr}"
  tls:
    certificate: {dir}/registry.crt
    key: {dir}/registry.key
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_access_log() {
        let line = r#"10.201.1.2 - - [07/Dec/2026:14:03:53 +0000] "GET /v2/bridgehead/bridgehead/manifests/0.1.0 HTTP/1.1" 200 1234 "" "containerd/1.6.20~ds1""#;
        assert_eq!(
            Request::parse(line),
            Some(Request {
                client: "10.201.1.2".parse().unwrap(),
                method: "GET".into(),
                path: "/v2/bridgehead/bridgehead/manifests/0.1.0".into(),
                status: 200,
            })
        );
        for bad in [
            "",
            "10.0.0.1",
            "nonsense - - [x] \"GET / HTTP/1.1\" 200 0",
            "10.0.0.1 - - [x] \"GET\" 200",
        ] {
            assert_eq!(Request::parse(bad), None, "{bad:?}");
        }
    }
}
