// Every refusal of the contract, sent as exact bytes on a raw socket: the
// status and JSON error code, that no upstream saw anything, and that the
// proxy keeps serving afterwards. `layer` records which part of the stack
// answered (documentation for the report; only the contract is asserted).
import { METHODS } from 'node:http'
import { createServer } from 'node:net'
import t, { type Test } from 'tap'
import { PROXY_METHODS } from '../../src/config/config.js'
import { json, listenOnLoopback, send, startProxy, type RunningProxy } from '../support/helpers.js'
import { errorOf, get, headerNames, rawRequest, startCountingUpstream, type CountingUpstream, type RawOptions, type RawResponse } from '../support/raw.js'

interface Rig {
  readonly proxy: RunningProxy
  readonly mgmt: CountingUpstream
  readonly opt: CountingUpstream
  readonly api: CountingUpstream
  /** Request heads seen by any upstream, complete or not. */
  readonly seen: () => number
  /** Requests any upstream received completely. */
  readonly completed: () => number
  /** Header lines a normal request needs (COS_REQUIRE_HEADER). */
  readonly extra: string
}

async function rig (t: Test, env: Record<string, string> = {}, extra = ''): Promise<Rig> {
  const mgmt = await startCountingUpstream()
  const opt = await startCountingUpstream()
  const api = await startCountingUpstream()
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: mgmt.url, COS_OPTIMIZE_API_URL: `${opt.url}/opt/v1`, COS_API_URL: `${api.url}/base`, ...env })
  t.teardown(async () => { await proxy.close(); await Promise.all([mgmt.close(), opt.close(), api.close()]) })
  return {
    proxy,
    mgmt,
    opt,
    api,
    seen: () => mgmt.started() + opt.started() + api.started(),
    completed: () => mgmt.received.length + opt.received.length + api.received.length,
    extra,
  }
}

/** Layers observed, printed once at the end for the report. */
const layers: string[] = []

function layerOf (res: RawResponse | undefined, headForwarded: boolean): string {
  if (headForwarded) return `${layerOf(res, false)} (after the head was forwarded; upstream request aborted)`
  if (res === undefined) return 'no response'
  const err = errorOf(res)
  const message = err?.message ?? ''
  if (err === undefined) {
    const body = res.body.toString('utf8')
    if (body.includes('FST_ERR_BAD_URL')) return 'fastify router (onBadUrl, not the JSON shape)'
    if (body === '') return 'node http server (empty body)'
    return `unknown (${body.slice(0, 60)})`
  }
  if (message === 'malformed HTTP request' || message.startsWith('the request headers exceed') || message.includes('not received in time')) return 'node parser → clientErrorHandler'
  if (message.startsWith('CONNECT')) return 'server connect handler'
  if (message === 'source/request contain invalid characters') return '@fastify/http-proxy / reply-from destination check'
  if ((err.code === 'method_not_allowed' && message.includes('on this route')) || message.startsWith('the path only looks like')) return 'route onRequest (admit)'
  if (err.code === 'route_not_found') return 'fastify router → not-found handler'
  return `guard (onRequest): ${message}`
}

async function healthy (t: Test, r: Rig, label: string): Promise<void> {
  const res = await rawRequest(r.proxy.port, get('/management/healthy', r.extra), { timeoutMs: 2000 })
  t.equal(res.finals[0]?.status, 200, `${label}: the proxy still serves a normal request`)
}

interface Refusal {
  readonly name: string
  readonly bytes: string | Buffer | readonly (string | Buffer)[]
  readonly status: number
  /** undefined: the JSON shape is not required (Node's own server wrote it). */
  readonly code: string | undefined
  /** The head may reach the upstream (a streamed body fails later) but no request may complete there. */
  readonly headMayPass?: boolean
  readonly opts?: RawOptions
  /** Overrides the layer guessed from the answer (for the report). */
  readonly layer?: string
}

async function expectRefused (t: Test, r: Rig, c: Refusal): Promise<RawResponse | undefined> {
  const seen = r.seen()
  const completed = r.completed()
  const res = await rawRequest(r.proxy.port, typeof c.bytes === 'string' ? Buffer.from(c.bytes, 'latin1') : c.bytes, { timeoutMs: 2500, settleMs: 100, ...c.opts })
  const first = res.finals[0]
  t.equal(res.finals.length, 1, `${c.name}: exactly one response`)
  t.equal(first?.status, c.status, `${c.name}: status ${c.status}`)
  if (c.code !== undefined) {
    t.same(errorOf(first)?.code, c.code, `${c.name}: JSON error {"error":{"code":"${c.code}",…}} (got ${JSON.stringify(first?.body.toString('utf8').slice(0, 160))})`)
  }
  if (first !== undefined) {
    t.notOk(headerNames(first).some(h => h === 'server' || h === 'x-powered-by'), `${c.name}: no Server / X-Powered-By`)
  }
  // give a forwarded request time to land before counting
  await new Promise(resolve => setTimeout(resolve, 30))
  layers.push(`${c.name.padEnd(44)} ${String(first?.status ?? '-').padEnd(4)} ${c.layer ?? layerOf(first, r.seen() > seen)}`)
  if (c.headMayPass === true) t.equal(r.completed() - completed, 0, `${c.name}: no upstream received a complete request`)
  else t.equal(r.seen() - seen, 0, `${c.name}: nothing reached any upstream`)
  await healthy(t, r, c.name)
  return first
}

const H = 'Host: 127.0.0.1\r\n'
const C = 'Connection: close\r\n'

t.test('request targets that are not a plain path, and CONNECT → 400', async t => {
  const r = await rig(t)
  const cases: Refusal[] = [
    { name: 'absolute-form http://other-host/x', bytes: `GET http://other-host/x HTTP/1.1\r\nHost: other-host\r\n${C}\r\n`, status: 400, code: 'bad_request' },
    { name: 'absolute-form https://127.0.0.1:1/x', bytes: `GET https://127.0.0.1:1/x HTTP/1.1\r\n${H}${C}\r\n`, status: 400, code: 'bad_request' },
    { name: 'absolute-form upper-case HTTP://other/x', bytes: `GET HTTP://other/x HTTP/1.1\r\n${H}${C}\r\n`, status: 400, code: 'bad_request' },
    { name: 'absolute-form POST with body', bytes: `POST http://other-host/x HTTP/1.1\r\n${H}Content-Length: 2\r\n${C}\r\nhi`, status: 400, code: 'bad_request' },
    { name: 'asterisk-form OPTIONS *', bytes: `OPTIONS * HTTP/1.1\r\n${H}${C}\r\n`, status: 400, code: 'bad_request' },
    { name: 'authority-form with GET', bytes: `GET other-host:80 HTTP/1.1\r\n${H}${C}\r\n`, status: 400, code: 'bad_request' },
    { name: 'CONNECT host:port', bytes: 'CONNECT other-host:443 HTTP/1.1\r\nHost: other-host:443\r\n\r\n', status: 400, code: 'bad_request' },
    { name: 'CONNECT to the upstream itself', bytes: `CONNECT 127.0.0.1:${new URL(r.api.url).port} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET / HTTP/1.1\r\n\r\n`, status: 400, code: 'bad_request' },
    { name: 'CONNECT with an origin-form path', bytes: `CONNECT /management/x HTTP/1.1\r\n${H}\r\n`, status: 400, code: 'bad_request' },
  ]
  for (const c of cases) await expectRefused(t, r, c)
})

t.test('nothing a client writes makes the proxy connect anywhere but its upstreams (open-relay probes)', async t => {
  // A canary server stands for "another host": it must never see a connection.
  const hits: string[] = []
  const canary = createServer(socket => {
    socket.on('data', (d: Buffer) => { hits.push(d.toString('latin1').split('\r\n')[0] ?? '') })
    socket.end('HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\ncanary')
  })
  const canaryPort = await listenOnLoopback(canary)
  t.teardown(() => new Promise<void>(resolve => { canary.close(() => { resolve() }) }))
  const c = `127.0.0.1:${canaryPort}`
  // the catch-all route without a base path is the easiest to confuse
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: up.url, COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const targets = [
    `http://${c}/x`, `//${c}/x`, `///${c}/x`, `/management//${c}/x`, `/management///${c}/x`, `/%2F%2F${c}/x`, `/%2F/${c}/x`,
    `/management/%2F%2F${c}/x`, `/http://${c}/x`, `/management/http://${c}/x`, `/\\\\${c}/x`, `/management/\\\\${c}/x`, `/@${c}/x`,
    `/management@${c}/x`, `/%40${c}/x`, `/%09//${c}/x`, `/management/%0d%0a//${c}`,
  ]
  for (const target of targets) {
    const res = await rawRequest(proxy.port, `GET ${target} HTTP/1.1\r\nHost: ${c}\r\nX-Forwarded-Host: ${c}\r\nForwarded: host=${c}\r\nConnection: close\r\n\r\n`)
    const status = res.finals[0]?.status ?? 0
    t.ok(status === 200 || (status >= 400 && status < 500), `${target}: forwarded to the upstream or refused (${status})`)
    t.notOk(res.text.includes('canary'), `${target}: the canary did not answer`)
  }
  t.same(hits, [], 'the canary never saw a connection')
  t.ok(up.received.every(r => r.headers.host === new URL(up.url).host), 'the upstream always got its own Host')
})

t.test('paths with dot-segments, backslashes, NUL, double encoding → 400, nothing forwarded', async t => {
  const r = await rig(t)
  const paths = [
    '/management/../optimize/x',
    '/management/%2e%2e/x',
    '/management/%2E%2E/x',
    '/management/%2E./x',
    '/management/.%2e/x',
    '/management/..%2fx',
    '/management/..%2Fx',
    '/management/%2f../x',
    '/management/%2F..',
    '/management/./x',
    '/management/%2e/x',
    '/management/.',
    '/management/..',
    '/%2e%2e/management/x',
    '/optimize/a/../../management/x',
    '/management/a\\b',
    '/management/..\\x',
    '/management/a%5Cb',
    '/management/a%5cb',
    '/management/..%5cx',
    '/management/a%00b',
    '/management/%00',
    '/management/%252e%252e/x',
    '/management/%25%32%65%25%32%65/x',
    '/management/a%252fb',
    '/management/a%255cb',
    '/management/a%2500b',
    '/management/x#frag',
    '/optimize/..;/management/x',
    '/optimize/a/..;x/..;y/management/x',
    '/optimize/.;/x',
    '/optimize/..%3B/management/x',
    '/optimize/..%20/management/x',
  ]
  for (const path of paths) await expectRefused(t, r, { name: `path ${path}`, bytes: get(path), status: 400, code: 'bad_request' })
})

t.test('malformed percent-escapes → 400 in the proxy\'s JSON shape', async t => {
  const r = await rig(t)
  for (const path of ['/management/%zz', '/management/%', '/management/%c0%ae%c0%ae/x', '/%E0%A4%A']) {
    await expectRefused(t, r, { name: `malformed escape ${path}`, bytes: get(path), status: 400, code: 'bad_request' })
  }
})

t.test('an encoded "/" that would change the route → 400; one that would not is forwarded as is', async t => {
  const r = await rig(t)
  for (const path of ['/optimize%2Fx', '/optimize%2fx', '/optimize%2F', '/management%2Fclusters', '/management%2F..%2Foptimize']) {
    await expectRefused(t, r, { name: `route-changing ${path}`, bytes: get(path), status: 400, code: 'bad_request' })
  }
  const ok: [string, CountingUpstream, string][] = [
    ['/optimize/a%2Fb', r.opt, '/opt/v1/a%2Fb'],
    ['/management/a%2fb%2Fc?x=%2F', r.mgmt, '/a%2fb%2Fc?x=%2F'],
    ['/other%2Fthing', r.api, '/base/other%2Fthing'],
  ]
  for (const [path, upstream, expected] of ok) {
    const before = upstream.received.length
    const res = await rawRequest(r.proxy.port, get(path))
    t.equal(res.finals[0]?.status, 200, `${path} forwarded`)
    t.equal(upstream.received.at(before)?.url, expected, `${path} → ${expected} on the intended upstream`)
  }
})

t.test('ambiguous framing and malformed header lines → 400, nothing forwarded', async t => {
  const r = await rig(t)
  const P = `POST /management/x HTTP/1.1\r\n${H}`
  const cases: [string, string][] = [
    ['Content-Length + Transfer-Encoding', `${P}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding + Content-Length', `${P}Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n`],
    ['Content-Length repeated, same value', `${P}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello`],
    ['Content-Length repeated, different values', `${P}Content-Length: 5\r\nContent-Length: 0\r\n\r\nhello`],
    ['Content-Length list "5, 5"', `${P}Content-Length: 5, 5\r\n\r\nhello`],
    ['Content-Length non-numeric "5x"', `${P}Content-Length: 5x\r\n\r\nhello`],
    ['Content-Length "+5"', `${P}Content-Length: +5\r\n\r\nhello`],
    ['Content-Length "-1"', `${P}Content-Length: -1\r\n\r\n`],
    ['Content-Length "0x5"', `${P}Content-Length: 0x5\r\n\r\nhello`],
    ['Content-Length empty', `${P}Content-Length: \r\n\r\n`],
    ['Content-Length beyond 2^64', `${P}Content-Length: 99999999999999999999\r\n\r\n`],
    ['Transfer-Encoding "chunked, identity"', `${P}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding "xchunked"', `${P}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding "chunkedx"', `${P}Transfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding "identity"', `${P}Transfer-Encoding: identity\r\n\r\n`],
    ['Transfer-Encoding "gzip"', `${P}Transfer-Encoding: gzip\r\n\r\n`],
    ['Transfer-Encoding chunked + Transfer-Encoding x', `${P}Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding with space before colon', `${P}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding with tab before colon', `${P}Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n`],
    ['Transfer-Encoding value after vertical tab', `${P}Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n`],
    ['Content-Length with space before colon', `${P}Content-Length : 0\r\n\r\n`],
    ['obs-fold in Transfer-Encoding', `${P}Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n`],
    ['obs-fold in an ordinary header', `${P}X-A: a\r\n\tb\r\nContent-Length: 0\r\n\r\n`],
    ['bare CR inside a header value', `${P}X-A: a\rb\r\nContent-Length: 0\r\n\r\n`],
    ['bare LF inside a header value', `${P}X-A: a\nX-B: b\r\nContent-Length: 0\r\n\r\n`],
    ['NUL inside a header value', `${P}X-A: a\x00b\r\nContent-Length: 0\r\n\r\n`],
    ['header line without a colon', `${P}X-A\r\nContent-Length: 0\r\n\r\n`],
    ['empty header name', `${P}: x\r\nContent-Length: 0\r\n\r\n`],
    ['bare LF line endings', 'POST /management/x HTTP/1.1\nHost: a\nContent-Length: 0\n\n'],
    ['tab inside the request target', `GET /management/a\tb HTTP/1.1\r\n${H}${C}\r\n`],
    ['raw non-ASCII bytes in the request target', `GET /management/\xc3\xa9\xff HTTP/1.1\r\n${H}${C}\r\n`],
  ]
  for (const [name, bytes] of cases) await expectRefused(t, r, { name, bytes, status: 400, code: 'bad_request' })
  // HTTP/1.1 without Host: Node's server answers 400 itself (not through the proxy).
  await expectRefused(t, r, { name: 'HTTP/1.1 without Host', bytes: `GET /management/x HTTP/1.1\r\n${C}\r\n`, status: 400, code: undefined })
})

t.test('malformed chunked bodies → 400; the streamed head may reach the upstream, a complete request never', async t => {
  const r = await rig(t)
  const P = `POST /management/x HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n`
  const cases: [string, string][] = [
    ['chunk size overflowing 64 bits', `${P}ffffffffffffffffff\r\nhello\r\n0\r\n\r\n`],
    ['chunk data longer than its size', `${P}5\r\nhelloXX0\r\n\r\n`],
    ['negative chunk size', `${P}-5\r\nhello\r\n0\r\n\r\n`],
    ['chunk size with 0x prefix', `${P}0x5\r\nhello\r\n0\r\n\r\n`],
    ['chunk lines ended by bare LF', `${P}5\nhello\n0\n\n`],
  ]
  for (const [name, bytes] of cases) await expectRefused(t, r, { name, bytes, status: 400, code: 'bad_request', headMayPass: true })
})

t.test('headers over 16 KiB → 431, nothing forwarded', async t => {
  const r = await rig(t)
  const big = (n: number): string => `GET /management/x HTTP/1.1\r\n${H}X-Big: ${'b'.repeat(n)}\r\n${C}\r\n`
  await expectRefused(t, r, { name: 'one 17 KiB header', bytes: big(17 * 1024), status: 431, code: 'request_header_fields_too_large' })
  await expectRefused(t, r, { name: 'one 64 KiB header', bytes: big(64 * 1024), status: 431, code: 'request_header_fields_too_large' })
  await expectRefused(t, r, { name: '17 KiB request target', bytes: get(`/management/x?q=${'q'.repeat(17 * 1024)}`), status: 431, code: 'request_header_fields_too_large' })
  // Total size on the wire, made of many short lines.
  const many = (count: number, tail = ''): string => `GET /management/x HTTP/1.1\r\n${H}${Array.from({ length: count }, () => 'a: 1\r\n').join('')}${tail}${C}\r\n`
  await expectRefused(t, r, { name: '3000 short headers (18 KiB on the wire)', bytes: many(3000), status: 431, code: 'request_header_fields_too_large' })
  await expectRefused(t, r, { name: '8000 short headers (48 KiB on the wire)', bytes: many(8000), status: 431, code: 'request_header_fields_too_large' })
  const numbered = (count: number, tail: string): string => `GET /management/x HTTP/1.1\r\n${H}${Array.from({ length: count }, (_, i) => `X-${i}: 1\r\n`).join('')}${tail}\r\n`
  // Node keeps only the first 2000 header lines in req.headers; what follows is invisible to the guard.
  await expectRefused(t, r, { name: 'Upgrade: websocket after 2100 headers (22 KiB)', bytes: numbered(2100, 'Connection: Upgrade\r\nUpgrade: websocket\r\n'), status: 431, code: 'request_header_fields_too_large' })
  // just under the limit passes
  const res = await rawRequest(r.proxy.port, big(15 * 1024))
  t.equal(res.finals[0]?.status, 200, '15 KiB of headers are forwarded')
})

t.test('COS_MAX_BODY_BYTES: a Content-Length above it, or a chunked body that grows above it → 413', async t => {
  const r = await rig(t, { COS_MAX_BODY_BYTES: '100' })
  const P = `POST /management/upload HTTP/1.1\r\n${H}`
  await expectRefused(t, r, { name: 'Content-Length 101 (limit 100)', bytes: `${P}Content-Length: 101\r\n${C}\r\n${'a'.repeat(101)}`, status: 413, code: 'payload_too_large' })
  await expectRefused(t, r, { name: 'Content-Length 10^15, no body sent', bytes: `${P}Content-Length: 1000000000000000\r\n\r\n`, status: 413, code: 'payload_too_large' })
  await expectRefused(t, r, { name: 'Content-Length 101 + Expect: 100-continue', bytes: `${P}Content-Length: 101\r\nExpect: 100-continue\r\n\r\n`, status: 413, code: 'payload_too_large' })
  const streamed = 'BodyLimit stream → reply-from onError'
  await expectRefused(t, r, {
    name: 'chunked, one 150-byte chunk',
    layer: streamed,
    bytes: `${P}Transfer-Encoding: chunked\r\n${C}\r\n96\r\n${'a'.repeat(150)}\r\n0\r\n\r\n`,
    status: 413,
    code: 'payload_too_large',
    headMayPass: true,
  })
  await expectRefused(t, r, {
    name: 'chunked, 60 + 60 bytes 100 ms apart',
    layer: streamed,
    bytes: [`${P}Transfer-Encoding: chunked\r\n${C}\r\n3c\r\n${'a'.repeat(60)}\r\n`, `3c\r\n${'a'.repeat(60)}\r\n`, '0\r\n\r\n'],
    opts: { gapMs: 100 },
    status: 413,
    code: 'payload_too_large',
    headMayPass: true,
  })
  await expectRefused(t, r, {
    name: 'chunked, 100 one-byte chunks then more, never finished',
    layer: streamed,
    bytes: [`${P}Transfer-Encoding: chunked\r\n\r\n`, '1\r\na\r\n'.repeat(100), '1\r\na\r\n'],
    opts: { gapMs: 50 },
    status: 413,
    code: 'payload_too_large',
    headMayPass: true,
  })
  for (const [name, bytes] of [
    ['Content-Length 100', `${P}Content-Length: 100\r\n${C}\r\n${'a'.repeat(100)}`],
    ['chunked 100', `${P}Transfer-Encoding: chunked\r\n${C}\r\n64\r\n${'a'.repeat(100)}\r\n0\r\n\r\n`],
  ] as const) {
    const before = r.mgmt.received.length
    const res = await rawRequest(r.proxy.port, bytes)
    t.equal(res.finals[0]?.status, 200, `${name}: at the limit is forwarded`)
    t.equal(r.mgmt.received.at(before)?.bodyBytes, 100, `${name}: all 100 bytes arrived`)
  }
})

t.test('WebSocket upgrades → 405 (other upgrades are ignored: test/security/upgrade.test.ts)', async t => {
  const r = await rig(t)
  const cases: [string, string][] = [
    ['WebSocket upgrade', 'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n'],
    ['WebSocket upgrade, odd case', 'connection: keep-alive, UPGRADE\r\nupgrade: WebSocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n'],
    ['WebSocket among other upgrade tokens', 'Connection: Upgrade\r\nUpgrade: h2c, websocket/13\r\n'],
    ['WebSocket in a repeated Upgrade header', 'Connection: Upgrade\r\nUpgrade: h2c\r\nUpgrade: WEBSOCKET\r\n'],
    ['Upgrade without Connection: upgrade', `Upgrade: websocket\r\n${C}`],
  ]
  for (const [name, headers] of cases) {
    await expectRefused(t, r, { name, bytes: `GET /management/ws HTTP/1.1\r\n${H}${headers}\r\n`, status: 405, code: 'method_not_allowed' })
  }
})

t.test('per-route allowed methods → 405 with Allow; TRACE is never forwarded', async t => {
  const r = await rig(t, { COS_MANAGEMENT_ALLOWED_METHODS: 'GET,HEAD', COS_OPTIMIZE_ALLOWED_METHODS: 'POST' })
  for (const method of ['POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']) {
    const body = method === 'OPTIONS' || method === 'DELETE' ? '' : 'Content-Length: 2\r\n'
    const bytes = `${method} /management/x HTTP/1.1\r\n${H}${body}${C}\r\n${body === '' ? '' : 'hi'}`
    await expectRefused(t, r, { name: `${method} on a GET,HEAD route`, bytes, status: 405, code: 'method_not_allowed' })
    const res = await rawRequest(r.proxy.port, bytes)
    t.same(res.finals[0]?.headers.allow, ['GET, HEAD'], `${method}: Allow lists the route's methods`)
  }
  await expectRefused(t, r, { name: 'GET on a POST route', bytes: get('/optimize/x'), status: 405, code: 'method_not_allowed' })
  t.same((await rawRequest(r.proxy.port, get('/optimize/x'))).finals[0]?.headers.allow, ['POST'])
  await expectRefused(t, r, { name: 'TRACE (may echo the token back)', bytes: `TRACE /management/x HTTP/1.1\r\n${H}${C}\r\n`, status: 405, code: 'method_not_allowed' })
  const mgmtBefore = r.mgmt.received.length
  t.equal((await rawRequest(r.proxy.port, get('/management/x'))).finals[0]?.status, 200, 'GET allowed')
  t.equal((await rawRequest(r.proxy.port, `HEAD /management/x HTTP/1.1\r\n${H}${C}\r\n`, { head: true })).finals[0]?.status, 200, 'HEAD allowed')
  t.equal(r.mgmt.received.length - mgmtBefore, 2)
  const optBefore = r.opt.received.length
  t.equal((await rawRequest(r.proxy.port, `POST /optimize/x HTTP/1.1\r\n${H}Content-Length: 2\r\n${C}\r\nhi`)).finals[0]?.status, 200, 'POST allowed on optimize')
  t.equal(r.opt.received.length - optBefore, 1)
  // TRACE on a route without a method list is not forwarded either
  const open = await rig(t)
  const seen = open.seen()
  const trace = await rawRequest(open.proxy.port, `TRACE /management/x HTTP/1.1\r\n${H}${C}\r\n`)
  t.ok((trace.finals[0]?.status ?? 0) >= 400 && (trace.finals[0]?.status ?? 0) < 500, `TRACE without a method list: 4xx (got ${trace.finals[0]?.status})`)
  t.equal(open.seen() - seen, 0, 'TRACE never forwarded')
})

t.test('COS_REQUIRE_HEADER: missing, other value, sent twice, empty → 403; never forwarded', async t => {
  const r = await rig(t, { COS_REQUIRE_HEADER: 'X-COS-Proxy: 1' }, 'X-COS-Proxy: 1\r\n')
  const cases: [string, string][] = [
    ['missing', ''],
    ['other value', 'X-COS-Proxy: 2\r\n'],
    ['value with a suffix', 'X-COS-Proxy: 1,1\r\n'],
    ['sent twice (same value)', 'X-COS-Proxy: 1\r\nX-COS-Proxy: 1\r\n'],
    ['empty', 'X-COS-Proxy:\r\n'],
    ['similar name', 'X-COS-Proxy-: 1\r\nX-COS-Proxies: 1\r\n'],
  ]
  for (const [name, header] of cases) {
    await expectRefused(t, r, { name: `required header ${name}`, bytes: get('/management/x', header), status: 403, code: 'missing_required_header' })
  }
  const before = r.mgmt.received.length
  for (const header of ['X-COS-Proxy: 1\r\n', 'x-cos-proxy:   1  \r\n', 'Connection: keep-alive\r\nX-COS-PROXY: 1\r\n']) {
    const res = await rawRequest(r.proxy.port, get('/management/x', header))
    t.equal(res.finals[0]?.status, 200, `accepted: ${JSON.stringify(header)}`)
  }
  t.equal(r.mgmt.received.length - before, 3)
  for (const rec of r.mgmt.received.slice(before)) {
    t.notOk(rec.rawHeaders.some((h, i) => i % 2 === 0 && h.toLowerCase() === 'x-cos-proxy'), 'the required header is not forwarded')
  }
  // name only: any non-empty value
  const nameOnly = await rig(t, { COS_REQUIRE_HEADER: 'X-COS-Proxy' }, 'X-COS-Proxy: yes\r\n')
  await expectRefused(t, nameOnly, { name: 'name-only required header missing', bytes: get('/management/x'), status: 403, code: 'missing_required_header' })
  await expectRefused(t, nameOnly, { name: 'name-only required header empty', bytes: get('/management/x', 'X-COS-Proxy:   \r\n'), status: 403, code: 'missing_required_header' })
  // Node joins repeated headers into one "a, b" string: "sent twice" must still be caught.
  await expectRefused(t, nameOnly, { name: 'name-only required header sent twice', bytes: get('/management/x', 'X-COS-Proxy: yes\r\nX-COS-Proxy: yes\r\n'), status: 403, code: 'missing_required_header' })
  t.equal((await rawRequest(nameOnly.proxy.port, get('/management/x', 'X-COS-Proxy: anything\r\n'))).finals[0]?.status, 200, 'name-only: any value passes')
})

t.test('layers that answered (for the report)', async t => {
  t.comment(`\n${layers.join('\n')}`)
  t.pass('recorded')
})

const OVERRIDES = ['X-HTTP-Method-Override', 'X-HTTP-Method', 'X-Method-Override', 'X-Original-Method', 'X-Original-HTTP-Method', 'X-Rewrite-Method', 'X-Method']

t.test('a method-override header cannot bypass COS_*_ALLOWED_METHODS', async t => {
  const r = await rig(t, { COS_MANAGEMENT_ALLOWED_METHODS: 'GET,HEAD' })
  for (const name of OVERRIDES) {
    for (const value of ['DELETE', ' delete ', 'GET, DELETE']) {
      const res = await send(`${r.proxy.url}/management/x`, { headers: { [name]: value } })
      t.equal(res.status, 405, `${name}: ${value}`)
      t.equal(res.headers.allow, 'GET, HEAD', 'Allow lists the route\'s methods')
      const message = (json(res) as { error: { code: string, message: string } }).error.message
      // It says the header is the cause: the request's own method (GET) is allowed.
      t.match(message, new RegExp(`^the ${name.toLowerCase()} header asks for (DELETE|another method), which is not allowed on this route$`), message)
    }
  }
  t.equal((await send(`${r.proxy.url}/management/x`, { headers: { 'X-HTTP-Method-Override': 'GET' } })).status, 200, 'naming an allowed method is fine')
  t.equal((await send(`${r.proxy.url}/management/x`, { method: 'DELETE' })).headers.allow, 'GET, HEAD')
  t.match((json(await send(`${r.proxy.url}/management/x`, { method: 'DELETE' })) as { error: { message: string } }).error.message, /^DELETE is not allowed on this route$/)
  t.equal(r.completed(), 1, 'only the allowed one was forwarded')
})

t.test('a method-override header cannot turn a request into TRACE or another method the proxy never forwards, on any route', async t => {
  const r = await rig(t) // no method lists
  for (const name of OVERRIDES) {
    for (const value of ['TRACE', 'CONNECT', 'PROPFIND', 'TRACK']) {
      const res = await send(`${r.proxy.url}/other/x`, { method: 'POST', headers: { [name]: value }, body: 'hi' })
      t.equal(res.status, 405, `${name}: ${value}`)
      t.equal(res.headers.allow, 'DELETE, GET, HEAD, PATCH, POST, PUT, OPTIONS')
      t.match(res.body.toString(), new RegExp(`the ${name.toLowerCase()} header asks for ${value}`))
    }
  }
  t.equal(r.seen(), 0, 'none was forwarded')
  // Naming a method the route forwards anyway gains nothing: passed on as sent.
  const ok = await send(`${r.proxy.url}/other/x`, { method: 'POST', headers: { 'X-HTTP-Method-Override': 'PATCH' }, body: 'hi' })
  t.equal(ok.status, 200)
  t.equal(r.api.received[0]?.headers['x-http-method-override'], 'PATCH', 'forwarded unchanged')
})

t.test('a path that only looks like a route prefix cannot reach the catch-all past COS_*_ALLOWED_METHODS', async t => {
  const r = await rig(t, { COS_MANAGEMENT_ALLOWED_METHODS: 'GET,HEAD', COS_OPTIMIZE_PATH_PREFIX: '/opt/v1', COS_OPTIMIZE_ALLOWED_METHODS: 'GET' })
  const lookalikes = [
    '/management;x/clusters', '/management%3Bx/clusters', '/MANAGEMENT/clusters', '/%4Danagement/clusters', '/management./clusters',
    '/management%20/clusters', '/management%2E/clusters', '/management%09/clusters', '/management%2e%2e/clusters', '//management/clusters',
    '/;x/management/clusters', '/%EF%BD%8Danagement/clusters', '/%254Danagement/clusters',
    '/opt/V1/x', '/OPT/v1/x', '/opt;x/v1/x', '/opt//v1/x', '/opt/v1;x/y', '/opt/v1./y',
  ]
  for (const path of lookalikes) {
    const first = await expectRefused(t, r, { name: `DELETE ${path}`, bytes: `DELETE ${path} HTTP/1.1\r\n${H}${C}\r\n`, status: 400, code: 'bad_request' })
    t.match(errorOf(first)?.message, /only looks like the \/(management|opt\/v1) prefix/, `${path}: says why`)
  }
  // Still as before: the route itself with its list, the form the router decodes to it, and paths merely sharing letters.
  t.equal((await rawRequest(r.proxy.port, `DELETE /management/clusters HTTP/1.1\r\n${H}${C}\r\n`)).finals[0]?.status, 405, 'DELETE /management/clusters: the route\'s list')
  const forwarded: [string, string, CountingUpstream, string][] = [
    ['GET', '/%6Danagement/clusters', r.mgmt, '/clusters'],
    ['DELETE', '/managementx/clusters', r.api, '/base/managementx/clusters'],
    ['DELETE', '/opt/v2/x', r.api, '/base/opt/v2/x'],
    ['DELETE', '/v1/management/x', r.api, '/base/v1/management/x'],
    ['GET', '/opt/v1/x', r.opt, '/opt/v1/x'],
  ]
  for (const [method, path, upstream, expected] of forwarded) {
    const before = upstream.received.length
    t.equal((await rawRequest(r.proxy.port, `${method} ${path} HTTP/1.1\r\n${H}${C}\r\n`)).finals[0]?.status, 200, `${method} ${path} forwarded`)
    t.equal(upstream.received.at(before)?.url, expected, `${method} ${path} → ${expected}`)
  }
})

t.test('methods the proxy does not forward get a JSON 405 naming them, with Allow, whichever layer knows them', async t => {
  const r = await rig(t)
  // Node's parser knows these (Fastify's router only some); CONNECT has its own answer (400, not a forward proxy).
  const parsed = METHODS.filter(m => !(PROXY_METHODS as readonly string[]).includes(m) && m !== 'CONNECT')
  // These Node's parser rejects: made up, or in the wrong case.
  const unknown = ['FOO', 'BREW', 'PROPFOO', 'TRACK', 'get', 'Delete', 'X-CUSTOM_1']
  for (const method of [...parsed, ...unknown]) {
    const first = await expectRefused(t, r, { name: method, bytes: `${method} /management/x HTTP/1.1\r\n${H}${C}\r\n`, status: 405, code: 'method_not_allowed' })
    t.same(first?.headers.allow, ['DELETE, GET, HEAD, PATCH, POST, PUT, OPTIONS'], `${method}: Allow`)
    const message = errorOf(first)?.message ?? ''
    t.ok(message.startsWith(`${method} is `), `${method}: named (${message})`)
    if (method === 'TRACE' || method === 'TRACK') t.match(message, /never forwarded: the upstream would echo the request back, signed token included/)
    else t.match(message, /is not forwarded: the proxy forwards only the methods of the COS APIs/)
  }
  t.match(errorOf(await expectRefused(t, r, { name: 'get', bytes: `get /management/x HTTP/1.1\r\n${H}${C}\r\n`, status: 405, code: 'method_not_allowed' }))?.message, /case-sensitive/)
  // Not a method at all (a TLS ClientHello on the plain port, a bare token): malformed, 400.
  await expectRefused(t, r, { name: 'TLS ClientHello', bytes: Buffer.from('160301020001000100', 'hex'), status: 400, code: 'bad_request' })
  await expectRefused(t, r, { name: 'token without a target', bytes: `FOO\r\n${H}\r\n`, status: 400, code: 'bad_request' })
})
