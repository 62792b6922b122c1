// What the webhook's listener may hold of the process, whatever clients send
// (issue 33): its one client, the API server, keeps a handful of keep-alive
// connections and sends each AdmissionReview in well under a second. Without
// these, 60 connections each holding all but the last bytes of a 3 MiB body
// took the webhook past its pod's limit (then 192Mi).
import type { Server as HttpsServer } from 'node:https'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { MAX_OUTSTANDING_PER_CONNECTION } from '../client/connections.js'
import { ByteBudget, limitAnswersInFlight, limitBodiesInFlight } from '../client/bytes-in-flight.js'
import type { ListenerPolicy } from '../client/listener.js'
import { sendError } from '../client/response.js'
import { ANNOTATIONS, DEFAULT_ENV_NAME } from './annotations.js'
import type { InjectMetrics } from './metrics.js'

export interface WebhookLimits {
  /** Connections open at once; at the cap a newcomer displaces the stalest (webhookListener). */
  readonly maxConnections: number
  /** Requests received and not yet answered on one connection (pipelined): past it, the connection is closed. */
  readonly maxPipelined: number
  /** Bytes of request bodies received and not yet answered, all connections together. */
  readonly bodyBytesInFlight: number
  /** The patch in one answer, base64 as sent: a pod whose patch would be larger is denied (answerBound). */
  readonly patchBytes: number
  /** Bytes of answers written and not yet taken by the socket (unread), all connections together. */
  readonly answerBytesInFlight: number
  /** For a request's headers to arrive, and for the TLS handshake before them. */
  readonly headersTimeoutMs: number
  /** For the whole request, body included. */
  readonly requestTimeoutMs: number
}

/**
 * 128 connections: dozens of API servers' worth. 4 pipelined, as on the
 * other listeners (MAX_OUTSTANDING_PER_CONNECTION): the API server (Go's HTTP
 * client) never pipelines, and each request waiting behind an unread answer
 * holds its objects in the heap. 16 MiB: five reviews of the
 * largest size at once (3 MiB, the API server's own limit), hundreds of
 * ordinary ones (a few KiB). 128 KiB of patch: a real one is a few KiB (the
 * sidecar, one env entry per container); 128 KiB is ~800 containers. At
 * 256 KiB, 128 connections each holding one such answer unread cost 7–9 MB
 * of the kernel's socket buffers, which cgroup v2 charges to the pod (1 MiB:
 * 36 MB), and the chart's 128Mi cgroup peaked at 119 MB of 134 under every
 * attack at once: halved for margin.
 * 4 MiB of unread answers: sixteen of the largest, a thousand ordinary ones
 * (issue 43: eight unread answers of 15 MB took the process to 360 MB). 10 s: the
 * API server gives up on a webhook after its timeoutSeconds (the chart's 5,
 * 30 at most), so a request still arriving after that only holds memory.
 */
export const WEBHOOK_LIMITS: WebhookLimits = {
  maxConnections: 128,
  maxPipelined: MAX_OUTSTANDING_PER_CONNECTION,
  bodyBytesInFlight: 16 * 1024 * 1024,
  patchBytes: 128 * 1024,
  answerBytesInFlight: 4 * 1024 * 1024,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 10_000,
}

/**
 * The webhook listener's policy (src/client/listener.ts): Node's timeouts
 * (the TLS handshake's too), no reaping of its own (the API server keeps its
 * connections: Fastify's 72 s keep-alive), the cap with the stalest
 * displaced (idle, in its handshake, or with a request still arriving; a
 * client that does not read its answers is idle once they are handed to the
 * socket), and a request with `maxPipelined` unanswered ahead of it dropped
 * with its connection before Fastify builds anything for it (Node parses a
 * whole TLS record, hundreds of short requests, before it looks at the
 * connection).
 */
export function webhookListener (limits: WebhookLimits): ListenerPolicy {
  return {
    headersTimeoutMs: limits.headersTimeoutMs,
    requestTimeoutMs: limits.requestTimeoutMs,
    keepAliveTimeoutMs: 72_000,
    connections: { maxConnections: limits.maxConnections, busyUntil: 'ended', pipelinedPerConnection: limits.maxPipelined, pipelinedPerListener: Infinity, beyondBound: 'close' },
  }
}

// --- One review's body

/**
 * What no AdmissionReview of a Pod comes near, checked before JSON.parse
 * (docs/kubernetes.md, The webhook). The API server refuses requests over
 * 3 MiB and etcd objects over 1.5 MiB. A Pod nests about 20 deep at most
 * (managedFields included). What JSON.parse costs is what it builds: nested
 * arrays make one object per 2 bytes (1.5 million in 3 MB: seconds of the
 * event loop), and 3 MiB of small objects with distinct keys held 42 MB of
 * the 64 MiB heap, enough to abort the process beside other work (issue 33).
 * The densest real Pod, all env variables with their managedFields entries,
 * spends ~20 bytes on each object or array and ~9 on each value or key
 * (counted by their `,` and `:`): 100,000 and 300,000 admit one of ~2 MiB,
 * more than etcd stores, and hold the worst body to ~24 MB of heap.
 */
export const REVIEW_LIMITS = { bodyBytes: 3 * 1024 * 1024, depth: 64, containers: 100_000, items: 300_000 } as const

const QUOTE = 0x22
const BACKSLASH = 0x5c

/**
 * One linear pass over the bytes, strings skipped (UTF-8 continuation bytes
 * are never a quote, backslash, bracket, comma or colon): the first limit the
 * nesting, the number of objects and arrays, or of values and keys exceeds,
 * or undefined. Unbalanced or malformed text is JSON.parse's to refuse.
 */
export function jsonShapeProblem (body: Buffer, limits: { readonly depth: number, readonly containers: number, readonly items: number } = REVIEW_LIMITS): string | undefined {
  let depth = 0
  let containers = 0
  let items = 0
  const n = body.length
  for (let i = 0; i < n; i++) {
    const c = body[i]
    if (c === QUOTE) {
      // To the closing quote: byte by byte for the first 32 (names, most values), then by
      // indexOf for a quote preceded by an even number of backslashes.
      let j = i + 1
      const stop = Math.min(n, j + 32)
      for (; j < stop; j++) {
        const d = body[j]
        if (d === BACKSLASH) j++
        else if (d === QUOTE) break
      }
      if (j < stop) {
        i = j
        continue
      }
      i = j - 1
      for (;;) {
        i = body.indexOf(QUOTE, i + 1)
        if (i < 0) return undefined
        let k = i - 1
        while (body[k] === BACKSLASH) k--
        if ((i - k) % 2 === 1) break
      }
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > limits.depth) return `the body nests arrays and objects deeper than ${limits.depth} levels; no AdmissionReview does (refused before parsing)`
      if (++containers > limits.containers) return `the body holds more than ${limits.containers} objects and arrays; no AdmissionReview of a Pod does (refused before parsing)`
    } else if (c === 0x5d || c === 0x7d) {
      depth--
    } else if (c === 0x2c || c === 0x3a) {
      if (++items > limits.items) return `the body holds more than ${limits.items} values and keys; no AdmissionReview of a Pod does (refused before parsing)`
    }
  }
  return undefined
}

/** Most reviews are a few KiB; a Pod with large annotations or many env variables can reach 1 MiB. */
export const LARGE_BODY = 256 * 1024

/** Jobs run one per turn of the event loop (setImmediate), in order. */
export class TurnQueue {
  readonly #jobs: (() => void)[] = []
  #scheduled = false

  push (job: () => void): void {
    this.#jobs.push(job)
    if (!this.#scheduled) this.#next()
  }

  #next (): void {
    this.#scheduled = true
    setImmediate(() => {
      try {
        this.#jobs.shift()?.()
      } finally {
        if (this.#jobs.length > 0) this.#next()
        else this.#scheduled = false
      }
    })
  }
}

// --- Bytes in flight

export interface Budgets {
  /** Request bodies received and not answered (limits.bodyBytesInFlight). */
  readonly bodies: ByteBudget
  /** Answers written and not yet read (limits.answerBytesInFlight). */
  readonly answers: ByteBudget
}

/**
 * Both budgets on the listener (src/client/bytes-in-flight.ts), each with
 * its metric and log line: a body that does not fit is refused 503
 * webhook_busy with Connection: close (the refusal is returned, for a chunked
 * body's BudgetExceeded); an answer that does not fit closes the connections
 * holding the oldest unread answers.
 */
export function limitInFlight (app: FastifyInstance<HttpsServer>, budgets: Budgets, bodyLimit: number, metrics: InjectMetrics): (request: FastifyRequest, reply: FastifyReply, declared: number) => void {
  const { bodies, answers } = budgets
  const refuse = (request: FastifyRequest, reply: FastifyReply, declared: number): void => {
    metrics.error('busy')
    const message = `the webhook holds ${bodies.inFlight} bytes of other reviews' bodies; ${declared === 0 ? 'this chunked one' : `this one's ${declared}`} would pass its bound of ${bodies.limit}: try again`
    request.log.warn({ problem: message }, 'admission review refused: bodies in flight')
    void reply.header('connection', 'close').header('retry-after', '1')
    sendError(reply, 503, 'webhook_busy', message)
  }
  limitBodiesInFlight(app, bodies, bodyLimit, refuse)
  limitAnswersInFlight(app, answers, (request, cut) => {
    metrics.unreadAnswersCut()
    request.log.warn({ ...cut, inFlight: answers.inFlight, bound: answers.limit }, 'connection closed: its answers were not read and the unread answers were at their bound')
  })
  return refuse
}

// --- One review's answer

function field (v: unknown, key: string): unknown {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>)[key] : undefined
}

function lengthOf (v: unknown): number {
  return Array.isArray(v) ? v.length : 0
}

/** One env operation (patch.ts) at its largest but for the variable's name, with its comma. */
const ENV_OPERATION = JSON.stringify({ op: 'add', path: '/spec/initContainers/99999/env', value: [{ name: '', value: 'http://127.0.0.1:65535' }] }).length + 1

/**
 * What grows with the pod in its patch, read from the review before any of
 * it is built: one env operation per container and init container, each
 * naming the variable (the env annotation's value, whose length nothing else
 * bounds), base64 as sent. Zero for a review without a pod's containers.
 */
export function envPatchEstimate (body: unknown): { readonly containers: number, readonly bytes: number } {
  const object = field(field(body, 'request'), 'object')
  const spec = field(object, 'spec')
  const containers = lengthOf(field(spec, 'containers')) + lengthOf(field(spec, 'initContainers'))
  const env = field(field(field(object, 'metadata'), 'annotations'), ANNOTATIONS.env)
  const name = typeof env === 'string' ? env.length : DEFAULT_ENV_NAME.length
  return { containers, bytes: Math.ceil(containers * (ENV_OPERATION + name) / 3) * 4 }
}

/** The review with its pod's container lists emptied: decided as the real one (inject or not), its patch never large. */
export function withoutContainers (body: unknown): unknown {
  const request = field(body, 'request') as Record<string, unknown>
  const object = request.object as Record<string, unknown>
  const { initContainers: _, ...spec } = object.spec as Record<string, unknown>
  return { ...(body as Record<string, unknown>), request: { ...request, object: { ...object, spec: { ...spec, containers: [] } } } }
}
