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
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors, type Dispatcher } from 'undici'
import { failResponse } from '../client/response.js'
import { collectedSize, copyHead, sendOrFail, SMALL_BODY_BYTES, UpstreamBody } from './forward-response.js'
import type { ExchangeRoute } from './exchange-route.js'
import { CLIENT_GONE, trackUntilClientGone, untrack, type Abortable } from '../upstream/client-gone.js'
import { DRAIN_ABANDONED, DRAIN_MAX_BYTES, DRAIN_MAX_MS, isBodyless, noteRetry, retriesAfterFailure, retriesAfterUnauthorized, retryAfterMs, waitFits, type Waiting } from './retry.js'

type Controller = Dispatcher.DispatchController

// Retrying: a 401 read to its end before the request is sent again;
// Redialing: that 401's connection dropped instead (DRAIN_MAX_*);
// Held: a 401 kept whole (Collected as any small answer) waits for its Retry-After.
const enum Stage { Waiting, Retrying, Redialing, HeadOnly, Collecting, Streaming, Held, Done }

export class UpstreamExchange implements Dispatcher.DispatchHandler, Abortable, Waiting {
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
  #streamed: UpstreamBody | undefined
  /** The 401's read bound (Retrying), or its Retry-After (Held). */
  #timer: NodeJS.Timeout | undefined
  /** performance.now() when a 401 being collected may be retried; 0: none held, -1: to be passed instead. */
  #retryAt = 0

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
    if (this.#stage === Stage.Held) { this.stopWaiting(); return }
    this.#controller?.abort(reason)
    this.#streamed?.destroy()
  }

  /** A held 401 is not retried after all (the proxy is closing, or its client went away): it is the answer. */
  stopWaiting (): void {
    this.#retryAt = -1
    if (this.#stage === Stage.Held) { clearTimeout(this.#timer); this.#passHeld() }
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
    if (statusCode === 401 && this.#attempt === 0 && retriesAfterUnauthorized(route, this.#options.headers.authorization ?? '', request.method, this.#bodyless())) {
      const waitMs = retryAfterMs(headers)
      // Never sooner than its Retry-After: kept whole while it waits, or else it is the answer (docs/routing.md).
      if (waitMs > 0 ? this.#holds(headers, now, waitMs) : this.#drainAndRetry(controller, headers)) return
    }
    request.upstreamMs = now - request.upstreamStart
    route.clock?.observe(headers, now)
    route.observer?.upstreamResponse?.(route.name, statusCode, statusCode === 503 && headers['retry-after'] !== undefined)
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
      copyHead(this.#reply, this.#status, headers)
      // A 204 may not carry a Content-Length (RFC 9110 §8.6); a 304 or HEAD answer keeps the representation's.
      if (statusCode === 204) reply.removeHeader('content-length')
      sendOrFail(this.#reply, this.#controller)
      return
    }
    const size = collectedSize(headers)
    if (size >= 0) {
      this.#stage = Stage.Collecting
      this.#headers = headers
      this.#body = Buffer.allocUnsafe(size)
      return
    }
    this.#stream(controller, headers)
  }

  /** `kept`, `chunk`: what a held 401 had collected, and what outgrew it (#passHeld). */
  #stream (controller: Controller, headers: IncomingHttpHeaders, kept?: Buffer, chunk?: Buffer): void {
    this.#stage = Stage.Streaming
    copyHead(this.#reply, this.#status, headers)
    const stream = new UpstreamBody()
    stream.controller = controller
    if (kept !== undefined) { stream.push(kept); stream.push(chunk) }
    this.#streamed = stream
    sendOrFail(this.#reply, this.#controller, stream)
  }

  onResponseData (controller: Controller, chunk: Buffer): void {
    if (this.#stage === Stage.Collecting) {
      // undici fails the body if it outgrows its Content-Length; this only keeps the copy in bounds.
      // A held 401 of no declared length that outgrows its buffer is not kept (nor retried): it streams on.
      if (this.#retryAt !== 0 && this.#filled + chunk.length > (this.#body as Buffer).length) this.#passHeld(controller, chunk)
      else this.#filled += chunk.copy(this.#body as Buffer, this.#filled)
    } else if (this.#stage === Stage.Streaming) {
      if (!(this.#streamed as UpstreamBody).push(chunk)) controller.pause()
    } else if (this.#stage === Stage.Retrying) {
      this.#filled += chunk.length
      if (this.#filled > DRAIN_MAX_BYTES) this.#redial(controller)
    }
  }

  onResponseEnd (): void {
    const stage = this.#stage
    this.#stage = Stage.Done
    if (stage === Stage.Retrying) {
      clearTimeout(this.#timer)
      this.#retry()
      return
    }
    if (stage === Stage.Collecting && this.#retryAt !== 0) {
      this.#stage = Stage.Held
      if (this.#retryAt < 0) this.#passHeld()
      else this.#timer = setTimeout(() => { this.#release(); noteRetry(this.#request, this.#route, 'unauthorized'); this.#retry() }, this.#retryAt - performance.now())
      return
    }
    this.#finish()
    if (stage === Stage.Collecting) {
      copyHead(this.#reply, this.#status, this.#headers as IncomingHttpHeaders)
      const body = this.#body as Buffer
      sendOrFail(this.#reply, this.#controller, this.#filled === body.length ? body : body.subarray(0, this.#filled))
    } else if (stage === Stage.Streaming) {
      (this.#streamed as UpstreamBody).push(null)
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
    if (stage === Stage.Retrying) clearTimeout(this.#timer)
    else if (this.#retryAt !== 0) this.#release()
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
      (this.#streamed as UpstreamBody).destroy(error)
      return
    }
    if (this.#gone !== undefined) return
    this.#route.fail(this.#reply, error)
  }

  /** Gives up reading the 401 to be retried (DRAIN_MAX_*): its connection is dropped, and onResponseError retries. */
  #redial (controller: Controller): void {
    if (this.#stage !== Stage.Retrying) return
    this.#stage = Stage.Redialing
    clearTimeout(this.#timer)
    controller.abort(DRAIN_ABANDONED)
  }

  /** A 401 to retry after its Retry-After, collected (a Content-Type, at most 16 KiB) while it waits; false: the wait does not fit (waitFits), or the proxy is closing. */
  #holds (headers: IncomingHttpHeaders, now: number, waitMs: number): boolean {
    const { waits, headersTimeoutMs } = this.#route
    const size = headers['content-length'] === undefined && typeof headers['content-type'] === 'string' ? SMALL_BODY_BYTES : collectedSize(headers)
    if (waits === undefined || waits.closing || this.#request.method === 'HEAD' || !(size >= 0) || !waitFits(waitMs, now - this.#request.upstreamStart, headersTimeoutMs ?? Infinity)) return false
    this.#stage = Stage.Collecting
    this.#status = 401
    this.#headers = headers
    this.#body = Buffer.allocUnsafe(size)
    this.#retryAt = now + waitMs
    this.#request.upstreamMs = now - this.#request.upstreamStart
    waits.add(this)
    return true
  }

  /** The 401 is read to its end (its connection stays reusable) and the request sent again. */
  #drainAndRetry (controller: Controller, headers: IncomingHttpHeaders): true {
    this.#stage = Stage.Retrying
    noteRetry(this.#request, this.#route, 'unauthorized')
    const length = headers['content-length']
    if (typeof length === 'string' && !(Number(length) <= DRAIN_MAX_BYTES) && this.#request.method !== 'HEAD') this.#redial(controller)
    else this.#timer = setTimeout(() => { this.#redial(controller) }, DRAIN_MAX_MS)
    return true
  }

  #release (): void {
    this.#retryAt = 0
    this.#route.waits?.delete(this)
  }

  /** The held 401 forwarded (as collected, or streamed on from `chunk`), counted and explained as any 401 a client gets. */
  #passHeld (controller?: Controller, chunk?: Buffer): void {
    const route = this.#route
    this.#release()
    route.observer?.upstreamResponse?.(route.name, 401, false)
    if (this.#gone !== undefined) { this.#finish(); return }
    route.authRefused?.(route.name, 401, this.#request.headers.traceparent)
    if (chunk === undefined) { this.#stage = Stage.Collecting; this.onResponseEnd() } else this.#stream(controller as Controller, this.#headers as IncomingHttpHeaders, (this.#body as Buffer).subarray(0, this.#filled), chunk)
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
}
