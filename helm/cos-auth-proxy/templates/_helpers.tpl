{{/*
Named templates of the cos-auth-proxy chart.

Public, for a parent chart that runs the proxy as a sidecar in its own pods
(call them with this chart's context, `index .Subcharts "cos-auth-proxy"`, or
`.Subcharts.<alias>` when the dependency has an alias):

  cos-auth-proxy.sidecar.container    one container list item: put it under
                                      `initContainers` when sidecar.native is
                                      true (it carries restartPolicy: Always),
                                      under `containers` when false
  cos-auth-proxy.sidecar.volumes      the volume list items it mounts
  cos-auth-proxy.sidecar.native       "true" or "" (where the container goes)
  cos-auth-proxy.sidecar.url          http://127.0.0.1:<port>, for the app
  cos-auth-proxy.terminationGracePeriodSeconds
                                      seconds the proxy's drain needs
  cos-auth-proxy.sidecar.checkPod     renders nothing; fails the render for a
                                      pod the sidecar must not run in. Called
                                      with (dict "hostNetwork" <the pod's>): this
                                      chart cannot see the parent's pod spec

Everything else here is internal.
*/}}

{{- define "cos-auth-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cos-auth-proxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cos-auth-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cos-auth-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cos-auth-proxy.labels" -}}
helm.sh/chart: {{ include "cos-auth-proxy.chart" . }}
{{ include "cos-auth-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: proxy
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cos-auth-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cos-auth-proxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.isSidecar" -}}
{{- if eq .Values.mode "sidecar" }}true{{ end -}}
{{- end -}}

{{/* Name of the Secret with the key pair: the existing one, or the dev one this chart makes. */}}
{{- define "cos-auth-proxy.credentialsSecretName" -}}
{{- if .Values.credentials.existingSecret -}}
{{- .Values.credentials.existingSecret -}}
{{- else -}}
{{- printf "%s-dev-credentials" (include "cos-auth-proxy.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.listenHost" -}}
{{- if .Values.proxy.host -}}
{{- .Values.proxy.host -}}
{{- else if eq .Values.mode "sidecar" -}}
127.0.0.1
{{- else -}}
0.0.0.0
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.terminationGracePeriodSeconds" -}}
{{- $need := add .Values.shutdown.delaySeconds .Values.shutdown.timeoutSeconds -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $need 5 -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/*
The routes' URL values under upstream.*, in the order of the proxy's route
table (src/config/route.ts, ROUTE_TABLE: a test holds the two equal). A new
route adds its value here and its env in cos-auth-proxy.env.
*/}}
{{- define "cos-auth-proxy.routeUrlValues" -}}managementUrl optimizeUrl apiUrl{{- end -}}

{{/* "upstream.managementUrl, upstream.optimizeUrl, upstream.apiUrl" */}}
{{- define "cos-auth-proxy.routeUrlNames" -}}
{{- $names := list -}}
{{- range splitList " " (include "cos-auth-proxy.routeUrlValues" .) -}}{{- $names = append $names (printf "upstream.%s" .) -}}{{- end -}}
{{- join ", " $names -}}
{{- end -}}

{{/* Non-empty when at least one route has a URL. */}}
{{- define "cos-auth-proxy.anyRouteUrl" -}}
{{- $u := .Values.upstream -}}
{{- range splitList " " (include "cos-auth-proxy.routeUrlValues" .) -}}{{- if index $u . -}}yes{{- end -}}{{- end -}}
{{- end -}}

{{/* Fails the render with a clear message on values that cannot work. */}}
{{- define "cos-auth-proxy.validate" -}}
{{- $v := .Values -}}
{{- if not (include "cos-auth-proxy.anyRouteUrl" .) -}}
{{- fail (printf "cos-auth-proxy: set at least one of %s" (include "cos-auth-proxy.routeUrlNames" .)) -}}
{{- end -}}
{{- if and $v.credentials.existingSecret $v.credentials.create -}}
{{- fail "cos-auth-proxy: credentials.existingSecret and credentials.create are exclusive" -}}
{{- end -}}
{{- if not (or $v.credentials.existingSecret $v.credentials.create) -}}
{{- fail "cos-auth-proxy: set credentials.existingSecret to the Secret holding the Access Key pair (credentials.create is for development only)" -}}
{{- end -}}
{{- if and $v.credentials.create (not (and $v.credentials.accessKey $v.credentials.accessKeySecret)) -}}
{{- fail "cos-auth-proxy: credentials.create needs credentials.accessKey and credentials.accessKeySecret" -}}
{{- end -}}
{{- if eq $v.credentials.accessKeyKey $v.credentials.accessKeySecretKey -}}
{{- fail "cos-auth-proxy: credentials.accessKeyKey and credentials.accessKeySecretKey must differ" -}}
{{- end -}}
{{- include "cos-auth-proxy.validateSidecarValues" . -}}
{{- $need := add $v.shutdown.delaySeconds $v.shutdown.timeoutSeconds 1 -}}
{{- if lt (int (include "cos-auth-proxy.terminationGracePeriodSeconds" .)) (int $need) -}}
{{- fail (printf "cos-auth-proxy: terminationGracePeriodSeconds (%v) must be at least shutdown.delaySeconds + shutdown.timeoutSeconds + 1 (%v), or the kubelet kills the drain" $v.terminationGracePeriodSeconds $need) -}}
{{- end -}}
{{- if eq $v.mode "deployment" -}}
{{- if eq (include "cos-auth-proxy.listenHost" .) "127.0.0.1" -}}
{{- fail "cos-auth-proxy: in deployment mode the proxy must listen beyond loopback (proxy.host 0.0.0.0 or empty)" -}}
{{- end -}}
{{- if not $v.proxy.allowFrom -}}
{{- fail "cos-auth-proxy: in deployment mode set proxy.allowFrom to the CIDRs of the client pods (COS_ALLOW_FROM; the proxy's default admits loopback only)" -}}
{{- end -}}
{{- if and $v.networkPolicy.enabled (empty $v.networkPolicy.clientSelector) -}}
{{- fail "cos-auth-proxy: networkPolicy.clientSelector must select the client pods (an empty selector would admit every pod)" -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- fail "cos-auth-proxy: autoscaling.minReplicas must not exceed autoscaling.maxReplicas" -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.mode "sidecar") $v.sidecar.native (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "cos-auth-proxy: sidecar.native needs Kubernetes >= 1.29 (target %s): set sidecar.native=false, or pass --kube-version" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/* Checks of the values that shape the sidecar itself: the chart's and the injector's alike. */}}
{{- define "cos-auth-proxy.validateSidecarValues" -}}
{{- $v := .Values -}}
{{- $tls := $v.upstream.tls -}}
{{- if and (or $tls.caKey $tls.clientCertKey $tls.clientKeyKey) (not $tls.existingSecret) -}}
{{- fail "cos-auth-proxy: upstream.tls.*Key need upstream.tls.existingSecret" -}}
{{- end -}}
{{- if and $tls.existingSecret (not (or $tls.caKey $tls.clientCertKey)) -}}
{{- fail "cos-auth-proxy: upstream.tls.existingSecret needs upstream.tls.caKey and/or upstream.tls.clientCertKey" -}}
{{- end -}}
{{- if ne (empty $tls.clientCertKey) (empty $tls.clientKeyKey) -}}
{{- fail "cos-auth-proxy: upstream.tls.clientCertKey and upstream.tls.clientKeyKey go together" -}}
{{- end -}}
{{- if eq (int $v.proxy.port) (int $v.admin.port) -}}
{{- fail "cos-auth-proxy: proxy.port and admin.port must differ" -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.env" -}}
{{- $v := .Values -}}
- name: COS_LISTEN_HOST
  value: {{ include "cos-auth-proxy.listenHost" . | quote }}
- name: COS_LISTEN_PORT
  value: {{ $v.proxy.port | quote }}
- name: COS_ADMIN_HOST
  value: "0.0.0.0"
- name: COS_ADMIN_PORT
  value: {{ $v.admin.port | quote }}
{{- /* Loopback stays admitted: kubectl port-forward and the pod's own containers arrive over it. */ -}}
{{- with $v.proxy.allowFrom }}
- name: COS_ALLOW_FROM
  value: {{ concat . (list "127.0.0.0/8" "::1/128") | uniq | join "," | quote }}
{{- end }}
{{- with $v.proxy.requireHeader }}
- name: COS_REQUIRE_HEADER
  value: {{ . | quote }}
{{- end }}
{{- with $v.upstream.managementUrl }}
- name: COS_MANAGEMENT_API_URL
  value: {{ . | quote }}
{{- end }}
{{- with $v.upstream.optimizeUrl }}
- name: COS_OPTIMIZE_API_URL
  value: {{ . | quote }}
{{- end }}
{{- with $v.upstream.apiUrl }}
- name: COS_API_URL
  value: {{ . | quote }}
{{- end }}
{{- with $v.upstream.managementPathPrefix }}
- name: COS_MANAGEMENT_PATH_PREFIX
  value: {{ . | quote }}
{{- end }}
{{- with $v.upstream.optimizePathPrefix }}
- name: COS_OPTIMIZE_PATH_PREFIX
  value: {{ . | quote }}
{{- end }}
- name: COS_ACCESS_KEY_FILE
  value: {{ printf "%s/access-key" (trimSuffix "/" $v.credentials.mountPath) | quote }}
- name: COS_ACCESS_KEY_SECRET_FILE
  value: {{ printf "%s/access-key-secret" (trimSuffix "/" $v.credentials.mountPath) | quote }}
{{- if $v.upstream.tls.caKey }}
- name: COS_CA_FILE
  value: "/var/run/secrets/cos-tls/ca.crt"
{{- end }}
{{- if $v.upstream.tls.clientCertKey }}
- name: COS_CLIENT_CERT_FILE
  value: "/var/run/secrets/cos-tls/tls.crt"
- name: COS_CLIENT_KEY_FILE
  value: "/var/run/secrets/cos-tls/tls.key"
{{- end }}
- name: COS_SHUTDOWN_DELAY_MS
  value: {{ mul $v.shutdown.delaySeconds 1000 | quote }}
- name: COS_SHUTDOWN_TIMEOUT_MS
  value: {{ mul $v.shutdown.timeoutSeconds 1000 | quote }}
- name: COS_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
{{- with $v.accessLog.mode }}
- name: COS_ACCESS_LOG
  value: {{ . | quote }}
{{- end }}
{{- if not (kindIs "invalid" $v.accessLog.slowMs) }}
- name: COS_ACCESS_LOG_SLOW_MS
  value: {{ int64 $v.accessLog.slowMs | quote }}
{{- end }}
{{- if not (kindIs "invalid" $v.accessLog.sample) }}
- name: COS_ACCESS_LOG_SAMPLE
  value: {{ $v.accessLog.sample | toString | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

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
  {{- if not (kindIs "invalid" $v.securityContext.runAsUser) }}
  runAsUser: {{ $v.securityContext.runAsUser }}
  {{- end }}
  {{- if not (kindIs "invalid" $v.securityContext.runAsGroup) }}
  runAsGroup: {{ $v.securityContext.runAsGroup }}
  {{- end }}
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
{{- /* 0444 in a parent's pod (its fsGroup is unknown) or without fsGroup; else 0440 for the fsGroup */ -}}
{{- if kindIs "invalid" $mode -}}{{- $mode = ternary 292 288 (or .sidecar (kindIs "invalid" $v.podSecurityContext.fsGroup)) -}}{{- end -}}
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

{{/* ---- public: sidecar ---------------------------------------------------- */}}

{{- define "cos-auth-proxy.sidecar.container" -}}
{{- include "cos-auth-proxy.validate" . -}}
- {{ include "cos-auth-proxy.containerSpec" (dict "ctx" . "sidecar" true) | indent 2 | trim }}
{{- end -}}

{{- define "cos-auth-proxy.sidecar.volumes" -}}
{{- include "cos-auth-proxy.volumeList" (dict "ctx" . "sidecar" true) -}}
{{- end -}}

{{- define "cos-auth-proxy.sidecar.native" -}}
{{- if .Values.sidecar.native }}true{{ end -}}
{{- end -}}

{{/*
With hostNetwork the pod's 127.0.0.1 is the node's loopback: every process on
the node, and every other hostNetwork pod, could use the key pair through the
proxy, and the admin port would bind the node's addresses. The injector
declines such pods for the same reason (docs/kubernetes.md).
*/}}
{{- define "cos-auth-proxy.sidecar.checkPod" -}}
{{- if .hostNetwork -}}
{{- fail "cos-auth-proxy: the sidecar cannot run in a hostNetwork pod: its 127.0.0.1 would be the node's loopback, where every process on the node could use the key pair, and its admin port would bind the node's addresses. Run the proxy standalone (mode=deployment) for such pods" -}}
{{- end -}}
{{- end -}}

{{- define "cos-auth-proxy.sidecar.url" -}}
{{- printf "http://127.0.0.1:%v" .Values.proxy.port -}}
{{- end -}}
