// Steps three to five of a proxied request: it leaves signed over the
// route's undici dispatcher, is retried only when safe (retry.ts), and the
// upstream's answer comes back (a head alone, a small body in one write, or
// a stream) or its failure is answered (forward-response.ts).
//
// One undici dispatch handler per request, written for this proxy: undici's
// own request() (what @fastify/reply-from forwards with) wraps every answer
// in a body stream and every request in a promise-shaped callback chain,
// which costs more per small request than the signing does
// (docs/performance.md).
import type { IncomingHttpHeaders } from 'node:http'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'
import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors, type Dispatcher } from 'undici'
import type { RefusalStatus } from './auth-refusals.js'
import type { RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { failResponse } from '../client/response.js'
import { CLIENT_GONE, trackUntilClientGone, untrack, type Abortable } from '../upstream/client-gone.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'
import { DRAIN_ABANDONED, DRAIN_MAX_BYTES, DRAIN_MAX_MS, isBodyless, noteRetry, retriesAfterFailure, retriesAfterUnauthorized } from './retry.js'
import { forEachForwardedHeader } from './upstream-headers.js'

type Controller = Dispatcher.DispatchController

/** Bodies up to this size, of a declared length, are collected and sent with the head in one write. */
const SMALL_BODY_BYTES = 16 * 1024

/** What the exchange reports; the metrics registry implements it. */
export interface ExchangeObserver {
  readonly retried: (route: RouteName, reason: 'connect' | 'unauthorized') => void
  readonly tokenMinted: () => void
  /** The upstream answered (the status of its answer, before the proxy forwards it). */
  readonly upstreamResponse?: ((route: RouteName, status: number) => void) | undefined
}

/** Fixed per route: where and how its requests go. */
export interface ExchangeRoute {
  readonly name: RouteName
  readonly origin: string
  readonly dispatcher: Dispatcher
  readonly credentials: CredentialStore
  readonly observer?: ExchangeObserver | undefined
  readonly resyncCredentials?: (() => void) | undefined
  readonly clock?: UpstreamClock | undefined
  readonly authRefused?: ((route: RouteName, status: RefusalStatus, traceparent: string | string[] | undefined) => void) | undefined
  /** Answers a failed exchange (forward-response.ts: 502/504/413, or nothing for a client gone). */
  readonly fail: (reply: FastifyReply, error: Error) => void
  /** COS_UPSTREAM_TIMEOUT_MS: interim answers (1xx) do not put off the final one past it. */
  readonly headersTimeoutMs?: number | undefined
}

// Retrying: a 401 read to its end before the request is sent again;
// Redialing: that 401's connection dropped instead (DRAIN_MAX_*).
const enum Stage { Waiting, Retrying, Redialing, HeadOnly, Collecting, Streaming, Done }

/** A body streamed to the client, filled by the exchange, with undici paused while the client is slow. */
class UpstreamBody extends Readable {
  controller: Controller | undefined
  override _read (): void { this.controller?.resume() }
  // Destroyed before its end (the response failed, the client went away): the upstream stops sending too.
  override _destroy (err: Error | null, callback: (error?: Error | null) => void): void {
    if (!this.readableEnded) this.controller?.abort(err ?? CLIENT_GONE)
    callback(err)
  }
}

export class UpstreamExchange implements Dispatcher.DispatchHandler, Abortable {
  readonly #route: ExchangeRoute
  readonly #request: FastifyRequest
  readonly #reply: FastifyReply
  readonly #options: Dispatcher.DispatchOptions & { headers: IncomingHttpHeaders }
  /** The client's connection; kept, because Node lets go of it once a request's body has been read. */
  readonly #socket: Socket
  #controller: Controller | undefined
  #stage = Stage.Waiting
  #attempt = 0
  #gone: Error | undefined
  #status = 0
  #headers: IncomingHttpHeaders | undefined
  #body: Buffer | undefined
  #filled = 0
  #stream: UpstreamBody | undefined
  #drainTimer: NodeJS.Timeout | undefined

  constructor (route: ExchangeRoute, request: FastifyRequest, reply: FastifyReply, options: Dispatcher.DispatchOptions & { headers: IncomingHttpHeaders }) {
    this.#route = route
    this.#request = request
    this.#reply = reply
    this.#options = options
    this.#socket = request.raw.socket
  }

  /**
   * Sends the request; everything after happens in undici's callbacks. Not
   * when its client has already gone: nothing is sent (no token minted), and
   * its response, closed with the connection, logs and counts it as 499.
   */
  start (): void {
    if (!trackUntilClientGone(this.#socket, this)) return
    this.#send()
  }

  #send (): void {
    const { credentials, observer } = this.#route
    // admitToRoute (onRequest) saw a pair; read it again so a swap in between is honoured.
    this.#options.headers.authorization = credentials.current?.next()
    observer?.tokenMinted()
    this.#request.upstreamStart = performance.now()
    this.#route.dispatcher.dispatch(this.#options, this)
  }

  clientGone (reason: Error): void {
    this.#gone = reason
    this.#controller?.abort(reason)
    this.#stream?.destroy()
  }

  /**
   * About to be written on a connection. A request whose client left while it
   * was queued fails by a throw (undici's writeH1 catches it before a byte is
   * written, and the connection serves the next in the queue), not by
   * controller.abort(), which destroys the connection (a new one, a TLS
   * handshake, for the next request).
   */
  onRequestStart (controller: Controller): void {
    if (this.#gone !== undefined) throw this.#gone
    this.#controller = controller
  }

  onResponseStart (controller: Controller, statusCode: number, headers: IncomingHttpHeaders): void {
    const now = performance.now()
    const route = this.#route
    const request = this.#request
    if (statusCode > 101 && statusCode < 200) {
      // Interim (102, 103, …; undici fails a bare 100): skipped as reply-from
      // did, not forwarded (docs/routing.md says why) nor counted. undici
      // restarts its headers timer on each: past the timeout from sending,
      // the next one ends the request as a headers timeout (504).
      if (now - request.upstreamStart > (route.headersTimeoutMs ?? Infinity)) controller.abort(new errors.HeadersTimeoutError('interim answers only, no final answer within the upstream timeout'))
      return
    }
    if (statusCode === 401 && this.#attempt === 0 && retriesAfterUnauthorized(route, this.#options.headers.authorization ?? '', this.#bodyless())) {
      // The 401 is read to its end (its connection stays reusable) and the request sent again.
      this.#stage = Stage.Retrying
      noteRetry(request, route, 'unauthorized')
      const length = headers['content-length']
      if (typeof length === 'string' && !(Number(length) <= DRAIN_MAX_BYTES) && request.method !== 'HEAD') this.#redial(controller)
      else this.#drainTimer = setTimeout(() => { this.#redial(controller) }, DRAIN_MAX_MS)
      return
    }
    request.upstreamMs = now - request.upstreamStart
    route.clock?.observe(headers, now)
    route.observer?.upstreamResponse?.(route.name, statusCode)
    const reply = this.#reply
    if (this.#gone !== undefined || reply.sent) {
      controller.abort(this.#gone ?? CLIENT_GONE)
      return
    }
    if (statusCode === 401 || statusCode === 403) route.authRefused?.(route.name, statusCode, request.headers.traceparent)
    if (statusCode < 200 || statusCode > 599) {
      controller.abort(new Error(`the upstream answered with status ${statusCode}`))
      return
    }
    this.#status = statusCode
    if (request.method === 'HEAD' || statusCode === 204 || statusCode === 304) {
      this.#stage = Stage.HeadOnly
      this.#copyHead(headers)
      // A 204 may not carry a Content-Length (RFC 9110 §8.6); a 304 or HEAD answer keeps the representation's.
      if (statusCode === 204) reply.removeHeader('content-length')
      this.#sendOrFail()
      return
    }
    const length = headers['content-length']
    const size = typeof length === 'string' && length.length <= 5 ? Number(length) : NaN
    if (size <= SMALL_BODY_BYTES && typeof headers['content-type'] === 'string') {
      this.#stage = Stage.Collecting
      this.#headers = headers
      this.#body = Buffer.allocUnsafe(size)
      return
    }
    this.#stage = Stage.Streaming
    this.#copyHead(headers)
    const stream = new UpstreamBody()
    stream.controller = controller
    this.#stream = stream
    this.#sendOrFail(stream)
  }

  onResponseData (controller: Controller, chunk: Buffer): void {
    if (this.#stage === Stage.Collecting) {
      // undici fails the body if it outgrows its Content-Length; this only keeps the copy in bounds.
      this.#filled += chunk.copy(this.#body as Buffer, this.#filled)
    } else if (this.#stage === Stage.Streaming) {
      if (!(this.#stream as UpstreamBody).push(chunk)) controller.pause()
    } else if (this.#stage === Stage.Retrying) {
      this.#filled += chunk.length
      if (this.#filled > DRAIN_MAX_BYTES) this.#redial(controller)
    }
  }

  onResponseEnd (): void {
    const stage = this.#stage
    this.#stage = Stage.Done
    if (stage === Stage.Retrying) {
      clearTimeout(this.#drainTimer)
      this.#retry()
      return
    }
    this.#finish()
    if (stage === Stage.Collecting) {
      this.#copyHead(this.#headers as IncomingHttpHeaders)
      const body = this.#body as Buffer
      this.#sendOrFail(this.#filled === body.length ? body : body.subarray(0, this.#filled))
    } else if (stage === Stage.Streaming) {
      (this.#stream as UpstreamBody).push(null)
    }
  }

  onResponseError (_controller: Controller, error: Error): void {
    const stage = this.#stage
    this.#stage = Stage.Done
    if (stage === Stage.Redialing) {
      // The 401's connection, dropped by #redial: the request goes again on another, on the next turn.
      setImmediate(() => { this.#retry() })
      return
    }
    if (stage === Stage.Retrying) clearTimeout(this.#drainTimer)
    if (stage === Stage.Done) {
      // undici hands here what the exchange's own callbacks threw after it
      // ended: a fault of the proxy's, which fails this request alone.
      this.#request.log.error({ err: error }, 'request failed')
      if (!this.#reply.sent) failResponse(this.#reply.raw, error)
      return
    }
    if (stage === Stage.Waiting && this.#gone === undefined && this.#attempt === 0 && retriesAfterFailure(this.#request.method, this.#bodyless(), error)) {
      noteRetry(this.#request, this.#route, 'connect')
      // Not from inside undici's failure handling: on the next turn.
      setImmediate(() => { this.#retry() })
      return
    }
    this.#finish()
    // The head alone was all there was to forward; undici's complaint is about a body that cannot exist.
    if (stage === Stage.HeadOnly) return
    if (stage === Stage.Streaming) {
      // Fastify's handling of a failed body stream takes it from here (forward-response.ts).
      (this.#stream as UpstreamBody).destroy(error)
      return
    }
    if (this.#gone !== undefined) return
    this.#route.fail(this.#reply, error)
  }

  /** Gives up reading the 401 to be retried (DRAIN_MAX_*): its connection is dropped, and onResponseError retries. */
  #redial (controller: Controller): void {
    if (this.#stage !== Stage.Retrying) return
    this.#stage = Stage.Redialing
    clearTimeout(this.#drainTimer)
    controller.abort(DRAIN_ABANDONED)
  }

  #retry (): void {
    this.#attempt++
    this.#stage = Stage.Waiting
    this.#controller = undefined
    this.#filled = 0
    if (this.#gone === undefined) this.#send()
    else this.#finish()
  }

  #finish (): void {
    untrack(this.#socket, this)
  }

  #bodyless (): boolean {
    return isBodyless(this.#request.headers, this.#options.body)
  }

  #copyHead (headers: IncomingHttpHeaders): void {
    const reply = this.#reply
    reply.code(this.#status)
    forEachForwardedHeader(headers, (name, value) => { reply.header(name, value) })
    // An HTTP/1 connection cannot be reused until its request body has
    // been read: close it if the upstream answered before that point.
    if (!this.#request.raw.complete) reply.header('connection', 'close')
  }

  /** reply.send from undici's callbacks, which rethrow to the process on purpose: a throw fails this response only. */
  #sendOrFail (payload?: Buffer | Readable): void {
    try {
      void this.#reply.send(payload)
    } catch (err) {
      this.#controller?.abort(err as Error)
      failResponse(this.#reply.raw, err as Error)
    }
  }
}
