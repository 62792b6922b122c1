// The webhook's HTTPS listener: POST /mutate, and the serving certificate
// re-read from disk when it changes (cert-manager renews it in place; a
// Kubernetes Secret volume swaps the files through a symlink).
import { createHash } from 'node:crypto'
import { readFile } from 'node:fs/promises'
import type { Server as HttpsServer } from 'node:https'
import { createSecureContext } from 'node:tls'
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify'
import { sendError } from '../proxy/errors.js'
import type { InjectMetrics } from './metrics.js'
import { answerReview, MalformedReview, type InjectSettings } from './patch.js'

export interface CertificateFiles { readonly certFile: string, readonly keyFile: string }

export interface WebhookOptions {
  /** Asked per review: the definition can be replaced while serving (source.ts). */
  readonly settings: () => InjectSettings
  readonly tls: CertificateFiles
  readonly metrics: InjectMetrics
  readonly logger: FastifyBaseLogger
  /** How often the certificate files are compared with what is served. */
  readonly certificateCheckMs?: number
}

// An AdmissionReview carries the whole Pod; etcd refuses objects over 1.5 MiB.
const BODY_LIMIT = 4 * 1024 * 1024

interface Pem { readonly cert: Buffer, readonly key: Buffer, readonly digest: string }

async function readPem (files: CertificateFiles): Promise<Pem> {
  const [cert, key] = await Promise.all([readFile(files.certFile), readFile(files.keyFile)])
  const digest = createHash('sha256').update(cert).update('\0').update(key).digest('hex')
  return { cert, key, digest }
}

/** Routes registered, not listening. The certificate is read before it returns. */
export async function buildWebhookServer (opts: WebhookOptions): Promise<FastifyInstance<HttpsServer>> {
  const { metrics, settings } = opts
  const first = await readPem(opts.tls)
  const app = Fastify<HttpsServer>({
    https: { cert: first.cert, key: first.key, minVersion: 'TLSv1.2' },
    loggerInstance: opts.logger,
    bodyLimit: BODY_LIMIT,
    // The /mutate handler logs what was decided; Fastify's own lines would only repeat it.
    logController: new (class extends LogController {
      override incomingRequest (): void { /* see above */ }
      override requestCompleted (): void { /* see above */ }
    })(),
  })

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status = error.statusCode ?? 500
    if (status >= 400 && status < 500) {
      metrics.error('malformed')
      sendError(reply, status, status === 413 ? 'payload_too_large' : 'bad_request', error.message)
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
    let answer
    const current = settings()
    try {
      answer = answerReview(request.body, current)
    } catch (err) {
      if (!(err instanceof MalformedReview)) throw err
      metrics.error('malformed')
      request.log.warn({ problem: err.message }, 'malformed admission review')
      sendError(reply, 400, 'malformed_review', err.message)
      return
    }
    const { outcome, review } = answer
    metrics.outcome(outcome)
    const req = (request.body as { request: { namespace?: unknown, name?: unknown, dryRun?: unknown } }).request
    const where = { uid: review.response.uid, namespace: req.namespace, name: req.name, dryRun: req.dryRun === true }
    if (outcome.kind === 'injected') request.log.info({ ...where, version: current.version }, 'sidecar injected')
    else if (outcome.kind === 'refused') request.log.warn({ ...where, annotation: outcome.annotation, problem: outcome.message }, 'pod refused: bad annotation')
    else request.log.debug({ ...where, reason: outcome.reason }, 'review skipped')
    void reply.send(review)
  })

  watchCertificate(app, opts, first.digest)
  return app
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
