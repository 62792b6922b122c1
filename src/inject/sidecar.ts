// The container the webhook injects: the chart's own sidecar as rendered
// into the injector's ConfigMap (COS_INJECT_SIDECAR_FILE, read and checked by
// template.ts; without the chart, examples/injector/ ships the rendered
// default), adjusted per pod here (personalize) and nowhere else built: a new
// field of the sidecar goes into the chart's _container.tpl only.
// What a pod's own ConfigMap may tune, and what it may not, is decided here.
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
