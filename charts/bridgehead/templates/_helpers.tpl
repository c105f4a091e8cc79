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

{{/* The agent's pod template, for a DaemonSet or a Deployment. */}}
{{- define "bridgehead.agentPod" -}}
metadata:
  labels:
    app.kubernetes.io/name: bridgehead-agent
    {{- include "bridgehead.labels" . | nindent 4 }}
spec:
  priorityClassName: {{ .Values.priorityClassName }}
  serviceAccountName: bridgehead-agent
  # The restricted Pod Security level: no host file, no privileged port.
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
  {{- with .Values.agent.tolerations }}
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
    - --admin-server-port={{ .Values.agent.adminPort }}
    - --health-server-port={{ .Values.agent.healthPort }}
    - --service-account-token-path=/var/run/secrets/tokens/bridgehead-agent-token
    # kubelet expands $(VAR) from env. A Deployment may put two agents on one node.
    - --agent-id=$({{ if eq .Values.agent.kind "Deployment" }}POD_NAME{{ else }}NODE_NAME{{ end }})
    - --agent-identifiers=host=$(NODE_NAME)&ipv4=$(HOST_IP)
    - --count-server-leases
    - --lease-namespace={{ .Release.Namespace }}
    - --drain-grace-period={{ .Values.agent.drainGracePeriod }}
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
      containerPort: {{ .Values.agent.healthPort }}
    livenessProbe:
      httpGet:
        path: /healthz
        port: {{ .Values.agent.healthPort }}
      initialDelaySeconds: 10
      timeoutSeconds: 5
    # Ready while it holds a session with at least one server.
    readinessProbe:
      httpGet:
        path: /readyz
        port: {{ .Values.agent.healthPort }}
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
