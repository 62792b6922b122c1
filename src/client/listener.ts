// The one place a listener is built hardened: Node's server with its limits
// set where Node reads them, the connection tracker (connections.ts) with
// the listener's policy, pipelined requests admitted before the server's
// handler; the log controller and error answers the listeners share. Each
// listener states its policy as data (proxy-server.ts, admin.ts,
// inject/server.ts) and hands `listenerServer(policy)` to Fastify as its
// serverFactory: Fastify passes its `http` options only to a plain HTTP
// server it makes itself, so one place covers HTTP and HTTPS alike.
import type { IncomingMessage, Server, ServerOptions, ServerResponse } from 'node:http'
import type { Server as HttpsServer, ServerOptions as HttpsOptions } from 'node:https'
import { createRequire } from 'node:module'
import { LogController, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest, type RawServerBase } from 'fastify'
import { trackConnections, type ConnectionPolicy } from './connections.js'
import { GuardedResponse, sendError } from './response.js'
import { addTraceFields } from './trace-context.js'

// Required, not imported: an ES import of node:http loads Node's own copy of undici (response.ts).
const http = createRequire(import.meta.url)('node:http') as typeof import('node:http')
const https = createRequire(import.meta.url)('node:https') as typeof import('node:https')

/** What one listener lets its clients hold, and for how long. */
export interface ListenerPolicy {
  /** For a request's headers to arrive (and for the TLS handshake before them). */
  readonly headersTimeoutMs: number
  /** For the whole request, body included. */
  readonly requestTimeoutMs: number
  /** Node's keep-alive timeout between requests (the tracker's idleMs is what bounds an idle connection). */
  readonly keepAliveTimeoutMs: number
  /** The connections: idle reaping, the cap, pipelining (connections.ts; its defaults where not given). */
  readonly connections: Partial<ConnectionPolicy>
  /** A head Node refuses to write fails its own response, not the process (response.ts): the proxy's, whose heads come from upstreams. */
  readonly guardResponses?: boolean
}

type Handler = (req: IncomingMessage, res: ServerResponse) => void

/**
 * The server of a listener with `policy`, HTTPS with `tls`: for Fastify's
 * `serverFactory`. Node checks its timeouts every connectionsCheckingInterval
 * (30 s by default, which let a body take a minute): every second here, or
 * the headers timeout if shorter. Larger header sections than 16 KiB get
 * 431; what Node's parser can be lenient about (obs-fold, bare LF) is
 * refused. A TLS handshake has the headers timeout too (Node's default is
 * 120 s: a client that never finishes one would hold a slot that long).
 */
export function listenerServer (policy: ListenerPolicy): (handler: Handler) => Server
export function listenerServer (policy: ListenerPolicy, tls: HttpsOptions): (handler: Handler) => HttpsServer
export function listenerServer (policy: ListenerPolicy, tls?: HttpsOptions): (handler: Handler) => Server | HttpsServer {
  return handler => {
    const settings: ServerOptions = {
      headersTimeout: policy.headersTimeoutMs,
      requestTimeout: policy.requestTimeoutMs,
      keepAliveTimeout: policy.keepAliveTimeoutMs,
      connectionsCheckingInterval: Math.min(1000, policy.headersTimeoutMs),
      maxHeaderSize: 16 * 1024,
      insecureHTTPParser: false,
      ...(policy.guardResponses === true ? { ServerResponse: GuardedResponse } : {}),
    }
    // No allocation per request: one property read for a request that holds its socket.
    const admitted: Handler = (req, res) => { if (res.socket !== null || tracker.admit(req, res)) handler(req, res) }
    const server: Server | HttpsServer = tls === undefined
      ? http.createServer(settings, admitted)
      : https.createServer({ ...tls, ...settings, handshakeTimeout: policy.headersTimeoutMs }, admitted)
    server.keepAliveTimeout = policy.keepAliveTimeoutMs
    server.requestTimeout = policy.requestTimeoutMs
    const tracker = trackConnections(server, policy.connections)
    return server
  }
}

/**
 * The log of the admin and webhook listeners: one debug line per request
 * with `line` as its message (a failed one at warn), or none at all (the
 * webhook's handler logs what it decided). The proxy's is the request log
 * (src/observability/request-log.ts). Neither manages connections: that is
 * the tracker's.
 */
export class ListenerLog extends LogController {
  readonly #line: string | undefined

  constructor (line?: string) {
    super()
    this.#line = line
  }

  override incomingRequest (): void { /* the completion line is enough */ }

  override requestCompleted (error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    if (this.#line === undefined) return
    const line = {
      method: request.method,
      // The route pattern, never the raw path: a 404 path is client text.
      route: request.routeOptions.url ?? 'none',
      status: reply.statusCode,
      durationMs: Math.round(reply.elapsedTime * 100) / 100,
    }
    if (error) request.log.warn({ ...line, err: error }, this.#line)
    else request.log.debug(line, this.#line)
  }
}

/** How a listener answers an error thrown while handling a request. */
export interface ErrorAnswers {
  /** The error code of a 4xx, by status ('bad_request' for the others). */
  readonly codes: Readonly<Record<number, string>>
  /** A 5xx: its message, and the line it is logged with (at error, with the error). */
  readonly failed: { readonly message: string, readonly line: string }
  /** A 5xx Fastify raised keeps its status (the proxy's 503 while closing); else 500. */
  readonly keep5xx?: boolean
  /** A 4xx is logged at debug on the server's logger ('request refused'). */
  readonly logRefusals?: boolean
  /** The listener's own errors, answered first; true when it answered. */
  readonly own?: (error: FastifyError, request: FastifyRequest, reply: FastifyReply) => boolean
  /** Told of each error answered by the shapes here, by status (the webhook's metrics). */
  readonly answered?: (status: number) => void
}

/** The error handler: the listener's own errors, then a 4xx in the JSON shape, else a logged 5xx. */
export function answerErrors<S extends RawServerBase> (app: FastifyInstance<S>, answers: ErrorAnswers): void {
  const instance = app as unknown as FastifyInstance
  instance.setErrorHandler((error: FastifyError, request, reply) => {
    if (answers.own?.(error, request, reply) === true) return
    const raised = error.statusCode
    const status = raised !== undefined && raised >= 400 && raised < 600 && (raised < 500 || answers.keep5xx === true) ? raised : 500
    answers.answered?.(status)
    if (status >= 500) {
      request.log.error({ err: error }, answers.failed.line)
      sendError(reply, status, 'internal_error', answers.failed.message)
      return
    }
    // The server's logger: on the proxied routes, request.log passes only errors (proxy.ts).
    if (answers.logRefusals === true) request.server.log.debug(addTraceFields({ reqId: request.id, err: error }, request.headers.traceparent), 'request refused')
    sendError(reply, status, answers.codes[status] ?? 'bad_request', error.message)
  })
}
