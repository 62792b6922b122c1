// AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: the pure
// core of `cos-auth-proxy inject`. No I/O: the same review always gets the
// same answer (a dry run included), and Secrets are only named, never read.
import { accessLog, allowedMethods, AnnotationProblem, ANNOTATIONS, atLeast, choosePorts, configMapName, envVarName, logLevel, quantity, secretName } from './annotations.js'
import { personalize, type EnvVar, type SidecarTemplate, type TemplateFacts } from './sidecar.js'

/** One sidecar definition as the webhook applies it; replaced whole when the file changes. */
export interface InjectSettings {
  readonly template: SidecarTemplate
  readonly facts: TemplateFacts
  readonly nativeSidecar: boolean
  readonly defaultSecret?: string
  /** The value of the injected-version annotation (template.ts, definitionVersion). */
  readonly version: string
}

export type SkipReason = 'not_a_pod' | 'not_create' | 'not_annotated' | 'already_injected' | 'host_network' | 'windows'

/** Why a pod's review carries a warning: kubectl prints it, the log and cos_auth_proxy_inject_warnings_total{reason} count it. */
export type WarningReason = 'host_network' | 'has_sidecar' | 'share_process_namespace' | 'host_pid' | 'windows'
export interface Warning { readonly reason: WarningReason, readonly message: string }

export type Outcome =
  | { readonly kind: 'injected', readonly patch: readonly PatchOperation[], readonly warnings?: readonly Warning[] }
  /** A patch only with host_network and windows: the annotation that says why (cos-auth-proxy.io/not-injected). */
  | { readonly kind: 'skipped', readonly reason: SkipReason, readonly patch?: readonly PatchOperation[], readonly warnings?: readonly Warning[] }
  | { readonly kind: 'refused', readonly annotation: string, readonly message: string }

export interface PatchOperation { readonly op: 'add', readonly path: string, readonly value: unknown }

export interface AdmissionResponse {
  readonly uid: string
  readonly allowed: boolean
  readonly patchType?: 'JSONPatch'
  readonly patch?: string
  readonly status?: { readonly code: number, readonly message: string }
  /** admission.k8s.io/v1: shown by kubectl as "Warning: …" to whoever created the pod. */
  readonly warnings?: readonly string[]
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
  /** The names of the pod's own volumes (entries without a string name are the API server's to refuse). */
  readonly volumeNames: readonly string[]
  readonly terminationGracePeriodSeconds?: number
  /** The pod-level switches that change what the sidecar's 127.0.0.1 and /proc mean. */
  readonly hostNetwork: boolean
  readonly hostPID: boolean
  readonly shareProcessNamespace: boolean
  /** How the pod is bound to Windows nodes (windowsOnly), where the Linux sidecar cannot run. */
  readonly windows?: string
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
  const volumes: unknown[] = Array.isArray(spec.volumes) ? spec.volumes : []
  const windows = windowsOnly(spec)
  return {
    annotations: annotations ?? {},
    containers,
    ...(initContainers === undefined ? {} : { initContainers }),
    hasVolumes: Array.isArray(spec.volumes),
    volumeNames: volumes.flatMap(v => isObject(v) && typeof v.name === 'string' ? [v.name] : []),
    ...(typeof grace === 'number' ? { terminationGracePeriodSeconds: grace } : {}),
    hostNetwork: spec.hostNetwork === true,
    hostPID: spec.hostPID === true,
    shareProcessNamespace: spec.shareProcessNamespace === true,
    ...(windows === undefined ? {} : { windows }),
  }
}

const OS_LABELS: readonly unknown[] = ['kubernetes.io/os', 'beta.kubernetes.io/os']

/** A nodeSelectorTerm that only Windows (no Linux) nodes match: an expression on the OS label that leaves linux out. */
function excludesLinux (term: unknown): boolean {
  const expressions: unknown[] = isObject(term) && Array.isArray(term.matchExpressions) ? term.matchExpressions : []
  return expressions.some(e => isObject(e) && OS_LABELS.includes(e.key) && Array.isArray(e.values) &&
    (e.operator === 'In' ? !e.values.includes('linux') : e.operator === 'NotIn' && e.values.includes('linux')))
}

/** spec.os.name, a node selector on the OS label, or a required node affinity whose every term excludes Linux. */
function windowsOnly (spec: Json): string | undefined {
  if (isObject(spec.os) && spec.os.name === 'windows') return 'spec.os.name: windows'
  const selector = isObject(spec.nodeSelector) ? spec.nodeSelector : {}
  const label = OS_LABELS.find(l => selector[l as string] === 'windows')
  if (label !== undefined) return `nodeSelector ${label as string}: windows`
  const affinity = isObject(spec.affinity) && isObject(spec.affinity.nodeAffinity) ? spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution : undefined
  const terms = isObject(affinity) ? affinity.nodeSelectorTerms : undefined
  if (Array.isArray(terms) && terms.length > 0 && terms.every(excludesLinux)) return 'a required node affinity on kubernetes.io/os without linux'
  return undefined
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
  if (outcome.kind === 'refused') return { uid, allowed: false, status: { code: 400, message: `${outcome.annotation}: ${outcome.message}` } }
  const patch = outcome.patch === undefined ? {} : { patchType: 'JSONPatch' as const, patch: Buffer.from(JSON.stringify(outcome.patch)).toString('base64') }
  const prefix = outcome.kind === 'skipped' ? 'cos-auth-proxy: no sidecar injected: ' : 'cos-auth-proxy: '
  const warnings = outcome.warnings === undefined ? {} : { warnings: outcome.warnings.map(w => prefix + w.message) }
  return { uid, allowed: true, ...patch, ...warnings }
}

function decide (request: Json, settings: InjectSettings): Outcome {
  if (!isPod(request)) return { kind: 'skipped', reason: 'not_a_pod' }
  if (request.operation !== 'CREATE') return { kind: 'skipped', reason: 'not_create' }
  const pod = readPod(request.object)
  if (pod.annotations[ANNOTATIONS.inject] !== 'true') return { kind: 'skipped', reason: 'not_annotated' }
  if (pod.annotations[ANNOTATIONS.injected] !== undefined) return { kind: 'skipped', reason: 'already_injected' }
  // istio/istio#39788, Azure/azure-workload-identity#1017: a Linux sidecar in a Windows pod breaks the pod.
  if (pod.windows !== undefined) {
    const message = `${pod.windows}: the pod is for Windows nodes, and the sidecar is a Linux container (its image has no Windows variant)`
    const patch = [{ op: 'add' as const, path: `/metadata/annotations/${pointer(ANNOTATIONS.notInjected)}`, value: message }]
    return { kind: 'skipped', reason: 'windows', patch, warnings: [{ reason: 'windows', message }] }
  }
  // linkerd's injector declines such pods for the same reason (host_network_enabled).
  if (pod.hostNetwork) {
    const patch = [{ op: 'add' as const, path: `/metadata/annotations/${pointer(ANNOTATIONS.notInjected)}`, value: HOST_NETWORK }]
    return { kind: 'skipped', reason: 'host_network', patch, warnings: [{ reason: 'host_network', message: HOST_NETWORK }] }
  }
  const { name } = settings.facts
  if ([...pod.containers, ...pod.initContainers ?? []].some(c => c.name === name)) {
    const message = `the pod has a container named ${JSON.stringify(name)} already, taken for the sidecar (the chart's own?); ${ANNOTATIONS.inject} is not needed`
    return { kind: 'skipped', reason: 'already_injected', warnings: [{ reason: 'has_sidecar', message }] }
  }
  const clash = volumeClash(pod, settings)
  if (clash !== undefined) return { kind: 'refused', annotation: ANNOTATIONS.inject, message: clash }
  try {
    const warnings = processWarnings(pod, settings)
    return { kind: 'injected', patch: patchFor(pod, settings), ...(warnings.length === 0 ? {} : { warnings }) }
  } catch (err) {
    if (err instanceof AnnotationProblem) return { kind: 'refused', annotation: err.annotation, message: err.message }
    throw err
  }
}

/** Why a hostNetwork pod gets no sidecar: the value of cos-auth-proxy.io/not-injected and its warning. */
const HOST_NETWORK = 'hostNetwork: the pod\'s 127.0.0.1 is the node\'s loopback, where every process on the node could use the sidecar\'s key'

/** The sidecar's volumes the pod has already: the API server would refuse two of a name, so the webhook refuses first, naming them. */
function volumeClash (pod: Pod, settings: InjectSettings): string | undefined {
  const own = new Set(pod.volumeNames)
  const names = settings.template.volumes.map(v => v.name).filter((n): n is string => typeof n === 'string' && own.has(n))
  if (names.length === 0) return undefined
  const which = names.length === 1 ? `a volume named ${JSON.stringify(names[0])}` : `volumes named ${names.map(n => JSON.stringify(n)).join(', ')}`
  const one = names.length === 1
  return `cannot inject: the pod has ${which} already, and the sidecar adds its own of ${one ? 'that name' : 'those names'} (the API server would refuse the pod). ` +
    `If the pod carries the chart's sidecar (cos-auth-proxy.sidecar.volumes), remove this annotation; else rename ${one ? 'the volume' : 'them'}`
}

/** Pods whose processes see the sidecar's: one running as its uid reads its key files through /proc/<pid>/root. */
function processWarnings (pod: Pod, settings: InjectSettings): Warning[] {
  const context = settings.template.container.securityContext as { runAsUser?: unknown } | undefined
  const uid = typeof context?.runAsUser === 'number' ? `uid ${context.runAsUser}` : 'uid'
  const warnings: Warning[] = []
  if (pod.shareProcessNamespace) {
    warnings.push({ reason: 'share_process_namespace', message: `shareProcessNamespace: a container running as the sidecar's ${uid} can read its key files through /proc/<pid>/root; run the app as another uid` })
  }
  if (pod.hostPID) warnings.push({ reason: 'host_pid', message: `hostPID: any process on the node running as the sidecar's ${uid} can read its key files through /proc/<pid>/root` })
  return warnings
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
  const { facts } = settings
  const envName = envVarName(text(ANNOTATIONS.env))
  const ports = choosePorts([...pod.initContainers ?? [], ...pod.containers], text(ANNOTATIONS.port), facts)
  const cpu = quantity(ANNOTATIONS.cpu, text(ANNOTATIONS.cpu), 'cpu')
  const memory = quantity(ANNOTATIONS.memory, text(ANNOTATIONS.memory), 'memory')
  const methods = allowedMethods(text(ANNOTATIONS.allowedMethods))
  const configMap = configMapName(text(ANNOTATIONS.envFromConfigMap))
  const access = accessLog(text(ANNOTATIONS.accessLog))
  const { container, volumes } = personalize(settings.template, facts, {
    native: settings.nativeSidecar,
    proxyPort: ports.proxy,
    adminPort: ports.admin,
    logLevel: logLevel(text(ANNOTATIONS.logLevel), facts.logLevel),
    ...(access === undefined ? {} : { accessLog: access }),
    ...(methods === undefined ? {} : { methods }),
    secret: secretName(text(ANNOTATIONS.secret), settings.defaultSecret),
    requests: { cpu: cpu?.text ?? facts.requests.cpu, memory: memory?.text ?? facts.requests.memory },
    limits: { cpu: atLeast(cpu, facts.limits.cpu), memory: atLeast(memory, facts.limits.memory) },
    ...(configMap === undefined ? {} : { configMap }),
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

  if (pod.hasVolumes) ops.push(...volumes.map(value => ({ op: 'add' as const, path: '/spec/volumes/-', value })))
  else ops.push({ op: 'add', path: '/spec/volumes', value: volumes })

  // Kubernetes' default is 30 s when the pod says nothing.
  if ((pod.terminationGracePeriodSeconds ?? 30) < facts.graceSeconds) ops.push({ op: 'add', path: '/spec/terminationGracePeriodSeconds', value: facts.graceSeconds })

  // The inject annotation is there, so the map is too.
  ops.push({ op: 'add', path: `/metadata/annotations/${pointer(ANNOTATIONS.injected)}`, value: settings.version })
  return ops
}

function envOps (list: 'containers' | 'initContainers', containers: readonly Container[], url: EnvVar): PatchOperation[] {
  const ops: PatchOperation[] = []
  containers.forEach((c, i) => {
    if (c.env === undefined || c.env === null) ops.push({ op: 'add', path: `/spec/${list}/${i}/env`, value: [url] })
    else if (!c.env.some(e => e.name === url.name)) ops.push({ op: 'add', path: `/spec/${list}/${i}/env/-`, value: url })
  })
  return ops
}
