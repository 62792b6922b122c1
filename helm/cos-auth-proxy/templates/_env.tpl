{{/*
The proxy's environment (COS_*), from the values: one list for the
Deployment, the parent chart's sidecar and the injector's ConfigMap alike. A
new setting of the sidecar goes here (and, as a value, into values.yaml and
values.schema.json). Internal.
*/}}
{{- define "cos-auth-proxy.listenHost" -}}
{{- if .Values.proxy.host -}}
{{- .Values.proxy.host -}}
{{- else if eq .Values.mode "sidecar" -}}
127.0.0.1
{{- else -}}
0.0.0.0
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
