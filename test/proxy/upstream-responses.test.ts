// Upstream answers that are odd or wrong, from raw TCP upstreams: none may
// crash the process or turn into a 500; each fails, at worst, its own request.
import { ServerResponse, type OutgoingHttpHeader, type OutgoingHttpHeaders } from 'node:http'
import t from 'tap'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { metricsObserver } from '../../src/proxy/proxy-server.js'
import { send, startProxy } from '../support/helpers.js'
import {
  TRAILER_PROBES, answerDeclaringTrailers, errorOf, headerNames, pathOf, rawRequest, startRawUpstream,
} from '../support/raw.js'

t.test('an upstream Trailer header cannot crash the process: HEAD, HTTP/1.0, with a Content-Length, on a 204; a chunked body with trailers arrives intact', async t => {
  const up = await startRawUpstream(answerDeclaringTrailers)
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const p of TRAILER_PROBES) {
    const res = await rawRequest(proxy.port, p.request, { head: p.head })
    const answer = res.finals[0]
    t.equal(res.finals.length, 1, `${p.name}: answered`)
    t.equal(answer?.status, p.status, `${p.name}: status`)
    t.equal(answer?.body.toString('latin1'), p.body, `${p.name}: body`)
    t.notOk(answer !== undefined && headerNames(answer).some(n => n === 'trailer' || n === 'te'), `${p.name}: no Trailer or TE header`)
    t.notOk(res.text.includes('X-Checksum: '), `${p.name}: the trailer field is not forwarded`)
  }
  t.equal(up.heads.length, TRAILER_PROBES.length, 'every probe reached the upstream')
  t.notOk(proxy.logs.text.includes('could not be written'), 'dropping the declaration left nothing to fail')
  const after = await send(`${proxy.url}/typed`)
  t.equal(after.status, 200, 'the proxy serves on')
  t.equal(after.body.toString(), 'hello world')
})

t.test('a 304 or 204 with a Content-Length passes through without a body, and the connection serves the next request', async t => {
  const up = await startRawUpstream((head, socket) => {
    const answers: Record<string, string> = {
      '/304': 'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 1234\r\n\r\n',
      '/204': 'HTTP/1.1 204 No Content\r\nContent-Length: 12\r\n\r\n',
    }
    socket.write(answers[pathOf(head)] ?? 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok')
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const req = (path: string, extra = ''): string => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${extra}\r\n`
  // One client connection, one request at a time.
  const res = await rawRequest(proxy.port, [req('/304', 'If-None-Match: "v1"\r\n'), req('/ok'), req('/204'), req('/ok')], { expect: 4, gapMs: 150 })
  t.same(res.finals.map(r => r.status), [304, 200, 204, 200])
  const [notModified, , noContent, last] = res.finals
  t.same(notModified?.headers.etag, ['"v1"'])
  t.same(notModified?.headers['content-length'], ['1234'], 'a 304 keeps the Content-Length of the representation (RFC 9110 §8.6)')
  t.equal(notModified?.body.length, 0)
  t.equal(noContent?.headers['content-length'], undefined, 'a 204 carries no Content-Length')
  t.equal(noContent?.body.length, 0)
  t.equal(last?.body.toString(), 'ok')
  t.equal(res.leftover.length, 0, 'no stray bytes: nothing was sent as a body')
  t.notOk(res.closedByPeer, 'the client connection stays open')
  t.notOk(proxy.logs.text.includes('"level":"error"'), 'nothing logged as an error')
})

t.test('a small body under a repeated Content-Type keeps both lines, not a Content-Type made up by the proxy', async t => {
  const up = await startRawUpstream((_head, socket) => {
    socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok')
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const res = await rawRequest(proxy.port, 'GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n')
  t.same(res.finals[0]?.headers['content-type'], ['text/plain', 'text/html'])
  t.equal(res.finals[0]?.body.toString(), 'ok')
})

t.test('malformed upstream answers are 502 upstream_unavailable JSON errors, never 500, without the upstream\'s headers', async t => {
  const extra = 'X-Upstream: 1\r\nCache-Control: max-age=60\r\n'
  const answers: Record<string, string> = {
    '/bad-status-line': 'HTTP/1.1 2x0 OK\r\n\r\n',
    '/garbage': 'this is not http\r\n\r\n',
    '/short-collected': `HTTP/1.1 200 OK\r\n${extra}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"par`,
    '/short-streamed': `HTTP/1.1 200 OK\r\n${extra}Content-Length: 100\r\n\r\n`,
    '/bad-chunk': `HTTP/1.1 200 OK\r\n${extra}Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n`,
    '/two-lengths': 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok',
    '/status-600': `HTTP/1.1 600 Odd\r\n${extra}Content-Length: 2\r\n\r\nok`,
    '/switching': 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n',
  }
  const up = await startRawUpstream((head, socket) => {
    const answer = answers[pathOf(head)]
    if (answer === undefined) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok')
    else socket.end(answer)
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const path of Object.keys(answers)) {
    const res = await send(`${proxy.url}${path}`, { headers: { 'x-request-id': `bad${path.replace(/\//g, '-')}` } })
    t.equal(res.status, 502, `${path}: 502`)
    t.equal(errorOf({ status: res.status, statusLine: '', rawHeaders: [], headers: {}, body: res.body })?.code, 'upstream_unavailable', `${path}: JSON error`)
    t.equal(res.headers['content-type'], 'application/json; charset=utf-8', `${path}: the error's own Content-Type`)
    t.equal(res.headers['x-request-id'], `bad${path.replace(/\//g, '-')}`, `${path}: x-request-id`)
    t.equal(res.headers['x-upstream'], undefined, `${path}: no header of the failed answer`)
    t.equal(res.headers['cache-control'], undefined, `${path}: no caching of the error`)
  }
  t.notOk(proxy.logs.text.includes('internal_error'), 'no 500 anywhere')
  t.notOk(proxy.logs.text.includes('already sent'), 'each answered once (reply-from goes on after answering a bad status)')
  t.equal((await send(`${proxy.url}/fine`)).status, 200, 'the proxy serves on')
})

t.test('an upstream body that stalls before its first byte → 502 upstream_unavailable (as a collected body does), not a 500', async t => {
  const up = await startRawUpstream((_head, socket) => { socket.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n') })
  const proxy = await startProxy({ COS_API_URL: up.url, COS_BODY_IDLE_TIMEOUT_MS: '300' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const res = await send(`${proxy.url}/stall`)
  t.equal(res.status, 502)
  t.match(JSON.parse(res.body.toString()), { error: { code: 'upstream_unavailable' } })
})

// undici never hands over a header value Node refuses, so refusals are
// forced here, with Node's own validation doing the throwing: a header named
// REFUSED_IN_HEAD gets a value Node refuses when the head is written (from
// Fastify's send, or implicitly by a body's first write), one named
// REFUSED_WHEN_SET when it is set on its own (Fastify sets a streamed
// answer's headers inside undici's response callback).
const REFUSED_IN_HEAD = 'x-refused-in-head'
const REFUSED_WHEN_SET = 'x-refused-when-set'
const BAD_VALUE = 'refused\u0001value'
type Fields = OutgoingHttpHeaders | OutgoingHttpHeader[] | undefined

function withRefusedValue (fields: Fields): Fields {
  return fields !== undefined && !Array.isArray(fields) && REFUSED_IN_HEAD in fields ? { ...fields, [REFUSED_IN_HEAD]: BAD_VALUE } : fields
}

function refuseMarkedHeaders (): () => void {
  const proto = ServerResponse.prototype
  // Node's own methods, called on their own object below and put back after.
  // eslint-disable-next-line @typescript-eslint/unbound-method
  const { setHeader, writeHead } = proto
  proto.setHeader = function (this: ServerResponse, name: string, value: number | string | readonly string[]) {
    return setHeader.call(this, name, name.toLowerCase() === REFUSED_WHEN_SET ? BAD_VALUE : value)
  }
  proto.writeHead = function (this: ServerResponse, status: number, reason?: string | Fields, fields?: Fields) {
    if (this.hasHeader(REFUSED_IN_HEAD)) setHeader.call(this, REFUSED_IN_HEAD, BAD_VALUE)
    return Reflect.apply(writeHead, this, [status, typeof reason === 'string' ? reason : withRefusedValue(reason), withRefusedValue(fields)]) as ServerResponse
  } as typeof writeHead
  return () => { proto.setHeader = setHeader; proto.writeHead = writeHead }
}

t.test('a throw while writing a response (a header value Node refuses, not a Trailer) ends only its own request: logged, counted, its connection closed', async t => {
  t.teardown(refuseMarkedHeaders())
  let release: () => void = () => undefined
  const up = await startRawUpstream((head, socket) => {
    const path = pathOf(head)
    if (path === '/slow') {
      release = () => socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nslow')
      return
    }
    const refused = path === '/fine' ? '' : `${path === '/set-in-callback' ? REFUSED_WHEN_SET : REFUSED_IN_HEAD}: 1\r\n`
    const type = path === '/collected' || path === '/head' ? 'Content-Type: text/plain\r\n' : ''
    if (path === '/304') socket.write(`HTTP/1.1 304 Not Modified\r\n${refused}\r\n`)
    else socket.write(`HTTP/1.1 200 OK\r\n${refused}${type}Content-Length: 5\r\n\r\n${head.startsWith('HEAD ') ? '' : 'hello'}`)
  })
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const proxy = await startProxy({ COS_API_URL: up.url }, 'info', { observer: metricsObserver(metrics) })
  t.teardown(async () => { await proxy.close(); await up.close() })

  // A request in flight on another connection while the others fail.
  const slow = send(`${proxy.url}/slow`)
  while (up.heads.length === 0) await new Promise(resolve => setTimeout(resolve, 10))

  const cases = [
    ['collected body: the head written once the body is in', 'GET', '/collected'],
    ['streamed body: the head written by the body\'s first write', 'GET', '/streamed'],
    ['streamed body: a header refused as it is set, in the upstream\'s response callback', 'GET', '/set-in-callback'],
    ['HEAD', 'HEAD', '/head'],
    ['304', 'GET', '/304'],
  ] as const
  for (const [name, method, path] of cases) {
    const id = `refused${path.replace(/\//g, '-')}`
    const res = await rawRequest(proxy.port, `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: ${id}\r\n\r\n`, { head: method === 'HEAD' })
    t.equal(res.finals.length, 0, `${name}: no response written`)
    t.ok(res.closedByPeer, `${name}: the connection is closed`)
    const lines = proxy.logs.records.filter(r => r.reqId === id)
    t.match(lines.filter(l => l.level === 'error'), [{ msg: 'the response could not be written: its connection was closed', err: { code: 'ERR_INVALID_CHAR' } }], `${name}: logged once, with the cause`)
    t.match(lines.find(l => l.msg === 'request'), { aborted: true }, `${name}: the request line says aborted`)
  }
  release()
  const inFlight = await slow
  t.equal(inFlight.status, 200, 'the request in flight elsewhere is answered')
  t.equal(inFlight.body.toString(), 'slow')
  t.equal((await send(`${proxy.url}/fine`)).status, 200, 'the proxy serves on')
  const scraped = await metrics.text()
  t.match(scraped, new RegExp(`cos_auth_proxy_response_failures_total\\{route="api"\\} ${cases.length}\n`), 'each failure counted')
  t.notMatch(scraped, /cos_auth_proxy_upstream_errors_total\{[^}]*\} [1-9]/, 'as the proxy\'s failure, not the upstream\'s')
  t.match(scraped, /cos_auth_proxy_upstream_errors_total\{route="api",kind="reset"\} 0\n/, '(its series at 0: the route has reached the upstream)')
})

t.test('an upstream header value with a control character (DEL) is a malformed answer: 502 upstream_unavailable, none of its headers forwarded', async t => {
  const up = await startRawUpstream((head, socket) => {
    const type = pathOf(head) === '/collected' ? 'Content-Type: text/plain\r\n' : ''
    socket.write(`HTTP/1.1 200 OK\r\nX-Odd: a\x7fb\r\nX-Fine: c\r\n${type}Content-Length: 5\r\n\r\nhello`)
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const path of ['/collected', '/streamed']) {
    const res = await rawRequest(proxy.port, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
    const answer = res.finals[0]
    t.equal(answer?.status, 502, `${path}: 502`)
    t.equal(errorOf(answer)?.code, 'upstream_unavailable', `${path}: the JSON error`)
    t.notOk(answer !== undefined && ('x-odd' in answer.headers || 'x-fine' in answer.headers), `${path}: none of the upstream's headers`)
  }
  t.equal((await send(`${proxy.url}/fine`)).status, 502, 'the proxy serves on (the same upstream, the same answer)')
})
