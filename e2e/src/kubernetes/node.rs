//! A node stand-in inside a test host's namespace (`node.py`: a kubelet on the node's address,
//! and a pod, an admission webhook and an aggregated API server on a pod address), and the
//! Kubernetes objects that make kube-apiserver send traffic there: the Node, a Pod bound to it,
//! Services with endpoints, a ValidatingWebhookConfiguration and an APIService.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::Context;

use super::ControlPlane;
use crate::netns::TestNet;
use crate::process::Process;

/// The stand-in's program.
const NODE_PY: &str = include_str!("node.py");
/// The namespace every test object lives in.
pub const NAMESPACE: &str = "bridgehead-test";
/// The pod's HTTP port (pod and service proxy).
pub const POD_PORT: u16 = 8080;
/// The webhook's port.
pub const WEBHOOK_PORT: u16 = 8443;
/// The aggregated API server's port.
pub const API_PORT: u16 = 9443;
/// The aggregated API's group.
pub const API_GROUP: &str = "bridgehead.test";

/// One node's stand-in, running. Stopped on drop.
#[derive(Debug)]
pub struct NodeStandIn {
    /// The node's name (Node object, `host=` identifier).
    pub name: String,
    /// The node's InternalIP: its test host's address.
    pub node_ip: Ipv4Addr,
    /// The pod's IP, in [`NodeStandIn::pod_cidr`] on the same host.
    pub pod_ip: Ipv4Addr,
    _process: Process,
}

impl NodeStandIn {
    /// Starts the stand-in for node `name` on host `host` of `net`, its pod on `10.244.H.10`
    /// (H = `host`), with a serving certificate from the control plane's CA.
    pub fn start(
        control_plane: &ControlPlane,
        net: &TestNet,
        host: usize,
        name: &str,
    ) -> anyhow::Result<NodeStandIn> {
        let node_ip = net.host(host).v4();
        let pod_ip = Ipv4Addr::new(10, 244, host as u8, 10);
        net.add_local_address(host, &format!("{pod_ip}/32"))?;
        let pair = control_plane.authority().server(
            name,
            &[
                name.to_owned(),
                node_ip.to_string(),
                pod_ip.to_string(),
                format!("{}.{NAMESPACE}.svc", webhook_service(name)),
                format!("{}.{NAMESPACE}.svc", api_service(name)),
            ],
        )?;
        let dir = control_plane.dir();
        let cert = dir.join(format!("node-{name}.crt"));
        let key = dir.join(format!("node-{name}.key"));
        std::fs::write(&cert, &pair.cert_pem)?;
        std::fs::write(&key, &pair.key_pem)?;
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                net.host(host).ns_name(),
                "python3",
                "-c",
                NODE_PY,
            ])
            .arg(name)
            .arg(&cert)
            .arg(&key)
            .arg(node_ip.to_string())
            .arg(pod_ip.to_string());
        let (process, _) = Process::spawn(command, &[&format!("node {name}")])
            .with_context(|| format!("starting the stand-in of node {name}"))?;
        Ok(NodeStandIn {
            name: name.to_owned(),
            node_ip,
            pod_ip,
            _process: process,
        })
    }

    /// The pod network of this node (what its agent announces as `cidr=`).
    pub fn pod_cidr(&self) -> String {
        let [a, b, c, _] = self.pod_ip.octets();
        format!("{a}.{b}.{c}.0/24")
    }

    /// The pod's name.
    pub fn pod(&self) -> String {
        format!("web-{}", self.name)
    }

    /// The Node (status through [`NodeStandIn::register`]), the Pod bound to it, and a Service
    /// with endpoints for each of the pod's servers.
    fn objects(&self) -> String {
        let (name, pod, pod_ip) = (&self.name, self.pod(), self.pod_ip);
        let mut yaml = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {NAMESPACE}\nspec:\n  nodeName: {name}\n  automountServiceAccountToken: false\n  containers:\n  - name: app\n    image: bridgehead.invalid/app\n"
        );
        for (service, port) in [
            (web_service(name), POD_PORT),
            (webhook_service(name), WEBHOOK_PORT),
            (api_service(name), API_PORT),
        ] {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {service}\n  namespace: {NAMESPACE}\nspec:\n  ports:\n  - name: main\n    port: {port}\n    targetPort: {port}\n---\n\
                 apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: {service}\n  namespace: {NAMESPACE}\nsubsets:\n- addresses:\n  - ip: {pod_ip}\n    nodeName: {name}\n    targetRef:\n      kind: Pod\n      name: {pod}\n      namespace: {NAMESPACE}\n  ports:\n  - name: main\n    port: {port}\n---\n\
                 apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}\n  namespace: {NAMESPACE}\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: IPv4\nendpoints:\n- addresses: [\"{pod_ip}\"]\n  nodeName: {name}\n  targetRef:\n    kind: Pod\n    name: {pod}\n    namespace: {NAMESPACE}\nports:\n- name: main\n  port: {port}\n"
            ));
        }
        yaml
    }

    /// Creates the node's objects in `control_plane` and sets the Node's and the Pod's status
    /// (the InternalIP and kubelet port; the pod IP, running), as a kubelet would.
    pub fn register(&self, control_plane: &ControlPlane) -> anyhow::Result<()> {
        control_plane.apply(&namespace_yaml())?;
        control_plane.apply(&self.objects())?;
        let node_status = format!(
            "{{\"status\":{{\"addresses\":[{{\"type\":\"InternalIP\",\"address\":\"{}\"}}],\"daemonEndpoints\":{{\"kubeletEndpoint\":{{\"Port\":10250}}}},\"conditions\":[{{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"StandIn\",\"message\":\"a test stand-in\"}}]}}}}",
            self.node_ip
        );
        control_plane.kubectl_ok(&[
            "patch",
            "node",
            &self.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &node_status,
        ])?;
        let pod_status = format!(
            "{{\"status\":{{\"phase\":\"Running\",\"podIP\":\"{ip}\",\"podIPs\":[{{\"ip\":\"{ip}\"}}],\"hostIP\":\"{node}\"}}}}",
            ip = self.pod_ip,
            node = self.node_ip
        );
        control_plane.kubectl_ok(&[
            "patch",
            "pod",
            &self.pod(),
            "-n",
            NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &pod_status,
        ])?;
        Ok(())
    }

    /// A ValidatingWebhookConfiguration for ConfigMaps created in the test namespace, served by
    /// this node's webhook (by Service, checked against the cluster CA).
    pub fn webhook_yaml(&self, control_plane: &ControlPlane) -> anyhow::Result<String> {
        let ca = base64(std::fs::read(&control_plane.ca)?);
        Ok(format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: bridgehead-test-{name}\nwebhooks:\n- name: configmaps.{name}.bridgehead.test\n  admissionReviewVersions: [v1]\n  sideEffects: None\n  failurePolicy: Fail\n  timeoutSeconds: 10\n  namespaceSelector:\n    matchLabels:\n      kubernetes.io/metadata.name: {NAMESPACE}\n  rules:\n  - apiGroups: [\"\"]\n    apiVersions: [v1]\n    operations: [CREATE]\n    resources: [configmaps]\n  clientConfig:\n    caBundle: {ca}\n    service:\n      namespace: {NAMESPACE}\n      name: {service}\n      port: {WEBHOOK_PORT}\n      path: /validate\n",
            name = self.name,
            service = webhook_service(&self.name),
        ))
    }

    /// An APIService for `bridgehead.test/v1` served by this node's aggregated API server.
    pub fn api_service_yaml(&self, control_plane: &ControlPlane) -> anyhow::Result<String> {
        let ca = base64(std::fs::read(&control_plane.ca)?);
        Ok(format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.{API_GROUP}\nspec:\n  group: {API_GROUP}\n  version: v1\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  caBundle: {ca}\n  service:\n    namespace: {NAMESPACE}\n    name: {service}\n    port: {API_PORT}\n",
            service = api_service(&self.name),
        ))
    }
}

/// The test namespace, and its `default` service account (no controller manager runs to
/// make it).
pub fn namespace_yaml() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: {NAMESPACE}\n"
    )
}

/// The pod's web Service of node `node`.
pub fn web_service(node: &str) -> String {
    format!("web-{node}")
}

fn webhook_service(node: &str) -> String {
    format!("webhook-{node}")
}

fn api_service(node: &str) -> String {
    format!("api-{node}")
}

/// Standard base64 with padding (what `caBundle` takes).
fn base64(data: Vec<u8>) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}
