// COS_ACCESS_LOG: a sidecar writes a request line for what needs a look
// (errors, the default), for every request (all) or for none (off); the
// metrics count every request whatever it says.
import { connect } from 'node:net'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { REFUSING_PORT, send, stallingUpstream, startProxy, startUpstream, until, type RunningProxy } from '../support/helpers.js'
import { startSidecar, writeKeyPair } from '../support/sidecar.js'

type Line = Record<string, unknown>

/** The request lines written for one request sent by `act`, once its response has closed. */
async function requestLines (proxy: RunningProxy, act: () => Promise<unknown>): Promise<Line[]> {
  const before = proxy.logs.records.length
  await act()
  // The line is written when the response closes, a few ticks after the client has it all.
  await new Promise(resolve => setTimeout(resolve, 100))
  return proxy.logs.records.slice(before).filter(r => r.msg === 'request')
}

t.test('COS_ACCESS_LOG=errors (the default): a 2xx writes no line; 4xx, 5xx, upstream failures, a client gone and a slow request one each', async t => {
  const ok = await startUpstream()
  const failing = await startUpstream((_req, res) => { res.statusCode = 500; res.end('{}') })
  const slow = await startUpstream((_req, res) => { setTimeout(() => { res.end('{}') }, 300) })
  const silent = await stallingUpstream()
  t.teardown(async () => { await Promise.all([ok.close(), failing.close(), slow.close(), silent.close()]) })

  const cases: { name: string, env: Record<string, string>, path: string, client?: 'hang-up', want: Line | undefined }[] = [
    { name: 'a 200', env: { COS_API_URL: ok.url }, path: '/v1/x', want: undefined },
    { name: 'a 404 the proxy answers (no route)', env: { COS_OPTIMIZE_API_URL: ok.url }, path: '/nowhere', want: { status: 404, route: 'none' } },
    { name: 'a 403 the guard answers (a web page)', env: { COS_API_URL: ok.url }, path: '/v1/x', want: { status: 403 } },
    { name: 'a 500 from the upstream', env: { COS_API_URL: failing.url }, path: '/v1/x', want: { status: 500 } },
    { name: 'a refused upstream (502)', env: { COS_API_URL: `http://127.0.0.1:${REFUSING_PORT}`, COS_CONNECT_TIMEOUT_MS: '300' }, path: '/v1/x', want: { status: 502 } },
    { name: 'an upstream that does not answer in time (504)', env: { COS_API_URL: silent.url, COS_UPSTREAM_TIMEOUT_MS: '300' }, path: '/v1/x', want: { status: 504 } },
    { name: 'a client gone before the answer (499)', env: { COS_API_URL: silent.url }, path: '/v1/x', client: 'hang-up', want: { status: 499, aborted: true } },
    { name: 'a 200 slower than COS_ACCESS_LOG_SLOW_MS', env: { COS_API_URL: slow.url, COS_ACCESS_LOG_SLOW_MS: '100' }, path: '/v1/x', want: { status: 200 } },
    { name: 'a 200 faster than COS_ACCESS_LOG_SLOW_MS', env: { COS_API_URL: slow.url, COS_ACCESS_LOG_SLOW_MS: '60000' }, path: '/v1/x', want: undefined },
    { name: 'a 200 with COS_ACCESS_LOG_SAMPLE=1 (a share of the rest)', env: { COS_API_URL: ok.url, COS_ACCESS_LOG_SAMPLE: '1' }, path: '/v1/x', want: { status: 200 } },
  ]
  for (const c of cases) {
    const proxy = await startProxy(c.env)
    try {
      const lines = await requestLines(proxy, async () => {
        if (c.client === 'hang-up') {
          const socket = connect(proxy.port, '127.0.0.1')
          socket.on('error', () => undefined)
          socket.write(`GET ${c.path} HTTP/1.1\r\nhost: 127.0.0.1:${String(proxy.port)}\r\n\r\n`)
          const heads = silent.heads()
          await until(() => silent.heads() > heads, 3000)
          socket.destroy()
          await until(() => proxy.logs.records.some(r => r.msg === 'request' && r.status === 499), 3000)
          return
        }
        const headers: Record<string, string> = c.want?.status === 403 ? { origin: 'https://evil.example' } : {}
        await send(`${proxy.url}${c.path}`, { headers }).catch(() => undefined)
      })
      if (c.want === undefined) {
        t.same(lines, [], `${c.name}: no line`)
      } else {
        t.equal(lines.length, 1, `${c.name}: one line`)
        t.match(lines[0], { level: 'info', msg: 'request', ...c.want }, `${c.name}: the line, its fields as ever`)
      }
    } finally {
      await proxy.close()
    }
  }
})

t.test('COS_ACCESS_LOG=all writes every request; off writes none, and the failure\'s own error line stays', async t => {
  const ok = await startUpstream()
  t.teardown(() => ok.close())
  const all = await startProxy({ COS_API_URL: ok.url, COS_ACCESS_LOG: 'all' })
  t.teardown(() => all.close())
  const lines = await requestLines(all, () => send(`${all.url}/v1/x`))
  t.match(lines, [{ msg: 'request', status: 200, method: 'GET', route: 'api' }], 'all: the 200 has its line')

  const off = await startProxy({ COS_API_URL: `http://127.0.0.1:${REFUSING_PORT}`, COS_ACCESS_LOG: 'off', COS_CONNECT_TIMEOUT_MS: '300' })
  t.teardown(() => off.close())
  const before = off.logs.records.length
  t.equal((await send(`${off.url}/v1/x`)).status, 502)
  await new Promise(resolve => setTimeout(resolve, 100))
  const written = off.logs.records.slice(before)
  t.same(written.filter(r => r.msg === 'request'), [], 'off: no request line, even for a 502')
  t.ok(written.some(r => r.msg === 'request failed' && r.level === 'error'), 'off: the failure is still logged as an error')
})

t.test('a real sidecar: the default writes no line for successes, probes or /metrics, and the metrics count every request', async t => {
  const up = await startUpstream()
  const dir = mkdtempSync(join(tmpdir(), 'cos-access-'))
  const s = await startSidecar({ COS_API_URL: up.url, ...writeKeyPair(dir, 'AKIDLOG', 'log-SeCrEt') }, { cwd: dir })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close(); rmSync(dir, { recursive: true, force: true }) })
  for (let i = 0; i < 5; i++) t.equal((await send(`${s.proxy}/v1/ok`)).status, 200)
  for (const path of ['/healthz', '/readyz', '/metrics']) t.equal((await send(`${s.admin}${path}`)).status, 200, `${path} answers`)
  t.equal((await send(`${s.proxy}/v1/ok`, { headers: { origin: 'https://evil.example' } })).status, 403, 'a refusal')
  const metrics = (await send(`${s.admin}/metrics`)).body.toString()
  const ok = /cos_auth_proxy_requests_total\{[^}]*route="api"[^}]*status_class="2xx"[^}]*\} (\d+)/.exec(metrics)
  t.equal(ok?.[1], '5', `requests_total counts the five 2xx all the same\n${metrics.split('\n').filter(l => l.startsWith('cos_auth_proxy_requests_total')).join('\n')}`)
  await new Promise(resolve => setTimeout(resolve, 100))
  const requests = s.lines().filter(l => l.msg === 'request')
  t.equal(requests.length, 1, 'one request line in all: the refusal')
  t.match(requests[0], { status: 403 })
})
