//! The add-ons `kubeadm init` installs, for the HA cluster ([`super::real_cluster`]'s
//! `start_ha`): kube-proxy as a DaemonSet on every node (iptables mode, its kubeconfig naming
//! the control plane's load balancer, as kubeadm's `kube-proxy` ConfigMap has it) and CoreDNS as
//! the `coredns` Deployment behind the `kube-dns` Service at [`CLUSTER_DNS`], each from
//! kubeadm's manifests with the test's images (built from their Go modules by
//! `scripts/k8s-build.sh` and `scripts/coredns-build.sh`, packed by `scripts/addon-images.sh`
//! and imported into each node, as the other test-only images are).
//!
//! Where they differ from kubeadm's, and why:
//! - kube-proxy leaves the machine's conntrack table size and timeouts as they are
//!   (`maxPerCore: 0`, timeouts `0s`): the node hosts share one kernel with everything else
//!   on this machine.
//! - CoreDNS answers for `cluster.local` and the reverse zones only, with no `forward` (and so
//!   no `loop`): nothing outside the cluster is to be resolved from a test. It does not
//!   tolerate the control-plane taint: the control-plane nodes past the first have a pod
//!   network nothing routes to (docs/ha.md), so a replica there would not answer the workers.
//!   Its image runs it as root with only `NET_BIND_SERVICE` (kubeadm's securityContext): the
//!   binary carries no file capability to bind port 53 as another user.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context};

use super::images::Archive;
use super::node_host::NodeHost;

/// The `kube-dns` Service's ClusterIP (kubeadm's: the tenth address of the service range).
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// How long kube-proxy's DaemonSet and CoreDNS's Deployment may take to roll out.
pub const ROLLOUT: Duration = Duration::from_secs(120);

/// The add-ons' images.
#[derive(Debug, Clone)]
pub struct AddonImages {
    pub kube_proxy: Archive,
    pub coredns: Archive,
}

impl AddonImages {
    /// Builds CoreDNS (`scripts/coredns-build.sh`, cached under `target/coredns`) and packs
    /// both images into `images/` beside the binaries, once per process.
    pub fn get() -> anyhow::Result<AddonImages> {
        static BUILT: OnceLock<Result<AddonImages, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| AddonImages::build().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn build() -> anyhow::Result<AddonImages> {
        let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts");
        run(Command::new(scripts.join("coredns-build.sh")))?;
        let mut pack = Command::new(scripts.join("addon-images.sh"));
        pack.arg(crate::process::bin_dir().join("images"));
        let stdout = run(pack)?;
        let archive = |file: &str| -> anyhow::Result<Archive> {
            let line = stdout
                .lines()
                .find(|line| line.split(' ').next().is_some_and(|p| p.ends_with(file)))
                .with_context(|| format!("addon-images.sh wrote no {file}: {stdout}"))?;
            let (path, name) = line.split_once(' ').context("archive line")?;
            Ok(Archive {
                path: path.into(),
                name: name.trim().to_owned(),
            })
        };
        Ok(AddonImages {
            kube_proxy: archive("/kube-proxy.oci.tar")?,
            coredns: archive("/coredns.oci.tar")?,
        })
    }

    /// Imports both images into `node`'s containerd.
    pub fn import(&self, node: &NodeHost) -> anyhow::Result<()> {
        for archive in [&self.kube_proxy, &self.coredns] {
            let out = node.ctr(&["images", "import", &archive.path.to_string_lossy()])?;
            if !out.status.success() {
                bail!(
                    "importing {} on {}: {}",
                    archive.path.display(),
                    node.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(())
    }

    /// kube-proxy's ServiceAccount, binding, ConfigMap and DaemonSet, its kubeconfig naming
    /// `endpoint` (`https://HOST:PORT`), the pods' network `cluster_cidr`.
    pub fn kube_proxy_manifests(&self, endpoint: &str, cluster_cidr: &str) -> String {
        format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  config.conf: |-
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    bindAddress: 0.0.0.0
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    clusterCIDR: {cluster_cidr}
    mode: iptables
    conntrack:
      maxPerCore: 0
      min: 0
      tcpEstablishedTimeout: 0s
      tcpCloseWaitTimeout: 0s
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: {endpoint}
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    k8s-app: kube-proxy
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      containers:
      - name: kube-proxy
        image: {image}
        imagePullPolicy: Never
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        securityContext:
          privileged: true
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        volumeMounts:
        - mountPath: /var/lib/kube-proxy
          name: kube-proxy
        - mountPath: /run/xtables.lock
          name: xtables-lock
        - mountPath: /lib/modules
          name: lib-modules
          readOnly: true
      hostNetwork: true
      priorityClassName: system-node-critical
      serviceAccountName: kube-proxy
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
      - operator: Exists
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: /run/xtables.lock
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
"#,
            image = self.kube_proxy.name,
        )
    }

    /// CoreDNS's ServiceAccount, RBAC, ConfigMap, Deployment and the `kube-dns` Service.
    pub fn coredns_manifests(&self) -> String {
        format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {{
        errors
        health {{
           lameduck 5s
        }}
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
           pods insecure
           ttl 30
        }}
        prometheus :9153
        cache 30 {{
           disable success cluster.local
           disable denial cluster.local
        }}
        reload
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 2
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchExpressions:
                - key: k8s-app
                  operator: In
                  values: [kube-dns]
              topologyKey: kubernetes.io/hostname
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
      containers:
      - name: coredns
        image: {image}
        imagePullPolicy: Never
        resources:
          limits:
            memory: 170Mi
          requests:
            cpu: 100m
            memory: 70Mi
        args: [-conf, /etc/coredns/Corefile]
        volumeMounts:
        - name: config-volume
          mountPath: /etc/coredns
          readOnly: true
        ports:
        - containerPort: 53
          name: dns
          protocol: UDP
        - containerPort: 53
          name: dns-tcp
          protocol: TCP
        - containerPort: 9153
          name: metrics
          protocol: TCP
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add: [NET_BIND_SERVICE]
            drop: [ALL]
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet:
            path: /health
            port: 8080
            scheme: HTTP
          initialDelaySeconds: 60
          timeoutSeconds: 5
          successThreshold: 1
          failureThreshold: 5
        readinessProbe:
          httpGet:
            path: /ready
            port: 8181
            scheme: HTTP
      dnsPolicy: Default
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items:
          - key: Corefile
            path: Corefile
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/cluster-service: "true"
    kubernetes.io/name: CoreDNS
spec:
  clusterIP: {CLUSTER_DNS}
  selector:
    k8s-app: kube-dns
  ports:
  - name: dns
    port: 53
    protocol: UDP
  - name: dns-tcp
    port: 53
    protocol: TCP
  - name: metrics
    port: 9153
    protocol: TCP
"#,
            image = self.coredns.name,
        )
    }
}

/// Runs `command`; its stdout, or an error with its stderr.
fn run(mut command: Command) -> anyhow::Result<String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
