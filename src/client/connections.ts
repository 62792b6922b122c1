// The connection tracker of every listener (proxy, admin, webhook): idle
// reaping, the connection cap with displacement, and the pipelining bounds,
// as options (ConnectionPolicy); listener.ts builds a server with it.
//
// One engine: a periodic sweep over the open connections, nothing done per
// request but one property read (`res.socket`, set unless the request is
// pipelined behind another). The other engine the webhook used (listeners
// on every request's 'end' and its response's 'prefinish', 'finish' and
// 'close', and a closure per request) cost four listeners and a closure
// per request on the proxy's hot path; here a busy connection is read off
// Node's own fields when it matters (each sweep, and at the cap), so the
// proxy pays nothing for the cap and the webhook gets the same rules.
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'

/** A server socket as Node's HTTP server keeps it: `_httpMessage` is the response in progress on it, if any. */
export type WithPendingResponse<T> = T & { _httpMessage?: ServerResponse | null }

/** ... and `parser.incoming` the request it is parsing (a body still arriving), if any. */
type HttpSocket = WithPendingResponse<Socket> & { parser?: { incoming?: IncomingMessage | null } | null, [QUEUED]?: Queue }

/**
 * How many requests one connection may have outstanding: the one being
 * answered and those pipelined behind it. Node parses every request of a
 * chunk it has read (up to 64 KiB, or a TLS record: thousands of short
 * requests) before it looks at the connection's backlog, so without a bound
 * one connection that pipelines and never reads makes the process build
 * every answer at once. curl, Go, Java and browsers pipeline nothing or a
 * handful.
 */
export const MAX_OUTSTANDING_PER_CONNECTION = 4

/**
 * How many requests may wait behind another on their connections, all
 * connections of one listener together: what pipelining costs on top of one
 * request per connection, bounded whatever the number of connections. Each
 * waiting request holds its answer (up to 16 KiB collected, or what one
 * socket buffers of a stream) until the client reads the ones before it.
 */
export const MAX_PIPELINED_PER_LISTENER = 256

/** What a listener lets its connections hold: each listener states it as data (listener.ts). */
export interface ConnectionPolicy {
  /** A connection without a request in flight for this long is closed; Infinity: never (Node's keep-alive timeout alone). */
  readonly idleMs: number
  /** Connections open at once, counted from the TCP accept (a TLS handshake holds one too); Infinity: no cap. */
  readonly maxConnections: number
  /** At the cap: displace a connection the server owes nothing (`displace`), or close the newcomer (`refuse`). */
  readonly atCap: 'displace' | 'refuse'
  /** A request whose body is arriving is in progress, never displaced (the proxy port: the body goes upstream as it arrives). */
  readonly keepBodies: boolean
  /**
   * Until when a connection is busy with its answer: until the answer is
   * written (`written`: a client reading slowly is still served), or until
   * it is handed to the socket (`ended`: a client that does not read its
   * answers is then idle, displaced first; the webhook's).
   */
  readonly busyUntil: 'written' | 'ended'
  /** Requests outstanding on one connection (MAX_OUTSTANDING_PER_CONNECTION). */
  readonly pipelinedPerConnection: number
  /** Requests waiting behind another, all connections together (MAX_PIPELINED_PER_LISTENER); Infinity: no bound. */
  readonly pipelinedPerListener: number
  /**
   * A request beyond a bound: refused by the listener's onRequest hook
   * (`refuse`: pipelinedBeyondBound, then 503 and the close), or its
   * connection closed before the server sees it (`close`).
   */
  readonly beyondBound: 'refuse' | 'close'
}

export const DEFAULT_POLICY: ConnectionPolicy = {
  idleMs: Infinity,
  maxConnections: Infinity,
  atCap: 'displace',
  keepBodies: false,
  busyUntil: 'written',
  pipelinedPerConnection: MAX_OUTSTANDING_PER_CONNECTION,
  pipelinedPerListener: MAX_PIPELINED_PER_LISTENER,
  beyondBound: 'refuse',
}

/** One connection: the TCP socket accepted, and the socket HTTP runs on (the same, or its TLS socket once the handshake is done). */
interface Connection { readonly tcp: Socket, http: HttpSocket, lastBusy: number, bytesWritten: number }

/** The responses queued behind another on one connection, and the listener's count of them all. */
interface Queue { readonly responses: ServerResponse[], readonly listener: Counts }
interface Counts { waiting: number, readonly policy: ConnectionPolicy }

const QUEUED = Symbol('cos-auth-proxy.queuedResponses')
const COUNTS = Symbol('cos-auth-proxy.pipelinedRequests')

/** The tracker of one server: `admit` runs before the server's request handler (listener.ts). */
export interface ConnectionTracker {
  /** False when the request is dropped with its connection (`beyondBound: 'close'`), or its connection is closed already. */
  readonly admit: (req: IncomingMessage, res: ServerResponse) => boolean
}

/** Whether a request's body is still arriving on the connection: the server has nothing to answer yet. */
function receiving (socket: HttpSocket): boolean {
  const incoming = socket.parser?.incoming
  return incoming != null && !incoming.complete
}

/** Whether the server owes the connection an answer it is working on now. */
function answering (socket: HttpSocket, policy: ConnectionPolicy): boolean {
  const res = socket._httpMessage
  return res != null && !receiving(socket) && (policy.busyUntil === 'written' || !res.writableEnded)
}

/**
 * Tracks the connections of `server` by `policy`.
 *
 * Idle reaping: a connection that sits without a request in flight for
 * longer than `idleMs` is closed. Node's own keep-alive timer is a socket
 * timeout, which any byte resets (a client can trickle empty lines forever),
 * and a connection that never sends a byte has no timer at all. A sweep
 * (every second at most) looks at each connection: one being answered, or
 * written to since the last sweep (only answers write: trickled bytes do not
 * count), is busy now; one that was neither for `idleMs` is closed. One whose
 * request body is still arriving is left to the request timeout (a slow
 * upload is not idle), but is not busy either.
 *
 * The cap: a connection that arrives while `maxConnections` are open
 * displaces one the server owes nothing: an idle one first (nothing received
 * of a request: between requests, in its TLS handshake, never a byte sent,
 * trickling a head), the one busy longest ago; else, unless `keepBodies`,
 * one still sending a request's body. So connections, whatever they send,
 * cannot lock out a client that comes to send a request (a kubelet's probe,
 * the app, the API server); only when every one is being answered is the
 * newcomer closed. Not Node's `server.maxConnections`: that drops the
 * newcomer before 'connection' is emitted, whatever the others do.
 *
 * Pipelining: see admit and pipelinedBeyondBound.
 */
export function trackConnections (server: Server, options: Partial<ConnectionPolicy> = {}): ConnectionTracker {
  const policy: ConnectionPolicy = { ...DEFAULT_POLICY, ...options }
  const open = new Map<Socket, Connection>()
  const counts: Counts = { waiting: 0, policy }
  ;(server as { [COUNTS]?: Counts })[COUNTS] = counts
  server.on('connection', (socket: Socket) => {
    if (open.size >= policy.maxConnections && (policy.atCap === 'refuse' || !closeIdlest(open, policy))) {
      socket.destroy()
      return
    }
    open.set(socket, { tcp: socket, http: socket, lastBusy: performance.now(), bytesWritten: 0 })
    socket.once('close', () => open.delete(socket))
  })
  // HTTPS: HTTP runs on the TLS socket over the accepted one (Node keeps that as `_parent`).
  server.on('secureConnection', (tls: HttpSocket & { _parent?: Socket | null }) => {
    const connection = tls._parent == null ? undefined : open.get(tls._parent)
    if (connection !== undefined) connection.http = tls
  })
  const sweep = setInterval(() => {
    const now = performance.now()
    for (const [socket, c] of open) {
      const written = c.http.bytesWritten
      if (written !== c.bytesWritten || answering(c.http, policy)) {
        c.lastBusy = now
        c.bytesWritten = written
      } else if (now - c.lastBusy >= policy.idleMs && !receiving(c.http)) {
        open.delete(socket)
        close(c)
      }
    }
  }, Math.max(10, Math.min(1000, policy.idleMs / 2))).unref()
  server.once('close', () => clearInterval(sweep))
  return { admit: (req, res) => admit(counts, req, res) }
}

/**
 * Before the server's handler, for every request: nothing is done for one
 * that holds its socket (no request ahead of it; Node closes it itself).
 * A response queued behind another (HTTP/1.1 pipelining: Node parses ahead
 * and hands over every request it finds while earlier answers are pending)
 * never holds the socket until those are written, and Node never closes it
 * if the connection closes first: no 'close', so no request line, no metrics
 * sample, an in-flight gauge that never comes down, a budget never given
 * back, and a body piped into it that never stops. Such a response is closed
 * here with its connection. With `beyondBound: 'close'`, a request beyond
 * the bounds is dropped with its connection, before the server builds
 * anything for it; with `refuse`, the listener's onRequest hook refuses it
 * (pipelinedBeyondBound).
 */
function admit (counts: Counts, req: IncomingMessage, res: ServerResponse): boolean {
  if (res.socket !== null) return true
  const socket = req.socket as HttpSocket
  if (counts.policy.beyondBound === 'close') {
    if (socket.destroyed) return false
    if (beyond(counts, socket[QUEUED]?.responses.length ?? 0, 1)) {
      socket.destroy()
      ;(socket as { _parent?: Socket | null })._parent?.destroy()
      return false
    }
  }
  closeWithConnection(counts, socket, res)
  return true
}

function closeWithConnection (counts: Counts, socket: HttpSocket, res: ServerResponse): void {
  let queued = socket[QUEUED]
  if (queued === undefined) {
    queued = { responses: [], listener: counts }
    socket[QUEUED] = queued
    socket.once('close', closeQueued)
  } else if (queued.responses.length >= counts.policy.pipelinedPerConnection - 1) {
    // Forget the ones Node has closed since (written, or closed with the
    // socket), so that the length is what is still outstanding.
    const list = queued.responses
    let kept = 0
    for (const r of list) if (!r.destroyed) list[kept++] = r
    list.length = kept
  }
  queued.responses.push(res)
  counts.waiting++
  // Every response closes: written, destroyed with its connection, or closed by closeQueued.
  res.once('close', () => {
    counts.waiting--
    // Not kept once closed: a response holds its request, its upstream exchange and its
    // answer's buffers, and an idle keep-alive connection would hold them until it closes.
    const list = socket[QUEUED]?.responses
    const at = list === undefined ? -1 : list.indexOf(res)
    if (at >= 0) list?.splice(at, 1)
  })
}

/** Whether `queued` responses on a connection and `ahead` more (0: this one, queued already) pass a bound. */
function beyond (counts: Counts, queued: number, ahead: number): boolean {
  return queued + ahead >= counts.policy.pipelinedPerConnection || counts.waiting + ahead > counts.policy.pipelinedPerListener
}

/** How many requests wait behind another on the connections of `server` now. */
export function pipelinedWaiting (server: object): number {
  return (server as { [COUNTS]?: Counts })[COUNTS]?.waiting ?? 0
}

/**
 * Whether this request is beyond its listener's pipelinedPerConnection on
 * its connection (the one in progress plus those queued behind it, this one
 * included), or beyond pipelinedPerListener on its listener. Nothing to
 * count for a response that holds its socket: nothing is ahead of it.
 */
export function pipelinedBeyondBound (res: ServerResponse): boolean {
  if (res.socket !== null) return false
  const queued = (res.req.socket as HttpSocket)[QUEUED]
  return queued !== undefined && beyond(queued.listener, queued.responses.length, 0)
}

function closeQueued (this: HttpSocket): void {
  const queued = this[QUEUED]
  if (queued === undefined) return
  this[QUEUED] = { responses: [], listener: queued.listener }
  for (const res of queued.responses) {
    // Node marks what it closed destroyed; destroy() marks this one too, and
    // makes a late write to it (an upstream answer still on its way) a no-op.
    if (res.destroyed) continue
    res.destroy()
    res.emit('close')
  }
}

/**
 * Closes the idle connection that was busy longest ago, else (unless
 * `keepBodies`) the one still sending a request body that was; false when
 * there is neither. A connection written to since the last sweep counts as
 * busy now (read here: the sweep may be up to a second old).
 */
function closeIdlest (open: Map<Socket, Connection>, policy: ConnectionPolicy): boolean {
  const now = performance.now()
  let idlest: Connection | undefined
  let sending: Connection | undefined
  for (const c of open.values()) {
    const written = c.http.bytesWritten
    if (written !== c.bytesWritten) {
      c.bytesWritten = written
      c.lastBusy = now
    }
    if (receiving(c.http)) {
      if (!policy.keepBodies && (sending === undefined || c.lastBusy < sending.lastBusy)) sending = c
    } else if (!answering(c.http, policy) && (idlest === undefined || c.lastBusy < idlest.lastBusy)) {
      idlest = c
    }
  }
  const closed = idlest ?? sending
  if (closed === undefined) return false
  open.delete(closed.tcp)
  close(closed)
  return true
}

/** Both sockets: closing the TCP one alone does not stop a TLS socket with data still to go through. */
function close (c: Connection): void {
  if (c.http !== c.tcp) c.http.destroy()
  c.tcp.destroy()
}
