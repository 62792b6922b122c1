// Step four: whether a failed or refused attempt is tried once more, with a
// freshly minted token, and only when that cannot duplicate what the
// upstream did. Asked by the exchange (upstream-exchange.ts) after its first
// attempt only: there is never a third.
import type { IncomingHttpHeaders } from 'node:http'
import type { FastifyRequest } from 'fastify'
import { errors } from 'undici'
import { addTraceFields } from '../client/trace-context.js'
import type { RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import type { RetryReason } from '../observability/metrics.js'
import { errorCodes } from '../upstream/error-codes.js'

const RETRY_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS'])

/**
 * A 401 about to be retried is read to its end first, so that its connection
 * is reused, only while it stays this small and this quick: past either (a
 * hostile or broken upstream) that connection is dropped instead and the
 * request sent again on another.
 */
export const DRAIN_MAX_BYTES = 16 * 1024
export const DRAIN_MAX_MS = 1000
export const DRAIN_ABANDONED: Error = Object.assign(new errors.RequestAbortedError('the 401 answer to be retried was too long or too slow to read'), { stack: 'AbortError: 401 not drained' })
// Failures where the upstream cannot have acted on the request.
const CONNECTION_FAILURES: ReadonlySet<string> = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'])

/** No body of any kind: none streamed, none announced. */
export function isBodyless (headers: IncomingHttpHeaders, body: unknown): boolean {
  const length = headers['content-length']
  return body == null && headers['transfer-encoding'] === undefined && (length === undefined || length === '0')
}

/**
 * After a failure before any answer: retried when the request has no body,
 * its method is idempotent and the connection failed before anything was
 * answered (refused, reset, closed). Timeouts are never retried.
 */
export function retriesAfterFailure (method: string, bodyless: boolean, err: Error): boolean {
  return bodyless && RETRY_METHODS.has(method) && CONNECTION_FAILURES.has(errorCodes(err).next().value ?? '')
}

export interface UnauthorizedOptions {
  readonly credentials: CredentialStore
  /** Asks for the credential files to be re-read in the background (an upstream 401). */
  readonly resyncCredentials?: (() => void) | undefined
}

/**
 * After an upstream 401: retried when the request has no body and was
 * signed with a pair no longer in force (the watcher applied a rotation
 * while it was in flight). A 401 to the pair in force asks for a background
 * re-read instead, for the requests that follow (and for those in flight,
 * whose 401 then finds the new pair in force); the request at hand gets the
 * upstream's answer. Upstream 5xx answers are never retried.
 */
export function retriesAfterUnauthorized ({ credentials, resyncCredentials }: UnauthorizedOptions, authorization: string, method: string, bodyless: boolean): boolean {
  if (credentials.current?.signed(authorization) !== false) {
    resyncCredentials?.()
    return false
  }
  // Only a safe method: a non-idempotent one is never sent twice, whatever the upstream answered.
  return bodyless && RETRY_METHODS.has(method)
}

/**
 * The longest a retry waits for a Retry-After, whatever the time left:
 * past it, the answer that asked for the wait is the client's.
 */
export const RETRY_AFTER_MAX_MS = 60_000
// The three forms of HTTP-date (RFC 9110 §5.6.7) all begin with a day name; Date.parse alone takes "1" for a year.
const HTTP_DATE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? [\w :-]+$/
// Any length: a figure too large to read is a wait too long to make (Infinity), never none.
const DELTA_SECONDS = /^\d+$/

/**
 * What an answer's Retry-After asks, in ms from now: delta-seconds (a
 * non-negative integer) or an HTTP-date, read against the answer's own Date
 * when it has one (the upstream's clock, so a node clock off the upstream's
 * does not move the wait), else this node's clock; a date past is 0. -1: none,
 * or anything else (repeated, a fraction, a negative, a date that does not
 * parse), which is treated as none. Read only on answers that would be retried.
 */
export function retryAfterMs (headers: IncomingHttpHeaders, nowMs = Date.now()): number {
  const value = headers['retry-after']
  if (typeof value !== 'string') return -1
  if (DELTA_SECONDS.test(value)) return Number(value) * 1000
  const at = HTTP_DATE.test(value) ? Date.parse(value) : NaN
  if (Number.isNaN(at)) return -1
  const date = typeof headers.date === 'string' ? Date.parse(headers.date) : NaN
  return Math.max(0, at - (Number.isNaN(date) ? nowMs : date))
}

/** What an exchange waiting on a Retry-After is told when the proxy closes (drains): stop waiting. */
export interface Waiting { readonly stopWaiting: () => void }

/**
 * The exchanges of one proxy waiting on a Retry-After before their retry
 * (rare: a Set touched only by them). Once the proxy closes, none waits:
 * those waiting are told to stop, and none starts.
 */
export class RetryWaits {
  closing = false
  readonly #waiting = new Set<Waiting>()
  add (exchange: Waiting): void { this.#waiting.add(exchange) }
  delete (exchange: Waiting): void { this.#waiting.delete(exchange) }
  close (): void {
    this.closing = true
    for (const exchange of [...this.#waiting]) exchange.stopWaiting()
  }
}

/**
 * Whether a retry may wait `waitMs` for a Retry-After: at most
 * RETRY_AFTER_MAX_MS, and sent again no later than COS_UPSTREAM_TIMEOUT_MS
 * (`timeoutMs`) after the first attempt was (`sentMsAgo`).
 */
export function waitFits (waitMs: number, sentMsAgo: number, timeoutMs: number): boolean {
  return waitMs <= RETRY_AFTER_MAX_MS && sentMsAgo + waitMs <= timeoutMs
}

/**
 * A retry: counted, and logged at `debug` (`upstream request retried`) with
 * the request's id and trace context; nothing is built for the line unless
 * it is written. Not at `info`: a rotated key pair has every request in
 * flight retried once, and the 401 warning (auth-refusals.ts) already says
 * so, once a minute.
 */
export function noteRetry (request: FastifyRequest, route: { readonly name: RouteName, readonly observer?: { readonly retried: (route: RouteName, reason: RetryReason) => void } | undefined }, reason: RetryReason): void {
  route.observer?.retried(route.name, reason)
  const log = request.server.log
  if (log.level === 'debug' || log.level === 'trace') log.debug(addTraceFields({ reqId: request.id, route: route.name, reason }, request.headers.traceparent), 'upstream request retried')
}
