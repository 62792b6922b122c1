// The admin listener on a real port: probes follow the readiness function,
// /metrics serves the registry, /quitquitquit starts the drain once, and
// every error is the project's JSON shape. Routing tables use inject.
import type { AddressInfo } from 'node:net'
import { Writable } from 'node:stream'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { request } from 'undici'
import { buildAdminServer, type AdminOptions, type Readiness } from '../../src/admin/admin.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { rawRequest } from '../support/raw.js'

interface Admin {
  readonly url: string
  readonly metrics: ProxyMetrics
  /** What the readiness function answers next. */
  readiness: Readiness
  quits: number
}

/** A real admin server on 127.0.0.1:0, closed at the end of the test. */
async function startAdmin (t: Test, overrides: Partial<AdminOptions> = {}): Promise<Admin> {
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const state: Admin = { url: '', metrics, readiness: { ready: false, reason: 'credentials not loaded' }, quits: 0 }
  const app = buildAdminServer({ metrics, readiness: () => state.readiness, onQuit: () => { state.quits++ }, ...overrides })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => app.close())
  return Object.assign(state, { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}` })
}

interface Res { readonly status: number, readonly headers: Record<string, string | string[] | undefined>, readonly text: string }

async function call (url: string, opts: { method?: 'GET' | 'HEAD' | 'POST' | 'PUT' | 'DELETE', body?: string, headers?: Record<string, string> } = {}): Promise<Res> {
  const res = await request(url, { method: opts.method ?? 'GET', body: opts.body, headers: opts.headers })
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() }
}

const parseJson = (res: Res): unknown => JSON.parse(res.text)

t.test('/healthz is 200 {"status":"ok"} whatever readiness says', async t => {
  const admin = await startAdmin(t)
  for (const readiness of [{ ready: false, reason: 'credentials not loaded' }, { ready: true }, { ready: false, reason: 'draining' }] as const) {
    admin.readiness = readiness
    const res = await call(`${admin.url}/healthz`)
    t.equal(res.status, 200, JSON.stringify(readiness))
    t.same(parseJson(res), { status: 'ok' })
    t.match(res.headers['content-type'], /^application\/json/)
  }
})

t.test('/readyz follows the readiness function: 503 with the reason, 200 when ready, 503 again when draining', async t => {
  const admin = await startAdmin(t)
  const ready = async (): Promise<[number, unknown]> => { const r = await call(`${admin.url}/readyz`); return [r.status, parseJson(r)] }
  t.same(await ready(), [503, { status: 'not_ready', reason: 'credentials not loaded' }])
  admin.readiness = { ready: false, reason: 'proxy listener not started' }
  t.same(await ready(), [503, { status: 'not_ready', reason: 'proxy listener not started' }])
  admin.readiness = { ready: true }
  t.same(await ready(), [200, { status: 'ready' }])
  admin.readiness = { ready: false, reason: 'draining' }
  t.same(await ready(), [503, { status: 'not_ready', reason: 'draining' }])
})

t.test('the ready gauge on /metrics follows what /readyz answers, so an alert sees a sidecar that cannot sign', async t => {
  const admin = await startAdmin(t)
  const gauge = async (): Promise<string | undefined> => /^cos_auth_proxy_ready (\S+)$/m.exec((await call(`${admin.url}/metrics`)).text)?.[1]
  t.equal(await gauge(), '0', 'credentials not loaded')
  admin.readiness = { ready: true }
  t.equal(await gauge(), '1')
  admin.readiness = { ready: false, reason: 'draining' }
  t.equal(await gauge(), '0', 'draining')
})

t.test('HEAD probes answer like GET, without a body', async t => {
  const admin = await startAdmin(t)
  admin.readiness = { ready: true }
  for (const path of ['/healthz', '/readyz', '/metrics']) {
    const res = await call(`${admin.url}${path}`, { method: 'HEAD' })
    t.equal(res.status, 200, path)
    t.equal(res.text, '')
  }
})

t.test('/metrics serves the registry as Prometheus text; admin requests are not proxy requests', async t => {
  const admin = await startAdmin(t)
  admin.metrics.requestFinished('management', 'GET', 200, 0.012, 0.01)
  admin.metrics.tokenMinted()
  await call(`${admin.url}/healthz`)
  await call(`${admin.url}/nope`)
  const res = await call(`${admin.url}/metrics`)
  t.equal(res.status, 200)
  t.equal(res.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8')
  t.equal(res.headers['content-type'], admin.metrics.contentType)
  t.match(res.text, /^cos_auth_proxy_requests_total\{route="management",method="GET",status_class="2xx"\} 1$/m)
  t.match(res.text, /^cos_auth_proxy_tokens_minted_total 1$/m)
  t.notMatch(res.text, /status_class="4xx"/, 'the admin 404 is not counted')
  t.equal(res.text, await admin.metrics.text(), 'exactly the registry text')
})

t.test('POST /quitquitquit answers 202 and calls onQuit once, whatever body curl or wget send', async t => {
  const admin = await startAdmin(t)
  const quit = async (opts: Parameters<typeof call>[1] = {}): Promise<void> => {
    const res = await call(`${admin.url}/quitquitquit`, { method: 'POST', ...opts })
    t.equal(res.status, 202)
    t.same(parseJson(res), { status: 'draining' })
  }
  await quit()
  t.equal(admin.quits, 1)
  await quit({ body: '', headers: { 'content-type': 'application/x-www-form-urlencoded' } }) // curl -d '' / wget --post-data=''
  await quit({ body: '{"why":"job done"}', headers: { 'content-type': 'application/json' } })
  await quit({ body: 'not json', headers: { 'content-type': 'application/json' } })
  t.equal(admin.quits, 1, 'the drain is started once')
  const tooBig = await call(`${admin.url}/quitquitquit`, { method: 'POST', body: 'x'.repeat(4096), headers: { 'content-type': 'text/plain' } })
  t.equal(tooBig.status, 413)
  t.equal((parseJson(tooBig) as { error: { code: string } }).error.code, 'payload_too_large')
  const health = await call(`${admin.url}/healthz`)
  t.equal(health.status, 200, 'the admin server itself keeps answering; the caller closes it after the drain')
})

t.test('onQuit throwing is logged; the caller still gets its 202', async t => {
  const lines: string[] = []
  const sink = new Writable({ write (chunk: Buffer, _enc, cb) { lines.push(chunk.toString('utf8')); cb() } })
  const admin = await startAdmin(t, { onQuit: () => { throw new Error('boom') }, logger: pino({ level: 'info' }, sink) })
  const res = await call(`${admin.url}/quitquitquit`, { method: 'POST' })
  t.equal(res.status, 202)
  t.match(lines.join(''), /quitquitquit: starting the drain failed/)
})

t.test('routing: known paths with the wrong method are 405 + Allow, unknown paths 404, both JSON', async t => {
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const app = buildAdminServer({ metrics, readiness: () => ({ ready: true }), onQuit: () => undefined })
  t.teardown(() => app.close())
  const cases = [
    ['GET', '/quitquitquit', 405, 'POST'],
    ['PUT', '/quitquitquit', 405, 'POST'],
    ['POST', '/healthz', 405, 'GET, HEAD'],
    ['DELETE', '/readyz', 405, 'GET, HEAD'],
    ['POST', '/metrics?x=1', 405, 'GET, HEAD'],
    ['GET', '/', 404, undefined],
    ['GET', '/healthz/', 404, undefined],
    ['GET', '/management/v1/clusters', 404, undefined],
    ['POST', '/quit', 404, undefined],
  ] as const
  for (const [method, url, status, allow] of cases) {
    const res = await app.inject({ method, url })
    t.equal(res.statusCode, status, `${method} ${url}`)
    t.equal(res.headers.allow, allow, `${method} ${url} Allow`)
    t.match(res.headers['content-type'], /^application\/json/)
    const body = res.json<{ error: { code: string, message: string } }>()
    t.same(Object.keys(body), ['error'])
    t.same(Object.keys(body.error), ['code', 'message'])
    t.equal(body.error.code, status === 405 ? 'method_not_allowed' : 'route_not_found')
  }
})

t.test('a throwing readiness function is a 500 internal_error in the JSON shape', async t => {
  const admin = await startAdmin(t, { readiness: () => { throw new Error('boom') } })
  const res = await call(`${admin.url}/readyz`)
  t.equal(res.status, 500)
  t.same(parseJson(res), { error: { code: 'internal_error', message: 'the admin endpoint failed' } })
})

t.test('probes log nothing at info; at debug one line each with the route pattern, never the raw path', async t => {
  for (const level of ['info', 'debug'] as const) {
    const lines: string[] = []
    const sink = new Writable({ write (chunk: Buffer, _enc, cb) { lines.push(...chunk.toString('utf8').split('\n').filter(l => l !== '')); cb() } })
    const admin = await startAdmin(t, { logger: pino({ level }, sink) })
    lines.length = 0 // Fastify's own "Server listening at" line: once per process, not per probe
    await call(`${admin.url}/healthz`)
    await call(`${admin.url}/readyz`)
    await call(`${admin.url}/metrics`)
    await call(`${admin.url}/private-path?token=abc`)
    if (level === 'info') {
      t.same(lines, [], 'silent at info')
      continue
    }
    const records = lines.map(l => JSON.parse(l) as Record<string, unknown>)
    t.same(records.map(r => [r.msg, r.level, r.route, r.status]), [
      ['admin request', 20, '/healthz', 200],
      ['admin request', 20, '/readyz', 503],
      ['admin request', 20, '/metrics', 200],
      ['admin request', 20, 'none', 404],
    ])
    t.notMatch(lines.join('\n'), /private-path|token=abc/)
  }
})

t.test('the admin listener closes silent connections, slow header senders and idle keep-alive connections within its limits', async t => {
  const admin = await startAdmin(t, { limits: { headersTimeoutMs: 300, requestTimeoutMs: 600, idleTimeoutMs: 300 } })
  const port = Number(new URL(admin.url).port)
  const timed = async (what: Promise<Awaited<ReturnType<typeof rawRequest>>>): Promise<[boolean, number, string]> => {
    const start = Date.now()
    const res = await what
    // Closed: ended by the admin listener, or reset by it (a drip still being written when it closes may see a reset).
    return [res.closedByPeer || res.error !== undefined, Date.now() - start, res.text]
  }
  const drip = Array.from({ length: 40 }, () => 'a')
  const [silent, trickle, keepAlive] = await Promise.all([
    timed(rawRequest(port, '', { timeoutMs: 4000 })),
    timed(rawRequest(port, ['GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ', ...drip], { gapMs: 100, timeoutMs: 4000 })),
    timed(rawRequest(port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', { expect: 2, timeoutMs: 4000 })),
  ])
  // Bounds: the limit plus the once-a-second sweep and a margin for a loaded machine.
  t.ok(silent[0] && silent[1] < 2500, `a connection that sends nothing is closed (${silent[1]} ms; headers timeout 300 ms)`)
  t.ok(trickle[0] && trickle[1] < 2500, `a header sender dripping a byte every 100 ms is closed (${trickle[1]} ms)`)
  t.notMatch(trickle[2], /^HTTP\/1\.1 200 /, 'and never answered')
  t.ok(keepAlive[0] && keepAlive[1] < 2500, `an idle keep-alive connection is closed (${keepAlive[1]} ms; idle timeout 300 ms)`)
  t.match(keepAlive[2], /^HTTP\/1\.1 200 /, 'after its request was answered')
})

t.test('at COS_ADMIN_MAX_CONNECTIONS idle connections, a probe still gets its answer', async t => {
  const admin = await startAdmin(t, { limits: { maxConnections: 4 } })
  const port = Number(new URL(admin.url).port)
  const idle = Array.from({ length: 8 }, () => rawRequest(port, '', { timeoutMs: 1000 }))
  await new Promise(resolve => setTimeout(resolve, 100))
  const probe = await call(`${admin.url}/healthz`)
  t.equal(probe.status, 200, 'the probe displaced an idle connection')
  const closed = (await Promise.all(idle)).filter(r => r.closedByPeer).length
  t.ok(closed >= 5, `the server closed at least 5 of the 8 idle connections (${closed}): no more than 4 were held, and the probe took a place`)
})
