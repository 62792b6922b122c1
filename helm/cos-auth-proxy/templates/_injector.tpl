{{/* Named templates of the injection webhook (injector.enabled). */}}

{{- define "cos-auth-proxy.injector.fullname" -}}
{{- printf "%s-injector" (include "cos-auth-proxy.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{/* Its own app name, so neither the proxy's Deployment nor its Service select the webhook's pods. */}}
{{- define "cos-auth-proxy.injector.name" -}}
{{- printf "%s-injector" (include "cos-auth-proxy.name" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{- define "cos-auth-proxy.injector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cos-auth-proxy.injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cos-auth-proxy.injector.labels" -}}
helm.sh/chart: {{ include "cos-auth-proxy.chart" . }}
{{ include "cos-auth-proxy.injector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: injector
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cos-auth-proxy.injector.tlsSecretName" -}}
{{- .Values.injector.tls.existingSecret | default (printf "%s-tls" (include "cos-auth-proxy.injector.fullname" .)) -}}
{{- end -}}

{{- define "cos-auth-proxy.injector.sidecarConfigMapName" -}}
{{- printf "%s-sidecar" (include "cos-auth-proxy.injector.fullname" .) -}}
{{- end -}}

{{- define "cos-auth-proxy.injector.serviceHost" -}}
{{- printf "%s.%s.svc" (include "cos-auth-proxy.injector.fullname" .) .Release.Namespace -}}
{{- end -}}
