// The log table of docs/operations.md against what a real proxy writes: each
// outcome a request can have (answered, refused without credentials, the
// upstream unreachable, silent, failing midway, a client hanging up) driven
// through one, its lines grouped by request id. One line of the proxy's own
// per outcome, beside the request line, at the level the table gives; never
// @fastify/reply-from's `response errored` or Fastify's stream warnings.
import { connect } from 'node:net'
import t, { type Test } from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { LogCapture, REFUSING_PORT, send, stallingUpstream, startProxy, startUpstream, testConfig, until } from '../support/helpers.js'
import { read } from './exported.js'
import { sectionText } from './markdown.js'

/** The rows of the table under "Logs": `msg` prefix (up to its "…") → level. */
function documentedLines (): Map<string, string> {
  const rows = new Map<string, string>()
  for (const m of sectionText(read('docs/operations.md'), 'Logs').matchAll(/^\| `([^`]+)`(?: \/ `[^`]+`)? \| (\w+) \|/gm)) {
    rows.set((m[1] ?? '').replace(/\s*…$/, ''), m[2] ?? '')
  }
  return rows
}

type Line = Record<string, unknown>

/** The level and msg of each line, in order. */
const shape = (lines: readonly Line[]): string[] => lines.map(l => `${String(l.level)} ${String(l.msg)}`)

/** The lines of the one request the capture holds a request line for, after `send` ran. */
async function linesOfOneRequest (logs: LogCapture, send: () => Promise<unknown>): Promise<Line[]> {
  const before = logs.records.length
  await send()
  if (!await until(() => logs.records.slice(before).some(r => r.msg === 'request'), 5000)) throw new Error('no request line')
  // Lines of the same turn are written together; one more turn for any straggler.
  await new Promise(resolve => setTimeout(resolve, 50))
  const fresh = logs.records.slice(before)
  const ids = new Set(fresh.filter(r => r.msg === 'request').map(r => r.reqId))
  if (ids.size !== 1) throw new Error(`${ids.size} request lines`)
  return fresh.filter(r => ids.has(r.reqId))
}

const documented = documentedLines()

/** Every line but the request line is one the table lists, at its level. */
function checkAgainstTable (t: Test, lines: readonly Line[]): void {
  for (const line of lines) {
    const msg = String(line.msg)
    if (msg === 'request') { t.equal(line.level, 'info', 'the request line is at info'); continue }
    const row = [...documented].find(([prefix]) => msg.startsWith(prefix))
    t.ok(row, `"${msg}" is in the table`)
    if (row !== undefined) t.equal(line.level, row[1], `"${msg}" at the level the table gives`)
  }
}

t.test('the table lists request failed at error', async t => {
  t.equal(documented.get('request failed'), 'error')
  t.ok(documented.size >= 8, `${documented.size} rows`)
})

t.test('each outcome: one line of its own at the documented level, beside the request line', async t => {
  const ok = await startUpstream()
  const failing = await startUpstream((_req, res) => { res.statusCode = 500; res.end('{}') })
  const silent = await stallingUpstream()
  // A head that promises 100 kB, 20 kB of it, then the connection reset.
  const midway = await stallingUpstream(socket => {
    socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 100000\r\n\r\n${'x'.repeat(20_000)}`)
    setTimeout(() => socket.resetAndDestroy(), 50)
  })
  const closed = `http://127.0.0.1:${REFUSING_PORT}`
  t.teardown(async () => { await Promise.all([ok.close(), failing.close(), silent.close(), midway.close()]) })

  const cases: { name: string, upstream: string, client?: 'hang-up', want: string[], status: number, aborted?: true }[] = [
    // COS_ACCESS_LOG=errors, the default: a success writes nothing.
    { name: 'answered', upstream: ok.url, want: [], status: 200 },
    { name: 'the upstream answers 500 (forwarded as it is)', upstream: failing.url, want: ['info request'], status: 500 },
    { name: 'the upstream refuses connections (502)', upstream: closed, want: ['error request failed', 'info request'], status: 502 },
    { name: 'the upstream does not answer in time (504)', upstream: silent.url, want: ['error request failed', 'info request'], status: 504 },
    { name: 'the upstream body fails midway', upstream: midway.url, want: ['error request failed', 'info request'], status: 200, aborted: true },
    { name: 'the client hangs up', upstream: silent.url, client: 'hang-up', want: ['info request'], status: 499, aborted: true },
  ]
  for (const c of cases) {
    const proxy = await startProxy({ COS_API_URL: c.upstream, COS_UPSTREAM_TIMEOUT_MS: c.client === 'hang-up' ? '30000' : '300', COS_CONNECT_TIMEOUT_MS: '300' })
    try {
      if (c.want.length === 0) {
        const before = proxy.logs.records.length
        t.equal((await send(`${proxy.url}/v1/x`)).status, c.status, `${c.name}: answered`)
        await new Promise(resolve => setTimeout(resolve, 100))
        t.same(shape(proxy.logs.records.slice(before)), [], `${c.name}: no line at all`)
        continue
      }
      const lines = await linesOfOneRequest(proxy.logs, async () => {
        if (c.client !== 'hang-up') { await send(`${proxy.url}/v1/x`).catch(() => undefined); return }
        const socket = connect(proxy.port, '127.0.0.1')
        socket.on('error', () => undefined)
        socket.write(`GET /v1/x HTTP/1.1\r\nhost: 127.0.0.1:${proxy.port}\r\n\r\n`)
        const heads = silent.heads()
        await until(() => silent.heads() > heads, 3000)
        socket.destroy()
      })
      t.same(shape(lines), c.want, `${c.name}: its lines`)
      t.match(lines.find(l => l.msg === 'request'), { status: c.status, ...(c.aborted ? { aborted: true } : {}) }, `${c.name}: the request line`)
      const failed = lines.find(l => l.msg === 'request failed')
      if (failed !== undefined) t.match(failed, { err: { message: String } }, `${c.name}: the cause is logged`)
      checkAgainstTable(t, lines)
      t.notOk(proxy.logs.records.some(r => r.msg === 'response errored' || r.level === 'warn'), `${c.name}: no warning anywhere`)
    } finally {
      await proxy.close()
    }
  }
})

t.test('without credentials: the 503 logs its request line only', async t => {
  const upstream = await startUpstream()
  const config = testConfig({ COS_API_URL: upstream.url })
  const logs = new LogCapture()
  const app = await buildProxyServer({ config, credentials: new CredentialStore(), logger: createLogger('info', logs) })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(async () => { await app.close(); await upstream.close() })
  const { port } = app.server.address() as { port: number }
  const lines = await linesOfOneRequest(logs, () => send(`http://127.0.0.1:${port}/v1/x`))
  t.same(shape(lines), ['info request'])
  t.match(lines[0], { status: 503, route: 'api' })
  checkAgainstTable(t, lines)
  t.equal(upstream.received.length, 0, 'nothing reached the upstream')
})
