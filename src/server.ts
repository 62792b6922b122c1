// Wiring and lifecycle: config → credentials, upstreams, metrics, proxy and
// admin listeners, and the drain on SIGTERM / SIGINT / POST /quitquitquit.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Duplex } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply } from 'fastify'
import type { Logger } from 'pino'
import { buildAdminServer, listenWithAdmin, type Readiness } from './admin.js'
import { AuthRefusals } from './auth-refusals.js'
import { reapIdleConnections, type WithPendingResponse } from './connections.js'
import { PROXY_METHODS, type Config } from './config.js'
import { CredentialWatcher, type ReloadOutcome } from './credential-watcher.js'
import { CredentialStore } from './credentials.js'
import { sendError } from './errors.js'
import { allowList, browserPolicy, hasRequiredHeader, hostProblem, isLoopbackAddress, originProblem, peerAllowed, targetProblem } from './guard.js'
import { ProxyMetrics, classifyUpstreamError } from './metrics.js'
import { proxyPlugin, type ProxyObserver } from './proxy.js'
import { RequestLog, type RequestObserver } from './request-log.js'
import { GuardedResponse } from './response.js'
import { readUpstreamClocks, UpstreamClock, type ClockThresholds } from './upstream-clock.js'
import type { MintingClock } from './token.js'
import { Upstreams } from './upstream.js'

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

const CLIENT_ERRORS: Readonly<Record<string, readonly [number, string, string]>> = {
  HPE_HEADER_OVERFLOW: [431, 'request_header_fields_too_large', 'the request headers exceed 16 KiB'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request_timeout', 'the request was not received in time'],
  ERR_HTTP_HEADERS_TIMEOUT: [408, 'request_timeout', 'the request headers were not received in time'],
}

function writeRawError (socket: Duplex, status: number, code: string, message: string, headers = ''): void {
  if (socket.writable) {
    const body = JSON.stringify({ error: { code, message } })
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES_TEXT[status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${headers}connection: close\r\n\r\n${body}`)
  }
  socket.destroy()
}

const STATUS_CODES_TEXT: Readonly<Record<number, string>> = { 400: 'Bad Request', 405: 'Method Not Allowed', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' }

/**
 * Connections on which nothing more is forwarded: a request on them was
 * refused (the refusal says `connection: close`), could not be parsed, or
 * was CONNECT. Node parses ahead and hands over every request it finds
 * while earlier answers are still pending, queueing their responses; the
 * ones behind a refusal would run upstream (a POST nobody receives the
 * answer to, so a retry duplicates it) and their answers never be written.
 * The value: the responses dropped so far (see droppedBehindRefusal).
 */
const condemned = new WeakMap<Duplex, ServerResponse[]>()

// A client that pipelines this many requests behind a refused one is cut
// off: each dropped request is held until the connection closes.
const MAX_DROPPED = 100

/** Marks the connection; false when it already was. */
function condemn (socket: Duplex): boolean {
  if (condemned.has(socket)) return false
  const dropped: ServerResponse[] = []
  condemned.set(socket, dropped)
  // Node closes only the response that holds the socket: the dropped ones
  // are closed with the connection, which writes their log lines and
  // settles the in-flight gauge.
  socket.once('close', () => { for (const res of dropped) res.emit('close') })
  return true
}

/**
 * Drops a request parsed behind the refusal that closes its connection:
 * not forwarded and not answered (its answer would queue behind the
 * refusal, and the connection closes once that is written). Logged as 400.
 * False when the connection is not condemned.
 */
function droppedBehindRefusal (reply: FastifyReply): boolean {
  const socket = reply.request.raw.socket
  const dropped = condemned.get(socket)
  if (dropped === undefined) return false
  reply.code(400)
  reply.hijack()
  const res = reply.raw
  // Holding the socket means nothing is queued ahead: the refusal is out, only the close is left.
  if (res.socket !== null || dropped.push(res) > MAX_DROPPED) socket.destroy()
  return true
}

/**
 * Runs `answer` (which writes and closes) once the responses owed to the
 * requests before the faulty one on this connection are written, so those
 * arrive whole and in order and the error comes last. When the response in
 * progress answers the very request at fault (an error in its body) it is
 * answered now, or, if that response has begun, the connection is only
 * closed: an error written into it would be misread.
 */
function afterOwedResponses (socket: Duplex, answer: () => void): void {
  const pending = (socket as WithPendingResponse<Duplex>)._httpMessage
  if (pending == null) answer()
  else if (pending.req.complete) pending.once('finish', () => { afterOwedResponses(socket, answer) })
  else if (pending.headersSent) socket.destroy()
  else answer()
}

type ParseError = Error & { code?: string, rawPacket?: unknown, bytesParsed?: unknown }

function isTokenByte (b: number | undefined): boolean {
  return b !== undefined && b > 0x20 && b < 0x7f && !'"(),/:;<=>?@[\\]{}'.includes(String.fromCharCode(b))
}

/**
 * The method Node's parser did not know (`FOO /x HTTP/1.1`), read around the
 * byte it stopped at; undefined when no method-like token followed by a space
 * is there (then the request is plain garbage, 400). The name itself is
 * given only when it starts a line: a method cut in two by a TCP segment
 * boundary would be misnamed.
 */
function unknownMethod (err: ParseError): string | undefined {
  const packet = err.rawPacket
  const at = err.bytesParsed
  if (!Buffer.isBuffer(packet) || typeof at !== 'number') return undefined
  let start = at
  // Backwards over what the parser took for the start of a known method (PROPFOO: PROP…).
  while (start > 0 && /[A-Z_-]/.test(String.fromCharCode(packet[start - 1] ?? 0))) start--
  let end = at
  while (end < packet.length && end - start <= 32 && isTokenByte(packet[end])) end++
  if (end === start || end - start > 32 || packet[end] !== 0x20) return undefined
  return start === 0 || packet[start - 1] === 0x0a ? packet.toString('latin1', start, end) : 'this method'
}

/** Why `method` is refused before routing, naming it. */
function notForwarded (method: string): string {
  if (method === 'TRACE' || method === 'TRACK') return `${method} is never forwarded: the upstream would echo the request back, signed token included`
  const caseHint = FORWARDED_METHODS.has(method.toUpperCase()) ? ' (methods are case-sensitive)' : ''
  return `${method} is not forwarded: the proxy forwards only the methods of the COS APIs (${ALLOW})${caseHint}`
}

/**
 * Requests Node's parser rejects (bad framing, unknown methods, oversized
 * headers, slow senders) get the JSON error shape too, after the answers
 * owed to earlier requests on the connection (see afterOwedResponses).
 * Once a connection is condemned, later errors on it (more garbage, a
 * timeout while an earlier answer is pending) add nothing.
 */
function rejectMalformed (err: ParseError, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed || !condemn(socket)) return
  const method = err.code === 'HPE_INVALID_METHOD' ? unknownMethod(err) : undefined
  if (method !== undefined) {
    afterOwedResponses(socket, () => { writeRawError(socket, 405, 'method_not_allowed', notForwarded(method), `allow: ${ALLOW}\r\n`) })
    return
  }
  const [status, code, message] = CLIENT_ERRORS[err.code ?? ''] ?? [400, 'bad_request', 'malformed HTTP request']
  afterOwedResponses(socket, () => { writeRawError(socket, status, code, message) })
}

type Refusal = readonly [status: number, code: string, message: string]

// Node lets one header name repeated many times past its maxHeaderSize (seen:
// 3000 × "a: 1", 18 KiB, accepted), so the total is counted here too.
const MAX_HEADER_BYTES = 16 * 1024
// Node keeps ~1000 header lines (rawHeaders entries capped near 2000) and drops
// the rest without a word: a request that reaches the cap is refused whole.
const MAX_RAW_HEADER_ENTRIES = 2000
const FORWARDED_METHODS = new Set<string>(PROXY_METHODS)
const ALLOW = PROXY_METHODS.join(', ')

// Any other Upgrade (h2c from Java's HttpClient and `curl --http2`) is ignored,
// as RFC 9110 §7.8 allows: the request is served as HTTP/1.1 and the header is
// not forwarded. A WebSocket client would wait for a socket it will not get.
// (Node joins a repeated Upgrade into one comma-separated value.)
const WEBSOCKET_UPGRADE = /(?:^|,)[ \t]*websocket[ \t]*(?:\/[^,]*)?(?:,|$)/i

/**
 * Everything refused before routing, in order: who is asking, how, for what.
 * Returns the refusal, or undefined to let the request through.
 */
function requestGuard (config: Config): (raw: IncomingMessage) => Refusal | undefined {
  const allowed = allowList(config.allowFrom)
  const checkedPeers = new WeakMap<object, boolean>()
  const required = config.requireHeader
  const maxBody = config.maxBodyBytes
  const browsers = browserPolicy(config)
  // The Host last let through: a client repeats its own, so most requests cost one comparison.
  let hostPassed: string | undefined
  return (raw) => {
    // Checked once per connection: the peer of a socket does not change.
    let peerOk = checkedPeers.get(raw.socket)
    if (peerOk === undefined) {
      peerOk = peerAllowed(allowed, raw.socket.remoteAddress)
      checkedPeers.set(raw.socket, peerOk)
    }
    if (!peerOk) return [403, 'forbidden_source', 'this source address may not use the proxy (COS_ALLOW_FROM)']
    const rawHeaders = raw.rawHeaders
    let headerBytes = 0
    let requiredSeen = 0
    for (let i = 0; i < rawHeaders.length; i += 2) {
      const name = rawHeaders[i] as string
      headerBytes += name.length + (rawHeaders[i + 1] as string).length + 4
      if (required !== undefined && name.length === required.name.length && name.toLowerCase() === required.name) requiredSeen++
    }
    if (headerBytes > MAX_HEADER_BYTES || rawHeaders.length >= MAX_RAW_HEADER_ENTRIES) {
      return [431, 'request_header_fields_too_large', 'the request headers exceed 16 KiB']
    }
    if (!FORWARDED_METHODS.has(raw.method ?? '')) return [405, 'method_not_allowed', notForwarded(raw.method ?? '')]
    if (raw.headers.upgrade !== undefined && WEBSOCKET_UPGRADE.test(raw.headers.upgrade)) return [405, 'method_not_allowed', 'WebSocket upgrades are not supported']
    const problem = targetProblem(raw.url ?? '', config.routes)
    if (problem !== undefined) return [400, 'bad_request', problem]
    const headers = raw.headers
    const fetchSite = headers['sec-fetch-site']
    if (headers.origin !== undefined || fetchSite !== undefined) {
      const fromPage = originProblem(browsers, headers.origin, fetchSite)
      if (fromPage !== undefined) return [403, 'forbidden_origin', fromPage]
    }
    if (headers.host !== hostPassed) {
      const rebound = hostProblem(browsers, headers.host)
      if (rebound !== undefined) return [403, 'forbidden_host', rebound]
      hostPassed = headers.host
    }
    // Node joins a repeated header into one value, so "sent twice" is counted on the raw lines.
    if (required !== undefined && (requiredSeen !== 1 || !hasRequiredHeader(required, raw.headers[required.name]))) {
      return [403, 'missing_required_header', `requests must carry the ${required.name} header once (COS_REQUIRE_HEADER)`]
    }
    if (maxBody > 0 && Number(raw.headers['content-length'] ?? 0) > maxBody) {
      return [413, 'payload_too_large', `request bodies are limited to ${maxBody} bytes (COS_MAX_BODY_BYTES)`]
    }
    return undefined
  }
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
    egress: config.egress,
    logger,
  })
}

export async function buildProxyServer (opts: ProxyServerOptions): Promise<FastifyInstance> {
  const { config } = opts
  const { client } = config
  const guard = requestGuard(config)
  const app = Fastify({
    // The router rejects a URL it cannot decode before any hook runs: answer
    // it through the same checks (the source comes first) and error shape.
    frameworkErrors: (error, request, reply) => {
      reply.header('x-request-id', request.id)
      if (droppedBehindRefusal(reply)) return
      refuse(reply, guard(request.raw) ?? [400, 'bad_request', error.code === 'FST_ERR_BAD_URL' ? 'malformed percent-encoding in path' : 'malformed request'])
    },
    loggerInstance: opts.logger,
    logController: opts.requestLog ?? new RequestLog(opts.observer),
    requestIdHeader: false,
    genReqId: requestId,
    return503OnClosing: true,
    keepAliveTimeout: client.keepAliveTimeoutMs,
    requestTimeout: client.requestTimeoutMs,
    http: {
      headersTimeout: client.headersTimeoutMs,
      requestTimeout: client.requestTimeoutMs,
      keepAliveTimeout: client.keepAliveTimeoutMs,
      maxHeaderSize: 16 * 1024, // larger header sections get 431
      // How often those timeouts are enforced (Node's default is 30 s).
      connectionsCheckingInterval: Math.min(1000, client.headersTimeoutMs),
      // Refuse what Node's parser can be lenient about (obs-fold, bare LF, …).
      insecureHTTPParser: false,
      // A response Node refuses to write fails its request, not the process.
      ServerResponse: GuardedResponse,
    },
    clientErrorHandler: rejectMalformed,
  })
  app.server.maxConnections = client.maxConnections
  reapIdleConnections(app.server, client.keepAliveTimeoutMs)
  // CONNECT is handed to a 'connect' listener before routing; with none, Node
  // would drop the socket without an answer.
  app.server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    // Node has detached its HTTP handling from the socket, including the
    // relay that tells a response still being written that the socket drained.
    socket.on('drain', () => { (socket as WithPendingResponse<Duplex>)._httpMessage?.emit('drain') })
    if (condemn(socket)) afterOwedResponses(socket, () => { writeRawError(socket, 400, 'bad_request', 'CONNECT is not supported: this is not a forward proxy') })
  })
  // Declared up front so every request object has the same shape.
  app.decorateRequest('upstreamStart', 0)
  app.decorateRequest('upstreamMs', -1)

  const upstreams = opts.upstreams ?? upstreamsFor(config, opts.logger)
  app.addHook('onClose', async () => { await upstreams.close() })
  const { clock, authRefused } = diagnose(app, opts, upstreams)

  // Refused before the body is read: close the connection rather than have
  // Node read (and discard) a body nobody wants to keep the socket alive.
  // What was pipelined behind it is dropped (see condemned).
  const refuse = (reply: FastifyReply, [status, code, message]: Refusal): void => {
    condemn(reply.request.raw.socket)
    reply.header('connection', 'close')
    if (status === 405) reply.header('allow', ALLOW)
    sendError(reply, status, code, message)
  }
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
    if (droppedBehindRefusal(reply)) return
    const refusal = guard(request.raw)
    if (refusal === undefined) done()
    else refuse(reply, refusal)
  })

  app.setNotFoundHandler((request, reply) => {
    sendError(reply, 404, 'route_not_found', `no route for ${request.method} on this path`)
  })

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status = error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 600 ? error.statusCode : 500
    if (status >= 500) {
      request.log.error({ err: error }, 'request failed')
      sendError(reply, status, 'internal_error', 'the proxy failed to handle the request')
      return
    }
    request.log.debug({ err: error }, 'request refused')
    sendError(reply, status, STATUS_CODES[status] ?? 'bad_request', error.message)
  })

  await app.register(proxyPlugin, {
    routes: config.routes,
    credentials: opts.credentials,
    upstreams,
    ...(config.requireHeader === undefined ? {} : { dropHeader: config.requireHeader.name }),
    maxBodyBytes: config.maxBodyBytes,
    ...(opts.observer === undefined ? {} : { observer: opts.observer }),
    ...(opts.resyncCredentials === undefined ? {} : { resyncCredentials: opts.resyncCredentials }),
    clock,
    authRefused,
  })
  return app
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
  return { clock, authRefused: (route, status) => { refusals.refused(route, status) } }
}

/**
 * pino writes stdout asynchronously; exiting straight after flush() lets the
 * exit hook write the buffer ahead of a write still in flight, reordering or
 * losing the last lines. Wait for the flush, but not forever.
 */
function exitAfterFlush (logger: Logger, code: number): void {
  setTimeout(() => process.exit(code), 1000).unref()
  logger.flush(() => process.exit(code))
}

/** How long the drain may still take once the shutdown timeout has cut everything (it needs milliseconds). */
const EXIT_GRACE_MS = 500


/** What the proxy and its request log report, counted in `metrics`. */
export function metricsObserver (metrics: ProxyMetrics): ProxyObserver & RequestObserver {
  return {
    requestStarted: () => metrics.requestStarted(),
    requestFinished: (route, method, status, total, upstream, aborted) => metrics.requestFinished(route, method, status, total, upstream, aborted),
    upstreamError: (route, err) => metrics.upstreamError(route, classifyUpstreamError(err)),
    retried: (route, reason) => metrics.retried(route, reason),
    tokenMinted: () => metrics.tokenMinted(),
    responseFailed: route => metrics.responseFailed(route),
    upstreamClockSkew: seconds => metrics.upstreamClockSkew(seconds),
  }
}

function usesFiles (config: Config): boolean {
  return config.credentials.accessKey.file !== undefined || config.credentials.secret.file !== undefined
}

/** For the start line: the egress proxy a route goes through, password redacted. */
function egressOf (upstreams: Upstreams, origin: string): { egressProxy?: string } {
  const proxy = upstreams.egressProxyFor(origin)
  return proxy === undefined ? {} : { egressProxy: proxy.url }
}

export interface ServeOptions {
  readonly config: Config
  readonly logger: Logger
  readonly onListening?: (address: AddressInfo) => void
  /** Log lines the logger's destination has dropped so far (exported as a metric). */
  readonly logLinesDropped?: () => number
  /** Runs after the proxy has drained, before the process exits. */
  readonly onClose?: () => Promise<void>
}

/**
 * Runs the sidecar until SIGTERM, SIGINT or POST /quitquitquit, then drains:
 * readiness turns 503 at once; after COS_SHUTDOWN_DELAY_MS the listener stops
 * accepting and idle keep-alive connections are closed; requests in flight
 * (streams included) get up to COS_SHUTDOWN_TIMEOUT_MS, then the rest are cut
 * on both sides, the client's connection and the upstream request; exit 0, at
 * most EXIT_GRACE_MS after the timeout. A second signal exits at once.
 */
export async function serve (opts: ServeOptions): Promise<void> {
  const { config, logger } = opts
  // First, as it reads the TLS files: a config error must come before anything starts.
  const upstreams = upstreamsFor(config, logger)
  const metrics = new ProxyMetrics(opts.logLinesDropped === undefined ? {} : { logLinesDropped: opts.logLinesDropped })
  const store = new CredentialStore()
  const watcher = new CredentialWatcher({
    credentials: config.credentials,
    encoding: config.tokenEncoding,
    store,
    reloadMs: config.credentialsReloadMs,
    logger,
    onOutcome: o => metrics.credentialReload(o.result, o.result === 'rejected' ? o.refusal : undefined),
  })
  await watcher.start()

  upstreams.watch(config.credentialsReloadMs)
  const observer = metricsObserver(metrics)
  const requestLog = new RequestLog(observer)
  const app = await buildProxyServer({
    config,
    credentials: store,
    logger,
    upstreams,
    observer,
    requestLog,
    resyncCredentials: () => { watcher.nudge() },
    ...(usesFiles(config) ? { rereadCredentials: () => watcher.reload() } : {}),
  })

  let listening = false
  let draining = false
  const readiness = (): Readiness => {
    if (draining) return { ready: false, reason: 'draining' }
    if (!listening) return { ready: false, reason: 'proxy listener not started' }
    if (store.current === undefined) return { ready: false, reason: 'credentials not loaded' }
    return { ready: true }
  }

  const drain = async (cause: string): Promise<void> => {
    draining = true
    logger.info({ cause, delayMs: config.shutdownDelayMs, timeoutMs: config.shutdownTimeoutMs }, 'draining: readiness is now 503')
    if (config.shutdownDelayMs > 0) await sleep(config.shutdownDelayMs)
    // Armed until the very end: whatever step the drain is in when the
    // timeout runs out, it is not waited for beyond it.
    const cut = setTimeout(cutWhatIsLeft, config.shutdownTimeoutMs)
    // server.close() closes the connections idle at that moment only; a
    // keep-alive connection whose last request finishes during the drain
    // would otherwise hold the exit until the timeout.
    const reap = setInterval(() => app.server.closeIdleConnections(), 50)
    await app.close() // stops accepting, then waits for the requests in flight
    clearInterval(reap)
    // Responses emit 'close' (which writes their log line) a few ticks after
    // their socket is gone; let them, so the last lines are not lost at exit.
    const settled = Date.now() + 200
    while (requestLog.open > 0 && Date.now() < settled) await new Promise(resolve => setImmediate(resolve))
    watcher.close()
    await admin.close()
    await opts.onClose?.()
    clearTimeout(cut)
    logger.info('stopped')
  }

  /**
   * The shutdown timeout: cut the clients' connections (which aborts their
   * upstream requests), destroy the upstream pools (so nothing waits for an
   * upstream that does not answer), and the admin listener's connections.
   * What is left of the drain then takes milliseconds; should something
   * still hang, the process exits EXIT_GRACE_MS later all the same.
   */
  const cutWhatIsLeft = (): void => {
    logger.warn('shutdown timeout reached: cutting the requests still in flight')
    app.server.closeAllConnections()
    admin.server.closeAllConnections()
    upstreams.destroy().catch((err: unknown) => logger.warn({ err }, 'destroying the upstream pools failed'))
    setTimeout(() => {
      logger.warn('shutdown: exiting with the drain unfinished')
      exitAfterFlush(logger, 0)
    }, EXIT_GRACE_MS).unref()
  }

  let stopping: Promise<void> | undefined
  const stop = (cause: string): void => {
    if (stopping !== undefined) {
      if (cause !== 'quitquitquit') {
        logger.warn({ signal: cause }, 'second signal: exiting without finishing the drain')
        exitAfterFlush(logger, 1)
      }
      return
    }
    stopping = drain(cause).then(
      () => { exitAfterFlush(logger, 0) },
      (err: unknown) => { logger.error({ err }, 'shutdown failed'); exitAfterFlush(logger, 1) })
  }

  const admin = buildAdminServer({ metrics, readiness, onQuit: () => stop('quitquitquit'), logger, limits: { maxConnections: config.admin.maxConnections } })
  const { address, fields } = await listenWithAdmin(app, config.listen, admin, config.admin)
  listening = true

  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))

  if (config.allowFromIsDefault && !isLoopbackAddress(config.listen.host)) {
    logger.warn({ host: config.listen.host, allowFrom: config.allowFrom },
      'listening beyond loopback with the default COS_ALLOW_FROM: only 127.0.0.0/8 and ::1 may use the proxy; set COS_ALLOW_FROM to the CIDRs of your clients (and restrict them with a NetworkPolicy)')
  }
  logger.info({
    ...fields,
    accessKey: store.current?.accessKey ?? null,
    routes: config.routes.map(r => ({ name: r.name, prefix: r.prefix === '' ? '/' : r.prefix, upstream: r.url, ...egressOf(upstreams, r.origin) })),
  }, 'cos-auth-proxy listening')
  opts.onListening?.(address)
}
