// An upstream request aborted as soon as the client it answers goes away.
import type { Socket } from 'node:net'
import { errors } from 'undici'

/** What is told that its client has gone: an upstream exchange in flight. */
export interface Abortable {
  clientGone: (reason: Error) => void
}

// One instance for every connection: a stack would point here and say nothing.
export const CLIENT_GONE: Error = Object.assign(new errors.RequestAbortedError('the client closed its connection'), { stack: 'AbortError: the client closed its connection' })

const IN_FLIGHT = Symbol('cos-auth-proxy.inFlight')
type TrackedSocket = Socket & { [IN_FLIGHT]?: InFlight | null }

/**
 * The exchanges in flight on one connection. Almost always one at a time (a
 * client pipelines rarely): that one is held in a field, and a Set is made
 * only for the others. A Set for every exchange cost its add and delete
 * and the identity hash each new exchange needs for it (~0.3 µs a request
 * in a CPU profile, with the token changes of the same commit 1.053× by
 * bench:ab).
 */
class InFlight {
  one: Abortable | undefined
  more: Set<Abortable> | undefined

  add (exchange: Abortable): void {
    if (this.one === undefined) this.one = exchange
    else (this.more ??= new Set()).add(exchange)
  }

  delete (exchange: Abortable): void {
    if (this.one === exchange) this.one = undefined
    else this.more?.delete(exchange)
  }
}

function abortAll (this: TrackedSocket): void {
  const inFlight = this[IN_FLIGHT]
  this[IN_FLIGHT] = null
  if (!inFlight) return
  inFlight.one?.clientGone(CLIENT_GONE)
  if (inFlight.more) for (const exchange of inFlight.more) exchange.clientGone(CLIENT_GONE)
}

/**
 * Ties an upstream exchange to the client connection it answers: when that
 * connection closes, nobody is left to read what the upstream would answer,
 * and the exchange is told at any stage (queued in the pool, waiting for the
 * head, streaming the body). The socket rather than the response, whose
 * 'close' never fires for a pipelined request queued behind another. One
 * listener and one InFlight per connection, shared by the requests on it;
 * it sits on the socket itself (a WeakMap lookup would cost more).
 * Returns false when the connection is already closed (or closing): then
 * nothing is to be sent, and its response was closed with it (by Node, or,
 * queued behind another, by closeWithConnection in src/client/connections.ts)
 * so the request is logged and counted as 499 all the same.
 */
export function trackUntilClientGone (socket: Socket, exchange: Abortable): boolean {
  const s = socket as TrackedSocket
  let inFlight = s[IN_FLIGHT]
  if (inFlight === null || socket.destroyed) return false
  if (inFlight === undefined) {
    inFlight = new InFlight()
    s[IN_FLIGHT] = inFlight
    socket.once('close', abortAll)
  }
  inFlight.add(exchange)
  return true
}

/** The exchange finished: its client's connection closing is no longer its concern. */
export function untrack (socket: Socket, exchange: Abortable): void {
  (socket as TrackedSocket)[IN_FLIGHT]?.delete(exchange)
}
