// Connection housekeeping shared by the proxy and admin listeners.
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'

/** A server socket as Node's HTTP server keeps it: `_httpMessage` is the response in progress on it, if any. */
export type WithPendingResponse<T> = T & { _httpMessage?: ServerResponse | null }

/** ... and `parser.incoming` the request it is parsing (a body still arriving), if any. */
type ServerSocket = WithPendingResponse<Socket> & { parser?: { incoming?: IncomingMessage | null } | null }

interface ConnectionState { lastBusy: number, bytesWritten: number }

type Connections = Map<ServerSocket, ConnectionState>

/** Whether a request's body is still arriving on the connection: the server has nothing to answer yet. */
function receiving (socket: ServerSocket): boolean {
  const incoming = socket.parser?.incoming
  return incoming != null && !incoming.complete
}

/**
 * Closes connections that sit without a request in flight for longer than
 * the keep-alive timeout. Node's own keep-alive timer is a socket timeout,
 * which any byte resets (a client can trickle empty lines forever), and a
 * connection that never sends a byte has no timer at all: either could hold
 * a slot of COS_MAX_CONNECTIONS indefinitely.
 *
 * Nothing is done per request: a sweep (every second at most) looks at each
 * connection. One with a response under way to a request that has arrived
 * whole (`_httpMessage`), or that was written to since the last sweep (only
 * responses write: trickled bytes do not count), is busy now; one that was
 * neither for `idleMs` is closed. So a connection is reaped between idleMs
 * and idleMs + the sweep interval after its last response. One whose
 * request body is still arriving is left to the request timeout (a slow
 * upload is not idle), but is not busy either.
 *
 * With `maxConnections`, a connection that arrives while that many are open
 * displaces one the server owes nothing: an idle one first (nothing received
 * of a request: a keep-alive connection between requests, one that never
 * sent a byte, one still trickling its request's head), the one busy longest
 * ago; else, unless `keepBodies`, one still sending a request's body,
 * however slowly it trickles. So connections, however many are opened and
 * whatever they send, cannot lock out a client that comes to send a request
 * (a kubelet's probe, the app); only when every one is waiting for its
 * answer (or, with `keepBodies`, sending a body) is the newcomer closed. The
 * cap is enforced here rather than by Node's `server.maxConnections`, which
 * drops the newcomer before 'connection' is emitted, whatever the others do.
 * `keepBodies` (the proxy port): a request whose body is arriving is in
 * progress (the body goes upstream as it arrives), bounded by the request
 * timeout, never displaced.
 */
export function reapIdleConnections (server: Server, idleMs: number, maxConnections = Infinity, { keepBodies = false } = {}): void {
  const connections: Connections = new Map()
  server.on('connection', (socket: ServerSocket) => {
    if (connections.size >= maxConnections && !closeIdlest(connections, keepBodies)) {
      socket.destroy()
      return
    }
    connections.set(socket, { lastBusy: performance.now(), bytesWritten: 0 })
    socket.once('close', () => connections.delete(socket))
  })
  const sweep = setInterval(() => {
    const now = performance.now()
    for (const [socket, state] of connections) {
      const written = socket.bytesWritten
      if (written !== state.bytesWritten || (socket._httpMessage != null && !receiving(socket))) {
        state.lastBusy = now
        state.bytesWritten = written
      } else if (now - state.lastBusy >= idleMs && !receiving(socket)) {
        connections.delete(socket)
        socket.destroy()
      }
    }
  }, Math.max(10, Math.min(1000, idleMs / 2))).unref()
  server.once('close', () => clearInterval(sweep))
}

const QUEUED = Symbol('cos-auth-proxy.queuedResponses')
type WithQueued = Socket & { [QUEUED]?: ServerResponse[] }

/**
 * How many requests one connection may have outstanding: the one being
 * answered and those pipelined behind it. Node parses every request of a
 * chunk it has read (up to 64 KiB: thousands of short requests) before it
 * looks at the connection's backlog, so without a bound one connection that
 * pipelines and never reads makes the process build every answer at once.
 * curl, Go, Java and browsers pipeline nothing or a handful; a request
 * beyond the bound is refused (503, `connection: close`, see
 * `pipelinedBeyondBound`) and what follows it is dropped with the
 * connection (connection-refusals.ts).
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

const PIPELINED = Symbol('cos-auth-proxy.pipelinedRequests')
/** The listener a server socket belongs to (net sets `server`), counting what waits on its connections. */
type CountingServer = { [PIPELINED]?: number }

/**
 * A response queued behind another on its connection (HTTP/1.1 pipelining:
 * Node parses ahead and hands over every request it finds while earlier
 * answers are pending) never holds the socket until those are written, and
 * Node never closes it if the connection closes first: no 'close', so no
 * request line, no metrics sample, an in-flight gauge that never comes
 * down, and a body piped into it that never stops. Such a response is closed
 * here with its connection. Called for every request: nothing is done for
 * one that holds its socket (Node closes that one itself).
 */
export function closeWithConnection (res: ServerResponse): void {
  if (res.socket !== null) return
  const socket = res.req.socket as WithQueued
  let queued = socket[QUEUED]
  if (queued === undefined) {
    queued = []
    socket[QUEUED] = queued
    socket.once('close', closeQueued)
  } else if (queued.length >= MAX_OUTSTANDING_PER_CONNECTION - 1) {
    // Forget the ones Node has closed since (written, or closed with the
    // socket), so that the length is what is still outstanding.
    let kept = 0
    for (const r of queued) if (!r.destroyed) queued[kept++] = r
    queued.length = kept
  }
  queued.push(res)
  const server = (socket as { server?: CountingServer }).server
  if (server !== undefined) server[PIPELINED] = (server[PIPELINED] ?? 0) + 1
  // Every response closes: written, destroyed with its connection, or closed by closeQueued.
  res.once('close', () => {
    if (server !== undefined) server[PIPELINED] = (server[PIPELINED] ?? 1) - 1
    // Not kept once closed: a response holds its request, its upstream exchange and its
    // answer's buffers, and an idle keep-alive connection would hold them until it closes.
    const list = socket[QUEUED]
    if (list !== undefined) {
      const at = list.indexOf(res)
      if (at >= 0) list.splice(at, 1)
    }
  })
}

/** How many requests wait behind another on the connections of `server` now. */
export function pipelinedWaiting (server: object): number {
  return (server as CountingServer)[PIPELINED] ?? 0
}

/**
 * Whether this request is beyond MAX_OUTSTANDING_PER_CONNECTION on its
 * connection (the one in progress plus those queued behind it, this one
 * included, once closeWithConnection has queued it), or beyond
 * MAX_PIPELINED_PER_LISTENER on its listener. Nothing to count for a
 * response that holds its socket: nothing is ahead of it.
 */
export function pipelinedBeyondBound (res: ServerResponse): boolean {
  if (res.socket !== null) return false
  const socket = res.req.socket as WithQueued & { server?: CountingServer }
  const queued = socket[QUEUED]
  return queued !== undefined && (queued.length >= MAX_OUTSTANDING_PER_CONNECTION || (socket.server?.[PIPELINED] ?? 0) > MAX_PIPELINED_PER_LISTENER)
}

function closeQueued (this: WithQueued): void {
  const queued = this[QUEUED]
  if (queued === undefined) return
  this[QUEUED] = []
  for (const res of queued) {
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
 * there is neither.
 */
function closeIdlest (connections: Connections, keepBodies: boolean): boolean {
  let idlest: ServerSocket | undefined
  let since = Infinity
  let sending: ServerSocket | undefined
  let sendingSince = Infinity
  for (const [socket, state] of connections) {
    if (receiving(socket)) {
      if (!keepBodies && state.lastBusy < sendingSince) {
        sending = socket
        sendingSince = state.lastBusy
      }
    } else if (socket._httpMessage == null && state.lastBusy < since) {
      idlest = socket
      since = state.lastBusy
    }
  }
  const closed = idlest ?? sending
  if (closed === undefined) return false
  connections.delete(closed)
  closed.destroy()
  return true
}

/** How long a refused connection is kept, at most, for its peer to read the answer; how many at once (beyond, the oldest is closed). */
export interface Linger { readonly ms: number, readonly max: number }
export const REFUSED_LINGER: Linger = { ms: 1000, max: 64 }

/**
 * Connections from peers refused whatever they send (COS_ALLOW_FROM on the
 * proxy port) are answered and closed as they are accepted: `answer` (a
 * whole HTTP response saying `connection: close`) is written and the
 * connection ended. The server never sees them: no 'connection' event, so
 * no HTTP parser, no slot of the connection cap, nothing another listener
 * of 'connection' counts. (The first listener of 'connection' is Node's own
 * HTTP handling, which attaches the parser: `emit` is the one place before
 * it.)
 *
 * What the peer sends meanwhile is read and dropped, unparsed: closing a
 * socket with unread bytes makes the kernel reset the connection, and the
 * peer could lose the answer before reading it. The connection closes when
 * the peer closes its side, after `linger.ms` otherwise, and sooner when
 * `linger.max` newer ones are waiting: however fast refused peers connect,
 * they hold a bounded number of descriptors, each for a second at most.
 * `onRefused` is called for each (to count it).
 */
export function refuseAtAccept (server: Server, refused: (socket: Socket) => boolean, answer: string, onRefused: (socket: Socket) => void, linger = REFUSED_LINGER): void {
  // Oldest first: a Set keeps insertion order.
  const lingering = new Set<Socket>()
  const emit = server.emit.bind(server) as (event: string | symbol, ...args: unknown[]) => boolean
  const intercepted = (event: string | symbol, ...args: unknown[]): boolean => {
    if (event !== 'connection') return emit(event, ...args)
    const socket = args[0] as Socket
    if (!refused(socket)) return emit(event, ...args)
    answerAndClose(socket, answer, lingering, linger)
    onRefused(socket)
    return true
  }
  server.emit = intercepted as Server['emit']
}

function answerAndClose (socket: Socket, answer: string, lingering: Set<Socket>, linger: Linger): void {
  socket.on('error', () => { /* a peer gone (reset, EPIPE) needs nothing more */ })
  const timer = setTimeout(() => { socket.destroy() }, linger.ms)
  lingering.add(socket)
  socket.once('close', () => {
    clearTimeout(timer)
    lingering.delete(socket)
  })
  socket.end(answer, 'latin1')
  socket.resume()
  for (const oldest of lingering) {
    if (lingering.size <= linger.max) break
    // Its answer went to the kernel when it was accepted (a fresh socket's first write completes
    // at once); destroySoon would wait for it otherwise.
    lingering.delete(oldest)
    oldest.destroySoon()
  }
}
