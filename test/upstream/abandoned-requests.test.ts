// A client that goes away takes its upstream request with it: whatever stage
// the request is in (waiting for the answer, streaming it, uploading a body),
// the upstream sees its connection closed at once and the pool keeps nothing.
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { ProxyMetrics, classifyUpstreamError } from '../../src/observability/metrics.js'
import { RequestLog } from '../../src/observability/request-log.js'
import { buildProxyServer, upstreamsFor } from '../../src/proxy/proxy-server.js'
import type { SwappableDispatcher } from '../../src/upstream/upstream.js'
import { LogCapture, send, stallingUpstream, streamForever, testConfig } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'

/** Well under any upstream timeout here (30 s): a close this soon was the abort. */
const PROMPTLY_MS = scaled(1000)

/** The real proxy, with its upstream pool and metrics in reach. */
async function startWatchedProxy (upstreamUrl: string, env: Record<string, string> = {}): Promise<{
  port: number
  pool: SwappableDispatcher
  metrics: ProxyMetrics
  logs: LogCapture
  close: () => Promise<void>
}> {
  const config = testConfig({ COS_API_URL: upstreamUrl, ...env })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const logs = new LogCapture()
  const logger = createLogger('info', logs)
  const upstreams = upstreamsFor(config, logger)
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const observer = {
    requestStarted: () => { metrics.requestStarted() },
    requestFinished: (route: string, method: string, status: number, total: number, upstream: number | undefined, aborted: boolean) => { metrics.requestFinished(route, method, status, total, upstream, aborted) },
    upstreamError: (route: string, err: Error) => { metrics.upstreamError(route, classifyUpstreamError(err)) },
    retried: (route: string, reason: 'connect' | 'unauthorized') => { metrics.retried(route, reason) },
    tokenMinted: () => { metrics.tokenMinted() },
  }
  const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger, upstreams, observer, requestLog: new RequestLog(observer) })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  if (address === null || typeof address === 'string') throw new Error('no port')
  return { port: address.port, pool: upstreams.dispatcherFor(new URL(upstreamUrl).origin), metrics, logs, close: () => app.close() }
}

async function until (what: string, check: () => boolean, ms = 3000): Promise<void> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 10))
  }
}

/** A raw client connection that sends `bytes` and keeps what comes back. */
async function rawClient (port: number, bytes: string): Promise<{ socket: Socket, received: () => string }> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => undefined)
  let received = ''
  socket.on('data', (chunk: Buffer) => { received += chunk.toString('latin1') })
  await new Promise(resolve => socket.once('connect', resolve))
  socket.write(bytes)
  return { socket, received: () => received }
}

/** Nothing running, waiting or queued on the pool: no request holds a connection. */
function statsOf (pool: SwappableDispatcher): NonNullable<SwappableDispatcher['stats']> {
  const stats = pool.stats
  if (stats === undefined) throw new Error('a direct pool was expected (no egress proxy)')
  return stats
}

function poolHoldsNothing (pool: SwappableDispatcher): boolean {
  const { running, pending, queued } = statsOf(pool)
  return running === 0 && pending === 0 && queued === 0
}

const GET = 'GET /slow HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n'

/** One stage at which a client leaves, and how to get the request there. */
interface Departure {
  readonly when: string
  readonly request: string
  readonly answer?: (socket: Socket, head: string) => void
  readonly env?: Record<string, string>
  /** Request heads the upstream must have before the client leaves. */
  readonly heads?: number
  /** Anything else to wait for before leaving. */
  readonly ready?: (received: () => string) => Promise<void>
}

let smallBodySentAt = 0
const UPLOAD = 'POST /upload HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n'
const DEPARTURES: readonly Departure[] = [
  { when: 'before the response headers', request: GET },
  {
    when: 'during a streamed response body',
    request: GET,
    answer: streamForever,
    ready: received => until('the stream to reach the client', () => received().includes('data:')),
  },
  {
    // Small bodies of a declared length are collected before the answer goes out (forward-response.ts).
    when: 'while the proxy collects a small response body',
    request: GET,
    answer: socket => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"partial":')
      smallBodySentAt = Date.now()
    },
    ready: async () => {
      await until('the upstream to send part of its body', () => smallBodySentAt > 0)
      await new Promise(resolve => setTimeout(resolve, 100)) // for the head to reach the proxy
    },
  },
  { when: 'during a streamed upload', request: UPLOAD },
  // Without the limit undici sees the body end early; with it the body is piped through a counter that does not.
  { when: 'during a streamed upload limited by COS_MAX_BODY_BYTES', request: UPLOAD, env: { COS_MAX_BODY_BYTES: '1000000' } },
  // Node never closes the response of a request queued behind another: the
  // abort hangs off the client's connection, not off the response.
  { when: 'with a pipelined request queued behind the first', request: GET + GET, heads: 2 },
]

for (const d of DEPARTURES) {
  t.test(`a client that leaves ${d.when} gets its upstream request aborted at once`, async t => {
    const heads = d.heads ?? 1
    const up = await stallingUpstream(d.answer)
    const proxy = await startWatchedProxy(up.url, d.env)
    t.teardown(async () => { await proxy.close(); await up.close() })
    const client = await rawClient(proxy.port, d.request)
    await until('the request to reach the upstream', () => up.heads() === heads)
    await d.ready?.(client.received)
    t.equal(statsOf(proxy.pool).running, heads, 'the request holds a pool connection')
    const leftAt = Date.now()
    client.socket.destroy()
    await until('the upstream to see its connection closed', () => up.closedAt.length === heads)
    const ms = Math.max(...up.closedAt) - leftAt
    t.ok(ms < PROMPTLY_MS, `the upstream saw its connection closed ${ms} ms after the client left`)
    await until('the pool to let go', () => poolHoldsNothing(proxy.pool))
  })
}

t.test('abandoned requests hold no pool connection: after 20 of them to a stalling upstream the next request goes through', async t => {
  const up = await stallingUpstream((socket, head) => {
    if (head.startsWith('GET /ok ')) socket.write('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok')
  })
  const proxy = await startWatchedProxy(up.url)
  t.teardown(async () => { await proxy.close(); await up.close() })
  const clients = await Promise.all(Array.from({ length: 20 }, () => rawClient(proxy.port, 'GET /stall HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n')))
  await until('the 20 requests to reach the upstream', () => up.heads() === 20)
  t.equal(statsOf(proxy.pool).running, 20, 'each holds a pool connection while it waits')
  for (const c of clients) c.socket.destroy()
  await until('the upstream to see the 20 connections closed', () => up.closedAt.length === 20)
  await until('the pool to let go', () => poolHoldsNothing(proxy.pool))
  const startedAt = Date.now()
  const res = await send(`http://127.0.0.1:${proxy.port}/ok`)
  t.equal(res.status, 200, 'the next request is answered')
  t.equal(res.body.toString(), 'ok')
  t.ok(Date.now() - startedAt < PROMPTLY_MS, 'answered without waiting for a connection')
})

t.test('an abandoned request is logged as aborted with status 499 and counted, never as an upstream error', async t => {
  const up = await stallingUpstream()
  const proxy = await startWatchedProxy(up.url)
  t.teardown(async () => { await proxy.close(); await up.close() })
  const client = await rawClient(proxy.port, GET)
  await until('the request to reach the upstream', () => up.heads() === 1)
  client.socket.destroy()
  await until('the upstream to see its connection closed', () => up.closedAt.length === 1)
  await until('the request line', () => proxy.logs.records.some(r => r.msg === 'request'))
  const line = proxy.logs.records.find(r => r.msg === 'request')
  t.match(line, { route: 'api', status: 499, aborted: true }, 'logged as a client closed request')
  t.notOk(proxy.logs.records.some(r => r.msg === 'request failed'), 'no error logged for it')
  await new Promise(resolve => setTimeout(resolve, 50)) // the aborted upstream request reports back
  const text = await proxy.metrics.text()
  t.match(text, /cos_auth_proxy_requests_aborted_total\{route="api"\} 1/, 'counted as aborted')
  t.match(text, /cos_auth_proxy_requests_total\{route="api",method="GET",status_class="4xx"\} 1/, 'and as a 4xx')
  t.notMatch(text, /cos_auth_proxy_upstream_errors_total\{/, 'not an upstream error')
  t.match(text, /cos_auth_proxy_in_flight_requests 0/, 'no longer in flight')
})
