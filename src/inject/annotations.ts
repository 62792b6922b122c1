// The pod annotations the webhook reads, each checked on its own: a bad value
// is an AnnotationProblem naming the annotation, and the pod is refused with it.
import { ACCESS_LOGS, LOG_LEVELS, PROXY_METHODS, ROUTE_TABLE } from '../config/config.js'

const PREFIX = 'cos-auth-proxy.io/'
export const ANNOTATIONS = {
  inject: `${PREFIX}inject`,
  secret: `${PREFIX}secret`,
  env: `${PREFIX}env`,
  allowedMethods: `${PREFIX}allowed-methods`,
  cpu: `${PREFIX}cpu`,
  memory: `${PREFIX}memory`,
  port: `${PREFIX}port`,
  logLevel: `${PREFIX}log-level`,
  accessLog: `${PREFIX}access-log`,
  envFromConfigMap: `${PREFIX}env-from-configmap`,
  /** Set by the webhook: program version and hash of the sidecar definition. Its presence makes a re-invocation a no-op. */
  injected: `${PREFIX}injected-version`,
  /** Set by the webhook on a pod that asks for the sidecar and cannot have it (hostNetwork): why. */
  notInjected: `${PREFIX}not-injected`,
} as const

export const DEFAULT_ENV_NAME = 'COS_PROXY_URL'

/** The upstream route settings, by the variable that lists a route's methods (the route table's). */
export const ROUTE_METHOD_VARIABLES: Readonly<Record<string, string>> = Object.fromEntries(ROUTE_TABLE.map(r => [r.url, r.methods]))

/** A refused value as the refusal quotes it: at most 64 characters of it (an annotation may hold 256 KiB, and the message reaches the API server, its client and the log). */
export function got (value: string): string {
  return value.length <= 64 ? JSON.stringify(value) : `${JSON.stringify(value.slice(0, 64))}… (${value.length} characters)`
}

export class AnnotationProblem extends Error {
  readonly annotation: string
  constructor (annotation: string, problem: string) {
    super(problem)
    this.annotation = annotation
  }
}

// DNS-1123 subdomain, as Secret and ConfigMap names are.
const OBJECT_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/

function objectName (annotation: string, value: string, what: string): string {
  if (value.length > 253 || !OBJECT_NAME.test(value)) throw new AnnotationProblem(annotation, `must be a ${what} name (lower-case DNS subdomain), got ${got(value)}`)
  return value
}

export function secretName (annotated: string | undefined, fallback: string | undefined): string {
  if (annotated === undefined) {
    if (fallback === undefined) throw new AnnotationProblem(ANNOTATIONS.secret, 'is required: this webhook has no default Secret (COS_INJECT_DEFAULT_SECRET)')
    return fallback
  }
  return objectName(ANNOTATIONS.secret, annotated, 'Secret')
}

export function configMapName (annotated: string | undefined): string | undefined {
  return annotated === undefined ? undefined : objectName(ANNOTATIONS.envFromConfigMap, annotated, 'ConfigMap')
}

// What the API server accepts as an environment variable name.
const ENV_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/

export function envVarName (annotated: string | undefined): string {
  if (annotated === undefined) return DEFAULT_ENV_NAME
  if (!ENV_NAME.test(annotated)) throw new AnnotationProblem(ANNOTATIONS.env, `must be an environment variable name like ${DEFAULT_ENV_NAME}, got ${got(annotated)}`)
  return annotated
}

export function logLevel (annotated: string | undefined, fallback: string): string {
  if (annotated === undefined) return fallback
  if (!(LOG_LEVELS as readonly string[]).includes(annotated)) throw new AnnotationProblem(ANNOTATIONS.logLevel, `must be one of ${LOG_LEVELS.join(', ')}, got ${got(annotated)}`)
  return annotated
}

/** COS_ACCESS_LOG for this pod's sidecar: errors, all or off; undefined keeps the definition's. */
export function accessLog (annotated: string | undefined): string | undefined {
  if (annotated === undefined) return undefined
  if (!(ACCESS_LOGS as readonly string[]).includes(annotated)) throw new AnnotationProblem(ANNOTATIONS.accessLog, `must be one of ${ACCESS_LOGS.join(', ')}, got ${got(annotated)}`)
  return annotated
}

export function port (annotated: string): number {
  const n = /^[0-9]{1,5}$/.test(annotated) ? Number(annotated) : NaN
  if (!(n >= 1 && n <= 65535)) throw new AnnotationProblem(ANNOTATIONS.port, `must be a port number 1-65535, got ${got(annotated)}`)
  return n
}

/** A container as far as its ports go. */
export interface PortsOf { readonly name: string, readonly ports?: readonly { readonly containerPort?: unknown }[] | null }

function firstFree (from: number, taken: (port: number) => boolean): number {
  let port = from
  while (taken(port)) port++
  return port
}

/** The proxy and admin ports: the annotation's (refused when a container declares it) or the definition's, moved past the containers' own. */
export function choosePorts (containers: readonly PortsOf[], annotated: string | undefined, defaults: { readonly proxyPort: number, readonly adminPort: number }): { proxy: number, admin: number } {
  const declared = new Map<number, string>()
  for (const c of containers) {
    for (const p of c.ports ?? []) if (typeof p.containerPort === 'number') declared.set(p.containerPort, c.name)
  }
  let proxy: number
  if (annotated === undefined) {
    proxy = firstFree(defaults.proxyPort, p => declared.has(p))
  } else {
    proxy = port(annotated)
    const owner = declared.get(proxy)
    if (owner !== undefined) throw new AnnotationProblem(ANNOTATIONS.port, `${proxy} clashes with a port of container ${JSON.stringify(owner)}`)
  }
  const admin = firstFree(defaults.adminPort, p => declared.has(p) || p === proxy)
  return { proxy, admin }
}

export interface Quantity { readonly text: string, readonly value: number }

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

export function quantity (annotation: string, text: string | undefined, what: 'cpu' | 'memory'): Quantity | undefined {
  if (text === undefined) return undefined
  const value = parseQuantity(text)
  if (value === undefined || !(value > 0)) {
    throw new AnnotationProblem(annotation, `must be a positive ${what} quantity like ${what === 'cpu' ? '100m or 0.5' : '128Mi or 1Gi'}, got ${got(text)}`)
  }
  return { text, value }
}

/** The annotation sets the request; the limit is raised to it when the definition's is lower. */
export function atLeast (request: Quantity | undefined, limit: string | undefined): string | undefined {
  if (request === undefined || limit === undefined) return limit
  return request.value > (parseQuantity(limit) ?? 0) ? request.text : limit
}

export function allowedMethods (annotated: string | undefined): string | undefined {
  if (annotated === undefined) return undefined
  const methods = annotated.split(',').map(m => m.trim().toUpperCase()).filter(m => m !== '')
  const unknown = methods.find(m => !(PROXY_METHODS as readonly string[]).includes(m))
  if (methods.length === 0 || unknown !== undefined) {
    throw new AnnotationProblem(ANNOTATIONS.allowedMethods, `must be a comma-separated list of ${PROXY_METHODS.join(', ')}${unknown === undefined ? '' : `, got ${got(unknown)}`}`)
  }
  return [...new Set(methods)].join(',')
}
