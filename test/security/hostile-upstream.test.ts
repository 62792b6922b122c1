// A hostile (or broken) upstream, from raw TCP servers that answer with exact
// bytes: what it can make the proxy do to its clients. Interim answers are
// skipped and the final one forwarded; malformed answers give a clean 502 and
// leave the client's connection serving; bytes past an answer reach no one;
// nothing it sends can hold a request past the proxy's bounds.
import { createServer as createNetServer, type Socket } from 'node:net'
import t from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { buildProxyServer, metricsObserver } from '../../src/proxy/proxy-server.js'
import { HeaderMinter, secretKey } from '../../src/token/token.js'
import { ACCESS_KEY, REFUSING_PORT, SECRET, listenOnLoopback, startProxy, testConfig } from '../support/helpers.js'
import { converse, errorOf, pathOf, rawRequest, startRawUpstream } from '../support/raw.js'

const H = 'Host: 127.0.0.1\r\n'
const GET = (path: string): string => `GET ${path} HTTP/1.1\r\n${H}\r\n`
const OK = 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok'

/** The sum of every sample of `name` whose labels include `labels` (a `k="v"` list). */
function sampled (text: string, name: string, labels = ''): number {
  let sum = 0
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) || !line.includes(labels)) continue
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}

t.test('interim answers (102 Processing, 103 Early Hints, an unknown 1xx) before the final answer do not turn it into a 502: the final answer reaches the client, only it is counted', async t => {
  const answers: Record<string, string> = {
    '/103': `HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n${OK}`,
    '/102': `HTTP/1.1 102 Processing\r\n\r\n${OK}`,
    '/104': `HTTP/1.1 104 Upload Resumption Supported\r\nUpload-Draft-Interop-Version: 3\r\n\r\n${OK}`,
    // Several, then a streamed (chunked) final answer.
    '/many': 'HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.js>; rel=preload\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </b.js>; rel=preload\r\n\r\n' +
      'HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n',
  }
  const up = await startRawUpstream((head, socket) => { socket.write(answers[pathOf(head)] ?? OK) })
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const proxy = await startProxy({ COS_API_URL: up.url }, 'info', { observer: metricsObserver(metrics) })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const paths = Object.keys(answers)
  const talk = await converse(proxy.port, paths.map(GET))
  t.same(talk.finals.map(r => r.status), [200, 200, 200, 201], 'each final answer, in order, on one client connection')
  t.same(talk.finals.map(r => r.body.toString()), ['ok', 'ok', 'ok', 'hello'])
  t.equal(talk.responses.length, talk.finals.length, 'no interim answer is forwarded (docs/routing.md)')
  t.equal(talk.leftover.length, 0, 'nothing else on the wire')
  t.notOk(talk.closedByPeer, 'the client connection stays open')
  const text = await metrics.text()
  t.equal(sampled(text, 'cos_auth_proxy_upstream_responses_total', 'status_class="1xx"'), 0, 'interim answers are not counted as upstream answers')
  t.equal(sampled(text, 'cos_auth_proxy_upstream_responses_total', 'status_class="2xx"'), paths.length, 'the final answers are, once each')
  t.equal(sampled(text, 'cos_auth_proxy_upstream_errors_total'), 0, 'no upstream error')
})

t.test('a stream of interim answers cannot hold a request past COS_UPSTREAM_TIMEOUT_MS: 504', async t => {
  const up = await startRawUpstream((head, socket) => {
    if (pathOf(head) !== '/endless') { socket.write(OK); return }
    const tick = setInterval(() => { if (socket.writable) socket.write('HTTP/1.1 102 Processing\r\n\r\n') }, 50)
    socket.on('close', () => { clearInterval(tick) })
  })
  const proxy = await startProxy({ COS_API_URL: up.url, COS_UPSTREAM_TIMEOUT_MS: '400' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const started = Date.now()
  const talk = await converse(proxy.port, [GET('/endless'), GET('/next')], { timeoutMs: 6000 })
  const ms = Date.now() - started
  t.same(talk.finals.map(r => r.status), [504, 200], 'a 504, then the next request on the connection is answered')
  t.equal(errorOf(talk.finals[0])?.code, 'upstream_timeout')
  t.ok(ms < 5000, `ended in ${ms} ms (the timeout twice at most, with a wide margin)`)
})

t.test('malformed upstream answers give a clean 502, and the next request on the same client connection gets the right answer', async t => {
  const answers: Record<string, string> = {
    '/bare-100': 'HTTP/1.1 100 Continue\r\n\r\n' + OK,
    '/cl-and-chunked': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
    '/te-identity': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\nok',
    '/bad-chunk-size': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n',
    '/chunk-size-bare-lf': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n',
    '/chunk-size-overflow': 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nok\r\n0\r\n\r\n',
    '/two-lengths': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok',
    '/length-list': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2, 2\r\n\r\nok',
    '/plus-length': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: +2\r\n\r\nok',
    '/oversized-head': `HTTP/1.1 200 OK\r\nX-Big: ${'b'.repeat(70 * 1024)}\r\nContent-Length: 2\r\n\r\nok`,
    '/obs-fold': 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok',
    '/bare-lf': 'HTTP/1.1 200 OK\nContent-Type: text/plain\nContent-Length: 2\n\nok',
    '/status-600': 'HTTP/1.1 600 Odd\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok',
    '/status-999': 'HTTP/1.1 999 Odd\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok',
    '/status-099': 'HTTP/1.1 099 Odd\r\n\r\n' + OK,
  }
  const up = await startRawUpstream((head, socket) => {
    const path = pathOf(head)
    const answer = answers[path]
    // A connection that carried a bad answer is closed by the proxy; it is also ended here, so nothing waits on it.
    if (answer === undefined) socket.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${path.length}\r\n\r\n${path}`)
    else socket.end(answer)
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const path of Object.keys(answers)) {
    const talk = await converse(proxy.port, [GET(path), GET(`/after${path}`)])
    t.same(talk.finals.map(r => r.status), [502, 200], `${path}: 502, then the next request is answered`)
    t.equal(errorOf(talk.finals[0])?.code, 'upstream_unavailable', `${path}: the proxy's JSON error`)
    t.equal(talk.finals[1]?.body.toString(), `/after${path}`, `${path}: the next answer is that request's own`)
    t.equal(talk.responses.length, 2, `${path}: nothing interim forwarded`)
    t.equal(talk.leftover.length, 0, `${path}: no stray bytes`)
  }
  t.notOk(proxy.logs.text.includes('internal_error'), 'never a 500')
})

t.test('bytes an upstream sends past the end of its answer reach no one: not that client, not the next request', async t => {
  const smuggled = 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\nsmuggled'
  let stray = 0
  const up = await startRawUpstream((head, socket) => {
    const path = pathOf(head)
    if (path === '/collected') socket.write(OK + smuggled)
    else if (path === '/streamed') socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${20 * 1024}\r\n\r\n${'s'.repeat(20 * 1024)}${smuggled}`)
    else if (path === '/chunked') socket.write(`HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n${smuggled}`)
    else if (path === '/head') socket.write(`HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok${smuggled}`)
    else if (path === '/no-content') socket.write(`HTTP/1.1 204 No Content\r\n\r\n${smuggled}`)
    else { stray++; socket.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${path.length}\r\n\r\n${path}`) }
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const [path, method, status, length] of [['/collected', 'GET', 200, 2], ['/streamed', 'GET', 200, 20 * 1024], ['/chunked', 'GET', 200, 2], ['/head', 'HEAD', 200, 0], ['/no-content', 'GET', 204, 0]] as const) {
    const requests = [`${method} ${path} HTTP/1.1\r\n${H}\r\n`, GET('/next'), GET('/last')]
    const res = method === 'HEAD'
      ? await rawRequest(proxy.port, requests[0] ?? '', { head: true })
      : await converse(proxy.port, requests)
    t.equal(res.finals[0]?.status, status, `${path}: its own answer`)
    t.equal(res.finals[0]?.body.length, length, `${path}: its own body, whole and no more`)
    if (method !== 'HEAD') t.same(res.finals.slice(1).map(r => r.body.toString()), ['/next', '/last'], `${path}: then the next requests get their own answers`)
    t.notOk(res.responses.some(r => r.body.toString() === 'smuggled'), `${path}: the stray answer reaches no client`)
    t.equal(res.leftover.length, 0, `${path}: no stray bytes`)
  }
  t.ok(stray >= 8, 'the next requests were answered by the upstream, each by its own answer')
})

/** A raw upstream for 401 retries: the first request of each test gets `first` (a 401), the re-signed one 200. */
async function rotatingUpstream (first: (socket: Socket) => void): Promise<{ url: string, firstClosed: () => boolean, requests: () => number, close: () => Promise<void> }> {
  let firstClosed = false
  const up = await startRawUpstream((_head, socket) => {
    if (up.heads.length % 2 === 1) {
      socket.once('close', () => { firstClosed = true })
      first(socket)
    } else {
      socket.write(OK)
    }
  })
  return { url: up.url, firstClosed: () => firstClosed, requests: () => up.heads.length, close: up.close }
}

t.test('the 401 read before a key-rotation retry is bounded in size and time: past either, its connection is dropped and the request retried', async t => {
  const key = secretKey(SECRET)
  const HEAD_401 = 'HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\n'
  const endless = (socket: Socket, bytes: string): void => {
    const tick = setInterval(() => { if (socket.writable) socket.write(bytes) }, 2)
    socket.on('close', () => { clearInterval(tick) })
  }
  const cases: [string, (socket: Socket) => void, boolean][] = [
    ['a small 401, read whole: the connection is reused', s => { s.write(`${HEAD_401}Content-Length: 12\r\n\r\nunauthorized`) }, false],
    ['a 401 declaring a body over the bound: not read at all', s => { s.write(`${HEAD_401}Content-Length: 1000000000\r\n\r\n`); endless(s, 'x'.repeat(16 * 1024)) }, true],
    ['an endless chunked 401 at full speed', s => { s.write(`${HEAD_401}Transfer-Encoding: chunked\r\n\r\n`); endless(s, `4000\r\n${'x'.repeat(0x4000)}\r\n`) }, true],
    ['a small 401 that trickles', s => { s.write(`${HEAD_401}Content-Length: 1000\r\n\r\n`); const tick = setInterval(() => { if (s.writable) s.write('x') }, 100); s.on('close', () => { clearInterval(tick) }) }, true],
  ]
  for (const [name, first, dropped] of cases) {
    const store = new CredentialStore(new HeaderMinter(ACCESS_KEY, key, 'url'))
    // The watcher applies a new pair while the request is at the upstream: its 401 is to a pair no longer in force.
    const up = await rotatingUpstream(socket => { store.swap(new HeaderMinter(ACCESS_KEY, secretKey(`${SECRET}-rotated`), 'url')); first(socket) })
    const app = await buildProxyServer({ config: testConfig({ COS_API_URL: up.url }), credentials: store, logger: createLogger('silent') })
    await app.listen({ host: '127.0.0.1', port: 0 })
    const port = (app.server.address() as { port: number }).port
    const started = Date.now()
    const res = await rawRequest(port, `GET /x HTTP/1.1\r\n${H}Connection: close\r\n\r\n`, { timeoutMs: 6000 })
    const ms = Date.now() - started
    const firstClosed = up.firstClosed()
    await app.close()
    await up.close()
    t.equal(res.finals[0]?.status, 200, `${name}: the re-signed request's answer`)
    t.equal(up.requests(), 2, `${name}: sent twice`)
    t.equal(firstClosed, dropped, `${name}: ${dropped ? 'the 401\'s connection was dropped' : 'the 401\'s connection is kept for reuse'}`)
    t.ok(ms < 5000, `${name}: answered in ${ms} ms`)
  }
})

t.test('an endless chunk extension (no body byte ever) is ended by COS_BODY_IDLE_TIMEOUT_MS, and the client connection serves on', async t => {
  const up = await startRawUpstream((head, socket) => {
    if (pathOf(head) !== '/extension') { socket.write(OK); return }
    socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=')
    const tick = setInterval(() => { if (socket.writable) socket.write('a'.repeat(64 * 1024)) }, 2)
    socket.on('close', () => { clearInterval(tick) })
  })
  const proxy = await startProxy({ COS_API_URL: up.url, COS_BODY_IDLE_TIMEOUT_MS: '500' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const started = Date.now()
  const talk = await converse(proxy.port, [GET('/extension'), GET('/next')], { timeoutMs: 6000 })
  const ms = Date.now() - started
  t.same(talk.finals.map(r => r.status), [502, 200], 'a 502 (no byte of the answer was sent), then the next request is answered')
  t.ok(ms < 5000, `ended in ${ms} ms`)
})

t.test('an upstream failure answered while the client is still uploading says connection: close, not keep-alive', async t => {
  const muted = new Set<Socket>()
  const mute = createNetServer(socket => { muted.add(socket); socket.on('error', () => undefined) })
  const mutePort = await listenOnLoopback(mute)
  // 504: a TLS handshake that never completes (COS_CONNECT_TIMEOUT_MS); 502: a refused connection.
  const proxy = await startProxy({ COS_API_URL: `https://127.0.0.1:${mutePort}`, COS_MANAGEMENT_API_URL: `http://127.0.0.1:${REFUSING_PORT}`, COS_CONNECT_TIMEOUT_MS: '300' })
  t.teardown(async () => { await proxy.close(); for (const s of muted) s.destroy(); await new Promise(resolve => { mute.close(resolve) }) })
  for (const [path, status] of [['/slow-upload', 504], ['/management/upload', 502]] as const) {
    const res = await rawRequest(proxy.port, `POST ${path} HTTP/1.1\r\n${H}Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n${'x'.repeat(1000)}`, { timeoutMs: 4000 })
    t.equal(res.finals[0]?.status, status, `${path}: ${status}`)
    t.same(res.finals[0]?.headers.connection, ['close'], `${path}: connection: close (the rest of the body will not be read)`)
    t.ok(res.closedByPeer, `${path}: and the proxy closes it`)
  }
})
