{{/*
Names and metadata: the chart's names, labels, image reference and the
credentials Secret's name. Internal. The chart's partials, by concern:
  _metadata.tpl   names and labels (this file)
  _validate.tpl   the cross-field checks values.schema.json cannot express
  _env.tpl        the routes and the proxy's environment
  _container.tpl  the proxy container and its volumes (Deployment and sidecar)
  _sidecar.tpl    the public templates a parent chart includes
  _injector.tpl   the injection webhook's names
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
