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
type TrackedSocket = Socket & { [IN_FLIGHT]?: Set<Abortable> | null }

function abortAll (this: TrackedSocket): void {
  const inFlight = this[IN_FLIGHT]
  this[IN_FLIGHT] = null
  if (inFlight) for (const exchange of inFlight) exchange.clientGone(CLIENT_GONE)
}

/**
 * Ties an upstream exchange to the client connection it answers: when that
 * connection closes, nobody is left to read what the upstream would answer,
 * and the exchange is told at any stage (queued in the pool, waiting for the
 * head, streaming the body). The socket rather than the response, whose
 * 'close' never fires for a pipelined request queued behind another. One
 * listener and one Set per connection, shared by the requests on it; the
 * Set sits on the socket itself (a WeakMap lookup would cost more).
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
    inFlight = new Set()
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
