// The container the webhook injects. With COS_INJECT_SIDECAR_FILE it is the
// chart's own sidecar as rendered into the injector's ConfigMap
// (template.ts), adjusted per pod here (personalize); without one,
// sidecarContainer builds the chart's sidecar with its default values:
// test/inject/chart.test.ts and patch.test.ts compare both field by field with what the chart
// renders (test/fixtures/chart/, examples/sidecar-parent-chart/rendered/),
// which scripts/ci-packaging.sh keeps current, so neither can drift unnoticed.
import { VARIABLES } from '../config/config.js'

type Json = Record<string, unknown>

export interface EnvVar { readonly name: string, readonly value: string }

/** A checked sidecar definition (template.ts reads and checks it; personalize adjusts it per pod). */
export interface SidecarTemplate {
  /** A Kubernetes Container; env entries with `value` or `valueFrom`. */
  readonly container: Json
  readonly volumes: readonly Json[]
}

/** What patch.ts reads off a checked template. */
export interface TemplateFacts {
  readonly name: string
  readonly proxyPort: number
  readonly adminPort: number
  readonly logLevel: string
  /** The COS_*_ALLOWED_METHODS of the routes configured, in the env's order. */
  readonly methodVariables: readonly string[]
  readonly graceSeconds: number
  readonly credentialsVolume: string
  readonly requests: { readonly cpu?: string, readonly memory?: string }
  readonly limits: { readonly cpu?: string, readonly memory?: string }
}

/** What the chart's values.yaml defaults to, and the names its sidecar templates use. */
export const SIDECAR = {
  containerName: 'cos-auth-proxy',
  credentialsVolume: 'cos-auth-proxy-credentials',
  /** An empty directory over the ServiceAccount token's path: the API server mounts the app pod's token into
   * every container without a mount there, and the proxy never calls the API server. */
  noApiTokenVolume: 'cos-auth-proxy-no-api-token',
  apiTokenMountPath: '/var/run/secrets/kubernetes.io/serviceaccount',
  credentialsMountPath: '/var/run/secrets/cos',
  // 0444: the pod's fsGroup is not known (the chart's sidecar mode does the same).
  credentialsDefaultMode: 0o444,
  proxyPort: 8080,
  adminPort: 9090,
  requests: { cpu: '50m', memory: '64Mi' },
  limits: { cpu: '1', memory: '128Mi' },
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
    volumeMounts: [
      { name: SIDECAR.credentialsVolume, mountPath: mount, readOnly: true },
      { name: SIDECAR.noApiTokenVolume, mountPath: SIDECAR.apiTokenMountPath, readOnly: true },
    ],
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

/** The empty directory that keeps the pod's ServiceAccount token out of the sidecar. */
export function noApiTokenVolume (): Record<string, unknown> {
  // No sizeLimit: mounted read-only, nothing is written, and the kubelet counts the directory's own
  // block (4 KiB) as usage: a real node evicted pods under a 1Ki limit.
  return { name: SIDECAR.noApiTokenVolume, emptyDir: {} }
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

/** The image's NODE_OPTIONS (Dockerfile): pinned as it is when a pod's ConfigMap is used. */
export const IMAGE_NODE_OPTIONS = '--max-old-space-size=64'

/**
 * What a pod's own ConfigMap (cos-auth-proxy.io/env-from-configmap) may set:
 * tuning of the sidecar itself, nothing that changes where it sends signed
 * requests, through which proxy, trusting which CA, or who may call it.
 */
export const CONFIGMAP_TUNABLE: readonly string[] = [
  'COS_TOKEN_ENCODING', 'COS_CLOCK_SKEW_CORRECTION', 'COS_CLOCK_SKEW_MAX_SECONDS', 'COS_UPSTREAM_TIMEOUT_MS', 'COS_CONNECT_TIMEOUT_MS', 'COS_UPSTREAM_MAX_CONNECTIONS',
  'COS_LOG_FORMAT', 'COS_ACCESS_LOG', 'COS_ACCESS_LOG_SLOW_MS', 'COS_ACCESS_LOG_SAMPLE', 'COS_CREDENTIALS_RELOAD_MS', 'COS_ADMIN_MAX_CONNECTIONS', 'COS_BODY_IDLE_TIMEOUT_MS', 'COS_MAX_BODY_BYTES',
  'COS_HEADERS_TIMEOUT_MS', 'COS_REQUEST_TIMEOUT_MS', 'COS_KEEPALIVE_TIMEOUT_MS', 'COS_MAX_CONNECTIONS',
  // On by default and for the pod itself only: a pod may turn it off (a mesh that forwards to 127.0.0.1).
  'COS_QUITQUITQUIT',
]

/** Read by Node itself: an extra CA, TLS checks off, an inspector, an egress proxy for fetch. */
const NODE_PINNED: Readonly<Record<string, string>> = {
  NODE_OPTIONS: IMAGE_NODE_OPTIONS, NODE_EXTRA_CA_CERTS: '', NODE_TLS_REJECT_UNAUTHORIZED: '', NODE_USE_ENV_PROXY: '', NODE_USE_SYSTEM_CA: '', SSL_CERT_FILE: '', SSL_CERT_DIR: '',
}

/**
 * In Kubernetes an `env` entry wins over the same name from `envFrom`: every
 * variable a ConfigMap must not set gets one (empty is unset for the proxy
 * and for Node), unless the definition sets it already.
 */
export function pinnedEnv (): EnvVar[] {
  const proxy = Object.keys(VARIABLES).filter(name => !CONFIGMAP_TUNABLE.includes(name)).map(name => ({ name, value: '' }))
  return [...proxy, ...Object.entries(NODE_PINNED).map(([name, value]) => ({ name, value }))]
}

/** What differs per pod, from its annotations and ports. */
export interface PodChoices {
  readonly native: boolean
  readonly proxyPort: number
  readonly adminPort: number
  readonly logLevel: string
  /** COS_ACCESS_LOG from the pod's annotation, in place of the definition's (or the proxy's default). */
  readonly accessLog?: string
  /** The method list for every configured route, in place of the definition's. */
  readonly methods?: string
  readonly secret: string
  readonly requests: { readonly cpu?: string | undefined, readonly memory?: string | undefined }
  readonly limits: { readonly cpu?: string | undefined, readonly memory?: string | undefined }
  readonly configMap?: string
}

/** The definition's quantities with the pod's on top; nothing when neither has any. */
function merged (base: unknown, add: Record<string, string | undefined>): Json | undefined {
  const extra = Object.fromEntries(Object.entries(add).filter(e => e[1] !== undefined))
  if (base === undefined && Object.keys(extra).length === 0) return undefined
  return { ...base as Json, ...extra }
}

/** The definition's container and volumes for one pod: only what PodChoices names changes. */
export function personalize (t: SidecarTemplate, facts: TemplateFacts, p: PodChoices): { container: Json, volumes: Json[] } {
  const set: Record<string, string> = { COS_LISTEN_PORT: String(p.proxyPort), COS_ADMIN_PORT: String(p.adminPort), COS_LOG_LEVEL: p.logLevel }
  if (p.accessLog !== undefined) set.COS_ACCESS_LOG = p.accessLog
  const lists = /^COS_[A-Z]+_ALLOWED_METHODS$/
  let env: Json[] = (structuredClone(t.container.env) as Json[])
    .filter(e => p.methods === undefined || !lists.test(e.name as string))
    .map(e => (e.name as string) in set ? { name: e.name, value: set[e.name as string] } : e)
  const { methods, configMap } = p
  if (p.accessLog !== undefined && !env.some(e => e.name === 'COS_ACCESS_LOG')) env.push({ name: 'COS_ACCESS_LOG', value: p.accessLog })
  if (methods !== undefined) env.push(...facts.methodVariables.map(name => ({ name, value: methods })))
  if (configMap !== undefined) {
    const named = new Set(env.map(e => e.name))
    env = [...env, ...pinnedEnv().filter(e => !named.has(e.name)).map(e => ({ ...e }))]
  }
  const admin = (n: unknown): unknown => n === facts.adminPort ? p.adminPort : n
  const container: Json = {}
  for (const [key, value] of Object.entries(structuredClone(t.container))) {
    if (key === 'restartPolicy') continue
    if (key === 'env') {
      container.env = env
      if (p.configMap !== undefined) container.envFrom = [{ configMapRef: { name: p.configMap } }]
    } else if (key === 'ports') container.ports = (value as Json[]).map(port => ({ ...port, containerPort: admin(port.containerPort) }))
    else if (/^(startup|readiness|liveness)Probe$/.test(key) && typeof (value as Json).httpGet === 'object') {
      const probe = value as { httpGet: Json }
      container[key] = { ...probe, httpGet: { ...probe.httpGet, port: admin(probe.httpGet.port) } }
    } else if (key === 'resources') {
      const r = value as Json
      const limits = merged(r.limits, p.limits)
      const requests = merged(r.requests, p.requests)
      container.resources = { ...r, ...(limits === undefined ? {} : { limits }), ...(requests === undefined ? {} : { requests }) }
    } else container[key] = value
    // Where the chart writes it, after imagePullPolicy.
    if (key === 'imagePullPolicy' && p.native) container.restartPolicy = 'Always'
  }
  const volumes = t.volumes.map(v => v.name === facts.credentialsVolume ? { ...v, secret: { ...v.secret as Json, secretName: p.secret } } : structuredClone(v))
  return { container, volumes }
}
