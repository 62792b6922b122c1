// The proxy against the verifying mock API, and a log capture at `trace` across
// every kind of request, proving no secret, token or signature is ever written.
import { randomBytes } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import { createLogger } from '../src/observability/logger.js'
import { buildMockApi } from '../src/mock-api/mock-api.js'
import { parseToken, queryEscape, secretKey } from '../src/token/token.js'
import { ACCESS_KEY, LogCapture, SECRET, json, send, sha256, startProxy, startUpstream } from './support/helpers.js'

async function startMock (secret: string, logs?: LogCapture): Promise<{ url: string, close: () => Promise<void> }> {
  const app = buildMockApi({ accessKey: ACCESS_KEY, key: secretKey(secret), logger: logs === undefined ? false : createLogger('trace', logs) })
  await app.listen({ host: '127.0.0.1', port: 0 })
  return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, close: () => app.close() }
}

t.test('the mock API accepts everything the proxy sends: both encodings, 200 concurrent requests, no replay', async t => {
  for (const encoding of ['url', 'none']) {
    const mock = await startMock(SECRET)
    const proxy = await startProxy({ COS_MANAGEMENT_API_URL: `${mock.url}/management`, COS_OPTIMIZE_API_URL: `${mock.url}/optimize`, COS_API_URL: mock.url, COS_TOKEN_ENCODING: encoding })
    const paths = ['/management/v1/clusters', '/management/v1/notification-rules', '/optimize/v1/workloads/recommendations', '/echo/x?y=1']
    const results = await Promise.all(Array.from({ length: 200 }, (_, i) => send(proxy.url + (paths[i % paths.length] ?? '/'))))
    t.same(results.map(r => r.status), results.map(() => 200), `${encoding}: all 200, none replayed or rejected`)
    const body = randomBytes(256 * 1024)
    const echo = await send(`${proxy.url}/echo/upload`, { method: 'POST', body, headers: { 'content-type': 'application/octet-stream' } })
    t.match(json(echo), { method: 'POST', url: '/echo/upload', bodyBytes: body.length, bodySha256: sha256(body) })
    await proxy.close()
    await mock.close()
  }
})

t.test('a wrong secret is caught by the API and its 401 passes through unchanged', async t => {
  const mock = await startMock('a-different-secret')
  const proxy = await startProxy({ COS_API_URL: mock.url })
  t.teardown(async () => { await proxy.close(); await mock.close() })
  const res = await send(`${proxy.url}/management/v1/clusters`)
  t.equal(res.status, 401)
  t.match(json(res), { error: { code: 'bad_signature' } })
  t.equal(res.headers['www-authenticate'], 'Bearer')
})

t.test('at trace level, no log line holds the secret, a token or a signature', async t => {
  const mockLogs = new LogCapture()
  const mock = await startMock(SECRET, mockLogs)
  const recorder = await startUpstream()
  const proxy = await startProxy({
    COS_MANAGEMENT_API_URL: `${mock.url}/management`,
    COS_OPTIMIZE_API_URL: recorder.url,
    COS_API_URL: 'http://127.0.0.1:9', // discard port: refused
    COS_UPSTREAM_TIMEOUT_MS: '1000',
    COS_ACCESS_LOG: 'all', // every line there is, to search for secrets
  }, 'trace')
  t.teardown(async () => { await proxy.close(); await mock.close(); await recorder.close() })

  const clientToken = 'Bearer client-supplied-token-value'
  await send(`${proxy.url}/management/v1/clusters`, { headers: { authorization: clientToken } })
  await send(`${proxy.url}/management/echo`, { method: 'POST', body: 'x'.repeat(10_000), headers: { 'content-type': 'text/plain', 'proxy-authorization': 'Basic c2VjcmV0' } })
  await send(`${proxy.url}/management/nowhere`)
  await send(`${proxy.url}/optimize/a?q=1`, { method: 'PUT', body: '{"a":1}', headers: { 'content-type': 'application/json' } })
  await send(`${proxy.url}/optimize/b`, { method: 'DELETE' })
  await send(`${proxy.url}/refused`)
  await send(`${proxy.url}/%zz`)

  const text = proxy.logs.text + '\n' + mockLogs.text
  t.ok(proxy.logs.lines.length >= 7, `captured ${proxy.logs.lines.length} proxy lines`)
  t.equal(proxy.app.log.level, 'trace', 'captured at trace')
  t.ok(proxy.logs.records.some(r => r.level === 'error' && r.msg === 'request failed' && typeof r.err === 'object'), 'upstream error logged with its error object')
  t.notOk(text.includes(SECRET), 'secret absent')
  t.notOk(text.includes(queryEscape(SECRET)), 'encoded secret absent')
  t.notOk(text.includes('client-supplied-token-value'), 'client Authorization absent')
  t.notOk(text.includes('c2VjcmV0'), 'client Proxy-Authorization absent')
  t.ok(recorder.received.length >= 2)
  for (const r of recorder.received) {
    const header = r.headers.authorization ?? ''
    const encoded = header.slice('Bearer '.length)
    const parsed = parseToken(encoded)
    if (!parsed.ok) throw new Error('proxy sent an unparsable token')
    t.notOk(text.includes(encoded), 'encoded token absent')
    t.notOk(text.includes(parsed.fields.signature), 'signature absent')
    t.notOk(text.includes(queryEscape(parsed.fields.signature)), 'encoded signature absent')
    t.notOk(text.includes(parsed.fields.nonce), 'nonce absent (only ever part of a token)')
  }
})
