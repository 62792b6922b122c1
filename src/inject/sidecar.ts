// The container the webhook injects. It is the chart's sidecar
// (helm/cos-auth-proxy/templates/_helpers.tpl, `cos-auth-proxy.containerSpec`
// with the chart's default values): test/inject/patch.test.ts compares the
// two field by field against examples/sidecar-parent-chart/rendered/native.yaml,
// which scripts/ci-packaging.sh keeps equal to what the chart renders, so
// neither can drift from the other unnoticed.

export interface EnvVar { readonly name: string, readonly value: string }

/** What the chart's values.yaml defaults to, and the names its sidecar templates use. */
export const SIDECAR = {
  containerName: 'cos-auth-proxy',
  credentialsVolume: 'cos-auth-proxy-credentials',
  credentialsMountPath: '/var/run/secrets/cos',
  // 0444: the pod's fsGroup is not known (the chart's sidecar mode does the same).
  credentialsDefaultMode: 0o444,
  proxyPort: 8080,
  adminPort: 9090,
  requests: { cpu: '50m', memory: '192Mi' },
  limits: { cpu: '1', memory: '320Mi' },
  runAsUser: 65532,
  runAsGroup: 65532,
  probes: {
    startup: { periodSeconds: 1, failureThreshold: 60, timeoutSeconds: 2 },
    readiness: { periodSeconds: 5, failureThreshold: 2, timeoutSeconds: 2 },
    liveness: { periodSeconds: 10, failureThreshold: 3, timeoutSeconds: 2 },
  },
  /** The chart's terminationGracePeriodSeconds: the drain plus this. */
  graceMarginSeconds: 5,
} as const

export interface SidecarOptions {
  readonly image: string
  /** initContainers with restartPolicy: Always (Kubernetes >= 1.29), else a plain container. */
  readonly native: boolean
  readonly proxyPort: number
  readonly adminPort: number
  /** Upstream settings, in the order the chart writes them, before the credential files. */
  readonly upstreamEnv: readonly EnvVar[]
  /** After the log level, as the chart's extraEnv. */
  readonly extraEnv: readonly EnvVar[]
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  readonly logLevel: string
  readonly requests: { readonly cpu: string, readonly memory: string }
  readonly limits: { readonly cpu: string, readonly memory: string }
}

function probe (path: string, port: number, timing: { periodSeconds: number, failureThreshold: number, timeoutSeconds: number }): object {
  return { httpGet: { path, port }, ...timing }
}

export function sidecarContainer (o: SidecarOptions): Record<string, unknown> {
  const mount = SIDECAR.credentialsMountPath
  return {
    name: SIDECAR.containerName,
    image: o.image,
    imagePullPolicy: 'IfNotPresent',
    ...(o.native ? { restartPolicy: 'Always' } : {}),
    args: ['serve'],
    ports: [{ name: 'cos-admin', containerPort: o.adminPort, protocol: 'TCP' }],
    env: [
      { name: 'COS_LISTEN_HOST', value: '127.0.0.1' },
      { name: 'COS_LISTEN_PORT', value: String(o.proxyPort) },
      // The kubelet probes it from outside the pod's loopback.
      { name: 'COS_ADMIN_HOST', value: '0.0.0.0' },
      { name: 'COS_ADMIN_PORT', value: String(o.adminPort) },
      ...o.upstreamEnv,
      // Files in a directory mount (never subPath), so a rotated Secret is read again.
      { name: 'COS_ACCESS_KEY_FILE', value: `${mount}/access-key` },
      { name: 'COS_ACCESS_KEY_SECRET_FILE', value: `${mount}/access-key-secret` },
      { name: 'COS_SHUTDOWN_DELAY_MS', value: String(o.shutdownDelayMs) },
      { name: 'COS_SHUTDOWN_TIMEOUT_MS', value: String(o.shutdownTimeoutMs) },
      { name: 'COS_LOG_LEVEL', value: o.logLevel },
      ...o.extraEnv,
    ],
    volumeMounts: [{ name: SIDECAR.credentialsVolume, mountPath: mount, readOnly: true }],
    startupProbe: probe('/readyz', o.adminPort, SIDECAR.probes.startup),
    readinessProbe: probe('/readyz', o.adminPort, SIDECAR.probes.readiness),
    livenessProbe: probe('/healthz', o.adminPort, SIDECAR.probes.liveness),
    resources: { limits: { ...o.limits }, requests: { ...o.requests } },
    securityContext: {
      runAsNonRoot: true,
      runAsUser: SIDECAR.runAsUser,
      runAsGroup: SIDECAR.runAsGroup,
      readOnlyRootFilesystem: true,
      allowPrivilegeEscalation: false,
      privileged: false,
      capabilities: { drop: ['ALL'] },
      seccompProfile: { type: 'RuntimeDefault' },
    },
    terminationMessagePolicy: 'FallbackToLogsOnError',
  }
}

/** The Secret as a directory volume with the two keys the proxy reads; the webhook only names it. */
export function credentialsVolume (secretName: string): Record<string, unknown> {
  return {
    name: SIDECAR.credentialsVolume,
    secret: {
      secretName,
      defaultMode: SIDECAR.credentialsDefaultMode,
      items: [
        { key: 'access-key', path: 'access-key' },
        { key: 'access-key-secret', path: 'access-key-secret' },
      ],
    },
  }
}

/** Seconds the pod must grant at least, as the chart computes them. */
export function graceSecondsNeeded (shutdownDelayMs: number, shutdownTimeoutMs: number): number {
  return Math.ceil((shutdownDelayMs + shutdownTimeoutMs) / 1000) + SIDECAR.graceMarginSeconds
}
