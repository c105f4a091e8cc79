//! charts/bridgehead with helm built from its Go module (`scripts/helm-build.sh`): `helm lint`;
//! the chart's version, image and deploy/image agreeing with the workspace version; its RBAC
//! the same objects as deploy/rbac's; a missing placeholder or a wrong shape refused by name;
//! every shape rendered by `helm template` passing
//! `kubectl apply --dry-run=server --validate=strict` against a real kube-apiserver (with the
//! prometheus-operator's CRDs) and every pod in it hardened; the hosted-control-plane example
//! validated; and `helm install --wait` on a real cluster whose `kubectl exec`, `kubectl logs
//! -f` and a `failurePolicy: Fail` webhook then go through the release, after which the
//! release is upgraded to agents as a Deployment (`agents_deployment`). Needs helm; the last
//! two also root and `scripts/k8s-build.sh`, the last the node runtime; skipped loudly otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use bridgehead_e2e::kubernetes::manifests::{self, hardening_problems, pod_specs};
use bridgehead_e2e::kubernetes::real_cluster::{Install, RealCluster, REPOSITORY};
use bridgehead_e2e::kubernetes::{self, carried, ControlPlane, Egress};
use bridgehead_e2e::{netns, prometheus};
use serde_json::Value;

#[path = "chart/agents_deployment.rs"]
mod agents_deployment;

/// The whole real-cluster test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(600);
/// Where the chart's DaemonSet makes the server's socket, on the node (values.yaml's).
const SOCKET: &str = "/etc/kubernetes/konnectivity-server/konnectivity-server.socket";

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/bridgehead")
}

fn helm(helm: &Path, args: &[&str]) -> Output {
    Command::new(helm)
        .args(args)
        .output()
        .expect("running helm")
}

/// `helm template` of the chart into kube-system with `values` (`--set` each): the YAML.
fn template(binary: &Path, values: &[&str]) -> String {
    let chart = chart().display().to_string();
    let mut args = vec![
        "template",
        "bridgehead",
        &chart,
        "--namespace",
        "kube-system",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    let out = helm(binary, &args);
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The value of `key:` on its own line in `text` (a flat YAML lookup, enough for these files).
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
        .trim()
        .trim_matches('"')
}

/// The shapes the tests render: the default (server DaemonSet, agents DaemonSet), agents as
/// a Deployment with no server (a hosted control plane's) and all the monitoring, and agents on
/// the host network.
const SHAPES: [&[&str]; 3] = [
    &["controlPlaneEndpoint=192.0.2.10"],
    &[
        "controlPlaneEndpoint=192.0.2.10",
        "agent.kind=Deployment",
        "server.shape=none",
        "monitoring.podMonitors=true",
        "monitoring.prometheusRule=true",
        "monitoring.dashboard=true",
        "monitoring.labels.release=kube-prometheus-stack",
    ],
    &["controlPlaneEndpoint=192.0.2.10", "agent.hostNetwork=true"],
];

#[test]
fn the_chart_lints_and_names_the_image_deploy_names() {
    let Some(binary) = manifests::require_helm("the_chart_lints_and_names_the_image_deploy_names")
    else {
        return;
    };
    let chart_dir = chart().display().to_string();
    for shape in SHAPES {
        let mut args = vec!["lint", "--strict", chart_dir.as_str()];
        for value in shape {
            args.extend(["--set", value]);
        }
        let out = helm(&binary, &args);
        assert!(
            out.status.success(),
            "helm lint {shape:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // One version everywhere: the workspace's (Cargo.toml), the chart's, the image's tag in
    // the chart's values and in deploy/image, and one repository for both.
    let version = env!("CARGO_PKG_VERSION");
    let chart_yaml = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    assert_eq!(field(&chart_yaml, "version"), version);
    assert_eq!(field(&chart_yaml, "appVersion"), version);
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let component = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/kustomization.yaml"),
    )
    .unwrap();
    assert_eq!(field(&values, "tag"), version);
    assert_eq!(field(&component, "newTag"), version);
    assert_eq!(field(&values, "repository"), field(&component, "newName"));
    let rendered = template(&binary, SHAPES[0]);
    assert_eq!(
        rendered
            .matches(&format!("image: {}\n", manifests::image()))
            .count(),
        2,
        "{rendered}"
    );
    agents_on_the_host_network_render_as_deploy_does(&binary);
    // A Deployment's agents leave a drained node: they do not tolerate every taint (the
    // cordoned node's `unschedulable` among them), a DaemonSet's do.
    for (shape, everything) in [(SHAPES[0], true), (SHAPES[1], false)] {
        let rendered = template(&binary, shape);
        let (_, agent) = rendered
            .split_once("# Source: bridgehead/templates/agent.yaml")
            .unwrap();
        assert_eq!(
            agent.contains("tolerations:\n        - operator: Exists\n"),
            everything,
            "{shape:?}: {agent}"
        );
    }

    // What an install must say is refused by name, not rendered half-way.
    for (values, says) in [
        (vec![], "controlPlaneEndpoint: the address the agents dial"),
        (
            vec!["controlPlaneEndpoint=x", "agent.kind=StatefulSet"],
            "agent.kind: \"StatefulSet\" is neither DaemonSet nor Deployment",
        ),
        (
            vec!["controlPlaneEndpoint=x", "server.shape=sidecar"],
            "server.shape: \"sidecar\" is neither daemonset nor none",
        ),
        (
            vec![
                "controlPlaneEndpoint=x",
                "agent.hostNetwork=true",
                "agent.healthPort=8134",
            ],
            "agent.hostNetwork: the agents' health port 8134 and admin port 8094 bind on every node, where the server holds [8132 8133 8134]",
        ),
    ] {
        let mut args = vec!["template", "bridgehead", chart_dir.as_str()];
        for value in &values {
            args.extend(["--set", value]);
        }
        let out = helm(&binary, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{values:?}: {stderr}"
        );
    }
}

/// `agent.hostNetwork`: the agents' pod on the node's network, as deploy/agent-host-network
/// has it: `ClusterFirstWithHostNet`, the health and admin ports moved off the server's (8093,
/// 8094, the probes and the container port with them; given ports kept), the node's loopback
/// denied; on the pod network, none of it.
fn agents_on_the_host_network_render_as_deploy_does(binary: &Path) {
    let agent = |values: &[&str]| {
        let rendered = template(binary, values);
        let (_, agent) = rendered
            .split_once("# Source: bridgehead/templates/agent.yaml")
            .unwrap_or_else(|| panic!("no agent in {rendered}"));
        agent.split("\n---").next().unwrap_or_default().to_owned()
    };
    let host = agent(SHAPES[2]);
    for needle in [
        "\n      hostNetwork: true\n",
        "\n      dnsPolicy: ClusterFirstWithHostNet\n",
        "- --health-server-port=8093\n",
        "- --admin-server-port=8094\n",
        "- --denied-destinations=127.0.0.0/8,::1/128\n",
        "containerPort: 8093\n",
    ] {
        assert!(host.contains(needle), "{needle:?} in\n{host}");
    }
    // The two probes.
    assert_eq!(host.matches("port: 8093\n").count(), 2, "{host}");
    let pod_network = agent(SHAPES[0]);
    for needle in ["hostNetwork", "dnsPolicy", "--denied-destinations", "8093"] {
        assert!(
            !pod_network.contains(needle),
            "{needle:?} in\n{pod_network}"
        );
    }
    assert!(
        pod_network.contains("- --health-server-port=8134\n"),
        "{pod_network}"
    );
    let given = agent(&[
        "controlPlaneEndpoint=192.0.2.10",
        "agent.hostNetwork=true",
        "agent.healthPort=9093",
        "agent.adminPort=9094",
    ]);
    for needle in [
        "- --health-server-port=9093\n",
        "- --admin-server-port=9094\n",
    ] {
        assert!(given.contains(needle), "{needle:?} in\n{given}");
    }
}

/// The objects of a YAML stream as kube-apiserver receives them: each document without its
/// comments and blank lines, sorted (order in a file means nothing to `kubectl apply`).
fn documents(yaml: &str) -> Vec<String> {
    let mut documents: Vec<String> = yaml
        .split("\n---")
        .map(|document| {
            document
                .lines()
                .filter(|line| {
                    let line = line.trim();
                    !line.is_empty() && !line.starts_with('#') && line != "---"
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|document| !document.is_empty())
        .collect();
    documents.sort();
    documents
}

#[test]
fn the_charts_rbac_is_deploy_rbac() {
    const TEST: &str = "the_charts_rbac_is_deploy_rbac";
    let Some(binary) = manifests::require_helm(TEST) else {
        return;
    };
    // The chart's RBAC templates are deploy/rbac's files with the release's namespace: rendered
    // into kube-system (deploy/rbac's), they are the same objects, rule for rule.
    let rendered = template(&binary, SHAPES[0]);
    let rbac: String = rendered
        .split("\n---")
        .filter(|document| document.contains("# Source: bridgehead/templates/rbac-"))
        .collect::<Vec<_>>()
        .join("\n---");
    let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/rbac");
    let kustomization = std::fs::read_to_string(deploy.join("kustomization.yaml")).unwrap();
    let mut files = String::new();
    for line in kustomization.lines() {
        if let Some(file) = line.strip_prefix("- ") {
            files += &std::fs::read_to_string(deploy.join(file.trim())).unwrap();
            files += "\n---\n";
        }
    }
    let (chart, deploy) = (documents(&rbac), documents(&files));
    assert!(deploy.len() >= 10, "{deploy:#?}");
    for document in &deploy {
        assert!(
            chart.contains(document),
            "deploy/rbac has an object the chart does not make:\n{document}"
        );
    }
    for document in &chart {
        assert!(
            deploy.contains(document),
            "the chart makes an RBAC object deploy/rbac does not:\n{document}"
        );
    }
}

#[test]
fn every_shape_passes_server_side_validation_and_is_hardened() {
    let test = "every_shape_passes_server_side_validation_and_is_hardened";
    let Some(binary) = manifests::require_helm(test) else {
        return;
    };
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    let Some(crds) = prometheus::operator_crds().unwrap() else {
        bridgehead_e2e::skip::skip(test, "needs Go for the prometheus-operator's CRDs");
        return;
    };
    netns::with_net(test, 1, Duration::from_secs(180), move |mut net| {
        let control_plane = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("{e:#}"));
        prometheus::install_operator_crds(&control_plane, &crds).unwrap();
        // What kube-controller-manager (not run here) makes in every namespace.
        control_plane
            .apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: kube-system\n")
            .unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        // The server's and the agents' DaemonSets; the agents' Deployment.
        for (shape, workloads) in SHAPES.into_iter().zip([2, 1, 2]) {
            let rendered = template(&binary, shape);
            let out = control_plane
                .kubectl_as(
                    &control_plane.kubeconfig,
                    &[
                        "apply",
                        "--dry-run=server",
                        "--validate=strict",
                        "-o",
                        "json",
                        "-f",
                        "-",
                    ],
                    Some(&rendered),
                )
                .unwrap();
            assert!(
                out.status.success(),
                "{shape:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let objects: Value = serde_json::from_slice(&out.stdout).unwrap();
            for item in objects["items"].as_array().unwrap() {
                kinds.insert(item["kind"].as_str().unwrap().to_owned());
            }
            let pods = pod_specs(&objects);
            assert_eq!(pods.len(), workloads, "{shape:?}: {pods:?}");
            for (what, pod) in pods {
                let problems = hardening_problems(&pod, &manifests::image());
                assert!(problems.is_empty(), "{shape:?} {what}: {problems:#?}");
            }
        }
        for kind in [
            "DaemonSet",
            "Deployment",
            "PodDisruptionBudget",
            "PodMonitor",
            "PrometheusRule",
            "ConfigMap",
            "ClusterRoleBinding",
        ] {
            assert!(kinds.contains(kind), "no {kind} in any shape: {kinds:?}");
        }

        // The hosted control plane's sidecar example, in its namespace.
        control_plane
            .apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hosted-cluster-1\n")
            .unwrap();
        let example = chart().join("examples/hosted-control-plane.yaml");
        let out = control_plane
            .kubectl_ok(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &example.display().to_string(),
            ])
            .unwrap_or_else(|e| panic!("examples/hosted-control-plane.yaml: {e:#}"));
        assert!(
            out.contains("deployment.apps/kube-apiserver created (server dry run)"),
            "{out}"
        );
    });
}

#[test]
fn helm_install_on_a_real_cluster_carries_exec_logs_and_webhooks() {
    let test = "helm_install_on_a_real_cluster_carries_exec_logs_and_webhooks";
    let Some(binary) = manifests::require_helm(test) else {
        return;
    };
    let Some(binaries) = kubernetes::require_nodes(test) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(test, 1, TIMEOUT, move |_| {
        let mut cluster = RealCluster::start_with(&binaries, 2, Install::Nothing)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let endpoint = format!("controlPlaneEndpoint={}", cluster.control_plane.address);
        // The image from the cluster's registry, as a user points the chart at theirs.
        let image = format!("image.repository={}", cluster.registry.image(REPOSITORY));
        let chart_dir = chart().display().to_string();
        let out = Command::new(&binary)
            .args([
                "install",
                "bridgehead",
                &chart_dir,
                "--namespace",
                "kube-system",
                "--set",
                &endpoint,
                "--set",
                &image,
                "--wait",
                "--timeout=4m",
            ])
            .env("KUBECONFIG", &cluster.control_plane.kubeconfig)
            .env("HOME", cluster.control_plane.dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm install: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            cluster.describe_pods("kube-system")
        );
        // kube-apiserver's side, which no chart can do (docs/install.md step 4): its egress to
        // the socket the chart's server makes on the control-plane node.
        let socket = cluster
            .etc_kubernetes()
            .join(SOCKET.trim_start_matches("/etc/kubernetes/"));
        let egress = cluster.control_plane.dir().join("chart-egress.yaml");
        std::fs::write(
            &egress,
            format!(
                "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
                socket.display()
            ),
        )
        .unwrap();
        cluster
            .control_plane
            .restart_apiserver_adding(&[format!(
                "--egress-selector-config-file={}",
                egress.display()
            )])
            .unwrap_or_else(|e| panic!("{e:#}"));
        let worker = cluster.workers[0].name.clone();
        carried::pods(&cluster, &worker).unwrap_or_else(|e| panic!("{e:#}"));
        carried::all_through_bridgehead(&cluster, &worker)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("kube-system")));
        agents_deployment::agents_as_a_deployment(&cluster, &binary);
    });
}
