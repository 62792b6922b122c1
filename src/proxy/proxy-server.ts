// The proxy server, wired: Fastify with its limits and timeouts, the
// connection-level refusals, the request guard, error answers, diagnostics
// and the proxy routes. Not listening: serve() (server.ts) runs it.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, Server } from 'node:http'
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyHttpOptions } from 'fastify'
import { AuthRefusals } from './auth-refusals.js'
import type { Config } from '../config/config.js'
import { condemn, droppedBehindRefusal, rawErrorResponse, refuseAtAccept, refuseConnect, rejectMalformed, TOO_MANY_PIPELINED } from '../client/connection-refusals.js'
import { pipelinedBeyondBound } from '../client/connections.js'
import { answerErrors, listenerServer, type ListenerPolicy } from '../client/listener.js'
import type { ReloadOutcome } from '../credentials/credential-watcher.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { sendError } from './errors.js'
import { classifyUpstreamError, type ProxyMetrics } from '../observability/metrics.js'
import { proxyPlugin, type ProxyObserver } from './proxy.js'
import { allowList, peerAllowed } from '../client/guard.js'
import { ALLOW, FORBIDDEN_SOURCE, requestGuard, type Refusal } from '../client/request-guard.js'
import { RequestLog, type RequestObserver } from '../observability/request-log.js'
import type { MintingClock } from '../token/token.js'
import { readUpstreamClocks, UpstreamClock, type ClockThresholds } from '../upstream/upstream-clock.js'
import { Upstreams } from '../upstream/upstream.js'

// A client-chosen id is kept when it is a sane token; anything else (too
// long, spaces, control bytes) is replaced, so logs cannot be forged with it.
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/

export function requestId (req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID()
}

const STATUS_CODES: Readonly<Record<number, string>> = {
  400: 'bad_request',
  404: 'route_not_found',
  405: 'method_not_allowed',
  408: 'request_timeout',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  431: 'request_header_fields_too_large',
}

export interface ProxyServerOptions {
  readonly config: Config
  readonly credentials: CredentialStore
  readonly logger: FastifyBaseLogger
  /** Built from config (and closed with the server) when not given. */
  readonly upstreams?: Upstreams
  readonly observer?: ProxyObserver & RequestObserver
  readonly resyncCredentials?: () => void
  /** Built from `observer` when not given. */
  readonly requestLog?: RequestLog
  /** Re-reads the credential files, sharing any read under way (to diagnose an upstream 401/403); unset for literal values. */
  readonly rereadCredentials?: () => Promise<ReloadOutcome>
  /** Thresholds and intervals of the clock and 401 diagnostics; defaults in upstream-clock.ts and auth-refusals.ts (tests shorten them). */
  readonly diagnostics?: Diagnostics
  /** The clock the store's minters stamp with, whose offset the correction moves; default the process-wide one (tests give each proxy its own). */
  readonly mintingClock?: MintingClock
}

export interface Diagnostics extends ClockThresholds {
  /** At most one warning about upstream 401/403 answers per this many ms. */
  readonly refusalWarningIntervalMs?: number
}

export function upstreamsFor (config: Config, logger: FastifyBaseLogger): Upstreams {
  return new Upstreams({
    connectTimeoutMs: config.connectTimeoutMs,
    headersTimeoutMs: config.upstreamTimeoutMs,
    bodyIdleTimeoutMs: config.bodyIdleTimeoutMs,
    maxConnections: config.upstreamMaxConnections,
    tls: config.tls,
    tlsReloadMs: config.credentialsReloadMs,
    egress: config.egress,
    logger,
  })
}

/**
 * The proxy listener's policy (listener.ts): the client-side timeouts and
 * the cap (COS_MAX_CONNECTIONS), idle connections reaped after the
 * keep-alive timeout, a request whose body is arriving never displaced (the
 * body goes upstream as it arrives), pipelining refused beyond the bounds
 * with 503, and heads from upstreams Node refuses to write failing only
 * their own response.
 */
export function proxyListener (client: Config['client']): ListenerPolicy {
  return {
    headersTimeoutMs: client.headersTimeoutMs,
    requestTimeoutMs: client.requestTimeoutMs,
    keepAliveTimeoutMs: client.keepAliveTimeoutMs,
    connections: { idleMs: client.keepAliveTimeoutMs, maxConnections: client.maxConnections, keepBodies: true },
    guardResponses: true,
  }
}

/** Fastify's options: the hardened server, and the request log. */
function serverOptions (opts: ProxyServerOptions): FastifyHttpOptions<Server> {
  return {
    loggerInstance: opts.logger,
    logController: opts.requestLog ?? new RequestLog(opts.observer, opts.config.accessLog),
    requestIdHeader: false,
    genReqId: requestId,
    return503OnClosing: true,
    serverFactory: listenerServer(proxyListener(opts.config.client)),
  }
}

/**
 * Refused before the body is read: close the connection rather than have
 * Node read (and discard) a body nobody wants to keep the socket alive.
 * What was pipelined behind it is dropped (see connection-refusals.ts).
 */
function refuse (reply: FastifyReply, refusal: Refusal): void {
  const [status, code, message] = refusal
  condemn(reply.request.raw.socket, refusal === TOO_MANY_PIPELINED ? 0 : undefined)
  reply.header('connection', 'close')
  if (status === 405) reply.header('allow', ALLOW)
  sendError(reply, status, code, message)
}

export async function buildProxyServer (opts: ProxyServerOptions): Promise<FastifyInstance> {
  const { config } = opts
  const guard = requestGuard(config)
  const app = Fastify({
    ...serverOptions(opts),
    // The router rejects a URL it cannot decode before any hook runs: answer
    // it through the same checks (the source comes first) and error shape.
    frameworkErrors: (error, request, reply) => {
      reply.header('x-request-id', request.id)
      if (droppedBehindRefusal(reply)) return
      refuse(reply, guard(request.raw) ?? [400, 'bad_request', error.code === 'FST_ERR_BAD_URL' ? 'malformed percent-encoding in path' : 'malformed request'])
    },
    clientErrorHandler: rejectMalformed,
  })
  refuseSourcesAtAccept(app, opts)
  app.server.on('connect', refuseConnect)
  // Declared up front so every request object has the same shape.
  app.decorateRequest('upstreamStart', 0)
  app.decorateRequest('upstreamMs', -1)
  app.decorateRequest('proxyRoute', undefined)

  const upstreams = opts.upstreams ?? upstreamsFor(config, opts.logger)
  app.addHook('onClose', async () => { await upstreams.close() })
  const { clock, authRefused } = diagnose(app, opts, upstreams)

  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
    if (droppedBehindRefusal(reply)) return
    const refusal = pipelinedBeyondBound(reply.raw) ? TOO_MANY_PIPELINED : guard(request.raw)
    if (refusal === undefined) done()
    else refuse(reply, refusal)
  })
  answerProxyErrors(app)

  await app.register(proxyPlugin, {
    routes: config.routes,
    credentials: opts.credentials,
    upstreams,
    ...(config.requireHeader === undefined ? {} : { dropHeader: config.requireHeader.name }),
    maxBodyBytes: config.maxBodyBytes,
    upstreamTimeoutMs: config.upstreamTimeoutMs,
    ...(opts.observer === undefined ? {} : { observer: opts.observer }),
    ...(opts.resyncCredentials === undefined ? {} : { resyncCredentials: opts.resyncCredentials }),
    clock,
    authRefused,
  })
  return app
}

/**
 * A peer outside COS_ALLOW_FROM gets 403 `forbidden_source` when its
 * connection is accepted, and the connection is closed: nothing it sends is
 * parsed, and it takes no slot of COS_MAX_CONNECTIONS (connection-refusals.ts,
 * refuseAtAccept). Counted as a request answered 403 (route `none`, method
 * `OTHER`: none was read), and logged as the refusal of a request was, by
 * COS_ACCESS_LOG (a status >= 400: not with `off`).
 */
function refuseSourcesAtAccept (app: FastifyInstance, opts: ProxyServerOptions): void {
  const allowed = allowList(opts.config.allowFrom)
  const [status, code, message] = FORBIDDEN_SOURCE
  const logged = opts.config.accessLog.mode !== 'off'
  refuseAtAccept(app.server, socket => !peerAllowed(allowed, socket.remoteAddress), rawErrorResponse(status, code, message), socket => {
    opts.observer?.requestStarted()
    opts.observer?.requestFinished('none', '', status, 0, undefined, false)
    if (logged) opts.logger.info({ peer: socket.remoteAddress, status, code }, 'connection refused: its source address is not in COS_ALLOW_FROM')
  })
}

/** 404 and every error thrown while handling a request, in the JSON error shape. */
function answerProxyErrors (app: FastifyInstance): void {
  app.setNotFoundHandler((request, reply) => {
    sendError(reply, 404, 'route_not_found', `no route for ${request.method} on this path`)
  })

  answerErrors(app, { codes: STATUS_CODES, failed: { message: 'the proxy failed to handle the request', line: 'request failed' }, keep5xx: true, logRefusals: true })
}

/**
 * The upstream's clock, read off its answers (and, with the correction on,
 * once before the proxy takes requests), and the warning about upstream
 * 401/403 answers.
 */
function diagnose (app: FastifyInstance, opts: ProxyServerOptions, upstreams: Upstreams): { clock: UpstreamClock, authRefused: AuthRefusals['refused'] } {
  const { config, logger, observer } = opts
  const { refusalWarningIntervalMs, ...thresholds } = opts.diagnostics ?? {}
  const clock = new UpstreamClock({
    ...thresholds,
    logger,
    correct: config.clockSkewCorrection,
    maxCorrectionS: config.clockSkewMaxSeconds,
    ...(opts.mintingClock === undefined ? {} : { clock: opts.mintingClock }),
    onMeasured: seconds => { observer?.upstreamClockSkew?.(seconds) },
  })
  app.addHook('onClose', (_instance, done) => { clock.close(); done() })
  if (config.clockSkewCorrection) {
    app.addHook('onReady', async () => { await readUpstreamClocks(clock, upstreams, config.routes, config.connectTimeoutMs, logger) })
  }
  const refusals = new AuthRefusals({
    store: opts.credentials,
    clock,
    logger,
    ...(opts.rereadCredentials === undefined ? {} : { reread: opts.rereadCredentials }),
    ...(refusalWarningIntervalMs === undefined ? {} : { intervalMs: refusalWarningIntervalMs }),
  })
  return { clock, authRefused: (route, status, traceparent) => { refusals.refused(route, status, traceparent) } }
}

/** What the proxy and its request log report, counted in `metrics`. */
export function metricsObserver (metrics: ProxyMetrics): ProxyObserver & RequestObserver {
  return {
    requestStarted: () => metrics.requestStarted(),
    requestFinished: (route, method, status, total, upstream, aborted, retryAfter) => metrics.requestFinished(route, method, status, total, upstream, aborted, retryAfter),
    upstreamError: (route, err) => metrics.upstreamError(route, classifyUpstreamError(err)),
    retried: (route, reason) => metrics.retried(route, reason),
    tokenMinted: () => metrics.tokenMinted(),
    upstreamResponse: (route, status, retryAfter) => metrics.upstreamResponse(route, status, retryAfter),
    responseFailed: route => metrics.responseFailed(route),
    upstreamClockSkew: seconds => metrics.upstreamClockSkew(seconds),
  }
}
