// Routes + header rewriting: the one place where a client request becomes a
// signed upstream request. One @fastify/http-proxy registration per route,
// each over its own keep-alive undici Pool (shared by routes with one origin).
import type { IncomingHttpHeaders } from 'node:http'
import { performance } from 'node:perf_hooks'
import { Readable, Transform, type TransformCallback } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
// Before @fastify/http-proxy, which loads reply-from: see the module.
import './reply-from-patch.js'
import httpProxy from '@fastify/http-proxy'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import { PROXY_METHODS, type Route, type RouteName } from './config.js'
import type { CredentialStore } from './credentials.js'
import { errorCodes, hasErrorCode } from './error-codes.js'
import { sendError } from './errors.js'
import { prefixLookalike } from './guard.js'
import { failResponse, responseFailure } from './response.js'
import type { RefusalStatus } from './auth-refusals.js'
import type { UpstreamClock } from './upstream-clock.js'
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
  /** A measurement of the upstream's clock, in seconds (upstream minus local). */
  upstreamClockSkew?: (seconds: number) => void
}

export interface ProxyOptions {
  readonly routes: readonly Route[]
  readonly credentials: CredentialStore
  readonly upstreams: Upstreams
  /** Asks for the credential files to be re-read in the background (an upstream 401); rate-limited, never blocks. */
  readonly resyncCredentials?: () => void
  readonly observer?: ProxyObserver
  /** A header only for the proxy (COS_REQUIRE_HEADER): never forwarded. */
  readonly dropHeader?: string
  /** 0 = unlimited. Streamed bodies are counted as they pass. */
  readonly maxBodyBytes?: number
  /** Reads the upstream's clock off its answers (sampled). */
  readonly clock?: UpstreamClock
  /** An upstream answered 401 or 403 (rate-limited diagnosis; never on the request's time). */
  readonly authRefused?: (route: RouteName, status: RefusalStatus) => void
}

// Hop-by-hop (RFC 9110 §7.6.1; HTTP2-Settings of an h2c upgrade, RFC 7540
// §3.2.1, even when Connection does not name it) plus the client's own
// credentials. `expect` is answered by Node's server itself (100-continue)
// and undici refuses it. Forwarding headers are whatever the client chose to
// write: an upstream that audits or filters on them would take them as the
// truth, and it sees the proxy's own address anyway. Nothing sets them
// instead (neither reply-from nor http-proxy adds any). Those present are set
// to undefined rather than deleted (undici skips undefined values and the
// object keeps its fast shape); absent ones are not touched, so the object
// does not grow keys that reply-from then copies.
const DROP_REQUEST = [
  'authorization', 'proxy-authorization', 'proxy-connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'http2-settings', 'expect',
  'forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-proto', 'x-forwarded-port', 'x-forwarded-prefix', 'x-real-ip',
] as const
// `trailer` and `te` as well: trailers are never forwarded, and Node refuses
// to write a head that declares them on a response that cannot carry them
// (HEAD, HTTP/1.0, a Content-Length, a 204).
const DROP_RESPONSE: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'trailer', 'te'])

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
// As reply-from's hooks have them: typed for HTTP/1 and HTTP/2 servers alike.
type OnResponse = NonNullable<FastifyReplyFromHooks['onResponse']>
type ProxyRequest = Parameters<OnResponse>[0]
type ProxyReply = Parameters<OnResponse>[1]

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

// Headers some frameworks and gateways honour to change the method (Express
// method-override, Symfony, ASP.NET, Google's and Azure's gateways, IIS URL
// Rewrite). They must not name a method the route refuses, nor, on a route
// with no list, one the proxy never forwards (TRACE would echo the token).
// They are refused rather than stripped: dropping one would run the request
// as another method than its sender meant (a POST instead of a DELETE).
const METHOD_OVERRIDES = ['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-method', 'x-original-http-method', 'x-rewrite-method', 'x-method'] as const
const NAMEABLE = /^[A-Za-z-]{1,24}$/

/** Why an override header asks for a method the route refuses, or undefined when none does. */
function overrideProblem (headers: IncomingHttpHeaders, allowed: readonly string[]): string | undefined {
  for (const name of METHOD_OVERRIDES) {
    const value = headers[name]
    if (value === undefined) continue
    const method = typeof value === 'string' ? value.trim().toUpperCase() : ''
    if (!allowed.includes(method)) {
      return `the ${name} header asks for ${NAMEABLE.test(method) ? method : 'another method'}, which is not allowed on this route`
    }
  }
  return undefined
}

interface AttemptRequest { method: string, headers: IncomingHttpHeaders, body: unknown }
interface AttemptResponse { statusCode: number, stream: { resume: () => void } }

const RETRY_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])
// Failures where the upstream cannot have acted on the request.
const CONNECTION_FAILURES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'])

/** reply.send from an event listener, where a throw would be uncaught: it fails this response only. */
function sendOrFail (reply: ProxyReply, payload?: Buffer): void {
  try {
    void reply.send(payload)
  } catch (err) {
    failResponse(reply.raw, err as Error)
  }
}

/**
 * A response that has no body by definition (RFC 9110 §6.4.1). undici 7
 * delivers a 204 or 304 with a non-zero Content-Length (which RFC 9110 allows
 * on a 304) and then fails its empty body with a length mismatch; the head
 * is all there is to forward, so the body stream is only drained. A 204 may
 * not carry a Content-Length (§8.6); a 304 or HEAD answer keeps the
 * representation's.
 */
function sendHeadOnly (reply: ProxyReply, statusCode: number, stream: Readable): void {
  stream.on('error', ignore)
  stream.resume()
  if (statusCode === 204) reply.removeHeader('content-length')
  sendOrFail(reply)
}

function ignore (): void { /* the error is undici's own, about a body that cannot exist */ }

/** Removes every header copied from the upstream's answer (reply-from's `connection: close` stays). */
function dropCopiedHeaders (reply: ProxyReply): void {
  for (const name of Object.keys(reply.getHeaders())) if (name !== 'connection') reply.removeHeader(name)
}

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
  const { credentials, upstreams, observer, dropHeader, clock, authRefused } = opts
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
    const now = performance.now()
    if (request !== undefined) request.upstreamMs = now - request.upstreamStart
    const h = headers as IncomingHttpHeaders
    clock?.observe(h, now)
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
    // The head of an upstream answer that then failed was copied: none of it belongs on this error.
    if (reply.request.upstreamMs >= 0) dropCopiedHeaders(reply)
    if (hasErrorCode(error, BODY_TOO_LARGE)) {
      sendError(reply, 413, 'payload_too_large', `request bodies are limited to ${maxBody} bytes (COS_MAX_BODY_BYTES)`)
      return
    }
    const route = reply.request.routeOptions.config.routeName
    if (route !== undefined) observer?.upstreamError(route, (error.cause as Error | undefined) ?? error)
    const status = upstreamErrorStatus(error)
    // A failure at the egress proxy names it: the upstream may be fine.
    const egress = upstreams.egressProblem(error)
    if (status === 504) sendError(reply, 504, 'upstream_timeout', egress ?? 'the upstream did not answer in time')
    else sendError(reply, 502, 'upstream_unavailable', egress ?? 'the upstream could not be reached')
  }

  // An upstream body that fails before any of it was written (shorter than
  // its Content-Length, a reset, a bad chunk, a body that stalls) reaches
  // Fastify's error handling through the stream: it is the upstream's
  // failure, as one before its head would be (502), never the proxy's 500.
  // Errors before any upstream answer go on to the server's handler.
  fastify.setErrorHandler((error, request, reply) => {
    // A response that could not be written closed its connection: its body stream's end is no news.
    if (responseFailure(reply.raw) !== undefined) return
    if (request.upstreamMs < 0 || !(error instanceof Error)) throw error
    onError(reply, { error })
  })

  /**
   * HEAD, 204 and 304 answers are sent as a head alone, whatever their
   * Content-Length says. A small body whose length the upstream declared is
   * collected and sent with the headers in one write; reply-from's default
   * pipes every body into the response, and for a few hundred bytes the pipe
   * (listeners, end-of-stream tracking on both streams) costs more than the
   * bytes. Anything larger, of unknown length, or without exactly one
   * Content-Type (Fastify would add one to a Buffer, or replace a repeated
   * one) streams through as before: bodies are never buffered beyond
   * SMALL_BODY_BYTES.
   */
  const onResponse: OnResponse = (request, reply, res) => {
    const upstream = res as unknown as UpstreamResponse
    try {
      forwardResponse(request, reply, upstream)
    } catch (err) {
      // Thrown into undici's response callback, it would be rethrown to the process (undici does so on purpose).
      upstream.stream.destroy()
      failResponse(reply.raw, err as Error)
    }
  }

  function forwardResponse (request: ProxyRequest, reply: ProxyReply, { statusCode, headers, stream }: UpstreamResponse): void {
    // reply-from comes here even after answering 502 to a status Fastify refuses.
    if (reply.sent) {
      stream.destroy()
      return
    }
    if ((statusCode === 401 || statusCode === 403) && authRefused !== undefined) {
      const route = request.routeOptions.config.routeName
      if (route !== undefined) authRefused(route, statusCode)
    }
    if (request.method === 'HEAD' || statusCode === 204 || statusCode === 304) {
      sendHeadOnly(reply, statusCode, stream)
      return
    }
    const length = headers['content-length']
    const size = typeof length === 'string' && length.length <= 5 ? Number(length) : NaN
    if (!(size <= SMALL_BODY_BYTES) || typeof headers['content-type'] !== 'string') {
      void reply.send(stream)
      return
    }
    const body = Buffer.allocUnsafe(size)
    let filled = 0
    stream.on('data', (chunk: Buffer) => {
      // undici fails the body if it outgrows its Content-Length; this only keeps the copy in bounds.
      filled += chunk.copy(body, filled)
    })
    stream.once('end', () => { sendOrFail(reply, filled === size ? body : body.subarray(0, filled)) })
    stream.once('error', (error: Error) => { onError(reply, { error }) })
  }

  // onRequest, so a refusal comes before any body is read. Callback style:
  // replying without calling done() ends the request here.
  const prefixed = opts.routes.filter(r => r.prefix !== '')
  function admit (request: FastifyRequest, reply: FastifyReply, done: () => void): void {
    const { routeName, allowedMethods } = request.routeOptions.config
    // Only the catch-all can get a path dressed up as a prefix: the router sends the real ones to their routes.
    const imitated = routeName === 'api' ? prefixLookalike(request.url, prefixed) : undefined
    if (imitated !== undefined) {
      sendError(reply, 400, 'bad_request', `the path only looks like the ${imitated.prefix} prefix (case, ";", a trailing dot or space, encoding): send it as ${imitated.prefix}/…`)
      return
    }
    const allowed = allowedMethods ?? PROXY_METHODS
    const problem = allowed.includes(request.method) ? overrideProblem(request.headers, allowed) : `${request.method} is not allowed on this route`
    if (problem !== undefined) {
      reply.header('allow', allowed.join(', '))
      sendError(reply, 405, 'method_not_allowed', problem)
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
   *  - the upstream answered 401 to a request without a body that was
   *    signed with a pair no longer in force (the watcher applied a rotation
   *    while the request was in flight).
   * Timeouts and upstream 5xx are never retried.
   *
   * The hook must answer at once, and a retry it schedules cannot be called
   * off, so the files cannot be re-read for the request at hand: any other
   * 401 asks for a background re-read, for the requests that follow (and for
   * those in flight, whose 401 then finds the new pair in force).
   */
  const retryDelayFor = (route: RouteName): NonNullable<FastifyReplyFromHooks['retryDelay']> => ({ err, req, res, attempt }) => {
    if (attempt > 0) return null
    const attemptReq = req as unknown as AttemptRequest
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition -- undefined on a response, whatever the typings say
    if (err != null) {
      if (!isBodyless(attemptReq) || !RETRY_METHODS.has(attemptReq.method) || !CONNECTION_FAILURES.has(errorCodes(err).next().value ?? '')) return null
      observer?.retried(route, 'connect')
    } else {
      const attemptRes = res as unknown as AttemptResponse | undefined
      if (attemptRes?.statusCode !== 401) return null
      if (credentials.current?.signed(attemptReq.headers.authorization ?? '') !== false) {
        opts.resyncCredentials?.()
        return null
      }
      if (!isBodyless(attemptReq)) return null
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
      // Nothing is returned: the reply is a thenable, and Fastify would hang
      // a promise and end-of-stream listeners on every response to await it.
      handler: (_request, reply, dest, options) => { reply.from(dest === '' ? '/' : dest, options) },
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
