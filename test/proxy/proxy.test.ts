// Every forwarding rule, checked at a real upstream that records what it got.
import { randomBytes } from 'node:crypto'
import t from 'tap'
import { secretKey, verifyToken } from '../../src/token/token.js'
import { ACCESS_KEY, SECRET, json, send, sha256, startProxy, startUpstream, type Received } from '../support/helpers.js'

const key = secretKey(SECRET)

function only (received: Received[]): Received {
  if (received.length !== 1) throw new Error(`expected one upstream request, got ${received.length}`)
  return received[0] as Received
}

t.test('routing by prefix on a segment boundary, prefix stripped, upstream path prepended', async t => {
  const mgmt = await startUpstream()
  const opt = await startUpstream()
  const api = await startUpstream()
  const proxy = await startProxy({
    COS_MANAGEMENT_API_URL: mgmt.url,
    COS_OPTIMIZE_API_URL: `${opt.url}/api/v1/`, // trailing slash ignored
    COS_API_URL: `${api.url}/base`,
  })
  t.teardown(async () => { await proxy.close(); await Promise.all([mgmt.close(), opt.close(), api.close()]) })

  const cases: [string, typeof mgmt, string][] = [
    ['/optimize/workloads?x=1', opt, '/api/v1/workloads?x=1'],
    ['/optimize', opt, '/api/v1'],
    ['/optimize/', opt, '/api/v1/'],
    ['/optimize?x=1', opt, '/api/v1?x=1'],
    ['/management/clusters', mgmt, '/clusters'],
    ['/management', mgmt, '/'],
    ['/optimizer', api, '/base/optimizer'],
    ['/management-x/y', api, '/base/management-x/y'],
    ['/anything/else', api, '/base/anything/else'],
    ['/', api, '/base/'],
  ]
  for (const [path, upstream, expected] of cases) {
    const before = upstream.received.length
    const res = await send(proxy.url + path)
    t.equal(res.status, 200, `${path} answered`)
    t.equal(upstream.received.length, before + 1, `${path} reached the intended upstream`)
    t.equal(upstream.received.at(-1)?.url, expected, `${path} → ${expected}`)
  }
  t.equal(mgmt.received.length + opt.received.length + api.received.length, cases.length, 'nothing went anywhere else')
})

t.test('query string is forwarded byte for byte', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_OPTIMIZE_API_URL: `${up.url}/v1` })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const query = '?b=%7e&a=1&a=2&flag&x=a+b&y=%2F&z=%2f&empty=&u=%C3%A9&sp=a%20b'
  await send(`${proxy.url}/optimize/w${query}`)
  t.equal(only(up.received).url, `/v1/w${query}`)
})

t.test('without COS_API_URL an unclaimed path is 404 route_not_found and nothing is forwarded', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const path of ['/optimize/x', '/managementx', '/']) {
    const res = await send(proxy.url + path, { headers: { 'x-request-id': 'rid-404' } })
    t.equal(res.status, 404, path)
    t.same(json(res), { error: { code: 'route_not_found', message: 'no route for GET on this path' } })
    t.equal(res.headers['x-request-id'], 'rid-404')
    t.match(res.headers['content-type'], /^application\/json/)
  }
  t.equal(up.received.length, 0)
})

t.test('every request carries a fresh token that verifies; client credentials never reach the upstream', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (let i = 0; i < 5; i++) {
    await send(`${proxy.url}/x`, { headers: { authorization: 'Bearer client-token', 'proxy-authorization': 'Basic Zm9vOmJhcg==' } })
  }
  const auths = up.received.map(r => r.headers.authorization ?? '')
  t.equal(new Set(auths).size, 5, 'five different tokens')
  for (const r of up.received) {
    const auth = r.headers.authorization ?? ''
    t.match(auth, /^Bearer AKIDTEST%2F\d{19}%2F[0-9a-f]{32}%2F[A-Za-z0-9%]+$/, 'url-encoded token')
    t.ok(verifyToken(auth.slice(7), { accessKey: ACCESS_KEY, key }).ok, 'token verifies')
    t.equal(r.headers['proxy-authorization'], undefined, 'Proxy-Authorization dropped')
    t.equal(r.rawHeaders.filter(h => h.toLowerCase() === 'authorization').length, 1, 'exactly one Authorization header')
    t.notOk(auth.includes('client-token'))
  }
  const stamps = up.received.map(r => BigInt((r.headers.authorization ?? '').split('%2F')[1] ?? '0'))
  for (let i = 1; i < stamps.length; i++) t.ok((stamps[i] ?? 0n) > (stamps[i - 1] ?? 0n), 'timestamps increase')
})

t.test('COS_TOKEN_ENCODING=none sends the raw token', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, COS_TOKEN_ENCODING: 'none' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  await send(`${proxy.url}/x`)
  const auth = only(up.received).headers.authorization ?? ''
  t.match(auth, /^Bearer AKIDTEST\/\d{19}\/[0-9a-f]{32}\/[A-Za-z0-9+/]{43}=$/)
  t.ok(verifyToken(auth.slice(7), { accessKey: ACCESS_KEY, key }).ok)
})

t.test('Host is the upstream’s, other headers and the method pass unchanged, hop-by-hop headers are dropped', async t => {
  const up = await startUpstream()
  // A Host name the proxy accepts, and still replaces with the upstream's.
  const proxy = await startProxy({ COS_API_URL: up.url, COS_ALLOWED_HOSTS: 'client.example' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const methods = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']
  for (const method of methods) {
    await send(`${proxy.url}/m`, {
      method,
      headers: {
        host: 'client.example',
        'x-custom': 'v1',
        accept: 'application/json',
        'user-agent': 'test-agent/1',
        connection: 'keep-alive, x-hop',
        'x-hop': 'must-not-pass',
        'keep-alive': 'timeout=5',
        te: 'trailers',
      },
    })
  }
  t.same(up.received.map(r => r.method), methods)
  const upHost = new URL(up.url).host
  for (const r of up.received) {
    t.equal(r.headers.host, upHost)
    t.equal(r.headers['x-custom'], 'v1')
    t.equal(r.headers.accept, 'application/json')
    t.equal(r.headers['user-agent'], 'test-agent/1')
    t.equal(r.headers['x-hop'], undefined, 'header named in Connection dropped')
    t.equal(r.headers['keep-alive'], undefined)
    t.equal(r.headers.te, undefined)
  }
})

t.test('x-request-id: forwarded when sent, generated otherwise, returned on the response', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const given = await send(`${proxy.url}/a`, { headers: { 'x-request-id': 'abc-123' } })
  t.equal(given.headers['x-request-id'], 'abc-123')
  t.equal(up.received[0]?.headers['x-request-id'], 'abc-123')

  const generated = await send(`${proxy.url}/b`)
  const id = generated.headers['x-request-id']
  t.match(id, /^[0-9a-f-]{36}$/)
  t.equal(up.received[1]?.headers['x-request-id'], id)

  const tooLong = await send(`${proxy.url}/c`, { headers: { 'x-request-id': 'x'.repeat(300) } })
  t.match(tooLong.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'an unreasonable id is replaced')
})

t.test('bodies stream both ways unchanged: 5 MiB up and down, chunked, JSON and text not re-encoded', async t => {
  const big = randomBytes(5 * 1024 * 1024)
  const up = await startUpstream((req, res) => {
    if (req.url === '/download') {
      res.setHeader('content-type', 'application/octet-stream')
      res.end(big)
      return
    }
    res.end('ok')
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })

  await send(`${proxy.url}/upload`, { method: 'POST', body: big, headers: { 'content-type': 'application/octet-stream' } })
  t.equal(up.received[0]?.bodyBytes, big.length)
  t.equal(up.received[0]?.bodySha256, sha256(big))
  t.equal(up.received[0]?.headers['content-length'], String(big.length))

  async function * chunks (): AsyncIterable<Buffer> {
    for (let i = 0; i < 5; i++) yield big.subarray(i * 1024 * 1024, (i + 1) * 1024 * 1024)
  }
  await send(`${proxy.url}/chunked`, { method: 'PUT', body: chunks(), headers: { 'content-type': 'application/octet-stream' } })
  t.equal(up.received[1]?.bodySha256, sha256(big), 'chunked upload arrives intact')
  t.equal(up.received[1]?.headers['transfer-encoding'], 'chunked')

  const oddJson = '{ "b" :1,\n  "a":[ 1 , 2 ] }'
  await send(`${proxy.url}/json`, { method: 'POST', body: oddJson, headers: { 'content-type': 'application/json' } })
  t.equal(up.received[2]?.bodySha256, sha256(Buffer.from(oddJson)), 'JSON bytes not re-serialised')

  const text = Buffer.alloc(3 * 1024 * 1024, 'text ')
  await send(`${proxy.url}/text`, { method: 'POST', body: text, headers: { 'content-type': 'text/plain' } })
  t.equal(up.received[3]?.bodySha256, sha256(text), 'text/plain larger than Fastify’s body limit passes')

  const down = await send(`${proxy.url}/download`)
  t.equal(down.status, 200)
  t.equal(down.body.length, big.length)
  t.equal(sha256(down.body), sha256(big))
})

t.test('Expect: 100-continue uploads work', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const body = randomBytes(64 * 1024)
  const res = await send(`${proxy.url}/e`, { method: 'POST', body, headers: { expect: '100-continue', 'content-type': 'application/octet-stream' } })
  t.equal(res.status, 200)
  t.equal(up.received[0]?.bodySha256, sha256(body))
})

t.test('responses pass through: status, multiple Set-Cookie, 204, 304, HEAD, Location, hop-by-hop stripped', async t => {
  const up = await startUpstream((req, res) => {
    switch (req.url) {
      case '/cookies':
        res.setHeader('set-cookie', ['a=1; Path=/', 'b=2; HttpOnly', 'c=3'])
        res.setHeader('x-upstream', 'yes')
        res.statusCode = 201
        res.end('created')
        return
      case '/204':
        res.statusCode = 204
        res.end()
        return
      case '/304':
        res.statusCode = 304
        res.setHeader('etag', '"v1"')
        res.end()
        return
      case '/redirect':
        res.statusCode = 302
        res.setHeader('location', '/base/elsewhere')
        res.end()
        return
      case '/hop':
        res.setHeader('connection', 'x-private')
        res.setHeader('x-private', 'secret-ish')
        res.setHeader('keep-alive', 'timeout=1')
        res.end('hop')
        return
      case '/503':
        res.statusCode = 503
        res.end('busy')
        return
      default:
        res.setHeader('content-type', 'text/plain')
        res.setHeader('content-length', '5')
        res.end(req.method === 'HEAD' ? undefined : 'hello')
    }
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })

  const cookies = await send(`${proxy.url}/cookies`)
  t.equal(cookies.status, 201)
  t.same(cookies.headers['set-cookie'], ['a=1; Path=/', 'b=2; HttpOnly', 'c=3'])
  t.equal(cookies.headers['x-upstream'], 'yes')
  t.equal(cookies.body.toString(), 'created')

  const noContent = await send(`${proxy.url}/204`)
  t.equal(noContent.status, 204)
  t.equal(noContent.body.length, 0)

  const notModified = await send(`${proxy.url}/304`, { headers: { 'if-none-match': '"v1"' } })
  t.equal(notModified.status, 304)
  t.equal(notModified.headers.etag, '"v1"')
  t.equal(notModified.body.length, 0)
  t.equal(up.received.at(-1)?.headers['if-none-match'], '"v1"')

  const head = await send(`${proxy.url}/head`, { method: 'HEAD' })
  t.equal(head.status, 200)
  t.equal(head.headers['content-length'], '5')
  t.equal(head.body.length, 0)
  t.equal(up.received.at(-1)?.method, 'HEAD')

  const redirect = await send(`${proxy.url}/redirect`)
  t.equal(redirect.status, 302)
  t.equal(redirect.headers.location, '/base/elsewhere', 'Location not rewritten')

  const hop = await send(`${proxy.url}/hop`)
  t.equal(hop.body.toString(), 'hop')
  t.equal(hop.headers['x-private'], undefined, 'header named in upstream Connection dropped')
  t.equal(hop.headers['keep-alive'], undefined)

  const before = up.received.length
  const busy = await send(`${proxy.url}/503`)
  t.equal(busy.status, 503, 'an upstream 503 is returned as is')
  t.equal(busy.body.toString(), 'busy')
  t.equal(up.received.length, before + 1, 'and not retried')
})

t.test('one log line per request at info: method, route, status, duration, request id', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_OPTIMIZE_API_URL: up.url, COS_ACCESS_LOG: 'all' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  await send(`${proxy.url}/optimize/x?secret=1`, { headers: { 'x-request-id': 'log-1' } })
  await send(`${proxy.url}/nowhere`, { headers: { 'x-request-id': 'log-2' } })
  const lines = proxy.logs.records.filter(r => r.reqId === 'log-1' || r.reqId === 'log-2')
  t.equal(lines.length, 2, 'exactly one line per request')
  t.match(lines[0], { level: 'info', msg: 'request', method: 'GET', route: 'optimize', status: 200, reqId: 'log-1' })
  t.type(lines[0]?.durationMs, 'number')
  t.match(lines[1], { route: 'none', status: 404, reqId: 'log-2' })
  t.notOk(proxy.logs.text.includes('secret=1'), 'paths and queries are not logged')
})

t.test('small bodies are sent in one piece, larger ones streamed: bytes, headers and failures are the same either way', async t => {
  const bytes = (n: number): Buffer => Buffer.from(Array.from({ length: n }, (_, i) => i % 251))
  const up = await startUpstream((req, res) => {
    const [, kind = '', size = '0'] = req.url?.split('/') ?? []
    const body = bytes(Number(size))
    switch (kind) {
      case 'typed':
        res.setHeader('content-type', 'application/x-test')
        res.setHeader('content-length', String(body.length))
        res.end(body)
        return
      case 'json': // Fastify appends a charset to JSON it serialises: not to bytes it forwards
        res.setHeader('content-type', 'application/json')
        res.setHeader('content-length', '11')
        res.end('{"ok":true}')
        return
      case 'untyped': // no Content-Type: none may be added on the way
        res.setHeader('content-length', String(body.length))
        res.end(body)
        return
      case 'chunked':
        res.setHeader('content-type', 'application/x-test')
        res.write(body.subarray(0, 10))
        res.end(body.subarray(10))
        return
      case 'short': // declares more than it sends, then hangs up
        res.setHeader('content-type', 'application/json')
        res.setHeader('content-length', '100')
        res.write('{"partial":')
        setTimeout(() => res.socket?.destroy(), 20)
        return
      default:
        res.statusCode = 404
        res.end()
    }
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })

  for (const size of [0, 1, 200, 16 * 1024, 16 * 1024 + 1, 300_000]) {
    const typed = await send(`${proxy.url}/typed/${size}`)
    t.equal(typed.status, 200)
    t.ok(typed.body.equals(bytes(size)), `typed ${size} B: same bytes`)
    t.equal(typed.headers['content-length'], String(size), `typed ${size} B: Content-Length kept`)
    t.equal(typed.headers['content-type'], 'application/x-test', `typed ${size} B: Content-Type kept`)
    t.equal(typed.headers['transfer-encoding'], undefined)

    const untyped = await send(`${proxy.url}/untyped/${size}`)
    t.ok(untyped.body.equals(bytes(size)), `untyped ${size} B: same bytes`)
    t.equal(untyped.headers['content-type'], undefined, `untyped ${size} B: no Content-Type added`)

    const chunked = await send(`${proxy.url}/chunked/${size}`)
    t.ok(chunked.body.equals(bytes(size)), `chunked ${size} B: same bytes`)
  }

  const asJson = await send(`${proxy.url}/json/0`)
  t.equal(asJson.headers['content-type'], 'application/json', 'Content-Type passed exactly')
  t.equal(asJson.body.toString(), '{"ok":true}')

  const short = await send(`${proxy.url}/short/0`)
  t.equal(short.status, 502, 'a small body cut short before anything was sent: a clean 502, not a truncated 200')
  t.match(json(short), { error: { code: 'upstream_unavailable' } })
  t.equal((await send(`${proxy.url}/typed/10`)).status, 200, 'the proxy serves on')
})
