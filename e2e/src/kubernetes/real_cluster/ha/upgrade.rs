//! A rolling upgrade of Bridgehead on an HA cluster (issue 50), the steps docs/operations.md's
//! "Upgrading Bridgehead" gives an operator: the next version's release image built
//! (`scripts/release.sh --image-only --version`) and pushed to the registry the nodes pull
//! from; each control-plane node's server replaced by an edit of its static pod manifest
//! (kubelet stops the old pod and starts the new one); the agents' DaemonSet rolled with
//! surge. And what says a step is done: the `bridgehead_build_info{version}` each server and
//! each agent exports.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::drills::SERVER_HEALTH_PORT;
use super::{control_plane_name, RealCluster};
use crate::kubernetes::real_cluster::{metric_sum, REPOSITORY};

/// The agents' DaemonSet (deploy/agent) and its container.
const AGENT_DAEMONSET: &str = "bridgehead-agent";
const AGENT_CONTAINER: &str = "agent";
/// What selects the agents' pods.
const AGENT_SELECTOR: &str = "app.kubernetes.io/name=bridgehead-agent";
/// The agents' health port (deploy/agent's `--health-server-port`), which serves `/metrics`.
const AGENT_HEALTH_PORT: u16 = 8134;
/// deploy/server-static-pod's manifest, in a control-plane node's `/etc/kubernetes`.
const SERVER_MANIFEST: &str = "manifests/konnectivity-server.yaml";
/// The agents' update strategy for an upgrade (docs/operations.md): each node's new agent
/// starts, and connects, before its old one is told to stop, so no node is without an agent.
const SURGE: &str = r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"maxSurge":"10%","maxUnavailable":0}}}}"#;

/// The release image of this tree under another version, ready to push.
#[derive(Debug)]
pub struct ReleaseImage {
    pub version: String,
    /// The OCI archive `scripts/release.sh` wrote.
    pub archive: PathBuf,
    /// How long `scripts/release.sh` took.
    pub took: Duration,
    _dir: tempfile::TempDir,
}

impl ReleaseImage {
    /// `scripts/release.sh --image-only --platform linux/amd64 --version VERSION`: the image
    /// the nodes run (`scripts/image.sh` builds it the same way), as `version`. Only the
    /// workspace's crates build again (build-info's `BRIDGEHEAD_VERSION`).
    pub fn build(version: &str) -> anyhow::Result<ReleaseImage> {
        let dir = tempfile::Builder::new().prefix("bh-release-").tempdir()?;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/release.sh");
        let mut command = Command::new(&script);
        // It runs cargo: this test's package environment stays here.
        crate::process::without_package_env(&mut command);
        let started = Instant::now();
        let out = command
            .args([
                "--image-only",
                "--platform",
                "linux/amd64",
                "--version",
                version,
            ])
            .arg("--out")
            .arg(dir.path())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "{} --version {version}: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(ReleaseImage {
            version: version.to_owned(),
            archive: dir.path().join("bridgehead.oci.tar"),
            took: started.elapsed(),
            _dir: dir,
        })
    }
}

/// The version after `version`, for a drill: the patch number raised and marked as the
/// drill's (`0.1.0` -> `0.1.1-drill`), so it never names a real release.
pub fn next_version(version: &str) -> String {
    let release = version.split(['-', '+']).next().unwrap_or(version);
    let mut parts: Vec<u64> = release.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    format!("{}.{}.{}-drill", parts[0], parts[1], parts[2] + 1)
}

/// The `version` label of `bridgehead_build_info` in Prometheus text.
fn build_version(metrics: &str) -> Option<String> {
    let line = metrics
        .lines()
        .find(|line| line.starts_with("bridgehead_build_info{"))?;
    let (_, rest) = line.split_once("version=\"")?;
    rest.split_once('"').map(|(version, _)| version.to_owned())
}

impl RealCluster {
    /// Pushes `image` to the cluster's registry under its version, as a release pipeline
    /// pushes a new version to the registry the nodes pull from.
    pub fn publish_release(&self, image: &ReleaseImage) -> anyhow::Result<()> {
        self.registry
            .push(&image.archive, &format!("{REPOSITORY}:{}", image.version))?;
        Ok(())
    }

    /// Points control-plane host `host`'s server at `version`'s image, as an operator edits
    /// its `/etc/kubernetes/manifests/konnectivity-server.yaml`: the `image:` tag changed,
    /// written beside the folder and renamed into it, so kubelet never reads half a file (it
    /// reads every file in the folder, so not there). kubelet then stops the old pod (SIGTERM,
    /// its grace period) and starts the new one.
    pub fn upgrade_server_of(&self, host: usize, version: &str) -> anyhow::Result<()> {
        let etc = self.etc_kubernetes_of(host)?;
        let manifest = etc.join(SERVER_MANIFEST);
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("reading {}", manifest.display()))?;
        let image = format!("image: {}:", self.registry.image(REPOSITORY));
        let line = text
            .lines()
            .find(|line| line.trim_start().starts_with(&image))
            .with_context(|| format!("{} has no {image:?} line", manifest.display()))?;
        let indent = &line[..line.len() - line.trim_start().len()];
        let edited = text.replacen(line, &format!("{indent}{image}{version}"), 1);
        let staged = etc.join("konnectivity-server.yaml.next");
        std::fs::write(&staged, edited)?;
        std::fs::rename(&staged, &manifest)
            .with_context(|| format!("replacing {}", manifest.display()))
    }

    /// The version each control-plane node's server reports (`bridgehead_build_info`), in
    /// host order; empty for one that does not answer.
    pub fn server_versions(&self) -> Vec<String> {
        (0..=self.others.len())
            .map(|host| {
                let metrics = self
                    .host_get(host, SERVER_HEALTH_PORT, "/metrics")
                    .unwrap_or_default();
                build_version(&metrics).unwrap_or_default()
            })
            .collect()
    }

    /// Waits (bounded poll on the servers' metrics) until host `host`'s server reports
    /// `version` and every server, that one included, has each other one as a peer: the new
    /// server found by its Lease and peered. How long that took; at most `within`.
    pub fn wait_server_upgraded(
        &self,
        host: usize,
        version: &str,
        within: Duration,
    ) -> anyhow::Result<Duration> {
        let servers = 1 + self.others.len();
        let peers = (servers - 1) as f64;
        let started = Instant::now();
        loop {
            let metrics: Vec<String> = (0..servers)
                .map(|h| {
                    self.host_get(h, SERVER_HEALTH_PORT, "/metrics")
                        .unwrap_or_default()
                })
                .collect();
            let reported = build_version(&metrics[host]);
            let seen: Vec<f64> = metrics
                .iter()
                .map(|m| metric_sum(m, "bridgehead_server_peers_connected", &[]))
                .collect();
            if reported.as_deref() == Some(version) && seen.iter().all(|&p| p == peers) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > within {
                bail!(
                    "{}'s server reports {reported:?}, not {version}, or peers are missing: {seen:?}, want {peers} each\n{}",
                    control_plane_name(host),
                    self.describe_pods("kube-system")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Rolls the agents' DaemonSet to `version`'s image as docs/operations.md says: its update
    /// strategy set to surge ([`SURGE`]), the image set (`kubectl set image`), the rollout
    /// waited on, at most `within`.
    pub fn roll_agents_to(&self, version: &str, within: Duration) -> anyhow::Result<()> {
        let cp = &self.control_plane;
        cp.kubectl_ok(&[
            "-n",
            "kube-system",
            "patch",
            "daemonset",
            AGENT_DAEMONSET,
            "--type=merge",
            "-p",
            SURGE,
        ])?;
        let image = self.registry.image(&format!("{REPOSITORY}:{version}"));
        cp.kubectl_ok(&[
            "-n",
            "kube-system",
            "set",
            "image",
            &format!("daemonset/{AGENT_DAEMONSET}"),
            &format!("{AGENT_CONTAINER}={image}"),
        ])?;
        self.rollout(AGENT_DAEMONSET, within)
    }

    /// Each agent pod's node and the version it reports (`bridgehead_build_info` on its
    /// health port, read from its node); pods being deleted left out.
    pub fn agent_versions(&self) -> anyhow::Result<Vec<(String, String)>> {
        let pods = self.control_plane.kubectl_ok(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            AGENT_SELECTOR,
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ])?;
        let nodes: Vec<_> = self
            .control_plane_nodes()
            .into_iter()
            .chain(self.workers.iter())
            .collect();
        let mut versions = Vec::new();
        for line in pods.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [node, ip] = fields[..] else {
                // Empty, or a third field: a pod being deleted (its agent draining).
                continue;
            };
            let host = nodes
                .iter()
                .find(|host| host.name == node)
                .with_context(|| format!("no node {node}"))?;
            let out = host.run(&[
                "curl",
                "-sS",
                "--max-time",
                "10",
                &format!("http://{ip}:{AGENT_HEALTH_PORT}/metrics"),
            ])?;
            let metrics = String::from_utf8_lossy(&out.stdout);
            versions.push((node.to_owned(), build_version(&metrics).unwrap_or_default()));
        }
        Ok(versions)
    }

    /// Control-plane host `host`'s `/etc/kubernetes`, seen from the test.
    fn etc_kubernetes_of(&self, host: usize) -> anyhow::Result<&Path> {
        if host == 0 {
            return Ok(self.etc_kubernetes());
        }
        self.others
            .iter()
            .find(|other| other.host == host)
            .map(|other| other.etc_kubernetes())
            .context("no such control-plane node")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_version_raises_the_patch_and_says_it_is_the_drills() {
        assert_eq!(next_version("0.1.0"), "0.1.1-drill");
        assert_eq!(next_version("1.2.9-rc.1"), "1.2.10-drill");
    }

    #[test]
    fn the_build_version_is_the_label_of_bridgehead_build_info() {
        let metrics = "# TYPE bridgehead_build_info gauge\nbridgehead_build_info{version=\"0.1.1-drill\",commit=\"0123456789ab\"} 1\n";
        assert_eq!(build_version(metrics).as_deref(), Some("0.1.1-drill"));
        assert_eq!(build_version("other 1\n"), None);
    }
}
