// Raw-socket client for the security suite: writes exact bytes, collects every
// byte the proxy sends back until it closes (or a bound is reached), and parses
// what it got as a sequence of HTTP/1.1 responses (a smuggled second request
// that gets answered shows up as a second response).
import { connect, createServer, type Server, type Socket } from 'node:net'
import { listenOnLoopback, startUpstream, type Upstream } from './helpers.js'

export interface RawResponse {
  readonly status: number
  readonly statusLine: string
  /** Header lines as received, names as sent. */
  readonly rawHeaders: readonly (readonly [string, string])[]
  /** Lower-cased name → every value. */
  readonly headers: Readonly<Record<string, readonly string[]>>
  readonly body: Buffer
}

export interface RawResult {
  /** Every byte received. */
  readonly bytes: Buffer
  readonly text: string
  /** Complete responses parsed from `bytes`, 1xx included. */
  readonly responses: readonly RawResponse[]
  /** Final (non-1xx) responses only. */
  readonly finals: readonly RawResponse[]
  /** Bytes after the last complete response (a response cut short, or garbage). */
  readonly leftover: Buffer
  /** The peer ended or closed the connection before we stopped listening. */
  readonly closedByPeer: boolean
  /** Stopped because `timeoutMs` passed. */
  readonly timedOut: boolean
  /** Socket error code, if any (ECONNRESET, …). */
  readonly error: string | undefined
}

export interface RawOptions {
  readonly host?: string
  /** Bind the client socket to this address (e.g. 127.0.0.2). */
  readonly localAddress?: string
  /** Hard bound on the whole exchange. Default 3000 ms. */
  readonly timeoutMs?: number
  /** Stop once this many final responses are complete and nothing more arrived for `settleMs`. Default 1. */
  readonly expect?: number
  /** Quiet period after `expect` responses before stopping (to catch an extra, smuggled, response). Default 150 ms. */
  readonly settleMs?: number
  /** Pause between the parts of `data` when it is an array. Default 0 (still separate writes). */
  readonly gapMs?: number
  /** Half-close our side after writing everything. Default false. */
  readonly endAfterWrite?: boolean
  /** Responses to HEAD carry no body. */
  readonly head?: boolean
}

const HEADER_END = Buffer.from('\r\n\r\n')

interface ParseOutcome { responses: RawResponse[], consumed: number }

function chunkedBody (buf: Buffer, start: number): { body: Buffer, end: number } | undefined {
  const parts: Buffer[] = []
  let pos = start
  for (;;) {
    const lineEnd = buf.indexOf('\r\n', pos)
    if (lineEnd < 0) return undefined
    const size = parseInt(buf.subarray(pos, lineEnd).toString('latin1').split(';')[0]?.trim() ?? '', 16)
    if (Number.isNaN(size)) return undefined
    pos = lineEnd + 2
    if (size === 0) {
      // trailers, then an empty line
      const trailerEnd = buf.indexOf('\r\n', pos)
      if (trailerEnd < 0) return undefined
      if (trailerEnd === pos) return { body: Buffer.concat(parts), end: pos + 2 }
      const end = buf.indexOf(HEADER_END, pos)
      if (end < 0) return undefined
      return { body: Buffer.concat(parts), end: end + 4 }
    }
    if (buf.length < pos + size + 2) return undefined
    parts.push(buf.subarray(pos, pos + size))
    pos += size + 2
  }
}

/** Parses as many complete responses as `buf` holds. `closed`: the stream ended (a body without framing runs to the end). */
export function parseResponses (buf: Buffer, closed: boolean, head = false): ParseOutcome {
  const responses: RawResponse[] = []
  let pos = 0
  while (pos < buf.length) {
    const headEnd = buf.indexOf(HEADER_END, pos)
    if (headEnd < 0) break
    const lines = buf.subarray(pos, headEnd).toString('latin1').split('\r\n')
    const statusLine = lines[0] ?? ''
    const m = /^HTTP\/1\.[01] (\d{3})(?: .*)?$/.exec(statusLine)
    if (m === null) break
    const status = Number(m[1])
    const rawHeaders: [string, string][] = []
    const headers: Record<string, string[]> = {}
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':')
      if (colon < 0) continue
      const name = line.slice(0, colon)
      const value = line.slice(colon + 1).trim()
      rawHeaders.push([name, value])
      ;(headers[name.toLowerCase()] ??= []).push(value)
    }
    let bodyStart = headEnd + 4
    let body: Buffer
    const te = headers['transfer-encoding']?.join(',').toLowerCase() ?? ''
    const cl = headers['content-length']?.[0]
    if ((status >= 100 && status < 200) || status === 204 || status === 304 || head) {
      body = Buffer.alloc(0)
    } else if (te.includes('chunked')) {
      const chunked = chunkedBody(buf, bodyStart)
      if (chunked === undefined) break
      body = chunked.body
      bodyStart = chunked.end
    } else if (cl !== undefined) {
      const n = Number(cl)
      if (buf.length < bodyStart + n) break
      body = buf.subarray(bodyStart, bodyStart + n)
      bodyStart += n
    } else {
      if (!closed) break
      body = buf.subarray(bodyStart)
      bodyStart = buf.length
    }
    responses.push({ status, statusLine, rawHeaders, headers, body })
    pos = bodyStart
  }
  return { responses, consumed: pos }
}

export interface RawRequestHead {
  /** e.g. "POST /x HTTP/1.1" */
  readonly requestLine: string
  readonly headers: Readonly<Record<string, readonly string[]>>
  readonly bodyBytes: number
  /** The body was complete in the bytes seen. */
  readonly complete: boolean
  /** This request's bytes as sent, head and framed body. */
  readonly bytes: Buffer
  /** The body's content (a chunked one decoded); empty unless complete. */
  readonly body: Buffer
}

/**
 * Splits what a client (the proxy) wrote on one connection into requests, by
 * Content-Length or chunked framing: an independent reading of the bytes the
 * upstream received, to compare with what the upstream's own parser saw.
 */
export function parseRequests (buf: Buffer): RawRequestHead[] {
  const out: RawRequestHead[] = []
  let pos = 0
  while (pos < buf.length) {
    const headEnd = buf.indexOf(HEADER_END, pos)
    if (headEnd < 0) break
    const lines = buf.subarray(pos, headEnd).toString('latin1').split('\r\n')
    const headers: Record<string, string[]> = {}
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':')
      if (colon > 0) (headers[line.slice(0, colon).toLowerCase()] ??= []).push(line.slice(colon + 1).trim())
    }
    const start = headEnd + 4
    const te = headers['transfer-encoding']?.join(',').toLowerCase() ?? ''
    const cl = headers['content-length']?.[0]
    const requestLine = lines[0] ?? ''
    const empty = Buffer.alloc(0)
    if (te.includes('chunked')) {
      const chunked = chunkedBody(buf, start)
      if (chunked === undefined) {
        out.push({ requestLine, headers, bodyBytes: buf.length - start, complete: false, bytes: buf.subarray(pos), body: empty })
        break
      }
      out.push({ requestLine, headers, bodyBytes: chunked.body.length, complete: true, bytes: buf.subarray(pos, chunked.end), body: chunked.body })
      pos = chunked.end
    } else {
      const n = cl === undefined ? 0 : Number(cl)
      const complete = buf.length >= start + n
      const end = Math.min(start + n, buf.length)
      out.push({ requestLine, headers, bodyBytes: end - start, complete, bytes: buf.subarray(pos, end), body: complete ? buf.subarray(start, end) : empty })
      if (!complete) break
      pos = end
    }
  }
  return out
}

function isFinal (r: RawResponse): boolean {
  return r.status >= 200
}

/**
 * Connects, writes `data` (one write, or each part in turn `gapMs` apart;
 * strings are written as latin1, one byte per character),
 * and collects the answer: until the peer closes, `expect` final responses are
 * complete and `settleMs` pass without more bytes, or `timeoutMs` passes.
 */
export function rawRequest (port: number, data: string | Buffer | readonly (string | Buffer)[], opts: RawOptions = {}): Promise<RawResult> {
  const timeoutMs = opts.timeoutMs ?? 3000
  const expect = opts.expect ?? 1
  const settleMs = opts.settleMs ?? 150
  const parts = typeof data === 'string' || Buffer.isBuffer(data) ? [data] : data
  return new Promise(resolve => {
    const chunks: Buffer[] = []
    let closedByPeer = false
    let timedOut = false
    let error: string | undefined
    let done = false
    let settle: NodeJS.Timeout | undefined
    const socket: Socket = connect({ host: opts.host ?? '127.0.0.1', port, ...(opts.localAddress === undefined ? {} : { localAddress: opts.localAddress }) })
    const finish = (): void => {
      if (done) return
      done = true
      clearTimeout(hard)
      clearTimeout(settle)
      socket.destroy()
      const bytes = Buffer.concat(chunks)
      const { responses, consumed } = parseResponses(bytes, closedByPeer, opts.head)
      resolve({
        bytes,
        text: bytes.toString('latin1'),
        responses,
        finals: responses.filter(isFinal),
        leftover: bytes.subarray(consumed),
        closedByPeer,
        timedOut,
        error,
      })
    }
    const hard = setTimeout(() => { timedOut = true; finish() }, timeoutMs)
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      clearTimeout(settle)
      const { responses } = parseResponses(Buffer.concat(chunks), false, opts.head)
      if (responses.filter(isFinal).length >= expect) settle = setTimeout(finish, settleMs)
    })
    socket.on('end', () => { closedByPeer = true; finish() })
    socket.on('close', () => { closedByPeer = true; finish() })
    socket.on('error', (err: NodeJS.ErrnoException) => { error = err.code ?? err.message; finish() })
    socket.once('connect', () => {
      void (async () => {
        for (const [i, part] of parts.entries()) {
          if (done || socket.destroyed) return
          if (i > 0 && (opts.gapMs ?? 0) > 0) await new Promise(resolve => setTimeout(resolve, opts.gapMs))
          socket.write(typeof part === 'string' ? Buffer.from(part, 'latin1') : part)
        }
        if (opts.endAfterWrite === true && !socket.destroyed) socket.end()
      })()
    })
  })
}

/** `{"error":{"code","message"}}` or undefined when the body is not that shape. */
export function errorOf (res: RawResponse | undefined): { code: string, message: string } | undefined {
  if (res === undefined) return undefined
  let parsed: unknown
  try {
    parsed = JSON.parse(res.body.toString('utf8'))
  } catch {
    return undefined
  }
  if (typeof parsed !== 'object' || parsed === null) return undefined
  const error = (parsed as { error?: unknown }).error
  if (typeof error !== 'object' || error === null) return undefined
  const { code, message } = error as { code?: unknown, message?: unknown }
  if (typeof code !== 'string' || typeof message !== 'string' || Object.keys(parsed).length !== 1) return undefined
  return { code, message }
}

/** A recording upstream that also counts requests whose headers arrived (recorded ones have a complete body). */
export interface CountingUpstream extends Upstream {
  /** Requests whose head reached the upstream, complete or not. */
  readonly started: () => number
  /** Every request line (method + url) seen, in order, complete or not. */
  readonly seen: string[]
}

export async function startCountingUpstream (...args: Parameters<typeof startUpstream>): Promise<CountingUpstream> {
  const up = await startUpstream(...args)
  const seen: string[] = []
  up.server.on('request', (req: { method?: string, url?: string }) => { seen.push(`${req.method ?? ''} ${req.url ?? ''}`) })
  return Object.assign(up, { started: () => seen.length, seen })
}

/** A TCP relay in front of a port that keeps every byte sent towards it: what the upstream really received on the wire. */
export interface Tap {
  readonly url: string
  readonly port: number
  /** Bytes received per accepted connection, in order. */
  readonly connections: Buffer[][]
  readonly text: () => string
  close: () => Promise<void>
}

export async function startTap (targetPort: number): Promise<Tap> {
  const connections: Buffer[][] = []
  const sockets = new Set<Socket>()
  const server: Server = createServer(client => {
    const seen: Buffer[] = []
    connections.push(seen)
    const target = connect({ host: '127.0.0.1', port: targetPort })
    sockets.add(client)
    sockets.add(target)
    client.on('data', (chunk: Buffer) => { seen.push(chunk) })
    client.pipe(target)
    target.pipe(client)
    const drop = (): void => { client.destroy(); target.destroy(); sockets.delete(client); sockets.delete(target) }
    client.on('close', drop)
    target.on('close', drop)
    client.on('error', drop)
    target.on('error', drop)
  })
  const port = await listenOnLoopback(server)
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    connections,
    text: () => connections.map(c => Buffer.concat(c).toString('latin1')).join('\n--- next connection ---\n'),
    close: () => new Promise<void>(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }),
  }
}

/** A minimal request with Connection: close, for one-shot raw exchanges. */
export function get (path: string, extra = ''): string {
  return `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${extra}Connection: close\r\n\r\n`
}

/** The names of the headers in a raw response, lower-cased. */
export function headerNames (res: RawResponse): string[] {
  return res.rawHeaders.map(([name]) => name.toLowerCase())
}

export interface Conversation {
  /** Every response parsed, 1xx included. */
  readonly responses: readonly RawResponse[]
  /** Final responses, in order: one per request answered. */
  readonly finals: readonly RawResponse[]
  /** Requests written. */
  readonly sent: number
  /** Bytes after the last complete response. */
  readonly leftover: Buffer
  /** The peer ended or closed the connection. */
  readonly closedByPeer: boolean
  /** A request went unanswered for `timeoutMs`. */
  readonly timedOut: boolean
  readonly error: string | undefined
}

/**
 * One connection, one request at a time, as a keep-alive client that does not
 * pipeline (Java's HttpClient, curl, Go, requests): each request is written
 * once the previous one has its final response. Stops when the peer closes, a
 * request goes unanswered for `timeoutMs` (default 3000), or `settleMs`
 * (default 150) after the last answer without more bytes.
 */
export function converse (port: number, requests: readonly (string | Buffer)[], opts: { timeoutMs?: number, settleMs?: number } = {}): Promise<Conversation> {
  const timeoutMs = opts.timeoutMs ?? 3000
  const settleMs = opts.settleMs ?? 150
  return new Promise(resolve => {
    const chunks: Buffer[] = []
    let sent = 0
    let closedByPeer = false
    let timedOut = false
    let error: string | undefined
    let done = false
    let timer: NodeJS.Timeout | undefined
    const socket = connect({ host: '127.0.0.1', port })
    const finish = (): void => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      const { responses, consumed } = parseResponses(Buffer.concat(chunks), closedByPeer)
      const bytes = Buffer.concat(chunks)
      resolve({ responses, finals: responses.filter(isFinal), sent, leftover: bytes.subarray(consumed), closedByPeer, timedOut, error })
    }
    const wait = (ms: number, onTimeout: () => void): void => {
      clearTimeout(timer)
      timer = setTimeout(onTimeout, ms)
    }
    const next = (): void => {
      if (sent === requests.length) {
        wait(settleMs, finish)
        return
      }
      const request = requests[sent++] ?? ''
      socket.write(typeof request === 'string' ? Buffer.from(request, 'latin1') : request)
      wait(timeoutMs, () => { timedOut = true; finish() })
    }
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      const answered = parseResponses(Buffer.concat(chunks), false).responses.filter(isFinal).length
      if (answered >= sent) next()
    })
    socket.on('end', () => { closedByPeer = true; finish() })
    socket.on('close', () => { closedByPeer = true; finish() })
    socket.on('error', (err: NodeJS.ErrnoException) => { error = err.code ?? err.message; finish() })
    socket.once('connect', next)
  })
}

/** A TCP server standing in for an upstream that answers with exact bytes, right or wrong. */
export interface RawUpstream {
  readonly url: string
  readonly port: number
  /** Every request head received (bodies are not expected), in order. */
  readonly heads: string[]
  /** TCP connections accepted so far. */
  readonly accepted: () => number
  close: () => Promise<void>
}

/**
 * Calls `answer` with each request head read on a connection (the proxy
 * sends bodiless requests here) and the socket to write the answer to, or to
 * end or leave hanging. Connections stay open until the answer ends them.
 */
export async function startRawUpstream (answer: (head: string, socket: Socket) => void): Promise<RawUpstream> {
  const heads: string[] = []
  const sockets = new Set<Socket>()
  let accepted = 0
  const server = createServer(socket => {
    accepted++
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => undefined)
    let pending = ''
    socket.on('data', (chunk: Buffer) => {
      pending += chunk.toString('latin1')
      for (let end = pending.indexOf('\r\n\r\n'); end >= 0; end = pending.indexOf('\r\n\r\n')) {
        const head = pending.slice(0, end)
        pending = pending.slice(end + 4)
        heads.push(head)
        answer(head, socket)
      }
    })
  })
  const port = await listenOnLoopback(server)
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    heads,
    accepted: () => accepted,
    close: () => new Promise<void>(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }),
  }
}

/** The path of a request head ("GET /x HTTP/1.1" → "/x"). */
export function pathOf (head: string): string {
  return head.split(' ', 2)[1] ?? ''
}

// Answers that declare trailers. Node refuses to write such a head on a
// response that cannot carry trailers, and did so by throwing out of the
// process (issue 11): the proxy must drop the declaration instead.
const TRAILER_ANSWERS: Readonly<Record<string, string>> = {
  '/chunked': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nTE: trailers\r\n\r\n',
  '/typed': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nTrailer: X-Checksum\r\n\r\n',
  '/untyped': 'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nTrailer: X-Checksum\r\n\r\n',
  '/204': 'HTTP/1.1 204 No Content\r\nTrailer: X-Checksum\r\n\r\n',
}
const TRAILER_BODIES: Readonly<Record<string, string>> = {
  '/chunked': '5\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: 5eb63bbb\r\n\r\n',
  '/typed': 'hello world',
  '/untyped': 'hello world',
  '/204': '',
}

/** A startRawUpstream answer: every path above declares a trailer (and sends no body to HEAD). */
export function answerDeclaringTrailers (head: string, socket: Socket): void {
  const path = pathOf(head)
  socket.write((TRAILER_ANSWERS[path] ?? 'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n') + (head.startsWith('HEAD ') ? '' : TRAILER_BODIES[path] ?? ''))
}

export interface TrailerProbe {
  readonly name: string
  /** The whole request, for rawRequest. */
  readonly request: string
  readonly head: boolean
  readonly status: number
  readonly body: string
}

const probe = (name: string, method: string, path: string, version: string, status: number, body: string): TrailerProbe => ({
  name,
  request: `${method} ${path} HTTP/${version}\r\nHost: 127.0.0.1\r\n${version === '1.1' ? 'Connection: close\r\n' : ''}\r\n`,
  head: method === 'HEAD',
  status,
  body,
})

/** Every way a declared trailer met a response that cannot carry it, plus the chunked GET that can. */
export const TRAILER_PROBES: readonly TrailerProbe[] = [
  probe('HEAD, chunked upstream answer', 'HEAD', '/chunked', '1.1', 200, ''),
  probe('HEAD, answer with a Content-Length', 'HEAD', '/typed', '1.1', 200, ''),
  probe('HTTP/1.0 client, chunked upstream answer', 'GET', '/chunked', '1.0', 200, 'hello world'),
  probe('HTTP/1.0 client, streamed answer', 'GET', '/untyped', '1.0', 200, 'hello world'),
  probe('Trailer with Content-Length, collected body', 'GET', '/typed', '1.1', 200, 'hello world'),
  probe('Trailer with Content-Length, streamed body', 'GET', '/untyped', '1.1', 200, 'hello world'),
  probe('Trailer on a 204', 'GET', '/204', '1.1', 204, ''),
  probe('Trailer on a 204, HTTP/1.0 client', 'GET', '/204', '1.0', 204, ''),
  probe('chunked with trailers on a GET: the body arrives intact', 'GET', '/chunked', '1.1', 200, 'hello world'),
]
