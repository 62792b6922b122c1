// What the webhook's listener may hold of the process, whatever clients send
// (issue 33): its one client, the API server, keeps a handful of keep-alive
// connections and sends each AdmissionReview in well under a second. Without
// these, 60 connections each holding all but the last bytes of a 3 MiB body
// took the webhook past its pod's limit (then 192Mi).
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createServer, type Server as HttpsServer, type ServerOptions } from 'node:https'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { ByteBudget, limitAnswersInFlight, limitBodiesInFlight } from '../client/bytes-in-flight.js'
import { sendError } from '../proxy/errors.js'
import { ANNOTATIONS, DEFAULT_ENV_NAME } from './annotations.js'
import type { InjectMetrics } from './metrics.js'

export interface WebhookLimits {
  /** Connections open at once; at the cap a newcomer displaces the stalest (capConnections). */
  readonly maxConnections: number
  /** Requests received and not yet answered on one connection (pipelined): past it, the connection is closed. */
  readonly maxPipelined: number
  /** Bytes of request bodies received and not yet answered, all connections together. */
  readonly bodyBytesInFlight: number
  /** The patch in one answer, base64 as sent: a pod whose patch would be larger is denied (answerBound). */
  readonly patchBytes: number
  /** Bytes of answers written and not yet taken by the socket (unread), all connections together. */
  readonly answerBytesInFlight: number
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
 * ordinary ones (a few KiB). 128 KiB of patch: a real one is a few KiB (the
 * sidecar, one env entry per container); 128 KiB is ~800 containers. At
 * 256 KiB, 128 connections each holding one such answer unread cost 7–9 MB
 * of the kernel's socket buffers, which cgroup v2 charges to the pod (1 MiB:
 * 36 MB), and the chart's 128Mi cgroup peaked at 119 MB of 134 under every
 * attack at once: halved for margin.
 * 4 MiB of unread answers: sixteen of the largest, a thousand ordinary ones
 * (issue 43: eight unread answers of 15 MB took the process to 360 MB). 10 s: the
 * API server gives up on a webhook after its timeoutSeconds (the chart's 5,
 * 30 at most), so a request still arriving after that only holds memory.
 */
export const WEBHOOK_LIMITS: WebhookLimits = {
  maxConnections: 128,
  maxPipelined: 4,
  bodyBytesInFlight: 16 * 1024 * 1024,
  patchBytes: 128 * 1024,
  answerBytesInFlight: 4 * 1024 * 1024,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 10_000,
}

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

// --- Bytes in flight

export interface Budgets {
  /** Request bodies received and not answered (limits.bodyBytesInFlight). */
  readonly bodies: ByteBudget
  /** Answers written and not yet read (limits.answerBytesInFlight). */
  readonly answers: ByteBudget
}

/**
 * Both budgets on the listener (src/client/bytes-in-flight.ts), each with
 * its metric and log line: a body that does not fit is refused 503
 * webhook_busy with Connection: close (the refusal is returned, for a chunked
 * body's BudgetExceeded); an answer that does not fit closes the connections
 * holding the oldest unread answers.
 */
export function limitInFlight (app: FastifyInstance<HttpsServer>, budgets: Budgets, bodyLimit: number, metrics: InjectMetrics): (request: FastifyRequest, reply: FastifyReply, declared: number) => void {
  const { bodies, answers } = budgets
  const refuse = (request: FastifyRequest, reply: FastifyReply, declared: number): void => {
    metrics.error('busy')
    const message = `the webhook holds ${bodies.inFlight} bytes of other reviews' bodies; ${declared === 0 ? 'this chunked one' : `this one's ${declared}`} would pass its bound of ${bodies.limit}: try again`
    request.log.warn({ problem: message }, 'admission review refused: bodies in flight')
    void reply.header('connection', 'close').header('retry-after', '1')
    sendError(reply, 503, 'webhook_busy', message)
  }
  limitBodiesInFlight(app, bodies, bodyLimit, refuse)
  limitAnswersInFlight(app, answers, (request, cut) => {
    metrics.unreadAnswersCut()
    request.log.warn({ ...cut, inFlight: answers.inFlight, bound: answers.limit }, 'connection closed: its answers were not read and the unread answers were at their bound')
  })
  return refuse
}

// --- One review's answer

function field (v: unknown, key: string): unknown {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>)[key] : undefined
}

function lengthOf (v: unknown): number {
  return Array.isArray(v) ? v.length : 0
}

/** One env operation (patch.ts) at its largest but for the variable's name, with its comma. */
const ENV_OPERATION = JSON.stringify({ op: 'add', path: '/spec/initContainers/99999/env', value: [{ name: '', value: 'http://127.0.0.1:65535' }] }).length + 1

/**
 * What grows with the pod in its patch, read from the review before any of
 * it is built: one env operation per container and init container, each
 * naming the variable (the env annotation's value, whose length nothing else
 * bounds), base64 as sent. Zero for a review without a pod's containers.
 */
export function envPatchEstimate (body: unknown): { readonly containers: number, readonly bytes: number } {
  const object = field(field(body, 'request'), 'object')
  const spec = field(object, 'spec')
  const containers = lengthOf(field(spec, 'containers')) + lengthOf(field(spec, 'initContainers'))
  const env = field(field(field(object, 'metadata'), 'annotations'), ANNOTATIONS.env)
  const name = typeof env === 'string' ? env.length : DEFAULT_ENV_NAME.length
  return { containers, bytes: Math.ceil(containers * (ENV_OPERATION + name) / 3) * 4 }
}

/** The review with its pod's container lists emptied: decided as the real one (inject or not), its patch never large. */
export function withoutContainers (body: unknown): unknown {
  const request = field(body, 'request') as Record<string, unknown>
  const object = request.object as Record<string, unknown>
  const { initContainers: _, ...spec } = object.spec as Record<string, unknown>
  return { ...(body as Record<string, unknown>), request: { ...request, object: { ...object, spec: { ...spec, containers: [] } } } }
}
