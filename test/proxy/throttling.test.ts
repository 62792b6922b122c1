// Throttling honoured (issue 46): an upstream 429, and a 503 with
// Retry-After, reach the client as the upstream sent them and are never
// retried; they are counted as status_class="throttled". The one retry that
// can follow an answer (a 401 to a key pair rotated while the request was in
// flight) never goes sooner than that answer's Retry-After, and is not made
// when the wait does not fit. Nothing that is not idempotent is ever sent twice.
import type { ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { performance } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { buildProxyServer, metricsObserver } from '../../src/proxy/proxy-server.js'
import { RETRY_AFTER_MAX_MS, retryAfterMs, waitFits } from '../../src/proxy/retry.js'
import { HeaderMinter, secretKey, verifyToken } from '../../src/token/token.js'
import { ACCESS_KEY, SECRET, send, sha256, startProxy, startUpstream, testConfig, until, type Upstream } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'

const P = 'cos_auth_proxy_'
const logger = createLogger('silent')

/** One sample's value from the exposition text; 0 when absent. */
function sample (text: string, name: string, labels: string): number {
  const line = text.split('\n').find(l => l.startsWith(`${P}${name}{`) && labels.split(',').every(l2 => l.includes(l2)))
  return line === undefined ? 0 : Number(line.split(' ').pop())
}

t.test('Retry-After is read as delta-seconds or an HTTP-date, against the answer\'s own Date; anything else is none', async t => {
  const now = Date.parse('Sun, 29 Nov 2026 08:00:00 GMT')
  const cases: [Record<string, string | string[]>, number][] = [
    [{}, -1],
    [{ 'retry-after': '0' }, 0],
    [{ 'retry-after': '7' }, 7000],
    [{ 'retry-after': '007' }, 7000],
    [{ 'retry-after': 'Sun, 29 Nov 2026 08:00:30 GMT' }, 30_000],
    [{ 'retry-after': 'Sunday, 29-Nov-26 08:00:30 GMT' }, 30_000], // RFC 850, obsolete but to be accepted
    [{ 'retry-after': 'Sun Nov 29 08:00:30 2026' }, 30_000], // asctime
    [{ 'retry-after': 'Sun, 29 Nov 2026 07:59:00 GMT' }, 0], // a date past: now
    // The upstream's clock an hour ahead of this node's: its Date, not this node's clock, is what the date is read against.
    [{ 'retry-after': 'Sun, 29 Nov 2026 09:00:02 GMT', date: 'Sun, 29 Nov 2026 09:00:00 GMT' }, 2000],
    [{ 'retry-after': '1.5' }, -1],
    [{ 'retry-after': '-1' }, -1],
    [{ 'retry-after': ' soon' }, -1],
    [{ 'retry-after': '2026' }, 2_026_000], // digits are seconds, never a year
    [{ 'retry-after': 'Sun, 99 Nov 2026 08:00:30 GMT' }, -1],
    [{ 'retry-after': ['1', '2'] }, -1],
    [{ 'retry-after': '9'.repeat(400) }, Infinity], // too large to read is too long to wait, never none
  ]
  for (const [headers, ms] of cases) t.equal(retryAfterMs(headers, now), ms, JSON.stringify(headers))
  t.ok(waitFits(1000, 500, 1500), 'a wait that ends with the timeout fits')
  t.notOk(waitFits(1001, 500, 1500), 'one ms past it does not')
  t.notOk(waitFits(RETRY_AFTER_MAX_MS + 1, 0, 2_147_483_647), 'nor past the cap, whatever the timeout')
  t.notOk(waitFits(Infinity, 0, Infinity), 'nor an unreadable figure')
})

t.test('an upstream 429 and a 503 with Retry-After reach the client unchanged (status, Retry-After in both forms, body byte for byte), are never retried, and count as throttled', async t => {
  const date = new Date(Date.now() + 60_000).toUTCString()
  const big = Buffer.alloc(40 * 1024, 'throttled ')
  const up = await startUpstream((req, res) => {
    const answers: Record<string, () => void> = {
      '/429': () => { res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' }); res.end('{"error":"slow down"}') },
      '/503-date': () => { res.writeHead(503, { 'content-type': 'text/plain', 'retry-after': date }); res.end('maintenance') },
      '/429-streamed': () => { res.writeHead(429, { 'content-type': 'application/octet-stream', 'retry-after': '120' }); res.end(big) },
      '/429-chunked': () => { res.writeHead(429, { 'retry-after': '3' }); res.write('chunk one,'); res.end('chunk two') },
      '/503-plain': () => { res.writeHead(503, { 'content-type': 'text/plain' }); res.end('down') },
    }
    const answer = answers[req.url ?? '']
    if (answer === undefined) res.end('ok')
    else answer()
  })
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const proxy = await startProxy({ COS_API_URL: up.url }, 'info', { observer: metricsObserver(metrics) })
  t.teardown(async () => { await proxy.close(); await up.close() })

  for (const [path, status, retryAfter, body] of [
    ['/429', 429, '7', Buffer.from('{"error":"slow down"}')],
    ['/503-date', 503, date, Buffer.from('maintenance')],
    ['/429-streamed', 429, '120', big],
    ['/429-chunked', 429, '3', Buffer.from('chunk one,chunk two')],
  ] as const) {
    const before = up.received.length
    const res = await send(`${proxy.url}${path}`)
    t.equal(res.status, status, `${path}: the upstream's status`)
    t.equal(res.headers['retry-after'], retryAfter, `${path}: its Retry-After, as sent`)
    t.equal(sha256(res.body), sha256(body), `${path}: its body, byte for byte`)
    t.equal(up.received.length, before + 1, `${path}: sent once, never retried`)
  }
  t.equal((await send(`${proxy.url}/503-plain`)).status, 503)
  const text = await metrics.text()
  t.equal(sample(text, 'upstream_responses_total', 'status_class="throttled"'), 4, 'the upstream\'s throttled answers, counted apart')
  t.equal(sample(text, 'upstream_responses_total', 'status_class="4xx"'), 0, 'a 429 is not counted as a 4xx')
  t.equal(sample(text, 'upstream_responses_total', 'status_class="5xx"'), 1, 'a 503 without Retry-After is still a 5xx: an upstream error')
  t.equal(sample(text, 'requests_total', 'status_class="throttled"'), 4, 'and the requests answered so, in requests_total too')
  t.equal(sample(text, 'requests_total', 'status_class="5xx"'), 1)
  t.equal(sample(text, 'upstream_retries_total', 'reason='), 0, 'nothing retried')
})

interface Rotating {
  readonly url: string
  readonly up: Upstream
  readonly app: Awaited<ReturnType<typeof buildProxyServer>>
  readonly metrics: ProxyMetrics
  /** performance.now() as the upstream wrote the 401, and as each request arrived. */
  readonly answered: number[]
  readonly arrived: number[]
}

/**
 * A proxy whose key pair is rotated while its first request is at the
 * upstream, which accepts only the new pair: the first answer is a 401 to a
 * pair no longer in force (the one retry the proxy makes after an answer),
 * written by `first`; the resent request gets 200 "new pair".
 */
async function rotating (t: Test, first: (res: ServerResponse) => void, env: Record<string, string> = {}): Promise<Rotating> {
  const newKey = secretKey(`${SECRET}-rotated`)
  const store = new CredentialStore(new HeaderMinter(ACCESS_KEY, secretKey(SECRET), 'url'))
  const answered: number[] = []
  const arrived: number[] = []
  const up = await startUpstream((req, res) => {
    arrived.push(performance.now())
    if (verifyToken((req.headers.authorization ?? '').slice(7), { accessKey: 'AKIDNEW', key: newKey }).ok) { res.end('new pair'); return }
    store.swap(new HeaderMinter('AKIDNEW', newKey, 'url'))
    answered.push(performance.now())
    first(res)
  })
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const app = await buildProxyServer({ config: testConfig({ COS_API_URL: up.url, ...env }), credentials: store, logger, observer: metricsObserver(metrics) })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(async () => { await app.close(); await up.close() })
  return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, up, app, metrics, answered, arrived }
}

const unauthorized = (headers: Record<string, string>) => (res: ServerResponse): void => {
  res.writeHead(401, { 'content-type': 'application/json', ...headers })
  res.end('{"error":"unauthorized"}')
}

t.test('a retry never fires sooner than the upstream\'s Retry-After (delta-seconds, and an HTTP-date read against the upstream\'s own Date)', async t => {
  const upstreamNow = Date.now() + 3_600_000 // the upstream's clock an hour ahead of this node's
  for (const [name, headers, waitMs] of [
    ['delta-seconds', { 'retry-after': '1' }, 1000],
    ['HTTP-date', { date: new Date(upstreamNow).toUTCString(), 'retry-after': new Date(upstreamNow + 2000).toUTCString() }, 2000],
  ] as const) {
    const r = await rotating(t, unauthorized(headers))
    const res = await send(`${r.url}/x`)
    t.equal(res.status, 200, `${name}: the resent request's answer`)
    t.equal(res.body.toString(), 'new pair')
    t.equal(r.up.received.length, 2, `${name}: sent twice, no more`)
    const gap = (r.arrived[1] ?? 0) - (r.answered[0] ?? Infinity)
    // A lower bound: the wait starts when the proxy reads the 401, after the upstream wrote it (timers run to the ms).
    t.ok(gap >= waitMs - 1, `${name}: resent ${Math.round(gap)} ms after the 401, not sooner than its Retry-After (${waitMs} ms)`)
    t.equal(sample(await r.metrics.text(), 'upstream_retries_total', 'reason="unauthorized"'), 1, `${name}: counted as the one retry`)
  }
})

t.test('a Retry-After that does not fit in what is left of COS_UPSTREAM_TIMEOUT_MS, or past the cap, is not waited: the 401 is the answer, sent once', async t => {
  for (const [name, retryAfter, env] of [
    ['longer than the timeout', '5', { COS_UPSTREAM_TIMEOUT_MS: '1000' }],
    ['past the cap of 60 s, in a long timeout', '61', { COS_UPSTREAM_TIMEOUT_MS: '600000' }],
    ['an absurd figure', '9'.repeat(40), { COS_UPSTREAM_TIMEOUT_MS: '600000' }],
  ] as const) {
    const r = await rotating(t, unauthorized({ 'retry-after': retryAfter, 'x-upstream': 'kept' }), env)
    const res = await send(`${r.url}/x`)
    t.equal(res.status, 401, `${name}: the upstream's 401`)
    t.equal(res.headers['retry-after'], retryAfter, `${name}: with its Retry-After`)
    t.equal(res.headers['x-upstream'], 'kept')
    t.equal(res.body.toString(), '{"error":"unauthorized"}', `${name}: and its body`)
    t.equal(r.up.received.length, 1, `${name}: never sent again`)
    const text = await r.metrics.text()
    t.equal(sample(text, 'upstream_retries_total', 'reason="unauthorized"'), 0, `${name}: no retry counted`)
    t.equal(sample(text, 'upstream_responses_total', 'status_class="4xx"'), 1, `${name}: the 401 counted as the upstream's answer`)
  }
})

t.test('a 401 with Retry-After whose body (no declared length) outgrows what the proxy keeps is passed whole as it comes, not retried nor cut', async t => {
  const big = Buffer.alloc(40 * 1024, 'unauthorized ')
  const r = await rotating(t, res => {
    res.writeHead(401, { 'content-type': 'text/plain', 'retry-after': '1' }) // chunked: Node does not know the length
    res.write(big.subarray(0, 1000))
    setTimeout(() => { res.end(big.subarray(1000)) }, 50)
  })
  const res = await send(`${r.url}/x`)
  t.equal(res.status, 401)
  t.equal(res.headers['retry-after'], '1')
  t.equal(sha256(res.body), sha256(big), 'its body, byte for byte')
  t.equal(r.up.received.length, 1, 'never sent again')
  t.equal(sample(await r.metrics.text(), 'upstream_responses_total', 'status_class="4xx"'), 1, 'counted once, as the upstream\'s answer')
})

t.test('a Retry-After that is neither delta-seconds nor an HTTP-date is ignored: the retry goes as it would without one', async t => {
  for (const retryAfter of ['1.5', '-1', 'soon']) {
    const r = await rotating(t, unauthorized({ 'retry-after': retryAfter }))
    const res = await send(`${r.url}/x`)
    t.equal(res.status, 200, `Retry-After: ${retryAfter}: resent`)
    t.equal(r.up.received.length, 2)
  }
})

t.test('a client that goes away while its retry waits on Retry-After: nothing is sent again, and the request is logged and counted as 499', async t => {
  const r = await rotating(t, unauthorized({ 'retry-after': '1' }))
  const controller = new AbortController()
  const gone = fetch(`${r.url}/x`, { signal: controller.signal }).then(() => 'answered', () => 'aborted')
  t.ok(await until(() => r.answered.length === 1), 'the 401 was written')
  await sleep(100) // the proxy has read it and waits
  controller.abort()
  t.equal(await gone, 'aborted')
  await sleep(1500) // past the Retry-After: a retry would have been sent by now
  t.equal(r.up.received.length, 1, 'never sent again')
  const text = await r.metrics.text()
  t.equal(sample(text, 'requests_aborted_total', 'route="api"'), 1, 'counted as aborted')
  t.equal(sample(text, 'upstream_retries_total', 'reason="unauthorized"'), 0, 'no retry counted')
  t.equal(sample(text, 'in_flight_requests', ''), 0, 'and it left the in-flight gauge')
})

t.test('the drain does not wait out a Retry-After: when the proxy closes, the held 401 is answered at once and nothing is sent again', async t => {
  const r = await rotating(t, unauthorized({ 'retry-after': '20' }))
  const pending = send(`${r.url}/x`)
  t.ok(await until(() => r.answered.length === 1), 'the 401 was written')
  await sleep(100)
  const started = performance.now()
  const closed = r.app.close()
  const res = await pending
  await closed
  const ms = performance.now() - started
  t.equal(res.status, 401, 'the upstream\'s 401 is the answer')
  t.equal(res.headers['retry-after'], '20')
  t.equal(res.body.toString(), '{"error":"unauthorized"}')
  t.equal(r.up.received.length, 1, 'never sent again')
  t.ok(ms < scaled(5000), `closed in ${Math.round(ms)} ms, not after the 20 s Retry-After`)
})

t.test('a POST is never sent twice, whatever the cause: a connection reset, a 401 after rotation (bodyless, with Retry-After or without), a throttled answer', async t => {
  for (const [name, headers] of [['a 401 after rotation', {}], ['a 401 after rotation with Retry-After: 1', { 'retry-after': '1' }]] as const) {
    for (const method of ['POST', 'PATCH']) {
      const r = await rotating(t, unauthorized(headers))
      const res = await send(`${r.url}/x`, { method })
      t.equal(res.status, 401, `${method}, ${name}: the 401 is the answer`)
      t.equal(r.up.received.length, 1, `${method}, ${name}: sent once`)
    }
  }
  // A reset before any answer, on a bodyless POST: the upstream may have acted on it.
  let connections = 0
  const up = await startUpstream((req, res) => {
    connections++
    if (req.url === '/throttled') { res.writeHead(429, { 'retry-after': '0' }); res.end(); return }
    res.socket?.resetAndDestroy()
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  t.equal((await send(`${proxy.url}/reset`, { method: 'POST' })).status, 502, 'a reset POST: 502')
  t.equal(connections, 1, 'a reset POST: sent once')
  t.equal((await send(`${proxy.url}/throttled`, { method: 'POST' })).status, 429, 'a throttled POST: 429')
  t.equal(connections, 2, 'a throttled POST: sent once')
})
