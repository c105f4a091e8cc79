//! The upstream Kubernetes e2e suite against a test cluster: `e2e.test` of k8s.io/kubernetes
//! at the release the clusters run, cut down to the test packages whose traffic goes from
//! kube-apiserver to nodes and pods (`scripts/e2e-suite-build.sh`, cached under
//! `target/e2e-suite`), and the images those tests run (`scripts/e2e-suite-images.sh`:
//! agnhost, busybox, the sample API server and its etcd), imported into each node under the
//! names `e2e/upstream/repo-list.yaml` makes the suite ask for. [`Suite::run`] runs it with the
//! focus and skip lists of `e2e/upstream/` and reads its JSON report into a [`Report`].
//!
//! What it leaves out: ginkgo's parallel mode (it needs the ginkgo CLI; the specs run one
//! after another), and any judgement of the results: the caller asserts.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context};

use super::images::Archive;
use super::node_host::NodeHost;

/// The suite's binary and the images its tests run.
#[derive(Debug, Clone)]
pub struct Suite {
    pub e2e_test: PathBuf,
    /// Each archive and the names it is imported under (the first its own; the others tags).
    archives: Vec<(PathBuf, Vec<String>)>,
    /// The name the suite gives the pause image; the nodes' sandbox image is tagged with it.
    pause: String,
}

/// `e2e/upstream/`: the focus and skip lists and the registry list.
fn lists() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("upstream")
}

impl Suite {
    /// Builds the suite and its images (once per process; cached across processes by the
    /// build script's stamp).
    pub fn get() -> anyhow::Result<Suite> {
        static BUILT: OnceLock<Result<Suite, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| Suite::build().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn build() -> anyhow::Result<Suite> {
        let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
        let built = run_script(Command::new(scripts.join("e2e-suite-build.sh")))?;
        let e2e_test = built
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .find(|path| path.ends_with("/e2e.test"))
            .with_context(|| format!("e2e-suite-build.sh named no e2e.test: {built}"))?
            .into();
        let mut pack = Command::new(scripts.join("e2e-suite-images.sh"));
        pack.arg(crate::process::bin_dir().join("images/e2e-suite"));
        let packed = run_script(pack)?;
        let mut archives = Vec::new();
        let mut pause = None;
        for line in packed.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.collect::<Vec<_>>()) {
                (Some("pause"), names) if names.len() == 1 => pause = Some(names[0].to_owned()),
                (Some(path), names) if path.ends_with(".oci.tar") && !names.is_empty() => {
                    archives.push((path.into(), names.into_iter().map(str::to_owned).collect()));
                }
                _ => bail!("e2e-suite-images.sh: unexpected line {line:?}"),
            }
        }
        Ok(Suite {
            e2e_test,
            archives,
            pause: pause.context("e2e-suite-images.sh named no pause image")?,
        })
    }

    /// Imports the suite's images into `node`'s containerd, and tags `sandbox` (the node's
    /// pause image) with the name the suite gives pause.
    pub fn import(&self, node: &NodeHost, sandbox: &Archive) -> anyhow::Result<()> {
        let ctr = |args: &[&str]| -> anyhow::Result<()> {
            let out = node.ctr(args)?;
            if !out.status.success() {
                bail!(
                    "ctr {} on {}: {}",
                    args.join(" "),
                    node.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        };
        for (path, names) in &self.archives {
            ctr(&["images", "import", &path.to_string_lossy()])?;
            for alias in &names[1..] {
                ctr(&["images", "tag", "--force", &names[0], alias])?;
            }
        }
        ctr(&["images", "tag", "--force", &sandbox.name, &self.pause])
    }

    /// Runs the suite against the cluster of `kubeconfig` with `kubectl`, its focus and skip
    /// from `e2e/upstream/`, writing its report and log into `dir`; fails only when the suite
    /// wrote no report (its specs' failures are the report's).
    pub fn run(
        &self,
        kubeconfig: &Path,
        kubectl: &Path,
        dir: &Path,
        timeout: Duration,
    ) -> anyhow::Result<Report> {
        let focus = pattern(&std::fs::read_to_string(lists().join("focus.txt"))?);
        let skip = pattern(&std::fs::read_to_string(lists().join("skip.txt"))?);
        let report = dir.join("report.json");
        let log = std::fs::File::create(dir.join("e2e.log"))?;
        let repo_list = lists().join("repo-list.yaml");
        let status = Command::new(&self.e2e_test)
            // Read when the suite's packages initialise, before its flags are parsed: images
            // named in package variables (kubectl's manifests' busybox, ...) see only this;
            // with the flag alone they name registry.k8s.io, which no node has.
            .env("KUBE_TEST_REPO_LIST", &repo_list)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--kubectl-path={}", kubectl.display()))
            .arg("--provider=skeleton")
            .arg(format!("--kube-test-repo-list={}", repo_list.display()))
            .arg(format!("--report-dir={}", dir.display()))
            .arg(format!("--ginkgo.focus={focus}"))
            .arg(format!("--ginkgo.skip={skip}"))
            .arg(format!("--ginkgo.json-report={}", report.display()))
            .arg(format!("--ginkgo.timeout={}s", timeout.as_secs()))
            .arg("--ginkgo.no-color")
            .arg("--ginkgo.v")
            // Nodes only reach this machine's test nets: no log dump over ssh.
            .arg("--dump-logs-on-failure=false")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("running {}", self.e2e_test.display()))?;
        let text = std::fs::read_to_string(&report).with_context(|| {
            format!(
                "{} exited {status} and wrote no report; its log is {}",
                self.e2e_test.display(),
                dir.join("e2e.log").display()
            )
        })?;
        Report::parse(&text)
    }
}

/// A list file's regular expressions, one a line (`#` comments and blank lines left out),
/// as one alternation.
pub fn pattern(list: &str) -> String {
    list.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect::<Vec<_>>()
        .join("|")
}

/// One node of ginkgo's JSON report: a spec (`It`) or a suite-level node (`BeforeSuite`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The containers' texts and the leaf's, as ginkgo prints them.
    pub name: String,
    /// `It`, `SynchronizedBeforeSuite`, `ReportAfterSuite`, ...
    pub kind: String,
    /// `passed`, `skipped`, `pending`, `failed`, `panicked`, `timedout`, `interrupted`, `aborted`.
    pub state: String,
    /// The failure's message, empty when none.
    pub failure: String,
    pub run_time: Duration,
}

impl Spec {
    /// True for a spec or suite node that ran and did not pass.
    pub fn failed(&self) -> bool {
        !matches!(self.state.as_str(), "passed" | "skipped" | "pending")
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.state, self.name)?;
        // The failure's first lines: the whole message can run to pages of object dumps.
        for line in self.failure.lines().take(5) {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

/// What a run of the suite reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// How many specs the focus and skip selected, before the run.
    pub will_run: u64,
    pub specs: Vec<Spec>,
}

impl Report {
    /// Reads ginkgo's `--ginkgo.json-report` (an array of one suite's report).
    pub fn parse(json: &str) -> anyhow::Result<Report> {
        let suites: serde_json::Value = serde_json::from_str(json).context("the JSON report")?;
        let suite = suites
            .as_array()
            .and_then(|suites| suites.first())
            .context("the JSON report holds no suite")?;
        let will_run = suite["PreRunStats"]["SpecsThatWillRun"]
            .as_u64()
            .context("the JSON report has no PreRunStats.SpecsThatWillRun")?;
        let mut specs = Vec::new();
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            let text = |key: &str| spec[key].as_str().unwrap_or_default().to_owned();
            let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|text| text.as_str())
                .collect();
            let leaf = text("LeafNodeText");
            let kind = text("LeafNodeType");
            name.push(if leaf.is_empty() { &kind } else { &leaf });
            specs.push(Spec {
                name: name.join(" "),
                kind: kind.clone(),
                state: text("State"),
                failure: spec["Failure"]["Message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                run_time: Duration::from_nanos(spec["RunTime"].as_u64().unwrap_or(0)),
            });
        }
        Ok(Report { will_run, specs })
    }

    /// The specs (`It` nodes) that passed.
    pub fn passed(&self) -> Vec<&Spec> {
        self.specs
            .iter()
            .filter(|spec| spec.kind == "It" && spec.state == "passed")
            .collect()
    }

    /// Every spec or suite node that ran and did not pass.
    pub fn failed(&self) -> Vec<&Spec> {
        self.specs.iter().filter(|spec| spec.failed()).collect()
    }
}

fn run_script(mut command: Command) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of ginkgo v2's JSON report, cut down: a suite node, a spec that passed, one
    /// that failed, one the focus left out.
    const REPORT: &str = r#"[{
      "SuiteDescription": "Kubernetes e2e suite",
      "SuiteSucceeded": false,
      "PreRunStats": {"TotalSpecs": 900, "SpecsThatWillRun": 2},
      "SpecReports": [
        {"ContainerHierarchyTexts": null, "LeafNodeType": "SynchronizedBeforeSuite",
         "LeafNodeText": "", "State": "passed", "RunTime": 1000000000},
        {"ContainerHierarchyTexts": ["[sig-cli] Kubectl client", "Simple pod"],
         "LeafNodeType": "It", "LeafNodeText": "should support exec", "State": "passed",
         "RunTime": 2500000000},
        {"ContainerHierarchyTexts": ["[sig-network] Proxy", "version v1"],
         "LeafNodeType": "It", "LeafNodeText": "should proxy through a service and a pod",
         "State": "failed", "RunTime": 7000000000,
         "Failure": {"Message": "error dialing backend: 502\nsecond line"}},
        {"ContainerHierarchyTexts": ["[sig-storage] CSI"], "LeafNodeType": "It",
         "LeafNodeText": "mounts", "State": "skipped", "RunTime": 0}
      ]
    }]"#;

    #[test]
    fn report_names_each_failed_spec_with_its_message() {
        let report = Report::parse(REPORT).unwrap();
        assert_eq!(report.will_run, 2);
        assert_eq!(report.specs.len(), 4);
        let passed: Vec<&str> = report.passed().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            passed,
            ["[sig-cli] Kubectl client Simple pod should support exec"]
        );
        let failed = report.failed();
        assert_eq!(failed.len(), 1);
        assert_eq!(
            failed[0].to_string(),
            "[failed] [sig-network] Proxy version v1 should proxy through a service and a pod\n    error dialing backend: 502\n    second line"
        );
        assert_eq!(report.specs[0].name, "SynchronizedBeforeSuite");
        assert_eq!(report.specs[1].run_time, Duration::from_millis(2500));
    }

    #[test]
    fn a_failed_suite_node_counts_as_a_failure() {
        let report = Report::parse(
            r#"[{"PreRunStats": {"SpecsThatWillRun": 5}, "SpecReports": [
                {"LeafNodeType": "SynchronizedBeforeSuite", "State": "failed",
                 "Failure": {"Message": "nodes not schedulable"}}]}]"#,
        )
        .unwrap();
        assert!(report.passed().is_empty());
        assert_eq!(report.failed().len(), 1);
    }

    #[test]
    fn a_report_without_a_suite_is_an_error() {
        assert!(Report::parse("[]").is_err());
        assert!(Report::parse("{}").is_err());
        assert!(Report::parse("not json").is_err());
    }

    #[test]
    fn list_files_join_into_one_alternation() {
        let list = "# comment\n\\[sig-cli\\] Kubectl exec\n\n  \\[sig-network\\] Proxy  \n";
        assert_eq!(
            pattern(list),
            "\\[sig-cli\\] Kubectl exec|\\[sig-network\\] Proxy"
        );
    }
}
