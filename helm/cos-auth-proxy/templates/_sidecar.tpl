{{/*
The public named templates of the cos-auth-proxy chart (the other partials
are internal; _metadata.tpl lists them).

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
*/}}
{{- define "cos-auth-proxy.terminationGracePeriodSeconds" -}}
{{- $need := add .Values.shutdown.delaySeconds .Values.shutdown.timeoutSeconds -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $need 5 -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

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
