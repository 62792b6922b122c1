// Wiring and lifecycle: config → credentials, upstreams, metrics, proxy and
// admin listeners, and the drain on SIGTERM / SIGINT / POST /quitquitquit.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { performance } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply } from 'fastify'
import type { Logger } from 'pino'
import { buildAdminServer, type Readiness } from './admin.js'
import { PROXY_METHODS, type Config } from './config.js'
import { CredentialWatcher } from './credential-watcher.js'
import { CredentialStore } from './credentials.js'
import { sendError } from './errors.js'
import { allowList, hasRequiredHeader, peerAllowed, targetProblem } from './guard.js'
import { ProxyMetrics, classifyUpstreamError } from './metrics.js'
import { proxyPlugin, type ProxyObserver } from './proxy.js'
import { RequestLog, type RequestObserver } from './request-log.js'
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

function writeRawError (socket: Duplex, status: number, code: string, message: string): void {
  if (socket.writable) {
    const body = JSON.stringify({ error: { code, message } })
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES_TEXT[status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`)
  }
  socket.destroy()
}

const STATUS_CODES_TEXT: Readonly<Record<number, string>> = { 400: 'Bad Request', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' }

/** A server socket as Node's HTTP server keeps it: `_httpMessage` is the response in progress on it, if any. */
type WithPendingResponse<T> = T & { _httpMessage?: ServerResponse | null }

/** Whether an error written now would be misread (see rejectMalformed). */
function answerUnderWay (socket: Duplex): boolean {
  const pending = (socket as WithPendingResponse<Duplex>)._httpMessage
  return pending != null && (pending.headersSent || pending.req.complete)
}

/**
 * Requests Node's parser rejects (bad framing, oversized headers, slow
 * senders) get the JSON error shape too, unless it would be misread: when
 * the response to an earlier request on the connection has started, or that
 * request was complete and the error is about the next one pipelined behind
 * it, a 400 written now would land inside that response or be taken as its
 * answer. Then the connection is only closed. (`_httpMessage` is the
 * response Node's own handler checks.)
 */
function rejectMalformed (err: Error & { code?: string }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  if (answerUnderWay(socket)) {
    socket.destroy()
    return
  }
  const [status, code, message] = CLIENT_ERRORS[err.code ?? ''] ?? [400, 'bad_request', 'malformed HTTP request']
  writeRawError(socket, status, code, message)
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

/**
 * Everything refused before routing, in order: who is asking, how, for what.
 * Returns the refusal, or undefined to let the request through.
 */
function requestGuard (config: Config): (raw: IncomingMessage) => Refusal | undefined {
  const allowed = allowList(config.allowFrom)
  const checkedPeers = new WeakMap<object, boolean>()
  const required = config.requireHeader
  const maxBody = config.maxBodyBytes
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
    if (!FORWARDED_METHODS.has(raw.method ?? '')) return [405, 'method_not_allowed', `${raw.method ?? ''} is not forwarded (TRACE could echo the token back)`]
    if (raw.headers.upgrade !== undefined) return [405, 'method_not_allowed', 'protocol upgrades (WebSocket) are not supported']
    const problem = targetProblem(raw.url ?? '', config.routes)
    if (problem !== undefined) return [400, 'bad_request', problem]
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

/**
 * Closes connections that sit without a request in flight for longer than
 * the keep-alive timeout. Node's own keep-alive timer is a socket timeout,
 * which any byte resets (a client can trickle empty lines forever), and a
 * connection that never sends a byte has no timer at all: either could hold
 * a slot of COS_MAX_CONNECTIONS indefinitely.
 *
 * Nothing is done per request: a sweep (every second at most) looks at each
 * connection. One with a response under way (`_httpMessage`), or that was
 * written to since the last sweep (only responses write: trickled bytes do
 * not count), is busy now; one that was neither for `idleMs` is closed. So a
 * connection is reaped between idleMs and idleMs + the sweep interval after
 * its last response.
 */
interface ConnectionState { lastBusy: number, bytesWritten: number }

function reapIdleConnections (server: Server, idleMs: number): void {
  const connections = new Map<WithPendingResponse<Socket>, ConnectionState>()
  server.on('connection', (socket: WithPendingResponse<Socket>) => {
    connections.set(socket, { lastBusy: performance.now(), bytesWritten: 0 })
    socket.once('close', () => connections.delete(socket))
  })
  const sweep = setInterval(() => {
    const now = performance.now()
    for (const [socket, state] of connections) {
      const written = socket.bytesWritten
      if (socket._httpMessage != null || written !== state.bytesWritten) {
        state.lastBusy = now
        state.bytesWritten = written
      } else if (now - state.lastBusy >= idleMs) {
        connections.delete(socket)
        socket.destroy()
      }
    }
  }, Math.max(10, Math.min(1000, idleMs / 2))).unref()
  server.once('close', () => clearInterval(sweep))
}

export interface ProxyServerOptions {
  readonly config: Config
  readonly credentials: CredentialStore
  readonly logger: FastifyBaseLogger
  /** Built from config (and closed with the server) when not given. */
  readonly upstreams?: Upstreams
  readonly observer?: ProxyObserver & RequestObserver
  readonly resyncCredentials?: () => boolean
  /** Built from `observer` when not given. */
  readonly requestLog?: RequestLog
}

export function upstreamsFor (config: Config, logger: FastifyBaseLogger): Upstreams {
  return new Upstreams({
    connectTimeoutMs: config.connectTimeoutMs,
    headersTimeoutMs: config.upstreamTimeoutMs,
    bodyIdleTimeoutMs: config.bodyIdleTimeoutMs,
    tls: config.tls,
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
    },
    clientErrorHandler: rejectMalformed,
  })
  app.server.maxConnections = client.maxConnections
  reapIdleConnections(app.server, client.keepAliveTimeoutMs)
  // CONNECT is handed to a 'connect' listener before routing; with none, Node
  // would drop the socket without an answer.
  app.server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    if (answerUnderWay(socket)) socket.destroy()
    else writeRawError(socket, 400, 'bad_request', 'CONNECT is not supported: this is not a forward proxy')
  })
  // Declared up front so every request object has the same shape.
  app.decorateRequest('upstreamStart', 0)
  app.decorateRequest('upstreamMs', -1)

  const upstreams = opts.upstreams ?? upstreamsFor(config, opts.logger)
  app.addHook('onClose', async () => { await upstreams.close() })

  // Refused before the body is read: close the connection rather than have
  // Node read (and discard) a body nobody wants to keep the socket alive.
  const refuse = (reply: FastifyReply, [status, code, message]: Refusal): void => {
    reply.header('connection', 'close')
    if (status === 405) reply.header('allow', ALLOW)
    sendError(reply, status, code, message)
  }
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
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
  })
  return app
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

function isLoopback (host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host)
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
    onOutcome: o => metrics.credentialReload(o.result),
  })
  await watcher.start()

  upstreams.watch(config.credentialsReloadMs)
  const observer: ProxyObserver & RequestObserver = {
    requestStarted: () => metrics.requestStarted(),
    requestFinished: (route, method, status, total, upstream, aborted) => metrics.requestFinished(route, method, status, total, upstream, aborted),
    upstreamError: (route, err) => metrics.upstreamError(route, classifyUpstreamError(err)),
    retried: (route, reason) => metrics.retried(route, reason),
    tokenMinted: () => metrics.tokenMinted(),
  }
  // The 401 path re-reads the files synchronously; an upstream that rejects
  // every request must not turn that into a read per request.
  let lastResync = 0
  const resyncCredentials = (): boolean => {
    const now = performance.now()
    if (now - lastResync < 250) return false
    lastResync = now
    return watcher.reloadSync().result === 'applied'
  }
  const requestLog = new RequestLog(observer)
  const app = await buildProxyServer({
    config,
    credentials: store,
    logger,
    upstreams,
    observer,
    requestLog,
    resyncCredentials,
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

  const admin = buildAdminServer({ metrics, readiness, onQuit: () => stop('quitquitquit'), logger })
  await admin.listen({ host: config.admin.host, port: config.admin.port })
  await app.listen({ host: config.listen.host, port: config.listen.port })
  listening = true

  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))

  if (config.allowFromIsDefault && !isLoopback(config.listen.host)) {
    logger.warn({ host: config.listen.host, allowFrom: config.allowFrom },
      'listening beyond loopback with the default COS_ALLOW_FROM: only 127.0.0.0/8 and ::1 may use the proxy; set COS_ALLOW_FROM to the CIDRs of your clients (and restrict them with a NetworkPolicy)')
  }
  const address = app.server.address() as AddressInfo
  const adminAddress = admin.server.address() as AddressInfo
  logger.info({
    address: address.address,
    port: address.port,
    admin: { address: adminAddress.address, port: adminAddress.port },
    accessKey: store.current?.accessKey ?? null,
    routes: config.routes.map(r => ({ name: r.name, prefix: r.prefix === '' ? '/' : r.prefix, upstream: r.url })),
  }, 'cos-auth-proxy listening')
  opts.onListening?.(address)
}
