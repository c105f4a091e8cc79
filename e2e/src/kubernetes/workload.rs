//! The real cluster's test workload ([`TestServer`]): e2e/go/testserver in one pod per worker
//! behind the Service `testserver`, with a serving certificate made at test time, and what
//! kube-apiserver reaches through it: the pod and service proxy subresources (HTTP on 8080),
//! a validating admission webhook and an aggregated API (HTTPS on 8443, the Service's 443). No
//! kube-proxy runs, and kube-apiserver needs none: what it dials for each, in v1.37.2, is an
//! endpoint's pod IP through the egress selector's `cluster` dialer. The service proxy picks a
//! random endpoint (`pkg/registry/core/service/storage` `ResourceLocation`) and, like the pod
//! proxy, uses the proxy transport whose dialer `cmd/kube-apiserver/app/server.go` sets to the
//! `cluster` network; webhooks resolve the Service to an endpoint per request
//! (k8s.io/apiserver `pkg/util/webhook/client.go`, `WebhookRoundTripLoadBalancing`, on by
//! default) and aggregated APIs per connection with `--enable-aggregator-routing=true`, both on
//! the `cluster` dialer (kube-aggregator `pkg/apiserver/apiserver.go`).

use anyhow::Context;
use bridgehead_certs::Authority;

use super::ControlPlane;

/// The aggregated API's group (version `v1`, one resource, `greetings`).
pub const API_GROUP: &str = "bridgehead.test";
/// The label that puts an object under the webhook's guard.
pub const GUARDED_LABEL: &str = "bridgehead.test/guarded";
/// The Service (namespace `default`).
pub const SERVICE: &str = "testserver";
/// What the webhook answers for an object named `denied-*`, before the node's name.
pub const DENIAL: &str = "denied by the webhook on ";

/// The pods, the Service and the CA their certificate comes from.
#[derive(Debug)]
pub struct TestServer {
    /// The CA's certificate, base64 (a `caBundle`).
    ca_bundle: String,
    /// `testserver-<node>` per node it runs on.
    pub pods: Vec<String>,
}

impl TestServer {
    /// The Secret, one pod on each of `nodes` and the Service; waits until the pods are Ready.
    pub fn start(control_plane: &ControlPlane, nodes: &[&str]) -> anyhow::Result<TestServer> {
        let authority = Authority::new("testserver-ca")?;
        // The name kube-apiserver checks for a webhook or an APIService backed by a Service.
        let pair = authority.server(SERVICE, &[format!("{SERVICE}.default.svc")])?;
        let mut yaml = format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {SERVICE}-tls\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {cert}\n  tls.key: {key}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {SERVICE}\n  namespace: default\nspec:\n  selector:\n    app: {SERVICE}\n  ports:\n  - name: http\n    port: 8080\n    targetPort: 8080\n  - name: https\n    port: 443\n    targetPort: 8443\n",
            cert = base64(pair.cert_pem.as_bytes()),
            key = base64(pair.key_pem.as_bytes()),
        );
        let mut pods = Vec::new();
        for node in nodes {
            let pod = format!("{SERVICE}-{node}");
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: default\n  labels:\n    app: {SERVICE}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: bridgehead.invalid/testserver:1\n    imagePullPolicy: Never\n    env:\n    - name: NODE\n      valueFrom:\n        fieldRef:\n          fieldPath: spec.nodeName\n    - name: TLS_CERT\n      value: /tls/tls.crt\n    - name: TLS_KEY\n      value: /tls/tls.key\n    ports:\n    - containerPort: 8080\n    - containerPort: 8443\n    readinessProbe:\n      httpGet:\n        path: /ready\n        port: 8080\n      periodSeconds: 1\n    volumeMounts:\n    - name: tls\n      mountPath: /tls\n      readOnly: true\n  volumes:\n  - name: tls\n    secret:\n      secretName: {SERVICE}-tls\n"
            ));
            pods.push(pod);
        }
        control_plane.apply(&yaml)?;
        let mut wait = vec!["wait".to_owned(), "--for=condition=Ready".to_owned()];
        wait.extend(pods.iter().map(|pod| format!("pod/{pod}")));
        wait.push(format!(
            "--timeout={}s",
            super::real_cluster::POD_READY.as_secs()
        ));
        let wait: Vec<&str> = wait.iter().map(String::as_str).collect();
        control_plane
            .kubectl_ok(&wait)
            .context("the testserver pods did not become Ready")?;
        Ok(TestServer {
            ca_bundle: base64(authority.ca.cert_pem.as_bytes()),
            pods,
        })
    }

    /// A ValidatingWebhookConfiguration named `name`: CREATE and UPDATE of ConfigMaps labelled
    /// [`GUARDED_LABEL`] go to the Service's `/validate`, and are rejected when it cannot be
    /// reached (`failurePolicy: Fail`). Nothing else the cluster does passes through it.
    pub fn webhook_yaml(&self, name: &str) -> String {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: {name}\nwebhooks:\n- name: configmaps.{API_GROUP}\n  admissionReviewVersions: [v1]\n  sideEffects: None\n  failurePolicy: Fail\n  timeoutSeconds: 10\n  objectSelector:\n    matchLabels:\n      {GUARDED_LABEL}: \"true\"\n  rules:\n  - apiGroups: [\"\"]\n    apiVersions: [v1]\n    operations: [CREATE, UPDATE]\n    resources: [configmaps]\n  clientConfig:\n    caBundle: {ca}\n    service:\n      namespace: default\n      name: {SERVICE}\n      port: 443\n      path: /validate\n",
            ca = self.ca_bundle,
        )
    }

    /// An APIService for `bridgehead.test/v1`, served by the Service's pods.
    pub fn api_service_yaml(&self) -> String {
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.{API_GROUP}\nspec:\n  group: {API_GROUP}\n  version: v1\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  caBundle: {ca}\n  service:\n    namespace: default\n    name: {SERVICE}\n    port: 443\n",
            ca = self.ca_bundle,
        )
    }

    /// A guarded ConfigMap named `name` (the webhook denies `denied-*`).
    pub fn guarded_configmap_yaml(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    {GUARDED_LABEL}: \"true\"\ndata:\n  written: \"{name}\"\n"
        )
    }
}

/// Byte `i` of what the testserver's `/bytes?n=N` answers (its `pattern`).
pub fn pattern_byte(i: u32) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Pods of the test's busybox image, each `(name, node, script)` run with `sh -c` on that
/// node, in the default namespace, as one YAML stream; `stdin` keeps each container's stdin
/// open (for `kubectl attach` and `exec -i`).
pub fn busybox_pods(pods: &[(&str, &str, &str)], stdin: bool) -> String {
    let stdin = if stdin { "    stdin: true\n" } else { "" };
    pods.iter()
        .map(|(name, node, script)| {
            format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: bridgehead.invalid/busybox:1\n    imagePullPolicy: Never\n    command: [sh, -c, '{script}']\n{stdin}"
            )
        })
        .collect()
}
