{{/*
The proxy container and the volumes it mounts, written once: the standalone
Deployment, a parent chart's sidecar (_sidecar.tpl) and the injector's
ConfigMap (injector-sidecar.yaml, what `cos-auth-proxy inject` injects) all
render these. A new field of the sidecar goes here and nowhere else. Internal.
*/}}
{{/*
The container (without the leading "- "). Called with (dict "ctx" $ "sidecar" bool).
*/}}
{{- define "cos-auth-proxy.containerSpec" -}}
{{- $ctx := .ctx -}}
{{- $v := $ctx.Values -}}
name: {{ if .sidecar }}{{ $v.sidecar.containerName }}{{ else }}{{ include "cos-auth-proxy.name" $ctx }}{{ end }}
image: {{ include "cos-auth-proxy.image" $ctx | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if and .sidecar $v.sidecar.native }}
restartPolicy: Always
{{- end }}
args: ["serve"]
{{- if not .sidecar }}
ports:
  - name: proxy
    containerPort: {{ $v.proxy.port }}
    protocol: TCP
  - name: admin
    containerPort: {{ $v.admin.port }}
    protocol: TCP
{{- else }}
ports:
  - name: cos-admin
    containerPort: {{ $v.admin.port }}
    protocol: TCP
{{- end }}
env:
{{- include "cos-auth-proxy.env" $ctx | nindent 2 }}
volumeMounts:
  - name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" .sidecar "what" "credentials") }}
    mountPath: {{ trimSuffix "/" $v.credentials.mountPath | quote }}
    readOnly: true
{{- if $v.upstream.tls.existingSecret }}
  - name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" .sidecar "what" "tls") }}
    mountPath: "/var/run/secrets/cos-tls"
    readOnly: true
{{- end }}
{{- if .sidecar }}
  {{- /* The app pod's ServiceAccount token stays out of the proxy, which never calls the API server:
  the API server mounts it into every container without a mount at this path. */}}
  - name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" .sidecar "what" "no-api-token") }}
    mountPath: "/var/run/secrets/kubernetes.io/serviceaccount"
    readOnly: true
{{- end }}
startupProbe:
  httpGet:
    path: /readyz
    port: {{ $v.admin.port }}
  periodSeconds: {{ $v.probes.startup.periodSeconds }}
  failureThreshold: {{ $v.probes.startup.failureThreshold }}
  timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ $v.admin.port }}
  periodSeconds: {{ $v.probes.readiness.periodSeconds }}
  failureThreshold: {{ $v.probes.readiness.failureThreshold }}
  timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ $v.admin.port }}
  periodSeconds: {{ $v.probes.liveness.periodSeconds }}
  failureThreshold: {{ $v.probes.liveness.failureThreshold }}
  timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
resources:
  {{- toYaml $v.resources | nindent 2 }}
securityContext:
  runAsNonRoot: true
  {{- with include "cos-auth-proxy.runAs" $ctx }}{{ . | trim | nindent 2 }}{{ end }}
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
terminationMessagePolicy: FallbackToLogsOnError
{{- end -}}

{{/* Volume names: prefixed in a parent's pod, where other volumes live too. */}}
{{- define "cos-auth-proxy.volumeName" -}}
{{- if .sidecar -}}cos-auth-proxy-{{ .what }}{{- else -}}{{ .what }}{{- end -}}
{{- end -}}

{{/* The volumes (list items). Called with (dict "ctx" $ "sidecar" bool). */}}
{{- define "cos-auth-proxy.volumeList" -}}
{{- $ctx := .ctx -}}
{{- $v := $ctx.Values -}}
{{- $mode := $v.credentials.defaultMode -}}
{{- /* 0444 in a parent's pod (its fsGroup is unknown) or without fsGroup (openshift: the SCC's, unknown); else 0440 for the fsGroup */ -}}
{{- if kindIs "invalid" $mode -}}{{- $mode = ternary 292 288 (or .sidecar (not (include "cos-auth-proxy.fsGroup" $ctx))) -}}{{- end -}}
- name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" .sidecar "what" "credentials") }}
  secret:
    secretName: {{ include "cos-auth-proxy.credentialsSecretName" $ctx }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ $v.credentials.accessKeyKey | quote }}
        path: access-key
      - key: {{ $v.credentials.accessKeySecretKey | quote }}
        path: access-key-secret
{{- with $v.upstream.tls }}
{{- if .existingSecret }}
- name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" $.sidecar "what" "tls") }}
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: {{ $mode }}
    items:
      {{- if .caKey }}
      - key: {{ .caKey | quote }}
        path: ca.crt
      {{- end }}
      {{- if .clientCertKey }}
      - key: {{ .clientCertKey | quote }}
        path: tls.crt
      - key: {{ .clientKeyKey | quote }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- if .sidecar }}
- name: {{ include "cos-auth-proxy.volumeName" (dict "ctx" $ctx "sidecar" .sidecar "what" "no-api-token") }}
  {{- /* No sizeLimit: mounted read-only, nothing is written; the kubelet counts the directory's own
  block (4 KiB) as usage and evicted pods under a 1Ki limit. */}}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/*
OpenShift's restricted-v2 SCC (values.yaml, openshift): "true" when no pod or
container gets a fixed uid, gid or fsGroup. Null: when the cluster serves
security.openshift.io/v1 (what `helm install` sees; `helm template` needs
--api-versions). Called with the chart's context.
*/}}
{{- define "cos-auth-proxy.openshift" -}}
{{- if kindIs "invalid" .Values.openshift -}}
{{- if .Capabilities.APIVersions.Has "security.openshift.io/v1" }}true{{ end -}}
{{- else if .Values.openshift }}true{{ end -}}
{{- end -}}

{{/* The runAsUser and runAsGroup lines of a securityContext: none on OpenShift, none for a null value. */}}
{{- define "cos-auth-proxy.runAs" -}}
{{- $sc := .Values.securityContext -}}
{{- if not (include "cos-auth-proxy.openshift" .) -}}
{{- if not (kindIs "invalid" $sc.runAsUser) }}
runAsUser: {{ $sc.runAsUser }}
{{- end }}
{{- if not (kindIs "invalid" $sc.runAsGroup) }}
runAsGroup: {{ $sc.runAsGroup }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The pod's fsGroup, or "" (null, or OpenShift: the SCC assigns one). */}}
{{- define "cos-auth-proxy.fsGroup" -}}
{{- if not (or (include "cos-auth-proxy.openshift" .) (kindIs "invalid" .Values.podSecurityContext.fsGroup)) -}}
{{- .Values.podSecurityContext.fsGroup -}}
{{- end -}}
{{- end -}}

{{/* The pod's own securityContext lines (the chart's Deployment and the injector's). */}}
{{- define "cos-auth-proxy.podSecurityContext" -}}
runAsNonRoot: true
{{- with include "cos-auth-proxy.runAs" . }}{{ . }}{{ end }}
{{- with include "cos-auth-proxy.fsGroup" . }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
A nodeSelector map (called with the user's, or nil) with kubernetes.io/os: linux
added unless it names that key: the image is Linux only (linux/amd64, linux/arm64).
*/}}
{{- define "cos-auth-proxy.linuxNodeSelector" -}}
{{- toYaml (merge (dict) (. | default dict) (dict "kubernetes.io/os" "linux")) -}}
{{- end -}}
