// The admin listener: probes, metrics and the drain trigger. A Fastify
// instance of its own, so it never shares the proxy's port, hooks or logs.
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import { fromWebPage } from '../client/browser-checks.js'
import { condemn, droppedBehindRefusal, TOO_MANY_PIPELINED } from '../client/connection-refusals.js'
import { pipelinedBeyondBound } from '../client/connections.js'
import { answerErrors, ListenerLog, listenerServer, type ListenerPolicy } from '../client/listener.js'
import type { Refusal } from '../client/request-guard.js'
import { sendError } from '../client/response.js'
import type { ProxyMetrics } from '../observability/metrics.js'

export type Readiness = { readonly ready: true } | { readonly ready: false, readonly reason: string }

/**
 * What the admin listener may hold of the process. It serves a kubelet (one
 * short connection per probe) and a scraper or two (one keep-alive
 * connection each): Node's defaults (no cap, 72 s keep-alive, 60 s for the
 * headers) let idle connections pile up until the process runs out of
 * descriptors and the proxy, the probes and the credential reads all fail.
 */
export interface AdminLimits {
  /** Open at once (COS_ADMIN_MAX_CONNECTIONS); at the cap a new connection displaces the one idle longest. */
  readonly maxConnections: number
  /** For a request's headers to arrive; a probe sends them at once. */
  readonly headersTimeoutMs: number
  /** For the whole request (no route takes a body but POST /quitquitquit, 1 KiB at most, sent with its head). */
  readonly requestTimeoutMs: number
  /** A connection without a request in flight for this long is closed. */
  readonly idleTimeoutMs: number
}

export const ADMIN_LIMITS: AdminLimits = { maxConnections: 64, headersTimeoutMs: 5_000, requestTimeoutMs: 5_000, idleTimeoutMs: 5_000 }

export interface AdminOptions {
  /** What /metrics serves: the proxy's, or the injection webhook's (which has no `ready` gauge). */
  readonly metrics: Pick<ProxyMetrics, 'text' | 'contentType'> & Partial<Pick<ProxyMetrics, 'observeReadiness'>>
  /** Asked on every GET /readyz. */
  readonly readiness: () => Readiness
  /** Called once, on the first POST /quitquitquit; later posts answer 202 without calling it again. */
  readonly onQuit: () => void
  /** Admin requests are logged at debug only; false or absent: not at all. */
  readonly logger?: FastifyBaseLogger | false
  /** ADMIN_LIMITS where not given. */
  readonly limits?: Partial<AdminLimits>
  /** Whether POST /quitquitquit may start the drain (COS_QUITQUITQUIT); true when not given. */
  readonly quitquitquit?: boolean
}

// What a container of the pod has at both ends when it calls localhost: the
// exact loopback addresses, not all of 127.0.0.0/8.
const POD_LOOPBACK: ReadonlySet<string> = new Set(['127.0.0.1', '::1', '::ffff:127.0.0.1'])

/**
 * Whether a connection is the pod calling itself: from 127.0.0.1 (or ::1)
 * **to** 127.0.0.1 (or ::1). A mesh's inbound hop forwards a remote pod's
 * connection from inside the pod, so the peer address alone does not tell:
 * Istio (1.10 on) and Kuma connect from 127.0.0.6 to the pod's IP, Linkerd
 * (2.11 on) from the pod's IP to the pod's IP; a container calling
 * localhost reaches 127.0.0.1 from 127.0.0.1. Meshes that rewrote the
 * destination to 127.0.0.1 (Istio before 1.10, Linkerd before 2.11) are
 * indistinguishable from the pod: COS_QUITQUITQUIT=false turns the endpoint
 * off (docs/security.md, "The admin listener").
 */
export function fromInsidePod (socket: { readonly remoteAddress?: string | undefined, readonly localAddress?: string | undefined }): boolean {
  return POD_LOOPBACK.has(socket.remoteAddress ?? '') && POD_LOOPBACK.has(socket.localAddress ?? '')
}

// Path → methods it answers, for 405 + Allow on the others (Fastify itself 404s them).
const ALLOW: ReadonlyMap<string, string> = new Map([
  ['/healthz', 'GET, HEAD'],
  ['/readyz', 'GET, HEAD'],
  ['/metrics', 'GET, HEAD'],
  ['/quitquitquit', 'POST'],
])

/**
 * The admin listener's policy (listener.ts): its own short timeouts, idle
 * connections reaped after idleTimeoutMs, at the cap the idlest displaced
 * (a body still arriving too: no admin route waits for one), pipelining
 * refused beyond the bounds with 503.
 */
export function adminListener (limits: AdminLimits): ListenerPolicy {
  return {
    headersTimeoutMs: limits.headersTimeoutMs,
    requestTimeoutMs: limits.requestTimeoutMs,
    keepAliveTimeoutMs: limits.idleTimeoutMs,
    connections: { idleMs: limits.idleTimeoutMs, maxConnections: limits.maxConnections },
  }
}

/** Routes registered, not listening: the caller listens (and closes it last, so /healthz answers through the drain). */
export function buildAdminServer (opts: AdminOptions): FastifyInstance {
  opts.metrics.observeReadiness?.(() => opts.readiness().ready)
  const app = Fastify({
    // No loggerInstance: Fastify's logger stays off.
    loggerInstance: opts.logger === false ? undefined : opts.logger,
    // The kubelet probes every few seconds: one debug line per request, nothing at info.
    logController: new ListenerLog('admin request'),
    bodyLimit: QUIT_BODY_BYTES,
    serverFactory: listenerServer(adminListener({ ...ADMIN_LIMITS, ...opts.limits })),
  })
  answerRefusalsAndErrors(app)
  registerAdminRoutes(app, opts)
  return app
}

/** What the admin listener refuses (web pages, unknown paths and methods) and its error shape. */
function answerRefusalsAndErrors (app: FastifyInstance): void {
  // `curl -d ''` and `wget --post-data` send a form content type to
  // /quitquitquit; any small body is accepted and ignored.
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, _body, done) => { done(null) })

  app.addHook('onRequest', (request, reply, done) => {
    if (droppedBehindRefusal(reply)) return
    const refusal = connectionRefusal(request, reply)
    if (refusal !== undefined) {
      // Before the body is read, and nothing more from this connection.
      condemn(request.raw.socket, refusal === TOO_MANY_PIPELINED ? 0 : undefined)
      reply.header('connection', 'close')
      sendError(reply, ...refusal)
      return
    }
    // No web page has any business here: a form on any site could otherwise
    // POST /quitquitquit through the developer's browser.
    if (fromWebPage(request.headers.origin, request.headers['sec-fetch-site'])) {
      sendError(reply, 403, 'forbidden_origin', 'the admin endpoints do not answer web pages (Origin, or Sec-Fetch-Site other than none)')
      return
    }
    done()
  })

  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?', 1)[0] ?? ''
    const allow = ALLOW.get(path)
    if (allow === undefined) {
      sendError(reply, 404, 'route_not_found', `no route for ${request.method} on this path`)
      return
    }
    reply.header('allow', allow)
    sendError(reply, 405, 'method_not_allowed', `${path} answers ${allow} only`)
  })

  answerErrors(app, { codes: { 413: 'payload_too_large' }, failed: { message: 'the admin endpoint failed', line: 'admin request failed' } })
}

/** The largest body POST /quitquitquit takes (`curl -d ''` sends none; a form tool may send a few bytes). */
const QUIT_BODY_BYTES = 1024

/**
 * What closes an admin connection before its request is handled: more
 * requests pipelined on it than any prober sends, or a body no admin route
 * reads (only /quitquitquit takes one, of a declared length of 1 KiB at
 * most). A body still arriving would hold a connection slot: refused before
 * it is read.
 */
function connectionRefusal (request: FastifyRequest, reply: FastifyReply): Refusal | undefined {
  if (pipelinedBeyondBound(reply.raw)) return TOO_MANY_PIPELINED
  const { headers } = request
  if (headers['transfer-encoding'] !== undefined) return [413, 'payload_too_large', 'the admin endpoints take no chunked body']
  const length = headers['content-length']
  if (length === undefined || length === '0') return undefined
  if (request.method === 'POST' && request.url.split('?', 1)[0] === '/quitquitquit' && Number(length) <= QUIT_BODY_BYTES) return undefined
  return [413, 'payload_too_large', `the admin endpoints take no body (POST /quitquitquit: ${QUIT_BODY_BYTES} bytes at most)`]
}

/** /healthz, /readyz, /metrics and POST /quitquitquit. */
function registerAdminRoutes (app: FastifyInstance, opts: AdminOptions): void {
  const { metrics } = opts
  // Liveness only: the event loop ran this handler. Stays 200 while draining,
  // so the kubelet does not restart a pod that is shutting down cleanly.
  app.get('/healthz', (_request, reply) => {
    void reply.send({ status: 'ok' })
  })

  app.get('/readyz', (_request, reply) => {
    const r = opts.readiness()
    if (r.ready) void reply.send({ status: 'ready' })
    else void reply.code(503).send({ status: 'not_ready', reason: r.reason })
  })

  app.get('/metrics', async (_request, reply) => {
    const text = await metrics.text()
    return reply.type(metrics.contentType).send(text)
  })

  let quitting = false
  const enabled = opts.quitquitquit ?? true
  // The admin port listens on 0.0.0.0 in a pod so the kubelet can probe it;
  // stopping the proxy is for the pod's own containers (a Job's main
  // container), so only a connection from localhost to localhost may ask.
  app.post('/quitquitquit', (request, reply) => {
    if (!enabled) {
      sendError(reply, 403, 'quitquitquit_disabled', 'POST /quitquitquit is turned off (COS_QUITQUITQUIT=false)')
      return
    }
    if (!fromInsidePod(request.socket)) {
      sendError(reply, 403, 'forbidden_source', 'only the pod itself may stop the proxy: a connection from 127.0.0.1 or ::1 to 127.0.0.1 or ::1 (localhost)')
      return
    }
    void reply.code(202).send({ status: 'draining' })
    if (quitting) return
    quitting = true
    // After the reply: the drain may close this server, and the caller wants its 202.
    try {
      opts.onQuit()
    } catch (err) {
      request.log.error({ err }, 'quitquitquit: starting the drain failed')
    }
  })
}
