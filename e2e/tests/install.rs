//! docs/install.md, run as written: a real cluster with no egress at all (kube-apiserver dials
//! nodes directly, and has no route to the workers, so `kubectl logs` fails), then every `sh`
//! block of the page in order, as root on the control-plane node, in a copy of this repository's
//! deploy/, with only `CONTROL_PLANE_ENDPOINT` and `BRIDGEHEAD_IMAGE` (the cluster's registry)
//! given their values; then `kubectl exec`,
//! `kubectl logs -f` and a `failurePolicy: Fail` webhook work, each counted by the server as
//! tunnels. Once per shape of the server: blocks marked `sh static-pod` or `sh daemonset` run
//! only for theirs.
//!
//! One step is not a shell's: kubelet restarting kube-apiserver when its manifest changes. The
//! test's kube-apiserver is a process, not a static pod, so the test reads the manifest the page
//! edited, checks it (server-side validation as a Pod), and restarts kube-apiserver with the
//! flags the edit added, their paths taken through the manifest's mounts to where the node's
//! `/etc/kubernetes` really is (as kubelet's hostPath mounts would). Needs root,
//! `scripts/k8s-build.sh` and `scripts/install-test-deps.sh`; skipped loudly otherwise.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bridgehead_e2e::kubernetes::real_cluster::{Install, RealCluster, REPOSITORY};
use bridgehead_e2e::kubernetes::{self, carried};
use bridgehead_e2e::netns;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(600);
/// What the page tells the operator to replace.
const ENDPOINT_LINE: &str = "export CONTROL_PLANE_ENDPOINT=control-plane.example.internal";
const IMAGE_LINE: &str = "export BRIDGEHEAD_IMAGE=bridgehead";
/// The shapes of the server, as the page marks their blocks.
const SHAPES: [&str; 2] = ["static-pod", "daemonset"];

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The fenced code blocks of `markdown`: (info string, body).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some("")) => found.extend(open.take()),
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block in docs/install.md");
    found
}

/// The script docs/install.md gives for `shape`, with `endpoint` for the control plane's and
/// `image` for the image's repository.
fn script(shape: &str, endpoint: &str, image: &str) -> String {
    let page = std::fs::read_to_string(repository().join("docs/install.md")).unwrap();
    let mut script = String::new();
    let mut last = String::new();
    for (info, body) in blocks(&page) {
        let mut words = info.split_whitespace();
        if words.next() != Some("sh") {
            continue;
        }
        let only = words.next();
        assert!(
            only.is_none_or(|only| SHAPES.contains(&only)) && words.next().is_none(),
            "docs/install.md: a block marked {info:?}, not `sh` or `sh <one of {SHAPES:?}>`"
        );
        if only.is_none_or(|only| only == shape) {
            script.push_str(&body);
            last = body;
        }
    }
    for line in [ENDPOINT_LINE, IMAGE_LINE] {
        assert!(
            script.contains(line),
            "docs/install.md no longer has {line:?}"
        );
    }
    // kube-apiserver's restart (which the test does) comes after every command of the page.
    assert!(
        last.contains("/etc/kubernetes/manifests/kube-apiserver.yaml"),
        "docs/install.md's last block for {shape} is not kube-apiserver's:\n{last}"
    );
    script
        .replace(
            ENDPOINT_LINE,
            &format!("export CONTROL_PLANE_ENDPOINT={endpoint}"),
        )
        .replace(IMAGE_LINE, &format!("export BRIDGEHEAD_IMAGE={image}"))
}

#[test]
fn the_page_is_one_script_per_shape() {
    for shape in SHAPES {
        let script = script(shape, "192.0.2.1", "registry.example/bridgehead");
        assert!(script.contains("export CONTROL_PLANE_ENDPOINT=192.0.2.1\n"));
        assert!(script.contains("kubectl apply -k deploy/rbac"));
        assert_eq!(
            script.contains("konnectivity-server.conf"),
            shape == "static-pod",
            "{shape}: the server's kubeconfig is the static pod's alone"
        );
    }
}

#[test]
fn a_fresh_install_with_the_static_pod_carries_exec_logs_and_webhooks() {
    fresh_install(
        "a_fresh_install_with_the_static_pod_carries_exec_logs_and_webhooks",
        "static-pod",
    );
}

#[test]
fn a_fresh_install_with_the_server_daemonset_carries_exec_logs_and_webhooks() {
    fresh_install(
        "a_fresh_install_with_the_server_daemonset_carries_exec_logs_and_webhooks",
        "daemonset",
    );
}

fn fresh_install(test: &'static str, shape: &'static str) {
    let Some(binaries) = kubernetes::require_nodes(test) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(test, 1, TIMEOUT, move |_| {
        let mut cluster = RealCluster::start_with(&binaries, 2, Install::Nothing)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let worker = cluster.workers[0].name.clone();
        carried::pods(&cluster, &worker).unwrap_or_else(|e| panic!("{e:#}"));
        // No egress yet: kube-apiserver has no way to the worker's kubelet.
        let before = cluster
            .control_plane
            .kubectl(&["logs", "--request-timeout=20s", carried::TICKER])
            .unwrap();
        assert!(
            !before.status.success(),
            "kubectl logs worked before the install: {}",
            String::from_utf8_lossy(&before.stdout)
        );

        let apiserver_before = cluster.control_plane.apiserver_args();
        run_the_page(&cluster, shape);
        restart_as_the_manifest_says(&mut cluster, &apiserver_before);

        let ready = cluster.server_health("/readyz").unwrap();
        assert!(ready.starts_with("ok"), "the server's /readyz: {ready:?}");
        carried::all_through_bridgehead(&cluster, &worker)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("kube-system")));
    });
}

/// The page's script for `shape`, as root on the control-plane node, in a copy of the
/// repository's deploy/ (the page edits deploy/image), with kubectl (the cluster's) on the PATH.
fn run_the_page(cluster: &RealCluster, shape: &str) {
    let endpoint = cluster.control_plane.address.to_string();
    let image = cluster.registry.image(REPOSITORY);
    let kubectl_dir = cluster.control_plane.binaries.kubectl.parent().unwrap();
    let checkout = tempfile::Builder::new()
        .prefix("bh-install-")
        .tempdir()
        .unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(repository().join("deploy"))
        .arg(checkout.path())
        .status()
        .unwrap();
    assert!(copied.success(), "copying deploy/");
    let script = format!(
        "cd {}\n{}",
        checkout.path().display(),
        script(shape, &endpoint, &image)
    );
    let path = format!(
        "PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        kubectl_dir.display()
    );
    let out = cluster
        .control_plane_node
        .run(&[
            "env",
            "-i",
            &path,
            "HOME=/root",
            "bash",
            "-xeuo",
            "pipefail",
            "-c",
            &script,
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "docs/install.md ({shape}) failed on the control-plane node:\n{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cluster.describe_pods("kube-system")
    );
}

/// kube-apiserver restarted as the edited `/etc/kubernetes/manifests/kube-apiserver.yaml`
/// asks: the flags it added to those of `before`, each path in them through the manifest's
/// mounts, and inside the EgressSelectorConfiguration the socket's path too.
fn restart_as_the_manifest_says(cluster: &mut RealCluster, before: &[String]) {
    let etc = cluster.etc_kubernetes().to_owned();
    let manifest = etc.join("manifests/kube-apiserver.yaml");
    let pod = cluster
        .control_plane
        .kubectl_ok(&[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-o",
            "json",
            "-f",
            &manifest.display().to_string(),
        ])
        .unwrap_or_else(|e| panic!("the edited kube-apiserver.yaml: {e:#}"));
    let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
    let container = &pod["spec"]["containers"][0];
    let mut mounts: Vec<(String, String)> = Vec::new();
    for mount in container["volumeMounts"].as_array().unwrap() {
        let volume = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|volume| volume["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount}"));
        if let Some(host) = volume["hostPath"]["path"].as_str() {
            mounts.push((
                mount["mountPath"].as_str().unwrap().to_owned(),
                host.to_owned(),
            ));
        }
    }
    let host_path = |path: &str| host_path(&mounts, &etc, path);
    let scratch = cluster.control_plane.dir().join("install-egress.yaml");
    let mut added = Vec::new();
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|arg| arg.as_str().unwrap())
        .filter(|arg| !before.iter().any(|given| given == arg))
        .collect();
    assert!(
        !command.is_empty(),
        "the page added no flag to kube-apiserver"
    );
    for arg in command {
        let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
        if flag == "--egress-selector-config-file" {
            let config = std::fs::read_to_string(host_path(value)).unwrap();
            let socket = config
                .lines()
                .find_map(|line| line.trim().strip_prefix("udsName:"))
                .unwrap_or_else(|| panic!("no udsName in {config}"))
                .trim();
            let seen = host_path(socket);
            std::fs::write(
                &scratch,
                config.replace(socket, &seen.display().to_string()),
            )
            .unwrap();
            added.push(format!("{flag}={}", scratch.display()));
        } else if value.starts_with('/') {
            added.push(format!("{flag}={}", host_path(value).display()));
        } else {
            added.push(arg.to_owned());
        }
    }
    cluster
        .control_plane
        .restart_apiserver_adding(&added)
        .unwrap_or_else(|e| panic!("kube-apiserver with {added:?}: {e:#}"));
}

/// Where `path`, as kube-apiserver's container sees it, is on the test's machine: through the
/// mount (container path, host path) that holds it, then the node's `/etc/kubernetes` at
/// `etc`. A path no mount holds is one the container could not see: the page is wrong.
fn host_path(mounts: &[(String, String)], etc: &Path, path: &str) -> PathBuf {
    let (inside, host) = mounts
        .iter()
        .filter(|(inside, _)| {
            path == inside || path.starts_with(&format!("{}/", inside.trim_end_matches('/')))
        })
        .max_by_key(|(inside, _)| inside.len())
        .unwrap_or_else(|| panic!("{path}: kube-apiserver's manifest mounts nothing there"));
    let on_node = format!("{host}{}", &path[inside.len()..]);
    let rest = on_node
        .strip_prefix("/etc/kubernetes/")
        .unwrap_or_else(|| panic!("{on_node}: the test's node has only /etc/kubernetes"));
    etc.join(rest)
}
