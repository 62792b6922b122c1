// What the webhook's listener may hold of the process, whatever clients send
// (issue 33): its one client, the API server, keeps a handful of keep-alive
// connections and sends each AdmissionReview in well under a second. Without
// these, 60 connections each holding all but the last bytes of a 3 MiB body
// took the webhook past its pod's limit (then 192Mi).
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createServer, type Server as HttpsServer, type ServerOptions } from 'node:https'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'
import { Transform, type TransformCallback } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'

export interface WebhookLimits {
  /** Connections open at once; at the cap a newcomer displaces the stalest (capConnections). */
  readonly maxConnections: number
  /** Requests received and not yet answered on one connection (pipelined): past it, the connection is closed. */
  readonly maxPipelined: number
  /** Bytes of request bodies received and not yet answered, all connections together. */
  readonly bodyBytesInFlight: number
  /** For a request's headers to arrive, and for the TLS handshake before them. */
  readonly headersTimeoutMs: number
  /** For the whole request, body included. */
  readonly requestTimeoutMs: number
}

/**
 * 128 connections: dozens of API servers' worth. 4 pipelined, as on the
 * other listeners (src/client/connections.ts): the API server (Go's HTTP
 * client) never pipelines, and each request waiting behind an unread answer
 * holds its objects in the heap. 16 MiB: five reviews of the
 * largest size at once (3 MiB, the API server's own limit), hundreds of
 * ordinary ones (a few KiB). 10 s: the API server gives up on a webhook after
 * its timeoutSeconds (the chart's 5, 30 at most), so a request still arriving
 * after that only holds memory.
 */
export const WEBHOOK_LIMITS: WebhookLimits = { maxConnections: 128, maxPipelined: 4, bodyBytesInFlight: 16 * 1024 * 1024, headersTimeoutMs: 10_000, requestTimeoutMs: 10_000 }

/**
 * The webhook's HTTPS server, made here (Fastify's serverFactory) so that
 * Node's own limits are set where Node reads them: Fastify passes its `http`
 * options only to an HTTP server, and Node checks the timeouts every
 * connectionsCheckingInterval (30 s by default, which let a body take a
 * minute). Connections are capped and pipelining bounded (see below), and a
 * request past the bound never reaches Fastify (`handler`).
 */
export function webhookServer (tls: ServerOptions, limits: WebhookLimits, handler: (req: IncomingMessage, res: ServerResponse) => void): HttpsServer {
  const open = new Map<Socket, Connection>()
  const server = createServer({
    ...tls,
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    connectionsCheckingInterval: Math.min(1000, limits.headersTimeoutMs),
    // Node's default is 120 s: a client that connects and never finishes the handshake would hold a slot that long.
    handshakeTimeout: limits.headersTimeoutMs,
  }, (req, res) => { if (admitted(open, limits, req, res)) handler(req, res) })
  server.keepAliveTimeout = 72_000 // Fastify's default, as before: the API server keeps its connections
  capConnections(server, open, limits.maxConnections)
  return server
}

// --- Connections

interface Connection { lastAnswer: number, answering: number, outstanding: number, tls?: Socket }

/** The TCP socket under a request's TLS socket (Node keeps it as `_parent`). */
type OnTls = IncomingMessage['socket'] & { _parent?: Socket | null }

/**
 * At most `max` connections, counted from the TCP accept (a TLS handshake
 * holds one too). At the cap, a newcomer displaces the connection that has
 * gone longest without an answer (idle, still in its handshake, or with a
 * request still arriving), never one whose request has arrived whole and is
 * being answered; when every one is, the newcomer is closed. So connections
 * opened and left, or trickling, cannot lock the API server out: its
 * request arrives at once on a connection younger than theirs.
 */
function capConnections (server: HttpsServer, open: Map<Socket, Connection>, max: number): void {
  server.on('connection', (socket: Socket) => {
    if (open.size >= max && !displaceStalest(open)) {
      socket.destroy()
      return
    }
    open.set(socket, { lastAnswer: performance.now(), answering: 0, outstanding: 0 })
    socket.once('close', () => open.delete(socket))
  })
  // Its TLS socket too, for close().
  server.on('secureConnection', (tls: OnTls) => {
    const connection = tls._parent == null ? undefined : open.get(tls._parent)
    if (connection !== undefined) connection.tls = tls
  })
}

/**
 * False, and the connection closed, for a request with `maxPipelined`
 * requests unanswered ahead of it, or on a connection closed already. Node
 * parses a whole read (a TLS record: hundreds of short requests) before it
 * looks at the connection, so the ones it still hands over are dropped here,
 * before Fastify builds anything for them.
 */
function admitted (open: Map<Socket, Connection>, limits: Pick<WebhookLimits, 'maxPipelined'>, req: IncomingMessage, res: ServerResponse): boolean {
  if (req.socket.destroyed) return false
  const socket = (req.socket as OnTls)._parent
  const connection = socket == null ? undefined : open.get(socket)
  if (socket == null || connection === undefined) return true
  if (connection.outstanding >= limits.maxPipelined) {
    close(socket, connection)
    return false
  }
  trackAnswer(connection, req, res)
  return true
}

/**
 * Answering: from the end of the body until the answer is handed to the
 * socket ('prefinish'), which is the connection's last answer; a client that
 * does not read its answers is then the stalest, not busy. Outstanding: until
 * the answer is written ('finish') or cut ('close'); a response queued behind
 * another may see only one of them.
 */
function trackAnswer (connection: Connection, req: IncomingMessage, res: ServerResponse): void {
  let answering = false
  let answered = false
  let ended = false
  connection.outstanding++
  req.once('end', () => {
    if (answered) return
    answering = true
    connection.answering++
  })
  const answer = (): void => {
    if (answered) return
    answered = true
    if (answering) connection.answering--
    connection.lastAnswer = performance.now()
  }
  const end = (): void => {
    if (ended) return
    ended = true
    connection.outstanding--
    answer()
  }
  res.once('prefinish', answer)
  res.once('finish', end)
  res.once('close', end)
}

/** Closes the connection not being answered whose last answer (or accept) is oldest; false when all are being answered. */
function displaceStalest (open: Map<Socket, Connection>): boolean {
  let stalest: Socket | undefined
  let since = Infinity
  for (const [socket, c] of open) {
    if (c.answering === 0 && c.lastAnswer < since) {
      stalest = socket
      since = c.lastAnswer
    }
  }
  if (stalest === undefined) return false
  close(stalest, open.get(stalest))
  open.delete(stalest)
  return true
}

/** Both sockets: closing the TCP one alone does not stop a TLS socket with data still to go through. */
function close (socket: Socket, connection: Connection | undefined): void {
  connection?.tls?.destroy()
  socket.destroy()
}

// --- Bodies in flight

/** The bytes of request bodies in flight, all connections together. */
export class BodyBudget {
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

/** One request's share of the budget, given back once, whichever way the request ends. */
class Share {
  bytes = 0
  #given = false

  constructor (private readonly budget: BodyBudget, private readonly onSocket: Set<Share>) {}

  get given (): boolean { return this.#given }

  take (bytes: number): boolean {
    if (this.#given || !this.budget.take(bytes)) return false
    this.bytes += bytes
    return true
  }

  readonly give = (): void => {
    if (this.#given) return
    this.#given = true
    this.onSocket.delete(this)
    this.budget.give(this.bytes)
    this.bytes = 0
  }
}

const SHARES = Symbol('cos-auth-proxy.bodyShares')
type WithShares = IncomingMessage['socket'] & { [SHARES]?: Set<Share> }

/** A share for this request, given back when its response closes or its connection does (a pipelined response may never close). */
function shareOf (budget: BodyBudget, req: IncomingMessage, res: ServerResponse): Share {
  const socket = req.socket as WithShares
  let shares = socket[SHARES]
  if (shares === undefined) {
    const set = new Set<Share>()
    shares = set
    socket[SHARES] = set
    socket.once('close', () => { for (const share of set) share.give() })
  }
  const share = new Share(budget, shares)
  shares.add(share)
  res.once('close', share.give)
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
 * sent (the parsed review is dropped with it), or the response or connection
 * closes: answered, refused, timed out or reset.
 */
export function limitBodiesInFlight (app: FastifyInstance<HttpsServer>, budget: BodyBudget, bodyLimit: number, refuse: (request: FastifyRequest, reply: FastifyReply, declared: number) => void): void {
  app.addHook('onRequest', (request, reply, done) => {
    const declared = Number(request.headers['content-length'] ?? 0)
    // Over the body limit: Fastify answers 413 without reading it.
    if (declared === 0 || declared > bodyLimit) {
      done()
      return
    }
    const share = shareOf(budget, request.raw, reply.raw)
    ;(request.raw as WithShare)[SHARE] = share
    if (!share.take(declared)) {
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
    // The review is answered: what it parsed to must not wait for a client that does not read.
    request.body = undefined
    done(null, payload)
  })
}
