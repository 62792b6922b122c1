// Routes + header rewriting: the one place where a client request becomes a
// signed upstream request. One @fastify/http-proxy registration per route,
// each over its own keep-alive undici Pool (shared by routes with one origin).
import type { IncomingHttpHeaders } from 'node:http'
import { performance } from 'node:perf_hooks'
import { Readable, Transform, type TransformCallback } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import httpProxy from '@fastify/http-proxy'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import type { Route, RouteName } from './config.js'
import type { CredentialStore } from './credentials.js'
import { errorCodes, hasErrorCode } from './error-codes.js'
import { sendError } from './errors.js'
import { abortWhenClientGone, type Upstreams } from './upstream.js'

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Bounded label for logs and metrics: never the raw path. */
    routeName?: RouteName
    /** COS_*_ALLOWED_METHODS; undefined = all. */
    allowedMethods?: readonly string[] | undefined
  }
  interface FastifyRequest {
    /** performance.now() when the request left for the upstream (decorated in server.ts). */
    upstreamStart: number
    /** ms from leaving to the upstream's response headers; -1 = never reached. */
    upstreamMs: number
  }
}

/** What the proxy reports; the metrics registry implements it (tests may pass nothing). */
export interface ProxyObserver {
  upstreamError: (route: RouteName, err: Error) => void
  retried: (route: RouteName, reason: 'connect' | 'unauthorized') => void
  tokenMinted: () => void
}

export interface ProxyOptions {
  readonly routes: readonly Route[]
  readonly credentials: CredentialStore
  readonly upstreams: Upstreams
  /** Re-reads the credential files now; true when a different pair is in force afterwards. */
  readonly resyncCredentials?: () => boolean
  readonly observer?: ProxyObserver
  /** A header only for the proxy (COS_REQUIRE_HEADER): never forwarded. */
  readonly dropHeader?: string
  /** 0 = unlimited. Streamed bodies are counted as they pass. */
  readonly maxBodyBytes?: number
}

// Hop-by-hop (RFC 9110 §7.6.1) plus the client's own credentials. `expect`
// is answered by Node's server itself (100-continue) and undici refuses it.
// Those present are set to undefined rather than deleted (undici skips
// undefined values and the object keeps its fast shape); absent ones are not
// touched, so the object does not grow keys that reply-from then copies.
const DROP_REQUEST = ['authorization', 'proxy-authorization', 'proxy-connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'expect'] as const
const DROP_RESPONSE: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade'])

function connectionTokens (value: string | string[]): string[] {
  return (Array.isArray(value) ? value.join(',') : value).split(',').map(s => s.trim().toLowerCase()).filter(s => s !== '')
}

/** Whether a Connection value names a header to drop beyond DROP_RESPONSE: not for the usual one-word values. */
function namesOtherHeaders (value: string | string[]): boolean {
  if (typeof value !== 'string') return true
  const v = value.length === 10 || value.length === 5 ? value.toLowerCase() : ''
  return v !== 'keep-alive' && v !== 'close'
}

const BODY_TOO_LARGE = 'COS_BODY_TOO_LARGE'
const UPSTREAM_ABORTED = 'UND_ERR_ABORTED'
const SMALL_BODY_BYTES = 16 * 1024

/** What reply-from hands onResponse (its typings say a ServerResponse). */
interface UpstreamResponse { statusCode: number, headers: IncomingHttpHeaders, stream: Readable }

/** Passes a streamed body through and fails it once it exceeds the limit, which aborts the upstream request. */
class BodyLimit extends Transform {
  #left: number
  constructor (limit: number) {
    super()
    this.#left = limit
  }

  override _transform (chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.#left -= chunk.length
    if (this.#left < 0) callback(Object.assign(new Error('request body too large'), { code: BODY_TOO_LARGE }))
    else callback(null, chunk)
  }
}

// Headers some frameworks honour to change the method: on a route limited to
// some methods they must not name another.
const METHOD_OVERRIDES = ['x-http-method-override', 'x-http-method', 'x-method-override'] as const

function overridesMethod (headers: IncomingHttpHeaders, allowed: readonly string[]): boolean {
  for (const name of METHOD_OVERRIDES) {
    const value = headers[name]
    if (value !== undefined && (typeof value !== 'string' || !allowed.includes(value.trim().toUpperCase()))) return true
  }
  return false
}

interface AttemptRequest { method: string, headers: IncomingHttpHeaders, body: unknown }
interface AttemptResponse { statusCode: number, stream: { resume: () => void } }

const RETRY_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
// Failures where the upstream cannot have acted on the request.
const CONNECTION_FAILURES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'])

function isBodyless (req: AttemptRequest): boolean {
  const length = req.headers['content-length']
  return (req.body === '' || req.body === undefined) && req.headers['transfer-encoding'] === undefined && (length === undefined || length === '0')
}

const TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'FST_REPLY_FROM_GATEWAY_TIMEOUT', 'FST_REPLY_FROM_TIMEOUT'])

/** Maps a reply-from/undici failure to the proxy's contract: 504 for timeouts, 502 for the rest. */
export function upstreamErrorStatus (error: Error): 502 | 504 {
  for (const code of errorCodes(error)) if (TIMEOUT_CODES.has(code)) return 504
  return 502
}

export async function proxyPlugin (fastify: FastifyInstance, opts: ProxyOptions): Promise<void> {
  const { credentials, upstreams, observer, dropHeader } = opts
  const maxBody = opts.maxBodyBytes ?? 0

  // Bodies are streamed, never parsed or buffered: drop Fastify's JSON and
  // text parsers; @fastify/http-proxy adds its pass-through parser for '*'.
  fastify.removeAllContentTypeParsers()

  const rewriteRequestHeaders: NonNullable<FastifyReplyFromHooks['rewriteRequestHeaders']> = (request, headers) => {
    const h = headers as IncomingHttpHeaders // HTTP/1 only: the proxy listens on plain HTTP/1.1
    // `Connection` and the headers it names are already gone: reply-from strips
    // them before calling this hook.
    for (const name of DROP_REQUEST) if (h[name] !== undefined) h[name] = undefined
    if (dropHeader !== undefined && h[dropHeader] !== undefined) h[dropHeader] = undefined
    // admit (onRequest) saw a pair; read it again so a swap in between is honoured.
    h.authorization = credentials.current?.next()
    observer?.tokenMinted()
    h['x-request-id'] = request.id
    abortWhenClientGone(h, request.raw.socket)
    request.upstreamStart = performance.now()
    return h
  }

  const rewriteHeaders: NonNullable<FastifyReplyFromHooks['rewriteHeaders']> = (headers, request) => {
    if (request !== undefined) request.upstreamMs = performance.now() - request.upstreamStart
    const h = headers as IncomingHttpHeaders
    // A new object rather than deletes: reply-from copies every key it finds
    // (so undefined will not do), and a delete drops the object to a slow
    // dictionary shape (measured: a copy of the usual five headers is ~5×
    // cheaper than deleting two of them).
    const connection = h.connection
    const named = connection !== undefined && namesOtherHeaders(connection) ? connectionTokens(connection) : undefined
    const kept: IncomingHttpHeaders = {}
    for (const name in h) {
      if (!DROP_RESPONSE.has(name) && named?.includes(name) !== true) kept[name] = h[name]
    }
    return kept
  }

  const onError: NonNullable<FastifyReplyFromHooks['onError']> = (reply, { error }) => {
    // Only a client that went away aborts an upstream request (its connection
    // closed: see abortWhenClientGone; or its upload stopped short): no one
    // to answer, and no upstream fault to count.
    if (hasErrorCode(error, UPSTREAM_ABORTED)) return
    if (hasErrorCode(error, BODY_TOO_LARGE)) {
      sendError(reply, 413, 'payload_too_large', `request bodies are limited to ${maxBody} bytes (COS_MAX_BODY_BYTES)`)
      return
    }
    const route = reply.request.routeOptions.config.routeName
    if (route !== undefined) observer?.upstreamError(route, (error.cause as Error | undefined) ?? error)
    const status = upstreamErrorStatus(error)
    if (status === 504) sendError(reply, 504, 'upstream_timeout', 'the upstream did not answer in time')
    else sendError(reply, 502, 'upstream_unavailable', 'the upstream could not be reached')
  }

  /**
   * A small body whose length the upstream declared is collected and sent
   * with the headers in one write; reply-from's default pipes every body into
   * the response, and for a few hundred bytes the pipe (listeners, end-of-
   * stream tracking on both streams) costs more than the bytes. Anything
   * larger, of unknown length, or without a Content-Type (Fastify would add
   * one to a Buffer) streams through as before: bodies are never buffered
   * beyond SMALL_BODY_BYTES.
   */
  const onResponse: NonNullable<FastifyReplyFromHooks['onResponse']> = (request, reply, res) => {
    const { statusCode, headers, stream } = res as unknown as UpstreamResponse
    const length = headers['content-length']
    const size = typeof length === 'string' && length.length <= 5 ? Number(length) : NaN
    if (!(size <= SMALL_BODY_BYTES) || headers['content-type'] === undefined || request.method === 'HEAD' ||
      statusCode < 200 || statusCode === 204 || statusCode === 304) {
      void reply.send(stream)
      return
    }
    const body = Buffer.allocUnsafe(size)
    let filled = 0
    stream.on('data', (chunk: Buffer) => {
      // undici fails the body if it outgrows its Content-Length; this only keeps the copy in bounds.
      filled += chunk.copy(body, filled)
    })
    stream.once('end', () => { void reply.send(filled === size ? body : body.subarray(0, filled)) })
    stream.once('error', (error: Error) => { onError(reply, { error }) })
  }

  // onRequest, so a refusal comes before any body is read. Callback style:
  // replying without calling done() ends the request here.
  function admit (request: FastifyRequest, reply: FastifyReply, done: () => void): void {
    const allowed = request.routeOptions.config.allowedMethods
    if (allowed !== undefined && (!allowed.includes(request.method) || overridesMethod(request.headers, allowed))) {
      reply.header('allow', allowed.join(', '))
      sendError(reply, 405, 'method_not_allowed', `${request.method} is not allowed on this route`)
      return
    }
    if (credentials.current === undefined) {
      sendError(reply, 503, 'credentials_unavailable', 'no valid access key pair is loaded yet')
      return
    }
    done()
  }

  // A preHandler (the body exists only after parsing) and only when there is
  // a limit: every hook costs every request.
  function limitBody (request: FastifyRequest, _reply: FastifyReply, done: () => void): void {
    if (request.body instanceof Readable) request.body = request.body.pipe(new BodyLimit(maxBody))
    done()
  }
  fastify.addHook('onRequest', admit)

  /**
   * reply-from calls this after every attempt with its internal request
   * options (`req`) and response (`res`), whatever its typings say. One more
   * attempt, with a freshly minted token, only when it is safe:
   *  - the request has no body, its method is idempotent and the connection
   *    failed before anything was answered (refused, reset, closed);
   *  - the upstream answered 401 to a request without a body and re-reading
   *    the credential files put a different pair in force (a rotation the
   *    watcher had not seen yet).
   * Timeouts and upstream 5xx are never retried.
   */
  const retryDelayFor = (route: RouteName): NonNullable<FastifyReplyFromHooks['retryDelay']> => ({ err, req, res, attempt }) => {
    if (attempt > 0) return null
    const attemptReq = req as unknown as AttemptRequest
    if (!isBodyless(attemptReq)) return null
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition -- undefined on a response, whatever the typings say
    if (err != null) {
      if (!RETRY_METHODS.has(attemptReq.method) || !CONNECTION_FAILURES.has(errorCodes(err).next().value ?? '')) return null
      observer?.retried(route, 'connect')
    } else {
      const attemptRes = res as unknown as AttemptResponse | undefined
      if (attemptRes?.statusCode !== 401 || opts.resyncCredentials?.() !== true) return null
      attemptRes.stream.resume() // drain the 401 so its connection is reused
      observer?.retried(route, 'unauthorized')
    }
    attemptReq.headers.authorization = credentials.current?.next()
    observer?.tokenMinted()
    return 1 // ms; 0 would read as "do not retry"
  }

  for (const route of opts.routes) {
    await fastify.register(httpProxy, {
      upstream: route.origin,
      // The catch-all is registered at '/', which http-proxy strips like any
      // prefix, so its rewrite keeps the '/' that separates base and path.
      prefix: route.prefix === '' ? '/' : route.prefix,
      rewritePrefix: route.prefix === '' ? route.basePath + '/' : route.basePath === '' ? '/' : route.basePath,
      undici: upstreams.dispatcherFor(route.origin),
      websocket: false,
      disableRequestLogging: true,
      // Responses pass through unchanged, Location included.
      internalRewriteLocationHeader: false,
      config: { routeName: route.name, allowedMethods: route.allowedMethods },
      ...(maxBody > 0 ? { preHandler: limitBody } : {}),
      // For a bare prefix with a query (`/management?q=1`) and no upstream base
      // path, http-proxy computes an empty destination, and reply-from reads
      // an empty one as "the original URL": the prefix would not be stripped.
      handler: (_request, reply, dest, options) => reply.from(dest === '' ? '/' : dest, options),
      replyOptions: {
        rewriteRequestHeaders,
        rewriteHeaders,
        onError,
        onResponse,
        // Replaces reply-from's default, which retries a GET that got 503
        // up to 10 times with the same token.
        retryDelay: retryDelayFor(route.name),
      },
    })
  }
}
