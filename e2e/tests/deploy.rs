//! The manifests in `deploy/` against a real kube-apiserver: every kustomization and manifest
//! passes `kubectl apply --dry-run=server` (strict field validation: an unknown or misplaced
//! field fails), and kube-apiserver starts with the EgressSelectorConfiguration file given
//! there. Needs root and `scripts/k8s-build.sh`; skipped loudly otherwise.

use std::path::PathBuf;
use std::time::Duration;

use bridgehead_e2e::kubernetes::{self, ControlPlane, Egress};
use bridgehead_e2e::netns;

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
        for kustomization in ["rbac", "server-daemonset", "agent"] {
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
        let pod = deploy("server-static-pod/konnectivity-server.yaml");
        let out = control_plane
            .kubectl_ok(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &pod.display().to_string(),
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
    });
}
