// `cos-auth-proxy inject`: the webhook's HTTPS listener (POST /mutate, its
// errors, the serving certificate re-read from disk when it changes:
// cert-manager renews it in place; a Kubernetes Secret volume swaps the
// files through a symlink), and the command that runs it with its admin
// listener (startWebhook, runInject). What the webhook lets clients hold:
// limits.ts.
import type { AddressInfo } from 'node:net'
import type { Server as HttpsServer } from 'node:https'
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import type { Logger } from 'pino'
import { drain } from '../admin/drain.js'
import { startListeners } from '../admin/lifecycle.js'
import { BudgetExceeded, ByteBudget } from '../client/bytes-in-flight.js'
import { answerErrors, ListenerLog, listenerServer } from '../client/listener.js'
import { sendError } from '../client/response.js'
import { envPatchEstimate, jsonShapeProblem, LARGE_BODY, limitInFlight, REVIEW_LIMITS, TurnQueue, WEBHOOK_LIMITS, webhookListener, withoutContainers, type Budgets, type WebhookLimits } from './limits.js'
import { createLogger, inLogFormat, stdoutDestination } from '../observability/logger.js'
import type { InjectConfig } from './config.js'
import { InjectMetrics } from './metrics.js'
import { SidecarSource } from './sidecar-source.js'
import { ServingCertificate, type CertificateFiles } from '../mounted/serving-certificate.js'
import { answerReview, MalformedReview, type InjectSettings, type ReviewAnswer } from './patch.js'

export type { CertificateFiles }

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

/** A body refused before parsing: 400 malformed_review. */
class RefusedBody extends Error {
  readonly statusCode = 400
}

/** Routes registered, not listening. The certificate is read before it returns. */
export async function buildWebhookServer (opts: WebhookOptions): Promise<FastifyInstance<HttpsServer>> {
  const { metrics, settings } = opts
  const limits = { ...WEBHOOK_LIMITS, ...opts.limits }
  const certificate = await ServingCertificate.read({ files: opts.tls, variables: ['COS_INJECT_TLS_CERT_FILE', 'COS_INJECT_TLS_KEY_FILE'], pollMs: opts.certificateCheckMs ?? 1000, logger: opts.logger, onReload: result => { metrics.certificateReload(result) } })
  metrics.observeCertificate(() => certificate.notAfter)
  const tls = { ...certificate.pair, minVersion: 'TLSv1.2' } as const
  const app = Fastify<HttpsServer>({
    https: tls,
    // The server with Node's limits, the connection cap and the pipelining bound (webhookListener, limits.ts).
    serverFactory: listenerServer(webhookListener(limits), tls),
    loggerInstance: opts.logger,
    bodyLimit: REVIEW_LIMITS.bodyBytes,
    // The /mutate handler logs what was decided; Fastify's own lines would only repeat it.
    logController: new ListenerLog(),
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

  answerErrors(app, {
    codes: {},
    failed: { message: 'the review could not be answered', line: 'admission review failed' },
    own: (error, request, reply) => {
      if (error instanceof BudgetExceeded) {
        refuse(request, reply, 0)
        return true
      }
      if (!(error instanceof RefusedBody) && error.statusCode !== 413) return false
      metrics.error('malformed')
      const [status, code, message] = error instanceof RefusedBody
        ? [400, 'malformed_review', error.message]
        : [413, 'payload_too_large', `the body is over ${REVIEW_LIMITS.bodyBytes / 1024 / 1024} MiB (${REVIEW_LIMITS.bodyBytes} bytes), the API server's own limit on a request: no AdmissionReview is that large`] as const
      request.log.warn({ problem: message }, 'malformed admission review')
      sendError(reply, status, code, message)
      return true
    },
    answered: status => { metrics.error(status < 500 ? 'malformed' : 'internal') },
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

  certificate.follow(app)
  return app
}

function stringOrNull (v: unknown): string | null {
  return typeof v === 'string' ? v : null
}

// --- The `inject` command

export interface RunningWebhook {
  readonly address: AddressInfo
  readonly adminAddress: AddressInfo
  /** Drains and closes both listeners (what SIGTERM does, without exiting). */
  readonly stop: (cause: string) => Promise<void>
  /** SIGTERM and SIGINT drain, then exit; a second signal exits at once. */
  readonly exitOnSignals: () => void
}

/**
 * Starts the webhook and its admin listener through the lifecycle `serve`
 * shares (admin/lifecycle.ts): readiness, the drain (readiness 503 at once,
 * answering for COS_SHUTDOWN_DELAY_MS while the API server still has this
 * pod as an endpoint, then reviews in flight get COS_SHUTDOWN_TIMEOUT_MS).
 * While serving, the sidecar definition is re-read when its file changes
 * (SidecarSource). The caller decides what a signal does (runInject).
 */
export async function startWebhook (config: InjectConfig, logger: Logger, programVersion: string): Promise<RunningWebhook> {
  const metrics = new InjectMetrics()
  metrics.sidecarVersion(config.settings.version)
  const source = new SidecarSource(config.settings, { file: config.sidecarFile, readAtStart: config.sidecarText, sidecar: config.sidecar, programVersion, metrics, logger })
  const settings = source.current
  if (config.tls === undefined) throw new Error('startWebhook needs the serving certificate (loadInjectConfig with serving)')
  const app = await buildWebhookServer({ settings, tls: config.tls, metrics, logger })
  source.start()
  app.addHook('onClose', (_instance, done) => { source.close(); done() })
  const { bound, stop, exitOnSignals } = await startListeners({
    app,
    listener: 'webhook listener',
    drain: (cause, admin) => drain(app, config, logger, {
      cause,
      onTimeout: () => {
        logger.warn('shutdown timeout reached: cutting the reviews still in flight')
        app.server.closeAllConnections()
      },
      afterClose: async () => { await admin.close() },
    }),
    admin: { metrics, logger, limits: { maxConnections: config.admin.maxConnections } },
    listen: config.listen,
    adminListen: config.admin,
    variables: { listen: 'COS_INJECT_PORT', admin: 'COS_ADMIN_PORT' },
    logger,
  })
  const current = settings()
  logger.info({
    ...bound.fields,
    image: current.template.container.image,
    version: current.version,
    sidecarFile: config.sidecarFile,
    nativeSidecar: current.nativeSidecar,
    openshift: config.sidecar.openshift === true,
    defaultSecret: current.defaultSecret ?? null,
  }, 'cos-auth-proxy injection webhook listening')
  return { address: bound.address, adminAddress: bound.adminAddress, stop, exitOnSignals }
}

/** The `inject` command, with the settings cli.ts loaded (a ConfigError there is exit 78): until SIGTERM or SIGINT, then the drain and exit. */
export async function runInject (config: InjectConfig, programVersion: string): Promise<void> {
  const logger = createLogger(config.logLevel, await inLogFormat(config.logFormat, stdoutDestination(), config.logColour))
  const webhook = await startWebhook(config, logger, programVersion)
  webhook.exitOnSignals()
}
