//! What every pod Bridgehead ships must hold, checked on objects as kube-apiserver returns them
//! (`kubectl apply --dry-run=server -o json`): deploy/'s kustomizations and the chart's
//! renderings alike (e2e/tests/deploy.rs, e2e/tests/chart.rs). And helm, built from its Go
//! module by `scripts/helm-build.sh`.

use std::path::PathBuf;

use serde_json::Value;

/// The pod specs among `objects` (a `List`, or one object): each with a name for failures.
pub fn pod_specs(objects: &Value) -> Vec<(String, Value)> {
    let items = match objects["items"].as_array() {
        Some(items) => items.clone(),
        None => vec![objects.clone()],
    };
    items
        .iter()
        .filter_map(|item| {
            let what = format!(
                "{} {}",
                item["kind"].as_str().unwrap_or("?"),
                item["metadata"]["name"].as_str().unwrap_or("?")
            );
            let spec = match item["kind"].as_str()? {
                "Pod" => item["spec"].clone(),
                "DaemonSet" | "Deployment" => item["spec"]["template"]["spec"].clone(),
                _ => return None,
            };
            Some((what, spec))
        })
        .collect()
}

/// What `pod` (a pod spec) lacks of the hardening every Bridgehead pod has: RuntimeDefault
/// seccomp, the priority class kubernetes.io's konnectivity page gives, and in each of its
/// containers a read-only root, no privilege escalation and no capability, the image
/// `image`; and no hostPath that turns a missing file into an empty one. Empty when none.
pub fn hardening_problems(pod: &Value, image: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    expect(
        pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault",
        "no RuntimeDefault seccomp profile for the pod".into(),
    );
    expect(
        pod["priorityClassName"] == "system-cluster-critical",
        format!("priority class {}", pod["priorityClassName"]),
    );
    for container in pod["containers"].as_array().into_iter().flatten() {
        let name = &container["name"];
        let context = &container["securityContext"];
        expect(
            context["readOnlyRootFilesystem"] == true,
            format!("{name}: root file system not read-only"),
        );
        expect(
            context["allowPrivilegeEscalation"] == false,
            format!("{name}: privilege escalation allowed"),
        );
        expect(
            context["capabilities"]["drop"] == serde_json::json!(["ALL"]),
            format!("{name}: capabilities not all dropped"),
        );
        expect(
            container["image"] == image,
            format!("{name}: image {}, not {image}", container["image"]),
        );
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let host = &volume["hostPath"];
        if host.is_object() {
            // A file or folder that must already be there says so, and stops the pod when it
            // is missing; only the socket's folder may be made.
            let kind = host["type"].as_str().unwrap_or("");
            expect(
                ["File", "Directory", "DirectoryOrCreate"].contains(&kind),
                format!("hostPath {volume} of type {kind:?}"),
            );
        }
    }
    problems
}

/// The image every manifest names: deploy/image's, the workspace version.
pub fn image() -> String {
    format!("bridgehead:{}", env!("CARGO_PKG_VERSION"))
}

/// `target/helm/bin/helm` (`scripts/helm-build.sh`), if built.
pub fn helm() -> Option<PathBuf> {
    let helm = crate::process::bin_dir().parent()?.join("helm/bin/helm");
    helm.exists().then_some(helm)
}

/// [`helm`], or `test` skipped loudly.
pub fn require_helm(test: &str) -> Option<PathBuf> {
    let found = helm();
    if found.is_none() {
        crate::skip::skip(test, "helm not built: run scripts/helm-build.sh (needs Go)");
    }
    found
}
