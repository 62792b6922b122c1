// The last step: the upstream's answer forwarded to the client (a head
// alone, a small body in one write, or a stream), or its failure answered
// as 502 / 504 (413 for a body over the limit).
import type { IncomingHttpHeaders } from 'node:http'
import type { Readable } from 'node:stream'
import type { FastifyInstance } from 'fastify'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import type { RefusalStatus } from './auth-refusals.js'
import type { RouteName } from '../config/config.js'
import { errorCodes, hasErrorCode } from '../upstream/error-codes.js'
import { sendError } from './errors.js'
import { failResponse, responseFailure } from '../client/response.js'
import { BODY_TOO_LARGE } from './route-admission.js'
import type { Upstreams } from '../upstream/upstream.js'

const UPSTREAM_ABORTED = 'UND_ERR_ABORTED'
const SMALL_BODY_BYTES = 16 * 1024

/** What reply-from hands onResponse (its typings say a ServerResponse). */
interface UpstreamResponse { statusCode: number, headers: IncomingHttpHeaders, stream: Readable }
// As reply-from's hooks have them: typed for HTTP/1 and HTTP/2 servers alike.
type OnResponse = NonNullable<FastifyReplyFromHooks['onResponse']>
type ProxyRequest = Parameters<OnResponse>[0]
type ProxyReply = Parameters<OnResponse>[1]
type OnError = NonNullable<FastifyReplyFromHooks['onError']>

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

const TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'FST_REPLY_FROM_GATEWAY_TIMEOUT', 'FST_REPLY_FROM_TIMEOUT'])

/** Maps a reply-from/undici failure to the proxy's contract: 504 for timeouts, 502 for the rest. */
export function upstreamErrorStatus (error: Error): 502 | 504 {
  for (const code of errorCodes(error)) if (TIMEOUT_CODES.has(code)) return 504
  return 502
}

export interface FailureOptions {
  readonly upstreams: Upstreams
  readonly observer?: { readonly upstreamError: (route: RouteName, err: Error) => void } | undefined
  readonly maxBodyBytes: number
}

/** reply-from's onError: what the client is told when the upstream request failed. */
export function answerUpstreamFailure ({ upstreams, observer, maxBodyBytes }: FailureOptions): OnError {
  return (reply, { error }) => {
    // Only a client that went away aborts an upstream request (its connection
    // closed: see abortWhenClientGone; or its upload stopped short): no one
    // to answer, and no upstream fault to count.
    if (hasErrorCode(error, UPSTREAM_ABORTED)) return
    // The head of an upstream answer that then failed was copied: none of it belongs on this error.
    if (reply.request.upstreamMs >= 0) dropCopiedHeaders(reply)
    if (hasErrorCode(error, BODY_TOO_LARGE)) {
      sendError(reply, 413, 'payload_too_large', `request bodies are limited to ${maxBodyBytes} bytes (COS_MAX_BODY_BYTES)`)
      return
    }
    const route = reply.request.routeOptions.config.routeName
    if (route !== undefined) observer?.upstreamError(route, (error.cause as Error | undefined) ?? error)
    const status = upstreamErrorStatus(error)
    // The proxy's one line for this outcome (reply-from's own is silenced: proxy.ts).
    reply.request.log.error({ err: error, status }, 'request failed')
    // A failure at the egress proxy names it: the upstream may be fine.
    const egress = upstreams.egressProblem(error)
    if (status === 504) sendError(reply, 504, 'upstream_timeout', egress ?? 'the upstream did not answer in time')
    else sendError(reply, 502, 'upstream_unavailable', egress ?? 'the upstream could not be reached')
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
    onError(reply, { error })
  })
}

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
export function forwardUpstreamResponse (onError: OnError, authRefused?: (route: RouteName, status: RefusalStatus) => void,
  observer?: { readonly upstreamResponse?: (route: RouteName, status: number) => void }): OnResponse {
  return (request, reply, res) => {
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
    const route = request.routeOptions.config.routeName
    if (route !== undefined) observer?.upstreamResponse?.(route, statusCode)
    // reply-from comes here even after answering 502 to a status Fastify refuses.
    if (reply.sent) {
      stream.destroy()
      return
    }
    if ((statusCode === 401 || statusCode === 403) && route !== undefined) authRefused?.(route, statusCode)
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
}
