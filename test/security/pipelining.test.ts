// Pipelined requests on one connection, as exact bytes in one write. Node's
// server parses ahead and hands over every request it finds while earlier
// answers are pending: once a request is refused (the refusal closes the
// connection), is malformed or is CONNECT, nothing behind it may be
// forwarded, and the answers owed to the requests before it come first.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { connect, type AddressInfo } from 'node:net'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import t, { type Test } from 'tap'
import { MAX_OUTSTANDING_PER_CONNECTION, MAX_PIPELINED_PER_LISTENER, pipelinedWaiting } from '../../src/client/connections.js'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { buildProxyServer, metricsObserver } from '../../src/proxy/proxy-server.js'
import { LogCapture, startProxy, testConfig, until, type RunningProxy } from '../support/helpers.js'
import { errorOf, rawRequest, startCountingUpstream, type CountingUpstream, type RawResult } from '../support/raw.js'

const GET = (path: string): string => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`
const POST = (path: string, body: string): string => `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n${body}`
const MALFORMED = 'POST /after HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'

/** The upstream answers each request with its own method and path, so answers can be told apart. */
function echo (req: IncomingMessage, res: ServerResponse): void {
  res.setHeader('content-type', 'text/plain')
  res.end(`${req.method ?? ''} ${req.url ?? ''}`)
}

interface Rig { readonly proxy: RunningProxy, readonly up: CountingUpstream }

async function rig (t: Test, env: Record<string, string> = {}, handler = echo): Promise<Rig> {
  const up = await startCountingUpstream((req, res) => { handler(req, res) })
  const proxy = await startProxy({ COS_API_URL: up.url, ...env })
  t.teardown(async () => { await proxy.close(); await up.close() })
  return { proxy, up }
}

/** Request log lines written so far (one per request, when its response closes). */
function requestLines (proxy: RunningProxy): Record<string, unknown>[] {
  return proxy.logs.records.filter(r => r.msg === 'request')
}

/** Waits (boundedly) until `count` request lines are written: every request, forwarded or dropped, is accounted for once. */
async function logged (proxy: RunningProxy, count: number): Promise<Record<string, unknown>[]> {
  return waitForLines(proxy.logs, count)
}

async function waitForLines (logs: LogCapture, count: number): Promise<Record<string, unknown>[]> {
  const lines = (): Record<string, unknown>[] => logs.records.filter(r => r.msg === 'request')
  for (let i = 0; i < 300 && lines().length < count; i++) await new Promise(resolve => setTimeout(resolve, 10))
  await new Promise(resolve => setTimeout(resolve, 30)) // one more would show up here
  return lines()
}

function statuses (res: RawResult): number[] {
  return res.finals.map(f => f.status)
}

t.test('requests pipelined behind a refused one never reach the upstream', async t => {
  const { proxy, up } = await rig(t, { COS_MAX_BODY_BYTES: '100', COS_REQUIRE_HEADER: 'X-Need' })
  const ok = 'X-Need: 1\r\n'
  const refused: [string, string, number][] = [
    ['a dot-segment path', `GET /a/../b HTTP/1.1\r\nHost: 127.0.0.1\r\n${ok}\r\n`, 400],
    ['a malformed percent-escape (the router refuses it)', `GET /%zz HTTP/1.1\r\nHost: 127.0.0.1\r\n${ok}\r\n`, 400],
    ['TRACE', `TRACE /x HTTP/1.1\r\nHost: 127.0.0.1\r\n${ok}\r\n`, 405],
    ['a missing required header', GET('/x'), 403],
    ['a body above COS_MAX_BODY_BYTES', `POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n${ok}Content-Length: 101\r\n\r\n${'a'.repeat(101)}`, 413],
  ]
  const withHeader = (request: string): string => request.replace('\r\n\r\n', `\r\n${ok}\r\n`)
  for (const [name, bytes, status] of refused) {
    const lines = requestLines(proxy).length
    const res = await rawRequest(proxy.port, bytes + withHeader(GET('/behind')) + withHeader(POST('/behind', 'hi')), { settleMs: 200 })
    t.same(statuses(res), [status], `${name}: exactly the refusal`)
    t.ok(res.closedByPeer, `${name}: then the connection is closed`)
    t.equal(res.leftover.length, 0, `${name}: nothing after the refusal`)
    t.same(up.seen, [], `${name}: the GET and the POST behind it never reached the upstream`)
    const written = (await logged(proxy, lines + 3)).slice(lines).map(l => `${String(l.method)} ${String(l.status)}`)
    t.same(written.sort(), [`${bytes.split(' ')[0] ?? ''} ${status}`, 'GET 400', 'POST 400'].sort(), `${name}: each of the three logged once`)
  }
  const again = await rawRequest(proxy.port, withHeader(GET('/still')) + withHeader(GET('/serving')), { expect: 2 })
  t.same(statuses(again), [200, 200], 'the proxy keeps serving pipelined requests')
})

t.test('a request pipelined before a malformed one gets its answer, then the 400, then the close', async t => {
  const { proxy, up } = await rig(t)
  const cases: [string, string, number, string][] = [
    ['ambiguous framing', MALFORMED, 400, 'bad_request'],
    ['an unknown method', 'BREW /pot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', 405, 'method_not_allowed'],
    ['CONNECT', 'CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n', 400, 'bad_request'],
  ]
  for (const [name, bad, status, code] of cases) {
    up.seen.length = 0
    const res = await rawRequest(proxy.port, GET('/first') + POST('/second', 'hi') + bad, { expect: 3 })
    t.same(statuses(res), [200, 200, status], `${name}: both answers, then ${status}`)
    t.same(res.finals.slice(0, 2).map(f => f.body.toString()), ['GET /first', 'POST /second'], `${name}: the answers whole and in order`)
    t.equal(errorOf(res.finals[2])?.code, code, `${name}: the JSON error last`)
    t.ok(res.closedByPeer, `${name}: then the close`)
    t.same(up.seen, ['GET /first', 'POST /second'], `${name}: only the requests before it were forwarded`)
  }
})

t.test('the answer to a slow request pipelined before a malformed one still arrives, then the 400', async t => {
  // The upstream answers only once the proxy has rejected the malformed bytes: the answer is owed after the error is known.
  let rejected: () => void = () => {}
  const rejection = new Promise<void>(resolve => { rejected = resolve })
  const { proxy, up } = await rig(t, {}, (req, res) => { void rejection.then(() => { echo(req, res) }) })
  proxy.app.server.on('clientError', () => { rejected() })
  const res = await rawRequest(proxy.port, GET('/slow') + MALFORMED, { expect: 2 })
  t.same(statuses(res), [200, 400])
  t.equal(res.finals[0]?.body.toString(), 'GET /slow', 'the slow answer, whole')
  t.equal(errorOf(res.finals[1])?.code, 'bad_request')
  t.ok(res.closedByPeer)
  t.same(up.seen, ['GET /slow'])
})

t.test('a large answer pipelined before CONNECT is written whole before the 400 (no stall once Node lets go of the socket)', async t => {
  const big = Buffer.alloc(8 * 1024 * 1024, 'x')
  const { proxy } = await rig(t, {}, (_req, res) => {
    res.setHeader('content-type', 'application/octet-stream')
    res.setHeader('content-length', big.length)
    res.end(big)
  })
  const res = await rawRequest(proxy.port, GET('/big') + 'CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n', { expect: 2, timeoutMs: 5000 })
  t.same(statuses(res), [200, 400])
  t.equal(res.finals[0]?.body.length, big.length, '8 MiB arrived')
  t.notOk(res.timedOut)
})

t.test('several valid pipelined requests are all forwarded and answered in order', async t => {
  const { proxy, up } = await rig(t, { COS_API_ALLOWED_METHODS: 'GET,POST' })
  const requests = [GET('/1'), POST('/2', 'two'), `DELETE /3 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, POST('/4', 'four')]
  t.equal(requests.length, MAX_OUTSTANDING_PER_CONNECTION, 'as many as one connection may have outstanding')
  const res = await rawRequest(proxy.port, requests.join(''), { expect: requests.length })
  // The 405 from the route's method list keeps the connection: what follows it is served.
  t.same(statuses(res), [200, 200, 405, 200])
  t.same(res.finals.filter(f => f.status === 200).map(f => f.body.toString()), ['GET /1', 'POST /2', 'POST /4'])
  t.notOk(res.closedByPeer, 'the connection stays open')
  t.same(up.seen, ['GET /1', 'POST /2', 'POST /4'])
})

t.test('one connection cannot have more than MAX_OUTSTANDING_PER_CONNECTION requests at the upstream: the next gets 503 and the close, nothing behind it is forwarded', async t => {
  const { proxy, up } = await rig(t)
  const within = Array.from({ length: MAX_OUTSTANDING_PER_CONNECTION }, (_, i) => GET(`/${i}`))
  const res = await rawRequest(proxy.port, [...within, GET('/beyond')].join(''), { expect: MAX_OUTSTANDING_PER_CONNECTION + 1, timeoutMs: 5000 })
  t.same(statuses(res), [...Array<number>(MAX_OUTSTANDING_PER_CONNECTION).fill(200), 503], 'every request within the bound answered in order, then the refusal')
  t.same(res.finals.slice(0, -1).map(f => f.body.toString()), within.map((_, i) => `GET /${i}`))
  t.equal(errorOf(res.finals.at(-1))?.code, 'too_many_pipelined')
  t.same(res.finals.at(-1)?.headers.connection, ['close'], 'the refusal closes the connection')
  t.ok(res.closedByPeer, 'and the proxy closes it')
  t.same(up.seen, within.map((_, i) => `GET /${i}`), 'the refused request was never forwarded')
  t.equal((await rawRequest(proxy.port, within.join(''), { expect: within.length })).finals.length, within.length, 'a new connection pipelines as many again')
  // More behind the refused one: a client that sent that many is cut off at once (each held request would cost until it reads).
  const seen = up.seen.length
  const cut = await rawRequest(proxy.port, [...within, GET('/beyond'), GET('/behind')].join(''), { timeoutMs: 5000 })
  t.ok(cut.closedByPeer || cut.error !== undefined, 'the connection is cut off')
  t.notOk(up.seen.slice(seen).some(line => line === 'GET /beyond' || line === 'GET /behind'), 'and nothing from the refused one on was forwarded')
})

t.test('an idle keep-alive connection does not keep its pipelined answers alive once they are sent (1,024 such connections held ~50 MB of answers)', async t => {
  const big = 'x'.repeat(16_000)
  const { proxy } = await rig(t, {}, (_req, res) => { res.end(big) })
  const sent: Array<WeakRef<ServerResponse>> = []
  proxy.app.server.on('request', (_req: IncomingMessage, res: ServerResponse) => { sent.push(new WeakRef(res)) })
  const socket = connect({ host: '127.0.0.1', port: proxy.port })
  t.teardown(() => { socket.destroy() })
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (d: string) => { text += d })
  socket.write(Array.from({ length: MAX_OUTSTANDING_PER_CONNECTION }, (_, i) => GET(`/${i}`)).join(''))
  t.ok(await until(() => [...text.matchAll(/HTTP\/1\.1 200 /g)].length === MAX_OUTSTANDING_PER_CONNECTION && text.endsWith(big)), 'every answer arrived')
  t.equal(sent.length, MAX_OUTSTANDING_PER_CONNECTION, 'each of them through the proxy')
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as () => void
  // A WeakRef's target is kept until the end of any job that made or dereferenced it: collect
  // in a turn of its own each time, then look; boundedly.
  const pipelined = sent.slice(1) // the first answer held the socket; the pipelined ones were queued
  const held = async (): Promise<number> => {
    await new Promise(resolve => setTimeout(resolve, 20))
    gc()
    await new Promise(resolve => setTimeout(resolve, 20))
    return pipelined.filter(r => r.deref() !== undefined).length
  }
  let left = await held()
  for (let i = 0; i < 10 && left > 0; i++) left = await held()
  t.equal(left, 0, `none of the ${pipelined.length} pipelined responses (with their requests and answers) is still held`)
  t.notOk(socket.destroyed, 'while the connection stays open')
})

t.test('pipelined requests across connections cannot outnumber MAX_PIPELINED_PER_LISTENER: the ones beyond are refused, however many connections share the work', async t => {
  const held: ServerResponse[] = []
  const { proxy } = await rig(t, {}, (_req, res) => { held.push(res) })
  const connections = 2 * Math.ceil(MAX_PIPELINED_PER_LISTENER / (MAX_OUTSTANDING_PER_CONNECTION - 1))
  let accepted = 0
  proxy.app.server.on('connection', () => { accepted++ })
  const request = Array.from({ length: MAX_OUTSTANDING_PER_CONNECTION }, (_, i) => GET(`/${i}`)).join('')
  const results = Array.from({ length: connections }, () => rawRequest(proxy.port, request, { expect: MAX_OUTSTANDING_PER_CONNECTION, timeoutMs: 20_000, settleMs: 300 }))
  // Nothing is answered until every connection has been accepted and the listener is at its bound.
  for (let i = 0; i < 1500 && (accepted < connections || pipelinedWaiting(proxy.app.server) < MAX_PIPELINED_PER_LISTENER - MAX_OUTSTANDING_PER_CONNECTION); i++) await new Promise(resolve => setTimeout(resolve, 10))
  await new Promise(resolve => setTimeout(resolve, 200))
  t.ok(pipelinedWaiting(proxy.app.server) <= MAX_PIPELINED_PER_LISTENER, `the listener holds no more than its bound waiting (${pipelinedWaiting(proxy.app.server)})`)
  const release = setInterval(() => { for (const res of held.splice(0)) res.end('ok') }, 20)
  t.teardown(() => { clearInterval(release) })
  const all = await Promise.all(results)
  const served = all.map(r => r.finals.filter(f => f.status === 200).length)
  const short = served.filter(n => n < MAX_OUTSTANDING_PER_CONNECTION).length
  t.ok(short > 0, `connections beyond the bound were refused or cut off (${short} of ${connections})`)
  t.ok(served.reduce((a, b) => a + b, 0) <= MAX_PIPELINED_PER_LISTENER + connections, 'no more were served than the bound allows')
  t.ok(all.every(r => r.finals.filter(f => f.status === 503).every(f => errorOf(f)?.code === 'too_many_pipelined')), 'each refusal says why')
  t.equal(pipelinedWaiting(proxy.app.server), 0, 'and once answered, none is counted as waiting')
})

t.test('a flood pipelined behind a refusal is cut off rather than held, and nothing of it is forwarded', async t => {
  const { proxy, up } = await rig(t)
  const lines = requestLines(proxy).length
  const res = await rawRequest(proxy.port, GET('/a/../b') + GET('/behind').repeat(300), { settleMs: 200 })
  t.ok(res.closedByPeer || res.error !== undefined, 'the connection is closed')
  t.ok(res.finals.every(f => f.status === 400), 'nothing but the refusal came back')
  t.same(up.seen, [], 'nothing forwarded')
  const written = (await logged(proxy, lines + 2)).slice(lines)
  t.ok(written.length >= 2 && written.every(l => l.status === 400), `every request parsed was logged as refused or dropped (${written.length})`)
  t.equal((await rawRequest(proxy.port, GET('/after'), { expect: 1 })).finals[0]?.status, 200, 'still serving')
})

/** The value of every sample of `name` in an exposition text, summed. */
function total (text: string, name: string): number {
  let sum = 0
  for (const line of text.split('\n')) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  return sum
}

t.test('requests pipelined behind a slow one whose client leaves are each logged and counted once, 499, and in-flight returns to 0', async t => {
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const up = await startCountingUpstream((req, res) => { if (req.method !== 'GET') echo(req, res) })
  const proxy = await startProxy({ COS_API_URL: up.url }, 'info', { observer: metricsObserver(metrics) })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const socket = connect(proxy.port, '127.0.0.1')
  socket.on('error', () => undefined)
  await new Promise(resolve => socket.once('connect', resolve))
  socket.write(GET('/slow') + POST('/1', 'one') + POST('/2', 'two') + POST('/3', 'three'))
  t.ok(await until(() => up.received.length === 4, 5000), 'the upstream has the slow GET and executed the three POSTs behind it')
  socket.destroy()
  const lines = await logged(proxy, 4)
  t.same(lines.map(l => `${String(l.method)} ${String(l.status)} ${String(l.aborted)}`).sort(), ['GET 499 true', 'POST 499 true', 'POST 499 true', 'POST 499 true'],
    'one line each, 499 aborted: none of them was answered')
  const text = await metrics.text()
  t.equal(total(text, 'cos_auth_proxy_requests_total'), 4, 'one requests_total sample each')
  t.equal(total(text, 'cos_auth_proxy_requests_aborted_total'), 4, 'each counted as aborted')
  t.equal(total(text, 'cos_auth_proxy_in_flight_requests'), 0, 'in-flight back at 0')
  t.equal(proxy.logs.records.filter(r => r.level === 50).length, 0, 'no error logged')
})

t.test('a request whose client left before it was forwarded is not sent, and is logged and counted once as 499', async t => {
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const up = await startCountingUpstream()
  const config = testConfig({ COS_API_URL: up.url })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const logs = new LogCapture()
  const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger: createLogger('info', logs), observer: metricsObserver(metrics) })
  // Held before the handler (as a slow hook would hold them) until their client has gone.
  let gone: () => void = () => undefined
  const clientGone = new Promise<void>(resolve => { gone = resolve })
  let held = 0
  app.addHook('preHandler', async () => { held++; await clientGone })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(async () => { gone(); await app.close(); await up.close() })
  const socket = connect((app.server.address() as AddressInfo).port, '127.0.0.1')
  socket.on('error', () => undefined)
  await new Promise(resolve => socket.once('connect', resolve))
  socket.write(GET('/first') + POST('/second', 'two'))
  t.ok(await until(() => held === 2, 5000), 'both requests are held')
  socket.destroy()
  // Their lines are written when the proxy sees the connection close: only then are they let go.
  const lines = await waitForLines(logs, 2)
  t.same(lines.map(l => `${String(l.method)} ${String(l.status)}`).sort(), ['GET 499', 'POST 499'], 'both logged once, 499')
  gone()
  const after = await rawRequest((app.server.address() as AddressInfo).port, `GET /after HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)
  t.equal(after.finals[0]?.status, 200, 'a request after them is forwarded')
  t.same(up.seen, ['GET /after'], 'neither of them was sent upstream')
  const text = await metrics.text()
  t.equal(total(text, 'cos_auth_proxy_requests_total'), 3, 'one sample each, and the one after')
  t.equal(total(text, 'cos_auth_proxy_in_flight_requests'), 0, 'in-flight back at 0')
  t.equal(total(text, 'cos_auth_proxy_tokens_minted_total'), 1, 'no token minted for them (one for the request after)')
})
