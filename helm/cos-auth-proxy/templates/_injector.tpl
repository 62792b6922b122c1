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

{{- define "cos-auth-proxy.injector.validate" -}}
{{- $v := .Values -}}
{{- if not (include "cos-auth-proxy.anyRouteUrl" .) -}}
{{- fail (printf "cos-auth-proxy: injector.enabled needs at least one of %s (what the injected sidecars forward to)" (include "cos-auth-proxy.routeUrlNames" .)) -}}
{{- end -}}
{{- if and $v.injector.nativeSidecar (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "cos-auth-proxy: injector.nativeSidecar needs Kubernetes >= 1.29 (target %s): set injector.nativeSidecar=false, or pass --kube-version" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- include "cos-auth-proxy.validateSidecarValues" . -}}
{{- if and $v.injector.tls.existingSecret $v.injector.certManager.enabled -}}
{{- fail "cos-auth-proxy: injector.tls.existingSecret and injector.certManager.enabled are two sources of the webhook's certificate: choose one" -}}
{{- end -}}
{{- if ne (not $v.injector.tls.existingSecret) (not $v.injector.tls.caBundle) -}}
{{- fail "cos-auth-proxy: injector.tls.existingSecret and injector.tls.caBundle go together (the Secret's certificate, and the CA that signed it, base64 PEM, for the webhook configuration)" -}}
{{- end -}}
{{- with $v.injector.tls.caBundle -}}
{{- /* The schema holds it to base64; what it decodes to is checked here, never quoted: the API server
would store anything and then fail every call to the webhook with an x509 error. */ -}}
{{- $pem := b64dec . | trim -}}
{{- if contains "PRIVATE KEY" $pem -}}
{{- fail "cos-auth-proxy: injector.tls.caBundle holds a private key: only the CA's certificate goes there (the webhook configuration is readable by anyone who can list it)" -}}
{{- end -}}
{{- if not (and (hasPrefix "-----BEGIN CERTIFICATE-----" $pem) (hasSuffix "-----END CERTIFICATE-----" $pem)) -}}
{{- fail "cos-auth-proxy: injector.tls.caBundle must be the base64 of the PEM CA certificate (-----BEGIN CERTIFICATE----- … -----END CERTIFICATE-----), e.g. base64 -w0 ca.crt; it decodes to something else" -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.proxy.port) (int $v.admin.port) -}}
{{- fail "cos-auth-proxy: proxy.port and admin.port must differ" -}}
{{- end -}}
{{- if eq (int $v.injector.port) (int $v.admin.port) -}}
{{- fail "cos-auth-proxy: injector.port and admin.port must differ" -}}
{{- end -}}
{{- end -}}
