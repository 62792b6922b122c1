// The webhook's HTTPS listener: POST /mutate, and the serving certificate
// re-read from disk when it changes (cert-manager renews it in place; a
// Kubernetes Secret volume swaps the files through a symlink).
import { createHash } from 'node:crypto'
import { readFile } from 'node:fs/promises'
import type { Server as HttpsServer } from 'node:https'
import { createSecureContext } from 'node:tls'
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify'
import { BudgetExceeded, ByteBudget } from '../client/bytes-in-flight.js'
import { sendError } from '../proxy/errors.js'
import { envPatchEstimate, limitInFlight, WEBHOOK_LIMITS, webhookServer, withoutContainers, type Budgets, type WebhookLimits } from './limits.js'
import type { InjectMetrics } from './metrics.js'
import { answerReview, MalformedReview, type InjectSettings, type ReviewAnswer } from './patch.js'

export interface CertificateFiles { readonly certFile: string, readonly keyFile: string }

export interface WebhookOptions {
  /** Asked per review: the definition can be replaced while serving (SidecarSource, sidecar-source.ts). */
  readonly settings: () => InjectSettings
  readonly tls: CertificateFiles
  readonly metrics: InjectMetrics
  readonly logger: FastifyBaseLogger
  /** How often the certificate files are compared with what is served. */
  readonly certificateCheckMs?: number
  /** WEBHOOK_LIMITS where not given. */
  readonly limits?: Partial<WebhookLimits>
  /** The bodies and answers in flight (a test reads them); of limits.*BytesInFlight where not given. */
  readonly budgets?: Partial<Budgets>
}

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
const LARGE_BODY = 256 * 1024

/** Jobs run one per turn of the event loop (setImmediate), in order. */
class TurnQueue {
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

/** A body refused before parsing: 400 malformed_review. */
class RefusedBody extends Error {
  readonly statusCode = 400
}

interface Pem { readonly cert: Buffer, readonly key: Buffer, readonly digest: string }

async function readPem (files: CertificateFiles): Promise<Pem> {
  const [cert, key] = await Promise.all([readFile(files.certFile), readFile(files.keyFile)])
  const digest = createHash('sha256').update(cert).update('\0').update(key).digest('hex')
  return { cert, key, digest }
}

/** Routes registered, not listening. The certificate is read before it returns. */
export async function buildWebhookServer (opts: WebhookOptions): Promise<FastifyInstance<HttpsServer>> {
  const { metrics, settings } = opts
  const limits = { ...WEBHOOK_LIMITS, ...opts.limits }
  const first = await readPem(opts.tls)
  const tls = { cert: first.cert, key: first.key, minVersion: 'TLSv1.2' } as const
  const app = Fastify<HttpsServer>({
    https: tls,
    // The server with Node's limits, the connection cap and the pipelining bound (limits.ts).
    serverFactory: handler => webhookServer(tls, limits, handler),
    loggerInstance: opts.logger,
    bodyLimit: REVIEW_LIMITS.bodyBytes,
    // The /mutate handler logs what was decided; Fastify's own lines would only repeat it.
    logController: new (class extends LogController {
      override incomingRequest (): void { /* see above */ }
      override requestCompleted (): void { /* see above */ }
    })(),
  })

  const budgets = {
    bodies: opts.budgets?.bodies ?? new ByteBudget(limits.bodyBytesInFlight),
    answers: opts.budgets?.answers ?? new ByteBudget(limits.answerBytesInFlight),
  }
  const refuse = limitInFlight(app, budgets, REVIEW_LIMITS.bodyBytes, metrics)

  // JSON as Fastify parses it (secure-json-parse: no __proto__ or constructor.prototype
  // keys), after the shape check: JSON.parse never sees a body that would make it build
  // more than REVIEW_LIMITS allows.
  // A body over LARGE_BODY waits its turn: one per turn of the event loop, so a
  // review of ordinary size is never parsed behind more than one large body.
  const parseJson = app.getDefaultJsonParser('error', 'error')
  const large = new TurnQueue()
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    const parse = (): void => {
      const problem = jsonShapeProblem(body)
      if (problem !== undefined) {
        done(new RefusedBody(problem), undefined)
        return
      }
      void parseJson(request, body.toString('utf8'), done)
    }
    if (body.length > LARGE_BODY) large.push(parse)
    else parse()
  })

  app.setErrorHandler((error: FastifyError, request, reply) => {
    if (error instanceof BudgetExceeded) {
      refuse(request, reply, 0)
      return
    }
    if (error instanceof RefusedBody) {
      metrics.error('malformed')
      request.log.warn({ problem: error.message }, 'malformed admission review')
      sendError(reply, 400, 'malformed_review', error.message)
      return
    }
    const status = error.statusCode ?? 500
    if (status === 413) {
      metrics.error('malformed')
      const message = `the body is over ${REVIEW_LIMITS.bodyBytes / 1024 / 1024} MiB (${REVIEW_LIMITS.bodyBytes} bytes), the API server's own limit on a request: no AdmissionReview is that large`
      request.log.warn({ problem: message }, 'malformed admission review')
      sendError(reply, 413, 'payload_too_large', message)
      return
    }
    if (status >= 400 && status < 500) {
      metrics.error('malformed')
      sendError(reply, status, 'bad_request', error.message)
      return
    }
    metrics.error('internal')
    request.log.error({ err: error }, 'admission review failed')
    sendError(reply, 500, 'internal_error', 'the review could not be answered')
  })
  app.setNotFoundHandler((request, reply) => {
    sendError(reply, 404, 'route_not_found', `no route for ${request.method} on this path (the webhook answers POST /mutate)`)
  })

  app.post('/mutate', (request, reply) => {
    let answer: ReviewAnswer
    const current = settings()
    // One env operation per container is what grows (issue 43): a pod whose operations alone would
    // pass the bound is decided without its containers, so its patch is never built.
    const estimate = envPatchEstimate(request.body)
    const over = estimate.bytes > limits.patchBytes
    try {
      answer = answerReview(over ? withoutContainers(request.body) : request.body, current)
    } catch (err) {
      if (!(err instanceof MalformedReview)) throw err
      metrics.error('malformed')
      request.log.warn({ problem: err.message }, 'malformed admission review')
      sendError(reply, 400, 'malformed_review', err.message)
      return
    }
    const { outcome, review } = answer
    const req = (request.body as { request: { namespace?: unknown, name?: unknown, dryRun?: unknown } }).request
    // Strings only (the logger caps their length): anything else in a review is the sender's, not a name.
    const where = { uid: review.response.uid, namespace: stringOrNull(req.namespace), name: stringOrNull(req.name), dryRun: req.dryRun === true }
    const patchBytes = over ? estimate.bytes : review.response.patch?.length ?? 0
    if (outcome.kind === 'injected' && patchBytes > limits.patchBytes) {
      metrics.patchTooLarge()
      const message = `${over ? 'would be' : 'is'} ${patchBytes} bytes (${estimate.containers} containers and init containers), over the webhook's bound of ${limits.patchBytes} for one answer: no real pod comes near it`
      request.log.warn({ ...where, containers: estimate.containers, patchBytes, bound: limits.patchBytes }, 'pod refused: its patch would pass the bound of one answer')
      void reply.send({ ...review, response: { uid: review.response.uid, allowed: false, status: { code: 400, message: `the patch that injects the sidecar ${message}` } } })
      return
    }
    metrics.outcome(outcome)
    const warnings = outcome.kind === 'refused' ? undefined : outcome.warnings?.map(w => w.message)
    if (outcome.kind === 'injected') request.log.info({ ...where, version: current.version, warnings }, 'sidecar injected')
    else if (outcome.kind === 'refused') request.log.warn({ ...where, annotation: outcome.annotation, problem: outcome.message }, 'pod refused')
    else if (warnings !== undefined) request.log.warn({ ...where, reason: outcome.reason, warnings }, 'sidecar not injected')
    else request.log.debug({ ...where, reason: outcome.reason }, 'review skipped')
    void reply.send(review)
  })

  watchCertificate(app, opts, first.digest)
  return app
}

function stringOrNull (v: unknown): string | null {
  return typeof v === 'string' ? v : null
}

/** Polls the two files; a changed, valid pair becomes the context of the next TLS handshake. */
function watchCertificate (app: FastifyInstance<HttpsServer>, opts: WebhookOptions, initialDigest: string): void {
  let served = initialDigest
  let rejected = ''
  let busy = false
  const check = async (): Promise<void> => {
    const pem = await readPem(opts.tls)
    if (pem.digest === served || pem.digest === rejected) return
    try {
      // Built here first so a half-written or mismatched pair is refused while the old one stays.
      createSecureContext({ cert: pem.cert, key: pem.key })
      app.server.setSecureContext({ cert: pem.cert, key: pem.key, minVersion: 'TLSv1.2' })
    } catch (err) {
      rejected = pem.digest
      opts.metrics.certificateReload('rejected')
      opts.logger.warn({ problem: (err as Error).message }, 'serving certificate on disk is not usable: still serving the previous one')
      return
    }
    served = pem.digest
    opts.metrics.certificateReload('applied')
    opts.logger.info('serving certificate reloaded')
  }
  const timer = setInterval(() => {
    if (busy) return
    busy = true
    check().catch((err: unknown) => {
      // Mid-swap a file can be missing for a moment: the next round reads it again.
      opts.logger.debug({ err }, 'serving certificate files not readable')
    }).finally(() => { busy = false })
  }, opts.certificateCheckMs ?? 1000)
  timer.unref()
  app.addHook('onClose', (_instance, done) => { clearInterval(timer); done() })
}
