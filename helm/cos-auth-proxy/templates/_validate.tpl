{{/*
The checks the schema cannot hold: rules across values (one needs, excludes
or must differ from another), the target's Kubernetes version, and what a
base64 value decodes to. Types, ranges, enums and patterns are in
values.schema.json, which Helm applies before any template. Internal.
*/}}
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

{{/* The injector's own values, and the sidecar values it renders into its ConfigMap. */}}
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
