// Shared test fixtures: a real upstream that records what it received and a
// real proxy listening on 127.0.0.1. No mocks of the network.
import { createHash } from 'node:crypto'
import { createServer, request as httpRequest, type Agent, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import { scaled } from './time-scale.js'
import { loadConfig, type Config } from '../../src/config/config.js'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import type { ProxyObserver } from '../../src/proxy/proxy.js'
import type { RequestObserver } from '../../src/observability/request-log.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { parseToken, queryEscape } from '../../src/token/token.js'

export const ACCESS_KEY = 'AKIDTEST'
// Marker text so a leak can never be a coincidence.
export const SECRET = 'SeCrEt-MaRkEr-7f3a+/=9'

export interface Received {
  readonly method: string
  readonly url: string
  readonly headers: IncomingHttpHeaders
  readonly rawHeaders: readonly string[]
  readonly bodyBytes: number
  readonly bodySha256: string
}

export type UpstreamHandler = (req: IncomingMessage, res: ServerResponse, received: Received) => void

export interface Upstream {
  readonly url: string
  readonly received: Received[]
  readonly server: Server
  close: () => Promise<void>
}

/** Listens on 127.0.0.1 at a port the system picks; returns the port. */
export async function listenOnLoopback (server: NetServer): Promise<number> {
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  return (server.address() as AddressInfo).port
}

/**
 * A port that refuses connections for as long as a test needs: nothing
 * listens on port 1, and it is never handed out as an ephemeral port (a port
 * that was merely free a moment ago can be taken by a server of another test
 * running in parallel: seen in CI).
 */
export const REFUSING_PORT = 1

/** An HTTP server on 127.0.0.1 that hashes each body as it streams and records the request. */
export async function startUpstream (handler?: UpstreamHandler): Promise<Upstream> {
  const received: Received[] = []
  const server = createServer((req, res) => {
    const hash = createHash('sha256')
    let bytes = 0
    req.on('data', (chunk: Buffer) => { hash.update(chunk); bytes += chunk.length })
    req.on('end', () => {
      const r: Received = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, bodyBytes: bytes, bodySha256: hash.digest('hex') }
      received.push(r)
      if (handler) { handler(req, res, r); return }
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ ok: true }))
    })
  })
  const port = await listenOnLoopback(server)
  return {
    url: `http://127.0.0.1:${port}`,
    received,
    server,
    close: () => new Promise<void>(resolve => { server.closeAllConnections(); server.close(() => resolve()) }),
  }
}

/** Collects every log line in memory. */
export class LogCapture extends Writable {
  readonly lines: string[] = []
  override _write (chunk: Buffer, _enc: BufferEncoding, cb: () => void): void {
    this.lines.push(...chunk.toString('utf8').split('\n').filter(l => l !== ''))
    cb()
  }

  get text (): string { return this.lines.join('\n') }
  get records (): Record<string, unknown>[] { return this.lines.map(l => JSON.parse(l) as Record<string, unknown>) }
}

export interface RunningProxy {
  readonly url: string
  readonly port: number
  readonly app: FastifyInstance
  readonly config: Config
  readonly logs: LogCapture
  readonly credentials: CredentialStore
  close: () => Promise<void>
}

export function testConfig (env: Record<string, string>): Config {
  return loadConfig({
    env: { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET: SECRET, COS_LISTEN_PORT: '0', ...env },
    dotenv: false,
  })
}

/** The real proxy on an ephemeral port, logging to memory at `level`. */
export async function startProxy (env: Record<string, string>, level: Config['logLevel'] = 'info', opts: { readonly observer?: ProxyObserver & RequestObserver } = {}): Promise<RunningProxy> {
  const config = testConfig({ COS_LOG_LEVEL: level, ...env })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(`${pair.variable} ${pair.problem}`)
  const credentials = new CredentialStore(pair.minter)
  const logs = new LogCapture()
  const app = await buildProxyServer({ config, credentials, logger: createLogger(config.logLevel, logs), ...opts })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as AddressInfo
  return { url: `http://127.0.0.1:${port}`, port, app, config, logs, credentials, close: () => app.close() }
}

export interface SimpleResponse {
  readonly status: number
  readonly headers: IncomingHttpHeaders
  readonly rawHeaders: readonly string[]
  readonly body: Buffer
}

/** node:http request (not fetch): full control over headers, bodies and the raw response. */
export function send (url: string, opts: { method?: string, headers?: Record<string, string | string[]>, body?: Buffer | string | AsyncIterable<Buffer> } = {}): Promise<SimpleResponse> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: opts.method ?? 'GET', headers: opts.headers, agent: false }, res => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks) }))
      res.on('error', reject)
    })
    req.on('error', reject)
    const body = opts.body
    if (body === undefined || typeof body === 'string' || Buffer.isBuffer(body)) {
      req.end(body)
    } else {
      void (async () => {
        for await (const chunk of body) req.write(chunk)
        req.end()
      })().catch(reject)
    }
  })
}

export function json (res: SimpleResponse): unknown {
  return JSON.parse(res.body.toString('utf8'))
}

export function sha256 (data: Buffer): string {
  return createHash('sha256').update(data).digest('hex')
}

export interface StallingUpstream {
  readonly url: string
  /** Request heads received so far. */
  heads: () => number
  /** When each connection that brought a request closed (ms since the epoch). */
  readonly closedAt: number[]
  close: () => Promise<void>
}

/**
 * An HTTP upstream on a raw TCP server that records when each connection
 * brought a request head and when it closed. `answer` runs once per
 * connection, on the head; by default nothing is ever answered.
 */
export async function stallingUpstream (answer: (socket: Socket, head: string) => void = () => undefined): Promise<StallingUpstream> {
  const sockets = new Set<Socket>()
  const closedAt: number[] = []
  let heads = 0
  const server = createNetServer(socket => {
    sockets.add(socket)
    socket.on('error', () => undefined)
    let head = ''
    socket.on('data', (chunk: Buffer) => {
      if (head.includes('\r\n\r\n')) return
      head += chunk.toString('latin1')
      if (!head.includes('\r\n\r\n')) return
      heads++
      answer(socket, head)
    })
    socket.on('close', () => { sockets.delete(socket); if (head !== '') closedAt.push(Date.now()) })
  })
  const port = await listenOnLoopback(server)
  return {
    url: `http://127.0.0.1:${port}`,
    heads: () => heads,
    closedAt,
    close: () => new Promise(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }),
  }
}

/** An answer for stallingUpstream: a response head, then a chunk of body every 20 ms for as long as the connection lasts. */
export function streamForever (socket: Socket): void {
  socket.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n')
  const tick = setInterval(() => { if (socket.writable) socket.write('6\r\ndata:\n\r\n') }, 20)
  socket.on('close', () => clearInterval(tick))
}

/** Polls `cond` until it holds or `ms` (scaled to the machine's load) pass. */
/** GET over a keep-alive agent; resolves the status (or the error code), never rejects. */
export function keepAliveGet (url: string, agent: Agent): Promise<number | string> {
  return new Promise(resolve => {
    const req = httpRequest(url, { agent }, res => {
      res.resume()
      res.on('end', () => { resolve(res.statusCode ?? 0) })
      res.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? 'error') })
    })
    req.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? 'error') })
    req.end()
  })
}

/**
 * The JSON lines a process has written to `out` so far: only whole lines, so
 * a read while it is writing one never parses half of it.
 */
export function jsonLines (out: string): Record<string, unknown>[] {
  const whole = out.slice(0, out.lastIndexOf('\n') + 1)
  return whole.split('\n').filter(l => l !== '').map(l => JSON.parse(l) as Record<string, unknown>)
}

export async function until (cond: () => boolean, ms = 2000): Promise<boolean> {
  const deadline = Date.now() + scaled(ms)
  while (!cond()) {
    if (Date.now() > deadline) return false
    await sleep(10)
  }
  return true
}

/** Every form the secret could take in text. */
export function secretForms (secret: string): string[] {
  return [secret, queryEscape(secret), encodeURIComponent(secret), Buffer.from(secret).toString('base64'), Buffer.from(secret).toString('hex'), JSON.stringify(secret).slice(1, -1)]
}

/** Every form a token sent upstream could leave in text: itself raw and encoded, its signature raw and escaped, its nonce. */
export function tokenForms (token: string): string[] {
  const parsed = parseToken(token)
  if (!parsed.ok) throw new Error(`unparsable token ${token}`)
  const { signature, nonce } = parsed.fields
  return [token, decodeURIComponent(token), signature, queryEscape(signature), nonce]
}
