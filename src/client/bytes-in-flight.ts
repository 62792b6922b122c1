// What a listener holds for its clients in bytes, bounded across all its
// connections: request bodies received and not yet answered (issue 33), and
// answers written that their clients have not yet read (issue 43). The
// webhook's listener uses both (src/inject/limits.ts).
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Server as HttpsServer } from 'node:https'
import type { Socket } from 'node:net'
import { Readable, Transform, type TransformCallback } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'

/** Bytes held for clients, all connections of a listener together. */
export class ByteBudget {
  #inFlight = 0

  constructor (readonly limit: number) {}

  get inFlight (): number { return this.#inFlight }

  /** Counts `bytes` when they fit in what is left; false (nothing counted) when not. */
  take (bytes: number): boolean {
    if (this.#inFlight + bytes > this.limit) return false
    this.#inFlight += bytes
    return true
  }

  give (bytes: number): void { this.#inFlight -= bytes }
}

/** A chunked body that outgrew what was left of the budget: refused by the error handler. */
export class BudgetExceeded extends Error {
  readonly statusCode = 503
}

/** One request's share of a budget, given back once, whichever way the request ends. */
class Share {
  bytes = 0
  #given = false

  /** unread: the set of answers not yet read, for an answer's share. */
  constructor (private readonly budget: ByteBudget, readonly socket: WithShares, readonly unread?: Set<Share>) {}

  get given (): boolean { return this.#given }

  take (bytes: number): boolean {
    if (this.#given || !this.budget.take(bytes)) return false
    this.bytes += bytes
    return true
  }

  readonly give = (): void => {
    if (this.#given) return
    this.#given = true
    this.socket[SHARES]?.delete(this)
    this.unread?.delete(this)
    this.budget.give(this.bytes)
    this.bytes = 0
  }
}

const SHARES = Symbol('cos-auth-proxy.bodyShares')
type WithShares = IncomingMessage['socket'] & { [SHARES]?: Set<Share>, _parent?: Socket | null }

/** A share for this request, given back when its response closes or its connection does (a pipelined response may never close). */
function shareOf (budget: ByteBudget, req: IncomingMessage, res: ServerResponse, unread?: Set<Share>): Share {
  const socket = req.socket as WithShares
  let shares = socket[SHARES]
  if (shares === undefined) {
    const set = new Set<Share>()
    shares = set
    socket[SHARES] = set
    socket.once('close', () => { for (const share of set) share.give() })
  }
  const share = new Share(budget, socket, unread)
  shares.add(share)
  res.once('close', share.give)
  // Closed already (a request cut mid-body, answered by Fastify all the same): no event is to come.
  if (socket.destroyed) share.give()
  return share
}

const SHARE = Symbol('cos-auth-proxy.bodyShare')
type WithShare = IncomingMessage & { [SHARE]?: Share }

/** Counts a chunked body as it arrives; errors (BudgetExceeded) at the first chunk that does not fit. */
class Counted extends Transform {
  constructor (private readonly share: Share) {
    super()
    // Fastify's reader takes the errors while it reads; once it has stopped (an answer sent), nobody waits for them.
    this.on('error', () => { /* see above */ })
  }

  override _transform (chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    // Answered already: what still arrives is read to be dropped.
    if (this.share.given) callback()
    else if (this.share.take(chunk.length)) callback(null, chunk)
    else callback(new BudgetExceeded('the bodies in flight would exceed the budget'))
  }
}

/**
 * Bodies in flight bounded by `budget`: a declared Content-Length is taken
 * before the body is read, and a request it does not fit is refused at once
 * (`refuse`: 503, Connection: close); a chunked body is taken as it arrives
 * (BudgetExceeded through the error handler). Given back when the answer is
 * sent (the parsed body is dropped with it), or the response or connection
 * closes: answered, refused, timed out or reset.
 */
export function limitBodiesInFlight (app: FastifyInstance<HttpsServer>, budget: ByteBudget, bodyLimit: number, refuse: (request: FastifyRequest, reply: FastifyReply, declared: number) => void): void {
  app.addHook('onRequest', (request, reply, done) => {
    const declared = Number(request.headers['content-length'] ?? 0)
    // Over the body limit: Fastify answers 413 without reading it.
    if (declared === 0 || declared > bodyLimit) {
      done()
      return
    }
    const share = shareOf(budget, request.raw, reply.raw)
    ;(request.raw as WithShare)[SHARE] = share
    // Given already: its connection is closed, and nothing will arrive.
    if (!share.take(declared) && !share.given) {
      share.give()
      refuse(request, reply, declared)
      return
    }
    done()
  })
  app.addHook('preParsing', (request, reply, payload, done) => {
    if (request.headers['content-length'] !== undefined || request.headers['transfer-encoding'] === undefined) {
      done(null, payload)
      return
    }
    const share = shareOf(budget, request.raw, reply.raw)
    ;(request.raw as WithShare)[SHARE] = share
    const counted = new Counted(share)
    // pipe() passes no error on: a client gone mid-body must end Fastify's read too.
    payload.once('error', (err: Error) => { counted.destroy(err) })
    done(null, payload.pipe(counted))
  })
  app.addHook('onSend', (request, _reply, payload, done) => {
    (request.raw as WithShare)[SHARE]?.give()
    // Answered: what the body parsed to must not wait for a client that does not read.
    request.body = undefined
    done(null, payload)
  })
}

/** The size of each write of a large answer (a TLS record's). */
const SLICE = 16 * 1024

function * slices (buffer: Buffer): Generator<Buffer> {
  for (let at = 0; at < buffer.length; at += SLICE) yield buffer.subarray(at, at + SLICE)
}

/** What a cut connection held: its answers not yet read, and their bytes with any body's. */
export interface Cut { readonly bytes: number, readonly answers: number }

/**
 * Answers in flight bounded by `budget`: an answer's bytes are taken when it
 * is handed to the response (onSend, once serialized) and given back when the
 * socket has taken the last of them ('finish': none of it is left in the
 * process, the kernel's socket buffer has it), or the response or its
 * connection closes. An answer the budget cannot take makes room: the
 * connection holding the oldest answer still unread is closed, and its bytes
 * given back at once, until it fits (`onCut` is told of each). A client that
 * reads its answers (the API server reads at once) holds them for
 * milliseconds, so it is never the oldest for long. Refusing the newcomer
 * instead would let a few unread answers lock every later one out: nothing
 * times out an answer being written. An answer larger than the whole budget
 * closes its own connection, unsent.
 *
 * An answer over 16 KiB is written in 16 KiB slices, as fast as the socket
 * takes them: Node's TLS socket keeps a buffer as large as its largest single
 * write for as long as the connection lives (NodeBIO), so 0.9 MB answers in
 * one write each left 0.9 MB on every connection after the kernel had taken
 * them (a heap snapshot: 56 such buffers, 52 MB, none of it counted here).
 */
export function limitAnswersInFlight (app: FastifyInstance<HttpsServer>, budget: ByteBudget, onCut: (request: FastifyRequest, cut: Cut) => void): void {
  // Insertion order: the oldest first.
  const unread = new Set<Share>()
  app.addHook('onSend', (request, reply, payload, done) => {
    const bytes = typeof payload === 'string' ? Buffer.byteLength(payload) : Buffer.isBuffer(payload) ? payload.length : 0
    if (bytes === 0) {
      done(null, payload)
      return
    }
    const share = shareOf(budget, request.raw, reply.raw, unread)
    reply.raw.once('finish', share.give)
    while (!share.take(bytes)) {
      const oldest = unread.values().next()
      if (oldest.done === true || share.given) break
      onCut(request, cutConnection(oldest.value.socket))
    }
    if (share.bytes > 0) unread.add(share)
    else if (!share.given) cutConnection(share.socket)
    if (bytes <= SLICE || share.given) {
      done(null, payload)
      return
    }
    const buffer = typeof payload === 'string' ? Buffer.from(payload) : payload as Buffer
    void reply.header('content-length', String(buffer.length))
    done(null, Readable.from(slices(buffer), { objectMode: false }))
  })
}

/** Closes the connection (its TLS socket and the TCP one under it) and gives back at once all it held. */
function cutConnection (socket: WithShares): Cut {
  let bytes = 0
  let answers = 0
  for (const share of socket[SHARES] ?? []) {
    bytes += share.bytes
    if (share.unread !== undefined) answers++
    share.give()
  }
  socket.destroy()
  socket._parent?.destroy()
  return { bytes, answers }
}
