import { LogController, type FastifyReply, type FastifyRequest } from 'fastify'
import { hasErrorCode } from '../upstream/error-codes.js'
import { responseFailure } from '../client/response.js'
import { addTraceFields } from '../client/trace-context.js'
import type { AccessLogSettings, RouteName } from '../config/config.js'

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * The route that admitted the request (route-admission.ts; decorated in
     * proxy-server.ts): its request line's route without reading
     * `request.routeOptions`, a getter that builds a new object each time.
     */
    proxyRoute: RouteName | undefined
  }
}

/** Per-request counters and histograms; ProxyMetrics implements it. */
export interface RequestObserver {
  requestStarted: () => void
  /** `aborted`: the connection closed before the response finished; `retryAfter`: a 503 that carries Retry-After (throttled). */
  requestFinished: (route: string, method: string, status: number, totalSeconds: number, upstreamSeconds: number | undefined, aborted: boolean, retryAfter?: boolean) => void
  /** A response that could not be written (its connection was closed instead); before its requestFinished. */
  responseFailed?: (route: string) => void
}

/** The fields of the one line per request. */
interface RequestLine { reqId: string, method: string, route: string, status: number, durationMs: number, upstreamMs?: number, aborted?: true }

/** nginx's "client closed request": logged when the connection closed before any status was sent. */
export const CLIENT_CLOSED_REQUEST = 499

/** Every request gets a line: what `COS_ACCESS_LOG=all` means, and what a RequestLog built without settings does. */
export const EVERY_REQUEST: AccessLogSettings = Object.freeze({ mode: 'all', slowMs: 0, sample: 0 })

/**
 * One line per request that needs a look (COS_ACCESS_LOG=errors, the
 * default: answered with a status ≥ 400, not answered at all, or slower than
 * COS_ACCESS_LOG_SLOW_MS, plus a sampled share of the rest), every request
 * (`all`), or none (`off`); the metrics count every request whatever the
 * setting. Written when the response is closed: method, route name, status,
 * duration and the request id. Never the
 * path, the query or a header: they may carry client data, and the
 * Authorization header carries a token.
 *
 * Fastify reports completion on the response's `finish`; a client that goes
 * away mid-response never gets there, so the line (and the in-flight gauge)
 * hang off `close`, which fires exactly once either way. Such a line says
 * `aborted`, and its status is 499 when no response had started (Fastify's
 * default 200 would claim an answer nobody sent).
 */
export class RequestLog extends LogController {
  readonly #observer: RequestObserver | undefined
  readonly #mode: AccessLogSettings['mode']
  readonly #slowMs: number
  readonly #sample: number
  /** Responses not yet closed (their line not yet written). */
  open = 0

  constructor (observer?: RequestObserver, accessLog: AccessLogSettings = EVERY_REQUEST) {
    super({ requestIdLogLabel: 'reqId' })
    this.#observer = observer
    this.#mode = accessLog.mode
    this.#slowMs = accessLog.slowMs
    this.#sample = accessLog.sample
  }

  /** Whether this request gets a line: in `errors` mode, a failure, a request not answered, a slow one, or the sample. */
  #logs (status: number, aborted: boolean, elapsedMs: number): boolean {
    const mode = this.#mode
    if (mode === 'all') return true
    if (mode === 'off') return false
    return status >= 400 || aborted || elapsedMs >= this.#slowMs || (this.#sample > 0 && Math.random() < this.#sample)
  }

  override incomingRequest (request: FastifyRequest, reply: FastifyReply): void {
    this.#observer?.requestStarted()
    this.open++
    const res = reply.raw
    // A response queued behind another (pipelining) closes with its connection too: the listener's tracker sees to it (src/client/connections.ts).
    res.once('close', () => { this.open--; this.#completed(request, reply) })
  }

  override requestCompleted (): void {
    // Written on close instead; see above.
  }

  /**
   * A response stream that ended in an error after its head was sent (an
   * upstream body that failed midway): the proxy's `request failed` line
   * instead of Fastify's warning. A client that went away ends its stream
   * too; its request line says `aborted`, and that is all there is to say.
   */
  override streamError (error: Error, request: FastifyRequest): void {
    if (hasErrorCode(error, 'ERR_STREAM_PREMATURE_CLOSE') || hasErrorCode(error, 'UND_ERR_ABORTED')) return
    request.log.error({ err: error }, 'request failed')
  }

  #completed (request: FastifyRequest, reply: FastifyReply): void {
    // Undecorated (another server, a test's): the getter.
    const route = request.proxyRoute ?? request.routeOptions.config.routeName ?? 'none'
    const failure = responseFailure(reply.raw)
    const aborted = !reply.raw.writableFinished || failure !== undefined
    if (failure !== undefined) {
      this.#observer?.responseFailed?.(route)
      request.log.error({ err: failure }, 'the response could not be written: its connection was closed')
    }
    // 499 when the client got no status: none was written, or the answer sat
    // queued behind another on a connection that closed (it never held the
    // socket: the tracker closed it with its connection). A reply the proxy itself took over (a
    // request dropped behind a refusal, connection-refusals.ts) keeps the
    // status it was given: no client closed that one.
    const res = reply.raw
    const status = aborted && ((!res.headersSent && !reply.sent) || (res.socket === null && res.writableEnded)) ? CLIENT_CLOSED_REQUEST : reply.statusCode
    const elapsedMs = reply.elapsedTime
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition -- undefined on requests no proxy route handled
    const upstreamMs = request.upstreamMs ?? -1
    // Retry-After looked up on a 503 alone: nothing more for any other answer.
    this.#observer?.requestFinished(route, request.method, status, elapsedMs / 1000, upstreamMs < 0 ? undefined : upstreamMs / 1000, aborted, status === 503 && reply.hasHeader('retry-after'))
    if (!this.#logs(status, aborted, elapsedMs)) return
    // Keys added in place: spreads would build and copy two objects per line.
    const line: RequestLine = { reqId: request.id, method: request.method, route, status, durationMs: Math.round(elapsedMs * 100) / 100 }
    if (upstreamMs >= 0) line.upstreamMs = Math.round(upstreamMs * 100) / 100
    if (aborted) line.aborted = true
    // The client's trace context, parsed only now that a line is written (trace-context.ts).
    addTraceFields(line, request.headers.traceparent)
    // The server's logger, with the id in the line: the request loggers of
    // the proxied routes pass only errors (proxy.ts). Same JSON either way.
    request.server.log.info(line, 'request')
  }
}
