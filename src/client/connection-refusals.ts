// Connection-level refusals: what Node's parser rejects (bad framing,
// unknown methods, oversized headers, slow senders) and CONNECT, answered on
// the raw socket in the proxy's JSON error shape, and the condemnation of a
// connection after a refusal, so nothing pipelined behind it is forwarded;
// peers refused whatever they send, answered and closed at accept.
import type { IncomingMessage, Server } from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import type { FastifyReply } from 'fastify'
import { MAX_OUTSTANDING_PER_CONNECTION, MAX_PIPELINED_PER_LISTENER, type WithPendingResponse } from './connections.js'
import { ALLOW, notForwarded, type Refusal } from './request-guard.js'

/**
 * A request beyond MAX_OUTSTANDING_PER_CONNECTION on its connection, or
 * MAX_PIPELINED_PER_LISTENER on its listener (connections.ts), on a
 * listener whose policy refuses it (`beyondBound: 'refuse'`): not processed, and the connection closed after it (condemn), so
 * what was pipelined behind it is dropped.
 */
export const TOO_MANY_PIPELINED: Refusal = [503, 'too_many_pipelined', `too many requests pipelined (at most ${MAX_OUTSTANDING_PER_CONNECTION} outstanding on one connection, ${MAX_PIPELINED_PER_LISTENER} waiting on all of them): this one and those pipelined behind it were not processed; send them again on a new connection`]

const CLIENT_ERRORS: Readonly<Record<string, readonly [number, string, string]>> = {
  HPE_HEADER_OVERFLOW: [431, 'request_header_fields_too_large', 'the request headers exceed 16 KiB'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request_timeout', 'the request was not received in time'],
  ERR_HTTP_HEADERS_TIMEOUT: [408, 'request_timeout', 'the request headers were not received in time'],
}

/** A whole HTTP/1.1 response in the JSON error shape, saying `connection: close`. */
export function rawErrorResponse (status: number, code: string, message: string, headers = ''): string {
  const body = JSON.stringify({ error: { code, message } })
  return `HTTP/1.1 ${status} ${STATUS_CODES_TEXT[status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${headers}connection: close\r\n\r\n${body}`
}

function writeRawError (socket: Duplex, status: number, code: string, message: string, headers = ''): void {
  if (socket.writable) socket.write(rawErrorResponse(status, code, message, headers))
  socket.destroy()
}

const STATUS_CODES_TEXT: Readonly<Record<number, string>> = { 400: 'Bad Request', 403: 'Forbidden', 405: 'Method Not Allowed', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' }

/**
 * Connections on which nothing more is forwarded: a request on them was
 * refused (the refusal says `connection: close`), could not be parsed, or
 * was CONNECT. Node parses ahead and hands over every request it finds
 * while earlier answers are still pending, queueing their responses; the
 * ones behind a refusal would run upstream (a POST nobody receives the
 * answer to, so a retry duplicates it) and their answers never be written.
 * The value: how many requests were dropped so far (see droppedBehindRefusal).
 */
const condemned = new WeakMap<Duplex, { dropped: number, readonly maxDropped: number }>()

// A client that pipelines this many requests behind a refused one is cut
// off: each dropped request is held until the connection closes.
const MAX_DROPPED = 100

/**
 * Marks the connection; false when it already was. `maxDropped`: how many
 * requests behind the refusal are dropped before the connection is cut off
 * instead. A refusal for pipelining too much gives none: its client has
 * already sent more than any legitimate one does, and each request held
 * behind answers it does not read costs what it costs until it does.
 */
export function condemn (socket: Duplex, maxDropped = MAX_DROPPED): boolean {
  if (condemned.has(socket)) return false
  // The dropped requests' responses are queued behind the refusal: they are
  // closed with the connection (closeWithConnection), which writes their log
  // lines and settles the in-flight gauge.
  condemned.set(socket, { dropped: 0, maxDropped })
  return true
}

/**
 * Drops a request parsed behind the refusal that closes its connection:
 * not forwarded and not answered (its answer would queue behind the
 * refusal, and the connection closes once that is written). Logged as 400.
 * False when the connection is not condemned.
 */
export function droppedBehindRefusal (reply: FastifyReply): boolean {
  const socket = reply.request.raw.socket
  const state = condemned.get(socket)
  if (state === undefined) return false
  reply.code(400)
  reply.hijack()
  // Holding the socket means nothing is queued ahead: the refusal is out, only the close is left.
  if (reply.raw.socket !== null || ++state.dropped > state.maxDropped) socket.destroy()
  return true
}

/**
 * Runs `answer` (which writes and closes) once the responses owed to the
 * requests before the faulty one on this connection are written, so those
 * arrive whole and in order and the error comes last. When the response in
 * progress answers the very request at fault (an error in its body) it is
 * answered now, or, if that response has begun, the connection is only
 * closed: an error written into it would be misread.
 */
function afterOwedResponses (socket: Duplex, answer: () => void): void {
  const pending = (socket as WithPendingResponse<Duplex>)._httpMessage
  if (pending == null) answer()
  else if (pending.req.complete) pending.once('finish', () => { afterOwedResponses(socket, answer) })
  else if (pending.headersSent) socket.destroy()
  else answer()
}

type ParseError = Error & { code?: string, rawPacket?: unknown, bytesParsed?: unknown }

function isTokenByte (b: number | undefined): boolean {
  return b !== undefined && b > 0x20 && b < 0x7f && !'"(),/:;<=>?@[\\]{}'.includes(String.fromCharCode(b))
}

/**
 * The method Node's parser did not know (`FOO /x HTTP/1.1`), read around the
 * byte it stopped at; undefined when no method-like token followed by a space
 * is there (then the request is plain garbage, 400). The name itself is
 * given only when it starts a line: a method cut in two by a TCP segment
 * boundary would be misnamed.
 */
function unknownMethod (err: ParseError): string | undefined {
  const packet = err.rawPacket
  const at = err.bytesParsed
  if (!Buffer.isBuffer(packet) || typeof at !== 'number') return undefined
  let start = at
  // Backwards over what the parser took for the start of a known method (PROPFOO: PROP…).
  while (start > 0 && /[A-Z_-]/.test(String.fromCharCode(packet[start - 1] ?? 0))) start--
  let end = at
  while (end < packet.length && end - start <= 32 && isTokenByte(packet[end])) end++
  if (end === start || end - start > 32 || packet[end] !== 0x20) return undefined
  return start === 0 || packet[start - 1] === 0x0a ? packet.toString('latin1', start, end) : 'this method'
}

/**
 * Requests Node's parser rejects (bad framing, unknown methods, oversized
 * headers, slow senders) get the JSON error shape too, after the answers
 * owed to earlier requests on the connection (see afterOwedResponses).
 * Once a connection is condemned, later errors on it (more garbage, a
 * timeout while an earlier answer is pending) add nothing.
 */
export function rejectMalformed (err: ParseError, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed || !condemn(socket)) return
  const method = err.code === 'HPE_INVALID_METHOD' ? unknownMethod(err) : undefined
  if (method !== undefined) {
    afterOwedResponses(socket, () => { writeRawError(socket, 405, 'method_not_allowed', notForwarded(method), `allow: ${ALLOW}\r\n`) })
    return
  }
  const [status, code, message] = CLIENT_ERRORS[err.code ?? ''] ?? [400, 'bad_request', 'malformed HTTP request']
  afterOwedResponses(socket, () => { writeRawError(socket, status, code, message) })
}

/**
 * CONNECT is handed to a 'connect' listener before routing; with none, Node
 * would drop the socket without an answer.
 */
export function refuseConnect (_req: IncomingMessage, socket: Duplex): void {
  // Node has detached its HTTP handling from the socket, including the
  // relay that tells a response still being written that the socket drained.
  socket.on('drain', () => { (socket as WithPendingResponse<Duplex>)._httpMessage?.emit('drain') })
  if (condemn(socket)) afterOwedResponses(socket, () => { writeRawError(socket, 400, 'bad_request', 'CONNECT is not supported: this is not a forward proxy') })
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
