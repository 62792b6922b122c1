// The upstream's answer forwarded by the exchange (upstream-exchange.ts):
// its head copied, a small body collected or the rest streamed, a send
// that throws failing its response alone. A failed upstream exchange
// answered: 502 / 504 (413 for a body over the limit), or nothing at all for
// a client that went away.
import type { IncomingHttpHeaders } from 'node:http'
import { Readable } from 'node:stream'
import type { FastifyInstance, FastifyReply } from 'fastify'
import type { Dispatcher } from 'undici'
import type { RouteName } from '../config/config.js'
import { CLIENT_GONE } from '../upstream/client-gone.js'
import { errorCodes, hasErrorCode } from '../upstream/error-codes.js'
import { sendError } from './errors.js'
import { failResponse, responseFailure } from '../client/response.js'
import { BODY_TOO_LARGE } from './route-admission.js'
import type { Upstreams } from '../upstream/upstream.js'
import { forEachForwardedHeader } from './upstream-headers.js'

const UPSTREAM_ABORTED = 'UND_ERR_ABORTED'

type Controller = Dispatcher.DispatchController

/** Bodies up to this size, of a declared length, are collected and sent with the head in one write. */
export const SMALL_BODY_BYTES = 16 * 1024

/** The size of an answer's body collected whole (a declared length up to SMALL_BODY_BYTES, a Content-Type); NaN: streamed. */
export function collectedSize (headers: IncomingHttpHeaders): number {
  const length = headers['content-length']
  const size = typeof length === 'string' && length.length <= 5 ? Number(length) : NaN
  return size <= SMALL_BODY_BYTES && typeof headers['content-type'] === 'string' ? size : NaN
}

/** A body streamed to the client, filled by the exchange, with undici paused while the client is slow. */
export class UpstreamBody extends Readable {
  controller: Controller | undefined
  override _read (): void { this.controller?.resume() }
  // Destroyed before its end (the response failed, the client went away): the upstream stops sending too.
  override _destroy (err: Error | null, callback: (error?: Error | null) => void): void {
    if (!this.readableEnded) this.controller?.abort(err ?? CLIENT_GONE)
    callback(err)
  }
}

/** The upstream's status and end-to-end headers onto the reply. */
export function copyHead (reply: FastifyReply, status: number, headers: IncomingHttpHeaders): void {
  reply.code(status)
  forEachForwardedHeader(headers, (name, value) => { reply.header(name, value) })
  // An HTTP/1 connection cannot be reused until its request body has
  // been read: close it if the upstream answered before that point.
  if (!reply.request.raw.complete) reply.header('connection', 'close')
}

/** reply.send from undici's callbacks, which rethrow to the process on purpose: a throw fails this response only. */
export function sendOrFail (reply: FastifyReply, controller: Controller | undefined, payload?: Buffer | Readable): void {
  try {
    void reply.send(payload)
  } catch (err) {
    controller?.abort(err as Error)
    failResponse(reply.raw, err as Error)
  }
}

type OnError = (reply: FastifyReply, error: Error) => void

/** Removes every header copied from the upstream's answer (the exchange's `connection: close` stays). */
function dropCopiedHeaders (reply: FastifyReply): void {
  for (const name of Object.keys(reply.getHeaders())) if (name !== 'connection') reply.removeHeader(name)
}

const TIMEOUT_CODES: ReadonlySet<string> = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT'])

/** Maps an upstream failure to the proxy's contract: 504 for timeouts, 502 for the rest. */
export function upstreamErrorStatus (error: Error): 502 | 504 {
  for (const code of errorCodes(error)) if (TIMEOUT_CODES.has(code)) return 504
  return 502
}

/** A 504 names the setting that ran out. */
function timeoutMessage (error: Error): string {
  return hasErrorCode(error, 'UND_ERR_CONNECT_TIMEOUT')
    ? 'the upstream did not accept a connection in time (COS_CONNECT_TIMEOUT_MS)'
    : 'the upstream did not answer in time (COS_UPSTREAM_TIMEOUT_MS)'
}

/** A 502, with the likely fix when the cause names one. */
function unreachableMessage (error: Error): string {
  // OpenSSL read something that is not TLS: most often plain HTTP on that port.
  if (hasErrorCode(error, 'ERR_SSL_WRONG_VERSION_NUMBER') || hasErrorCode(error, 'ERR_SSL_PACKET_LENGTH_TOO_LONG')) {
    return 'the upstream could not be reached: it does not speak TLS on that port (is the route\'s URL https:// for a plain-HTTP port? check its scheme)'
  }
  return 'the upstream could not be reached'
}

export interface FailureOptions {
  readonly upstreams: Upstreams
  readonly observer?: { readonly upstreamError: (route: RouteName, err: Error) => void } | undefined
  readonly maxBodyBytes: number
}

/** What the client is told when the upstream exchange failed. */
export function answerUpstreamFailure ({ upstreams, observer, maxBodyBytes }: FailureOptions): OnError {
  return (reply, error) => {
    // Only a client that went away aborts an upstream request (its connection
    // closed: see client-gone.ts; or its upload stopped short): no one to
    // answer, and no upstream fault to count.
    if (hasErrorCode(error, UPSTREAM_ABORTED)) return
    // The head of an upstream answer that then failed was copied: none of it belongs on this error.
    if (reply.request.upstreamMs >= 0) dropCopiedHeaders(reply)
    // Answered while the client is still uploading: the rest of its body
    // will not be read, so the connection cannot carry another request.
    // Said, rather than a keep-alive the reset that follows would belie.
    if (!reply.request.raw.complete) reply.header('connection', 'close')
    if (hasErrorCode(error, BODY_TOO_LARGE)) {
      sendError(reply, 413, 'payload_too_large', `request bodies are limited to ${maxBodyBytes} bytes (COS_MAX_BODY_BYTES)`)
      return
    }
    const route = reply.request.routeOptions.config.routeName
    if (route !== undefined) observer?.upstreamError(route, error)
    const status = upstreamErrorStatus(error)
    // The proxy's one line for this outcome.
    reply.request.log.error({ err: error, status }, 'request failed')
    // A failure at the egress proxy names it: the upstream may be fine.
    const egress = upstreams.egressProblem(error)
    if (status === 504) sendError(reply, 504, 'upstream_timeout', egress ?? timeoutMessage(error))
    else sendError(reply, 502, 'upstream_unavailable', egress ?? unreachableMessage(error))
  }
}

/**
 * An upstream body that fails before any of it was written (shorter than
 * its Content-Length, a reset, a bad chunk, a body that stalls) reaches
 * Fastify's error handling through the stream: it is the upstream's
 * failure, as one before its head would be (502), never the proxy's 500.
 * Errors before any upstream answer go on to the server's handler.
 */
export function answerFailedUpstreamBodies (fastify: FastifyInstance, onError: OnError): void {
  fastify.setErrorHandler((error, request, reply) => {
    // A response that could not be written closed its connection: its body stream's end is no news.
    if (responseFailure(reply.raw) !== undefined) return
    if (request.upstreamMs < 0 || !(error instanceof Error)) throw error
    onError(reply, error)
  })
}
