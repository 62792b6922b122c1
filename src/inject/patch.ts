// AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: the pure
// core of `cos-auth-proxy inject`. No I/O: the same review always gets the
// same answer (a dry run included), and Secrets are only named, never read.
import { PROXY_METHODS } from '../config.js'
import { credentialsVolume, graceSecondsNeeded, SIDECAR, sidecarContainer, type EnvVar } from './sidecar.js'

const PREFIX = 'cos-auth-proxy.io/'
export const ANNOTATIONS = {
  inject: `${PREFIX}inject`,
  secret: `${PREFIX}secret`,
  env: `${PREFIX}env`,
  allowedMethods: `${PREFIX}allowed-methods`,
  cpu: `${PREFIX}cpu`,
  memory: `${PREFIX}memory`,
  port: `${PREFIX}port`,
  /** Set by the webhook: the image injected. Its presence makes a re-invocation a no-op. */
  injected: `${PREFIX}injected-version`,
} as const

export const DEFAULT_ENV_NAME = 'COS_PROXY_URL'

/** The upstream route settings, by the variable that lists a route's methods. */
export const ROUTE_METHOD_VARIABLES = {
  COS_MANAGEMENT_API_URL: 'COS_MANAGEMENT_ALLOWED_METHODS',
  COS_OPTIMIZE_API_URL: 'COS_OPTIMIZE_ALLOWED_METHODS',
  COS_API_URL: 'COS_API_ALLOWED_METHODS',
} as const

export interface InjectSettings {
  readonly image: string
  readonly nativeSidecar: boolean
  readonly defaultSecret?: string
  /** COS_* upstream settings the sidecars get, in the chart's order. */
  readonly upstreamEnv: readonly EnvVar[]
  /** Further settings passed through (timeouts, token encoding, method lists). */
  readonly extraEnv: readonly EnvVar[]
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  readonly logLevel: string
}

export type SkipReason = 'not_a_pod' | 'not_create' | 'not_annotated' | 'already_injected'

export type Outcome =
  | { readonly kind: 'injected', readonly patch: readonly PatchOperation[] }
  | { readonly kind: 'skipped', readonly reason: SkipReason }
  | { readonly kind: 'refused', readonly annotation: string, readonly message: string }

export interface PatchOperation { readonly op: 'add', readonly path: string, readonly value: unknown }

export interface AdmissionResponse {
  readonly uid: string
  readonly allowed: boolean
  readonly patchType?: 'JSONPatch'
  readonly patch?: string
  readonly status?: { readonly code: number, readonly message: string }
}

export interface ReviewAnswer {
  readonly review: { readonly apiVersion: 'admission.k8s.io/v1', readonly kind: 'AdmissionReview', readonly response: AdmissionResponse }
  readonly outcome: Outcome
}

/** Not an AdmissionReview the API server would send: the caller answers 400. */
export class MalformedReview extends Error {
  override readonly name = 'MalformedReview'
}

interface Container {
  readonly name: string
  readonly env?: readonly { readonly name?: unknown }[] | null
  readonly ports?: readonly { readonly containerPort?: unknown }[] | null
}

interface Pod {
  readonly annotations: Readonly<Record<string, unknown>>
  readonly containers: readonly Container[]
  readonly initContainers?: readonly Container[]
  readonly hasVolumes: boolean
  readonly terminationGracePeriodSeconds?: number
}

type Json = Record<string, unknown>

function isObject (v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

function optionalList (v: unknown): boolean {
  return v === undefined || v === null || (Array.isArray(v) && v.every(isObject))
}

function containerList (v: unknown, where: string): Container[] | undefined {
  if (v === undefined || v === null) return undefined
  if (!Array.isArray(v) || !v.every(c => isObject(c) && typeof c.name === 'string' && optionalList(c.env) && optionalList(c.ports))) {
    throw new MalformedReview(`request.object.spec.${where} must be a list of containers with names (and env, ports lists)`)
  }
  return v as Container[]
}

function readPod (object: unknown): Pod {
  if (!isObject(object) || !isObject(object.spec)) throw new MalformedReview('request.object must be a Pod with a spec')
  const metadata = isObject(object.metadata) ? object.metadata : {}
  const annotations = isObject(metadata.annotations) ? metadata.annotations : undefined
  const spec = object.spec
  const containers = containerList(spec.containers, 'containers')
  if (containers === undefined) throw new MalformedReview('request.object.spec.containers is required')
  const initContainers = containerList(spec.initContainers, 'initContainers')
  const grace = spec.terminationGracePeriodSeconds
  return {
    annotations: annotations ?? {},
    containers,
    ...(initContainers === undefined ? {} : { initContainers }),
    hasVolumes: Array.isArray(spec.volumes),
    ...(typeof grace === 'number' ? { terminationGracePeriodSeconds: grace } : {}),
  }
}

/** The request part of a review, checked as far as this webhook reads it. */
function readRequest (body: unknown): { uid: string, request: Json } {
  if (!isObject(body) || body.apiVersion !== 'admission.k8s.io/v1' || body.kind !== 'AdmissionReview') {
    throw new MalformedReview('the body must be an AdmissionReview of admission.k8s.io/v1')
  }
  const request = body.request
  if (!isObject(request) || typeof request.uid !== 'string' || request.uid === '') {
    throw new MalformedReview('request.uid is required')
  }
  return { uid: request.uid, request }
}

function isPod (request: Json): boolean {
  const kind = request.kind
  return isObject(kind) && kind.group === '' && kind.kind === 'Pod' && (request.subResource === undefined || request.subResource === '')
}

/** Answers one review. Throws MalformedReview only. */
export function answerReview (body: unknown, settings: InjectSettings): ReviewAnswer {
  const { uid, request } = readRequest(body)
  const outcome = decide(request, settings)
  return { review: { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', response: responseFor(uid, outcome) }, outcome }
}

function responseFor (uid: string, outcome: Outcome): AdmissionResponse {
  switch (outcome.kind) {
    case 'injected':
      return { uid, allowed: true, patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(outcome.patch)).toString('base64') }
    case 'skipped':
      return { uid, allowed: true }
    case 'refused':
      return { uid, allowed: false, status: { code: 400, message: `${outcome.annotation}: ${outcome.message}` } }
  }
}

function decide (request: Json, settings: InjectSettings): Outcome {
  if (!isPod(request)) return { kind: 'skipped', reason: 'not_a_pod' }
  if (request.operation !== 'CREATE') return { kind: 'skipped', reason: 'not_create' }
  const pod = readPod(request.object)
  if (pod.annotations[ANNOTATIONS.inject] !== 'true') return { kind: 'skipped', reason: 'not_annotated' }
  if (pod.annotations[ANNOTATIONS.injected] !== undefined || hasSidecar(pod)) return { kind: 'skipped', reason: 'already_injected' }
  try {
    return { kind: 'injected', patch: patchFor(pod, settings) }
  } catch (err) {
    if (err instanceof AnnotationProblem) return { kind: 'refused', annotation: err.annotation, message: err.message }
    throw err
  }
}

function hasSidecar (pod: Pod): boolean {
  return [...pod.containers, ...pod.initContainers ?? []].some(c => c.name === SIDECAR.containerName)
}

class AnnotationProblem extends Error {
  readonly annotation: string
  constructor (annotation: string, problem: string) {
    super(problem)
    this.annotation = annotation
  }
}

/** JSON Pointer escaping (RFC 6901) of one path segment. */
function pointer (segment: string): string {
  return segment.replaceAll('~', '~0').replaceAll('/', '~1')
}

function patchFor (pod: Pod, settings: InjectSettings): PatchOperation[] {
  const a = pod.annotations
  const text = (name: string): string | undefined => {
    const v = a[name]
    if (v === undefined) return undefined
    if (typeof v !== 'string') throw new AnnotationProblem(name, 'must be a string')
    return v.trim()
  }
  const secret = secretName(text(ANNOTATIONS.secret), settings.defaultSecret)
  const envName = envVarName(text(ANNOTATIONS.env))
  const ports = choosePorts(pod, text(ANNOTATIONS.port))
  const cpu = quantity(ANNOTATIONS.cpu, text(ANNOTATIONS.cpu), 'cpu')
  const memory = quantity(ANNOTATIONS.memory, text(ANNOTATIONS.memory), 'memory')
  const methods = allowedMethods(text(ANNOTATIONS.allowedMethods))

  const container = sidecarContainer({
    image: settings.image,
    native: settings.nativeSidecar,
    proxyPort: ports.proxy,
    adminPort: ports.admin,
    upstreamEnv: settings.upstreamEnv,
    extraEnv: withMethods(settings, methods),
    shutdownDelayMs: settings.shutdownDelayMs,
    shutdownTimeoutMs: settings.shutdownTimeoutMs,
    logLevel: settings.logLevel,
    requests: { cpu: cpu?.text ?? SIDECAR.requests.cpu, memory: memory?.text ?? SIDECAR.requests.memory },
    limits: {
      cpu: atLeast(cpu, SIDECAR.limits.cpu),
      memory: atLeast(memory, SIDECAR.limits.memory),
    },
  })

  const ops: PatchOperation[] = []
  // Before the sidecar goes in at initContainers/0, while the indices are the pod's own.
  const url = { name: envName, value: `http://127.0.0.1:${ports.proxy}` }
  ops.push(...envOps('containers', pod.containers, url))
  // Native: the other init containers start after the proxy is ready, so they may use it too.
  if (settings.nativeSidecar) ops.push(...envOps('initContainers', pod.initContainers ?? [], url))

  if (!settings.nativeSidecar) ops.push({ op: 'add', path: '/spec/containers/-', value: container })
  else if (pod.initContainers === undefined) ops.push({ op: 'add', path: '/spec/initContainers', value: [container] })
  else ops.push({ op: 'add', path: '/spec/initContainers/0', value: container })

  const volume = credentialsVolume(secret)
  ops.push(pod.hasVolumes ? { op: 'add', path: '/spec/volumes/-', value: volume } : { op: 'add', path: '/spec/volumes', value: [volume] })

  const need = graceSecondsNeeded(settings.shutdownDelayMs, settings.shutdownTimeoutMs)
  // Kubernetes' default is 30 s when the pod says nothing.
  if ((pod.terminationGracePeriodSeconds ?? 30) < need) ops.push({ op: 'add', path: '/spec/terminationGracePeriodSeconds', value: need })

  // The inject annotation is there, so the map is too.
  ops.push({ op: 'add', path: `/metadata/annotations/${pointer(ANNOTATIONS.injected)}`, value: settings.image })
  return ops
}

function envOps (list: 'containers' | 'initContainers', containers: readonly Container[], url: EnvVar): PatchOperation[] {
  const ops: PatchOperation[] = []
  containers.forEach((c, i) => {
    if (c.name === SIDECAR.containerName) return
    if (c.env === undefined || c.env === null) ops.push({ op: 'add', path: `/spec/${list}/${i}/env`, value: [url] })
    else if (!c.env.some(e => e.name === url.name)) ops.push({ op: 'add', path: `/spec/${list}/${i}/env/-`, value: url })
  })
  return ops
}

// DNS-1123 subdomain, as Secret names are.
const SECRET_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/

function secretName (annotated: string | undefined, fallback: string | undefined): string {
  if (annotated === undefined) {
    if (fallback === undefined) throw new AnnotationProblem(ANNOTATIONS.secret, 'is required: this webhook has no default Secret (COS_INJECT_DEFAULT_SECRET)')
    return fallback
  }
  if (annotated.length > 253 || !SECRET_NAME.test(annotated)) throw new AnnotationProblem(ANNOTATIONS.secret, `must be a Secret name (lower-case DNS subdomain), got ${JSON.stringify(annotated)}`)
  return annotated
}

// What the API server accepts as an environment variable name.
const ENV_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/

function envVarName (annotated: string | undefined): string {
  if (annotated === undefined) return DEFAULT_ENV_NAME
  if (!ENV_NAME.test(annotated)) throw new AnnotationProblem(ANNOTATIONS.env, `must be an environment variable name like ${DEFAULT_ENV_NAME}, got ${JSON.stringify(annotated)}`)
  return annotated
}

function declaredPorts (pod: Pod): Map<number, string> {
  const ports = new Map<number, string>()
  for (const c of [...pod.initContainers ?? [], ...pod.containers]) {
    for (const p of c.ports ?? []) if (typeof p.containerPort === 'number') ports.set(p.containerPort, c.name)
  }
  return ports
}

function firstFree (from: number, taken: (port: number) => boolean): number {
  let port = from
  while (taken(port)) port++
  return port
}

/** The proxy and admin ports: the defaults unless a container declares them. */
function choosePorts (pod: Pod, annotated: string | undefined): { proxy: number, admin: number } {
  const declared = declaredPorts(pod)
  let proxy: number
  if (annotated === undefined) {
    proxy = firstFree(SIDECAR.proxyPort, p => declared.has(p))
  } else {
    proxy = /^[0-9]{1,5}$/.test(annotated) ? Number(annotated) : NaN
    if (!(proxy >= 1 && proxy <= 65535)) throw new AnnotationProblem(ANNOTATIONS.port, `must be a port number 1-65535, got ${JSON.stringify(annotated)}`)
    const owner = declared.get(proxy)
    if (owner !== undefined) throw new AnnotationProblem(ANNOTATIONS.port, `${proxy} clashes with a port of container ${JSON.stringify(owner)}`)
  }
  const admin = firstFree(SIDECAR.adminPort, p => declared.has(p) || p === proxy)
  return { proxy, admin }
}

interface Quantity { readonly text: string, readonly value: number }

// A Kubernetes resource quantity: decimal number and an SI or binary suffix.
const QUANTITY = /^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/
const FACTOR: Readonly<Record<string, number>> = {
  '': 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
}

function parseQuantity (text: string): number | undefined {
  const m = QUANTITY.exec(text)
  if (m === null) return undefined
  return Number(m[1]) * (FACTOR[m[2] ?? ''] ?? NaN)
}

function quantity (annotation: string, text: string | undefined, what: 'cpu' | 'memory'): Quantity | undefined {
  if (text === undefined) return undefined
  const value = parseQuantity(text)
  if (value === undefined || !(value > 0)) {
    throw new AnnotationProblem(annotation, `must be a positive ${what} quantity like ${what === 'cpu' ? '100m or 0.5' : '128Mi or 1Gi'}, got ${JSON.stringify(text)}`)
  }
  return { text, value }
}

/** The annotation sets the request; the limit is raised to it when the default is lower. */
function atLeast (request: Quantity | undefined, limit: string): string {
  return request !== undefined && request.value > (parseQuantity(limit) ?? 0) ? request.text : limit
}

function allowedMethods (annotated: string | undefined): string | undefined {
  if (annotated === undefined) return undefined
  const methods = annotated.split(',').map(m => m.trim().toUpperCase()).filter(m => m !== '')
  const unknown = methods.find(m => !(PROXY_METHODS as readonly string[]).includes(m))
  if (methods.length === 0 || unknown !== undefined) {
    throw new AnnotationProblem(ANNOTATIONS.allowedMethods, `must be a comma-separated list of ${PROXY_METHODS.join(', ')}${unknown === undefined ? '' : `, got ${JSON.stringify(unknown)}`}`)
  }
  return [...new Set(methods)].join(',')
}

/** The annotation's method list on every configured route, in place of the webhook's own. */
function withMethods (settings: InjectSettings, methods: string | undefined): EnvVar[] {
  if (methods === undefined) return [...settings.extraEnv]
  const lists = new Set<string>(Object.values(ROUTE_METHOD_VARIABLES))
  const routes = settings.upstreamEnv.flatMap(e => e.name in ROUTE_METHOD_VARIABLES ? [ROUTE_METHOD_VARIABLES[e.name as keyof typeof ROUTE_METHOD_VARIABLES]] : [])
  return [...settings.extraEnv.filter(e => !lists.has(e.name)), ...routes.map(name => ({ name, value: methods }))]
}
