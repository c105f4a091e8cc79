//! The manifests in `deploy/` against a real kube-apiserver: every kustomization and manifest
//! passes `kubectl apply --dry-run=server` (strict field validation: an unknown or misplaced
//! field fails), and kube-apiserver starts with the EgressSelectorConfiguration file given
//! there; every pod they run is hardened (seccomp, read-only root, no capability, the priority
//! class kubernetes.io's konnectivity page gives, no hostPath that makes a missing file), the
//! agents pass the restricted Pod Security level, and every image is the workspace version's.
//! Needs root and `scripts/k8s-build.sh`; skipped loudly otherwise.

use std::path::PathBuf;
use std::time::Duration;

use bridgehead_e2e::kubernetes::{self, manifests, ControlPlane, Egress};
use bridgehead_e2e::netns;
use serde_json::Value;

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

#[test]
fn every_manifest_passes_server_side_validation() {
    let test = "every_manifest_passes_server_side_validation";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, Duration::from_secs(180), move |mut net| {
        let egress = deploy("server-static-pod/egress-selector-configuration.yaml");
        let flag = format!("--egress-selector-config-file={}", egress.display());
        let control_plane =
            ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[flag.as_str()])
                .unwrap_or_else(|e| panic!("kube-apiserver with deploy's egress selector: {e:#}"));
        for kustomization in ["rbac", "server-daemonset", "agent", "agent-host-network"] {
            let dir = deploy(kustomization);
            let out = control_plane
                .kubectl_ok(&[
                    "apply",
                    "--dry-run=server",
                    "--validate=strict",
                    "-k",
                    &dir.display().to_string(),
                ])
                .unwrap_or_else(|e| panic!("deploy/{kustomization}: {e:#}"));
            assert!(out.contains("(server dry run)"), "{out}");
        }
        // What kube-controller-manager (not run here) makes in every namespace.
        control_plane
            .apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: kube-system\n")
            .unwrap();
        let out = control_plane
            .kubectl_ok(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-k",
                &deploy("server-static-pod").display().to_string(),
            ])
            .unwrap();
        assert!(
            out.contains("pod/konnectivity-server created (server dry run)"),
            "{out}"
        );
        // The kustomizations hold what docs/migrating.md and docs/ha.md say they do.
        let built = control_plane
            .kubectl_ok(&["kustomize", &deploy("agent").display().to_string()])
            .unwrap();
        for needle in [
            "kind: DaemonSet",
            "audience: system:konnectivity-server",
            "--count-server-leases",
            "path: /readyz",
            "fieldPath: spec.nodeName",
            "image: bridgehead:0.1.0",
        ] {
            assert!(built.contains(needle), "{needle}\n{built}");
        }
        // deploy/agent-host-network: deploy/agent on the node's network, its ports off the
        // server's (8133 and 8134 on control-plane nodes, where both run), the node's loopback
        // denied (docs/install.md, "Agents on the host network").
        let host = control_plane
            .kubectl_ok(&[
                "kustomize",
                &deploy("agent-host-network").display().to_string(),
            ])
            .unwrap();
        assert_eq!(
            host.replace("8094", "8133")
                .replace("8093", "8134")
                .replace("      dnsPolicy: ClusterFirstWithHostNet\n", "")
                .replace("      hostNetwork: true\n", "")
                .replace("        - --denied-destinations=127.0.0.0/8,::1/128\n", ""),
            built,
            "deploy/agent-host-network is deploy/agent with more than its own changes"
        );
        for needle in [
            "      hostNetwork: true\n",
            "      dnsPolicy: ClusterFirstWithHostNet\n",
            "- --health-server-port=8093\n",
            "- --admin-server-port=8094\n",
            "- --denied-destinations=127.0.0.0/8,::1/128\n",
        ] {
            assert!(host.contains(needle), "{needle}\n{host}");
        }
        // 8132 stays: the server's agent port, which the agents dial.
        for port in ["8133", "8134"] {
            assert!(!host.contains(port), "{port} in\n{host}");
        }
    });
}

#[test]
fn every_pod_is_hardened_and_the_agents_are_restricted() {
    let test = "every_pod_is_hardened_and_the_agents_are_restricted";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    netns::with_net(test, 1, Duration::from_secs(180), move |mut net| {
        let control_plane = ControlPlane::start(&binaries, &mut net, 0, Egress::Direct, &[])
            .unwrap_or_else(|e| panic!("{e:#}"));
        control_plane
            .apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: kube-system\n")
            .unwrap();
        let mut pods = 0;
        for kustomization in [
            "server-static-pod",
            "server-daemonset",
            "agent",
            "agent-host-network",
        ] {
            let out = control_plane
                .kubectl_ok(&[
                    "apply",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-k",
                    &deploy(kustomization).display().to_string(),
                ])
                .unwrap_or_else(|e| panic!("deploy/{kustomization}: {e:#}"));
            let objects: Value = serde_json::from_str(&out).unwrap();
            for (what, pod) in manifests::pod_specs(&objects) {
                let problems = manifests::hardening_problems(&pod, &manifests::image());
                assert!(
                    problems.is_empty(),
                    "deploy/{kustomization} {what}: {problems:#?}"
                );
                pods += 1;
            }
        }
        assert_eq!(
            pods, 4,
            "the static pod, the server's and the agents' DaemonSets (on the pod network and on the host's)"
        );

        // Pod Security admission warns about a workload whose pods a namespace's level would
        // refuse: none for the agents at `restricted`; the server, on the host's network and
        // files, and the agents on the host's network are at `privileged` as docs/install.md
        // says.
        control_plane
            .apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: restricted\n  labels:\n    pod-security.kubernetes.io/enforce: restricted\n    pod-security.kubernetes.io/warn: restricted\n")
            .unwrap();
        for (kustomization, admitted) in [
            ("agent", true),
            ("server-daemonset", false),
            ("agent-host-network", false),
        ] {
            let built = control_plane
                .kubectl_ok(&["kustomize", &deploy(kustomization).display().to_string()])
                .unwrap()
                .replace("namespace: kube-system", "namespace: restricted");
            let out = control_plane
                .kubectl_as(
                    &control_plane.kubeconfig,
                    &["apply", "--dry-run=server", "-f", "-"],
                    Some(&built),
                )
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "deploy/{kustomization}: {stderr}");
            assert_eq!(
                !stderr.contains("would violate PodSecurity \"restricted"),
                admitted,
                "deploy/{kustomization} at restricted: {stderr}"
            );
        }
    });
}
