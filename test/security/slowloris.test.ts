// Slow clients: a bounded slow-loris run (200 connections trickling header
// bytes) while a well-behaved client keeps being served, then the other
// timeouts and the connection cap. The only timing assertions are the bounds
// within which the proxy must have closed the slow connections.
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { startProxy } from '../support/helpers.js'
import { errorOf, get, parseResponses, rawRequest, startCountingUpstream } from '../support/raw.js'

interface Slow {
  readonly opened: number
  closedAt: number | undefined
  /** We gave up on it (the proxy never closed it). */
  abandoned: boolean
  readonly data: Buffer[]
  readonly socket: Socket
  timer: NodeJS.Timeout | undefined
}

/** Connects and writes `head`, then one byte of `drip` every `everyMs`, until the proxy closes the connection. */
function openSlow (port: number, head: string, drip: string, everyMs: number): Slow {
  const socket = connect({ host: '127.0.0.1', port })
  const slow: Slow = { opened: Date.now(), closedAt: undefined, abandoned: false, data: [], socket, timer: undefined }
  socket.on('connect', () => {
    if (head !== '') socket.write(head)
    if (drip !== '') slow.timer = setInterval(() => { if (!socket.destroyed) socket.write(drip) }, everyMs)
  })
  socket.on('data', (chunk: Buffer) => { slow.data.push(chunk) })
  socket.on('error', () => { /* reset by the proxy: counts as closed */ })
  socket.on('close', () => {
    clearInterval(slow.timer)
    if (!slow.abandoned) slow.closedAt = Date.now()
  })
  return slow
}

function abandon (slows: readonly Slow[]): void {
  for (const s of slows) {
    if (s.closedAt === undefined) s.abandoned = true
    clearInterval(s.timer)
    s.socket.destroy()
  }
}

/** 408 in the JSON shape, or a close without a byte. */
function closedProperly (s: Slow): boolean {
  const bytes = Buffer.concat(s.data)
  if (bytes.length === 0) return true
  const [res] = parseResponses(bytes, true).responses
  return res?.status === 408 && errorOf(res)?.code === 'request_timeout'
}

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

t.test('200 slow-loris connections cannot stop a well-behaved client, and are closed soon after the header timeout', async t => {
  const headersTimeout = 1000
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, COS_HEADERS_TIMEOUT_MS: String(headersTimeout) })
  const slows: Slow[] = []
  t.teardown(async () => { abandon(slows); await proxy.close(); await up.close() })

  for (let i = 0; i < 200; i++) slows.push(openSlow(proxy.port, `GET /slow/${i} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-${i}: `, 'a', 200))
  const start = Date.now()
  const statuses: number[] = []
  // The good client: one request after another, each on a new connection, for 3.5 s.
  while (Date.now() - start < 3500) {
    const res = await rawRequest(proxy.port, get('/good'), { timeoutMs: 2000 })
    statuses.push(res.finals[0]?.status ?? 0)
    await sleep(20)
  }
  // Wait (bounded) for the last slow sockets to be closed.
  const deadline = start + headersTimeout + 2500
  while (Date.now() < deadline && slows.some(s => s.closedAt === undefined)) await sleep(50)
  abandon(slows)

  t.ok(statuses.length >= 20, `the good client made ${statuses.length} requests during the run`)
  t.same(statuses.filter(s => s !== 200), [], 'every request of the good client got 200')
  const open = slows.filter(s => s.closedAt === undefined)
  t.equal(open.length, 0, `every slow connection was closed by the proxy within ${headersTimeout + 2500} ms of opening (${open.length} still open)`)
  const latest = Math.max(...slows.map(s => (s.closedAt ?? Infinity) - s.opened))
  t.ok(latest <= headersTimeout + 2500, `the last one closed ${latest} ms after it opened`)
  t.same(slows.filter(s => !closedProperly(s)).map(s => Buffer.concat(s.data).toString('latin1').slice(0, 80)), [], 'each got a JSON 408 or a plain close')
  t.notOk(up.seen.some(l => l.includes('/slow/')), 'no slow request reached the upstream')
  t.equal(up.received.length, statuses.length, 'the upstream saw exactly the good requests')
})

t.test('keep-alive connections kept busy with empty lines are closed too, and cannot hold the connection cap', async t => {
  // One real request, then "\r\n" every 200 ms: the parser skips empty lines
  // before a request line, so no request (and no header timer) ever starts,
  // while every byte re-arms the idle keep-alive timer.
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, COS_HEADERS_TIMEOUT_MS: '1000', COS_KEEPALIVE_TIMEOUT_MS: '300', COS_MAX_CONNECTIONS: '5' })
  const slows: Slow[] = []
  t.teardown(async () => { abandon(slows); await proxy.close(); await up.close() })
  for (let i = 0; i < 5; i++) slows.push(openSlow(proxy.port, `GET /first/${i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, '\r\n', 200))
  const start = Date.now()
  await sleep(3000)
  const good = await rawRequest(proxy.port, get('/good'), { timeoutMs: 500 })
  const deadline = start + 3500
  while (Date.now() < deadline && slows.some(s => s.closedAt === undefined)) await sleep(50)
  abandon(slows)
  t.equal(up.received.filter(r => r.url.startsWith('/first/')).length, 5, 'the five first requests were served')
  t.same(slows.filter(s => s.closedAt === undefined).map((_, i) => i), [], 'every connection was closed by the proxy within 3.5 s (keep-alive 300 ms, headers 1000 ms)')
  t.equal(good.finals[0]?.status, 200, `a well-behaved client is served 3 s in (got ${good.finals[0]?.status ?? (good.closedByPeer ? 'connection closed without an answer' : 'nothing')})`)
})

t.test('slow body, idle connection, idle keep-alive and the connection cap are all bounded', async t => {
  const up = await startCountingUpstream()
  const proxy = await startProxy({
    COS_API_URL: up.url,
    COS_HEADERS_TIMEOUT_MS: '1000',
    COS_REQUEST_TIMEOUT_MS: '1500',
    COS_KEEPALIVE_TIMEOUT_MS: '300',
  })
  const capped = await startProxy({ COS_API_URL: up.url, COS_MAX_CONNECTIONS: '5', COS_HEADERS_TIMEOUT_MS: '1000' })
  const slows: Slow[] = []
  t.teardown(async () => { abandon(slows); await proxy.close(); await capped.close(); await up.close() })

  // Headers complete, then the body one byte every 200 ms (R.U.D.Y.).
  const slowBody = openSlow(proxy.port, 'POST /slow-body HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n', 'a', 200)
  // Connects and never sends a byte.
  const idle = openSlow(proxy.port, '', '', 0)
  // One request on a keep-alive connection, then silence.
  const keepAlive = openSlow(proxy.port, 'GET /keep-alive HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', '', 0)
  slows.push(slowBody, idle, keepAlive)

  // Connection cap: 5 idle connections fill it; the next one displaces the one idle longest
  // (issue 43; when every connection is busy it is closed instead: test/security/refused-peers.test.ts).
  const fillers = Array.from({ length: 5 }, () => openSlow(capped.port, '', '', 0))
  slows.push(...fillers)
  await sleep(200)
  const over = await rawRequest(capped.port, get('/over-cap'), { timeoutMs: 1000 })
  t.equal(over.finals[0]?.status, 200, 'a connection over COS_MAX_CONNECTIONS is answered: an idle one made room')
  t.equal(fillers.filter(f => f.closedAt !== undefined).length, 1, 'one idle filler was closed for it')

  const deadline = Date.now() + 4000
  while (Date.now() < deadline && slows.some(s => s.closedAt === undefined)) await sleep(50)
  abandon(slows)

  const after = (s: Slow): number => (s.closedAt ?? Infinity) - s.opened
  t.ok(after(slowBody) <= 1500 + 2000, `slow body closed after ${after(slowBody)} ms (request timeout 1500 ms)`)
  t.ok(closedProperly(slowBody), 'slow body: JSON 408 or a plain close')
  t.notOk(up.received.some(r => r.url === '/slow-body'), 'the slow body never completed at the upstream')
  t.ok(after(idle) <= 1000 + 2000, `idle connection closed after ${after(idle)} ms (headers timeout 1000 ms)`)
  t.ok(closedProperly(idle), 'idle connection: JSON 408 or a plain close')
  t.ok(after(keepAlive) <= 300 + 2000, `idle keep-alive connection closed after ${after(keepAlive)} ms (keep-alive timeout 300 ms)`)
  t.match(Buffer.concat(keepAlive.data).toString('latin1'), /^HTTP\/1\.1 200 /, 'the keep-alive request itself was answered')
  for (const [i, f] of fillers.entries()) t.ok(after(f) <= 1000 + 2000, `filler ${i} closed after ${after(f)} ms`)

  // Once the cap's slots are free again, the capped proxy serves.
  const res = await rawRequest(capped.port, get('/after-cap'))
  t.equal(res.finals[0]?.status, 200, 'the capped proxy serves again once the idle connections are gone')
  const normal = await rawRequest(proxy.port, get('/after'))
  t.equal(normal.finals[0]?.status, 200, 'the proxy still serves')
})
