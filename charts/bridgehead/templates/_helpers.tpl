{{/* The image both workloads run. */}}
{{- define "bridgehead.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels on every object the chart makes. */}}
{{- define "bridgehead.labels" -}}
app.kubernetes.io/part-of: bridgehead
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The hardening every container of the chart has (docs/install.md, Security levels). */}}
{{- define "bridgehead.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* The agents' health and admin ports: as given, else 8134 and 8133 on the pod network and
8093 and 8094 on the host's, where the server holds 8133 and 8134 on control-plane nodes. */}}
{{- define "bridgehead.agentHealthPort" -}}
{{ .Values.agent.healthPort | default (ternary 8093 8134 .Values.agent.hostNetwork) }}
{{- end }}
{{- define "bridgehead.agentAdminPort" -}}
{{ .Values.agent.adminPort | default (ternary 8094 8133 .Values.agent.hostNetwork) }}
{{- end }}

{{/* The agent's pod template, for a DaemonSet or a Deployment. */}}
{{- define "bridgehead.agentPod" -}}
metadata:
  labels:
    app.kubernetes.io/name: bridgehead-agent
    {{- include "bridgehead.labels" . | nindent 4 }}
spec:
  priorityClassName: {{ .Values.priorityClassName }}
  serviceAccountName: bridgehead-agent
  {{- if .Values.agent.hostNetwork }}
  # Up before the pod network; Service names still resolve through the cluster DNS once it
  # runs (IP targets, kubelets and pods, need none). The privileged Pod Security level.
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- else }}
  # The restricted Pod Security level: no host file, no privileged port.
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := .Values.agent.tolerations }}
  {{- if kindIs "invalid" $tolerations }}
  {{- if eq .Values.agent.kind "Deployment" }}
  {{- $tolerations = list (dict "key" "node-role.kubernetes.io/control-plane" "operator" "Exists" "effect" "NoSchedule") }}
  {{- else }}
  {{- $tolerations = list (dict "operator" "Exists") }}
  {{- end }}
  {{- end }}
  {{- with $tolerations }}
  # A Deployment's agents do not tolerate a cordoned node's taint (values.yaml says why).
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.agent.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq .Values.agent.kind "Deployment" }}
  # Spread over nodes (at most one agent more on any node than on another) and zones.
  topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: DoNotSchedule
    labelSelector:
      matchLabels:
        app.kubernetes.io/name: bridgehead-agent
        app.kubernetes.io/instance: {{ .Release.Name }}
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        app.kubernetes.io/name: bridgehead-agent
        app.kubernetes.io/instance: {{ .Release.Name }}
  {{- end }}
  # Open tunnels (a kubectl logs -f) get this long to finish when the agent is replaced.
  terminationGracePeriodSeconds: {{ .Values.agent.terminationGracePeriodSeconds }}
  containers:
  - name: agent
    image: {{ include "bridgehead.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["/bridgehead-agent"]
    args:
    - --ca-cert=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    - --proxy-server-host={{ required "controlPlaneEndpoint: the address the agents dial (the control plane's load balancer or endpoint)" .Values.controlPlaneEndpoint }}
    - --proxy-server-port={{ .Values.server.agentPort }}
    - --admin-server-port={{ include "bridgehead.agentAdminPort" . }}
    - --health-server-port={{ include "bridgehead.agentHealthPort" . }}
    - --service-account-token-path=/var/run/secrets/tokens/bridgehead-agent-token
    # kubelet expands $(VAR) from env. A Deployment may put two agents on one node.
    - --agent-id=$({{ if eq .Values.agent.kind "Deployment" }}POD_NAME{{ else }}NODE_NAME{{ end }})
    - --agent-identifiers=host=$(NODE_NAME)&ipv4=$(HOST_IP)
    - --count-server-leases
    - --lease-namespace={{ .Release.Namespace }}
    - --drain-grace-period={{ .Values.agent.drainGracePeriod }}
    {{- if .Values.agent.hostNetwork }}
    # The node's loopback is the agent's (etcd on a control-plane node, kubelet's local ports).
    - --denied-destinations=127.0.0.0/8,::1/128
    {{- end }}
    {{- range .Values.agent.extraArgs }}
    - {{ . }}
    {{- end }}
    env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    resources:
      {{- toYaml .Values.agent.resources | nindent 6 }}
    ports:
    - name: health
      containerPort: {{ include "bridgehead.agentHealthPort" . }}
    livenessProbe:
      httpGet:
        path: /healthz
        port: {{ include "bridgehead.agentHealthPort" . }}
      initialDelaySeconds: 10
      timeoutSeconds: 5
    # Ready while it holds a session with at least one server.
    readinessProbe:
      httpGet:
        path: /readyz
        port: {{ include "bridgehead.agentHealthPort" . }}
      periodSeconds: 5
    securityContext:
      {{- include "bridgehead.containerSecurity" . | nindent 6 }}
    volumeMounts:
    - name: token
      mountPath: /var/run/secrets/tokens
      readOnly: true
  volumes:
  - name: token
    projected:
      sources:
      - serviceAccountToken:
          path: bridgehead-agent-token
          audience: {{ .Values.authenticationAudience }}
          expirationSeconds: {{ .Values.agent.tokenExpirationSeconds }}
{{- end }}
