// The sidecar definition the webhook injects: the container and the volumes
// it mounts, as the chart renders its own sidecar (`cos-auth-proxy.sidecar.*`
// into the injector's ConfigMap, read from COS_INJECT_SIDECAR_FILE; the
// default one rendered in examples/injector/ for deployments without the
// chart). Checked here so that a definition the webhook accepts is one the
// sidecar starts with.
import { createHash } from 'node:crypto'
import { ConfigError, loadConfig, routeUrlList } from '../config/config.js'
import { ROUTE_METHOD_VARIABLES } from './annotations.js'
import type { InjectSettings } from './patch.js'
import type { EnvVar, SidecarTemplate, TemplateFacts } from './sidecar.js'

export type Json = Record<string, unknown>

const SIDECAR_FILE_VARIABLE = 'COS_INJECT_SIDECAR_FILE'
/** The chart's terminationGracePeriodSeconds: the drain plus this. */
const GRACE_MARGIN_SECONDS = 5

function isObject (v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

function bad (problem: string): never {
  throw new ConfigError(SIDECAR_FILE_VARIABLE, problem)
}

export function envOf (container: Json): EnvVar[] {
  return (container.env as { name: string, value?: string }[]).flatMap(e => typeof e.value === 'string' ? [{ name: e.name, value: e.value }] : [])
}

/** Parses and checks the file's text: {"container": {...}, "volumes": [...]}. Throws ConfigError naming COS_INJECT_SIDECAR_FILE. */
export function parseSidecarFile (text: string): { template: SidecarTemplate, facts: TemplateFacts } {
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch (err) {
    bad(`must hold JSON ({"container": ..., "volumes": [...]}): ${(err as Error).message}`)
  }
  if (!isObject(parsed) || !isObject(parsed.container) || !Array.isArray(parsed.volumes) || !parsed.volumes.every(isObject)) {
    bad('must hold an object with "container" (a Container) and "volumes" (a list of Volumes)')
  }
  const template = { container: parsed.container, volumes: parsed.volumes }
  return { template, facts: checkTemplate(template) }
}

/** The facts of a template, or a ConfigError saying what is wrong with it. */
function checkTemplate (t: SidecarTemplate): TemplateFacts {
  const c = t.container
  if (typeof c.name !== 'string' || c.name === '') bad('container.name is required')
  if (typeof c.image !== 'string' || c.image === '' || /\s/.test(c.image)) bad('container.image must be an image reference')
  const env = c.env
  if (!Array.isArray(env) || !env.every(e => isObject(e) && typeof e.name === 'string' && (typeof e.value === 'string' || isObject(e.valueFrom)))) {
    bad('container.env must be a list of {name, value} or {name, valueFrom}')
  }
  if (c.envFrom !== undefined) bad('container.envFrom is per pod (cos-auth-proxy.io/env-from-configmap), not in the definition')
  const values = Object.fromEntries(envOf(c).map(e => [e.name, e.value]))
  // The proxy's own checks, so no injected sidecar exits 78 on the cluster-wide part.
  let proxy
  try {
    proxy = loadConfig({ env: values, dotenv: false, needs: 'nothing' })
  } catch (err) {
    if (err instanceof ConfigError) bad(`container.env: ${err.message}`)
    throw err
  }
  if (proxy.routes.length === 0) bad(`container.env sets no ${routeUrlList()}: the sidecars need an upstream`)
  for (const name of ['COS_LISTEN_PORT', 'COS_ADMIN_PORT', 'COS_LOG_LEVEL', 'COS_ACCESS_KEY_FILE', 'COS_ACCESS_KEY_SECRET_FILE']) {
    if (values[name] === undefined) bad(`container.env must set ${name}`)
  }
  const mounts = c.volumeMounts
  if (!Array.isArray(mounts) || !mounts.every(m => isObject(m) && typeof m.name === 'string' && typeof m.mountPath === 'string')) bad('container.volumeMounts must be a list of {name, mountPath}')
  for (const m of mounts as Json[]) {
    // A subPath mount never sees a rotated Secret; a writable one is not needed.
    if (m.subPath !== undefined || m.subPathExpr !== undefined) bad(`volume mount ${String(m.name)} must be a directory (no subPath), so rotated files are seen`)
    if (m.readOnly !== true) bad(`volume mount ${String(m.name)} must be readOnly`)
    if (!t.volumes.some(v => v.name === m.name)) bad(`volume mount ${String(m.name)} has no volume in "volumes"`)
  }
  const keyDir = values.COS_ACCESS_KEY_FILE?.replace(/\/[^/]*$/, '')
  const credentials = (mounts as Json[]).find(m => m.mountPath === keyDir)
  const volume = t.volumes.find(v => v.name === credentials?.name)
  if (volume === undefined || !isObject(volume.secret)) bad(`no Secret volume is mounted at ${keyDir ?? '?'} (COS_ACCESS_KEY_FILE's directory)`)
  const resources = isObject(c.resources) ? c.resources : {}
  return {
    name: c.name,
    proxyPort: proxy.listen.port,
    adminPort: proxy.admin.port,
    logLevel: proxy.logLevel,
    methodVariables: Object.entries(ROUTE_METHOD_VARIABLES).filter(([url]) => values[url] !== undefined).map(([, list]) => list),
    graceSeconds: Math.ceil((proxy.shutdownDelayMs + proxy.shutdownTimeoutMs) / 1000) + GRACE_MARGIN_SECONDS,
    credentialsVolume: volume.name as string,
    requests: quantities(resources.requests),
    limits: quantities(resources.limits),
  }
}

function quantities (v: unknown): { cpu?: string, memory?: string } {
  if (!isObject(v)) return {}
  const text = (q: unknown): string | undefined => typeof q === 'string' ? q : typeof q === 'number' ? String(q) : undefined
  const cpu = text(v.cpu)
  const memory = text(v.memory)
  return { ...(cpu === undefined ? {} : { cpu }), ...(memory === undefined ? {} : { memory }) }
}

/** Canonical JSON (sorted keys): the same definition always hashes the same. */
function canonical (v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`
  if (isObject(v)) return `{${Object.keys(v).sort().map(k => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`
  return JSON.stringify(v)
}

/**
 * The `injected-version` annotation: this program's version and a short hash
 * of everything that shapes the patch, so pods injected before a change differ.
 */
function definitionVersion (programVersion: string, template: SidecarTemplate, nativeSidecar: boolean): string {
  const hash = createHash('sha256').update(canonical({ programVersion, template, nativeSidecar })).digest('hex').slice(0, 12)
  return `${programVersion}-${hash}`
}

/**
 * COS_INJECT_OPENSHIFT: the container without runAsUser and runAsGroup, for
 * OpenShift's restricted-v2 SCC to assign from the namespace's range (a fixed
 * uid outside it gets the pod refused). runAsNonRoot and the rest stay.
 */
function withoutFixedIds (t: SidecarTemplate): SidecarTemplate {
  const context = t.container.securityContext
  if (!isObject(context)) return t
  const securityContext = Object.fromEntries(Object.entries(context).filter(([k]) => k !== 'runAsUser' && k !== 'runAsGroup'))
  return { ...t, container: { ...t.container, securityContext } }
}

/** The settings patch.ts applies, from a checked definition (openshift: COS_INJECT_OPENSHIFT). */
export function injectSettings (parsed: { template: SidecarTemplate, facts: TemplateFacts }, nativeSidecar: boolean, defaultSecret: string | undefined, programVersion: string, openshift = false): InjectSettings {
  const template = openshift ? withoutFixedIds(parsed.template) : parsed.template
  return Object.freeze({
    template,
    facts: parsed.facts,
    nativeSidecar,
    ...(defaultSecret === undefined ? {} : { defaultSecret }),
    version: definitionVersion(programVersion, template, nativeSidecar),
  })
}
