//! konnectivity as kubernetes.io's "Set up Konnectivity service" task installs it (in its
//! `grpc` mode, or in `http-connect`): the starting points of docs/migrating.md, for the
//! migration test. The
//! server is a static pod beside kube-apiserver on the Unix socket deploy/'s
//! EgressSelectorConfiguration names, ports 8132-8134; the agents a DaemonSet with projected
//! tokens (audience `system:konnectivity-server`); the user `system:konnectivity-server` bound
//! to `system:auth-delegator`. Two changes from the page, both because kubelets here are
//! reachable only from their own node (as on clusters whose nodes are firewalled from each
//! other): the server routes with `destHost,default` and the agents announce their node's
//! name and address. The image is `scripts/image.sh --konnectivity`'s, konnectivity's own
//! binaries built from their Go module.

/// How kube-apiserver speaks to konnectivity's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--mode=grpc`, egress `proxyProtocol: GRPC` (kubernetes.io's manifest).
    Grpc,
    /// `--mode=http-connect`, egress `proxyProtocol: HTTPConnect`.
    HttpConnect,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Grpc => "grpc",
            Mode::HttpConnect => "http-connect",
        }
    }
}

/// The server's static pod manifest (`/etc/kubernetes/manifests/konnectivity-server.yaml`).
pub fn server_manifest(image: &str, mode: Mode) -> String {
    let mode = mode.flag();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: konnectivity-server
  namespace: kube-system
spec:
  priorityClassName: system-cluster-critical
  hostNetwork: true
  containers:
  - name: konnectivity-server-container
    image: {image}
    imagePullPolicy: Never
    command: ["/proxy-server"]
    args:
    - --logtostderr=true
    - --uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket
    - --delete-existing-uds-file
    - --cluster-cert=/etc/kubernetes/pki/apiserver.crt
    - --cluster-key=/etc/kubernetes/pki/apiserver.key
    - --mode={mode}
    - --server-port=0
    - --agent-port=8132
    - --admin-port=8133
    - --health-port=8134
    - --agent-namespace=kube-system
    - --agent-service-account=konnectivity-agent
    - --kubeconfig=/etc/kubernetes/konnectivity-server.conf
    - --authentication-audience=system:konnectivity-server
    - --proxy-strategies=destHost,default
    livenessProbe:
      httpGet:
        scheme: HTTP
        host: 127.0.0.1
        port: 8134
        path: /healthz
      initialDelaySeconds: 30
      timeoutSeconds: 60
    ports:
    - name: agentport
      containerPort: 8132
      hostPort: 8132
    - name: adminport
      containerPort: 8133
      hostPort: 8133
    - name: healthport
      containerPort: 8134
      hostPort: 8134
    volumeMounts:
    - name: k8s-certs
      mountPath: /etc/kubernetes/pki
      readOnly: true
    - name: kubeconfig
      mountPath: /etc/kubernetes/konnectivity-server.conf
      readOnly: true
    - name: konnectivity-uds
      mountPath: /etc/kubernetes/konnectivity-server
      readOnly: false
  volumes:
  - name: k8s-certs
    hostPath:
      path: /etc/kubernetes/pki
  - name: kubeconfig
    hostPath:
      path: /etc/kubernetes/konnectivity-server.conf
      type: FileOrCreate
  - name: konnectivity-uds
    hostPath:
      path: /etc/kubernetes/konnectivity-server
      type: DirectoryOrCreate
"#
    )
}

/// The RBAC and the agents' DaemonSet (`kubectl apply -f`), its agents dialing `server`.
pub fn agent_manifests(image: &str, server: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:konnectivity-server
  labels:
    kubernetes.io/cluster-service: "true"
    addonmanager.kubernetes.io/mode: Reconcile
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:konnectivity-server
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: konnectivity-agent
  namespace: kube-system
  labels:
    kubernetes.io/cluster-service: "true"
    addonmanager.kubernetes.io/mode: Reconcile
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    addonmanager.kubernetes.io/mode: Reconcile
    k8s-app: konnectivity-agent
  namespace: kube-system
  name: konnectivity-agent
spec:
  selector:
    matchLabels:
      k8s-app: konnectivity-agent
  template:
    metadata:
      labels:
        k8s-app: konnectivity-agent
    spec:
      priorityClassName: system-cluster-critical
      tolerations:
      - key: "CriticalAddonsOnly"
        operator: "Exists"
      - operator: "Exists"
        effect: "NoExecute"
      - operator: "Exists"
        effect: "NoSchedule"
      containers:
      - image: {image}
        imagePullPolicy: Never
        name: konnectivity-agent
        command: ["/proxy-agent"]
        args:
        - --logtostderr=true
        - --ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        - --proxy-server-host={server}
        - --proxy-server-port=8132
        - --admin-server-port=8133
        - --health-server-port=8134
        - --service-account-token-path=/var/run/secrets/tokens/konnectivity-agent-token
        - --agent-identifiers=host=$(NODE_NAME)&ipv4=$(HOST_IP)
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: HOST_IP
          valueFrom:
            fieldRef:
              fieldPath: status.hostIP
        volumeMounts:
        - mountPath: /var/run/secrets/tokens
          name: konnectivity-agent-token
        livenessProbe:
          httpGet:
            port: 8134
            path: /healthz
          initialDelaySeconds: 15
          timeoutSeconds: 15
      serviceAccountName: konnectivity-agent
      volumes:
      - name: konnectivity-agent-token
        projected:
          sources:
          - serviceAccountToken:
              path: konnectivity-agent-token
              audience: system:konnectivity-server
"#
    )
}
