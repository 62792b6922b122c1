// Real clients through the real proxy. The request bytes Java's HttpClient,
// curl --http2, Go, Python and Node's fetch send (captured once, see
// test/fixtures/clients/README.txt) are replayed over raw sockets exactly as
// the clients sent them; curl and Node's fetch also run for real.
import { execFile } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { secretKey, verifyToken } from '../src/token/token.js'
import { ACCESS_KEY, SECRET, sha256, startProxy, startUpstream, type Received, type RunningProxy, type Upstream } from './support/helpers.js'
import { converse, headerNames, parseRequests, type RawRequestHead } from './support/raw.js'

const FIXTURES = new URL('./fixtures/clients/', import.meta.url)
const key = secretKey(SECRET)
const execFileAsync = promisify(execFile)

interface Rig { readonly proxy: RunningProxy, readonly up: Upstream }

/** One recording upstream behind all three routes, each with its own base path, so the mapping shows in the path. */
async function rig (t: Test): Promise<Rig> {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: `${up.url}/mgmt-api`, COS_OPTIMIZE_API_URL: `${up.url}/opt-api/v2`, COS_API_URL: `${up.url}/other` })
  t.teardown(async () => { await proxy.close(); await up.close() })
  return { proxy, up }
}

/** Where the routes send a client's request target. */
function mapped (target: string): string {
  if (target.startsWith('/management/')) return `/mgmt-api/${target.slice('/management/'.length)}`
  if (target.startsWith('/optimize/')) return `/opt-api/v2/${target.slice('/optimize/'.length)}`
  return `/other${target}`
}

/** The single Authorization the upstream got holds a token the API would accept. */
function tokenVerified (rec: Received): boolean {
  const values = rec.rawHeaders.filter((_, i) => i % 2 === 1 && rec.rawHeaders[i - 1]?.toLowerCase() === 'authorization')
  const auth = values[0] ?? ''
  return values.length === 1 && auth.startsWith('Bearer ') && verifyToken(auth.slice('Bearer '.length), { accessKey: ACCESS_KEY, key, maxSkewNs: 60_000_000_000n }).ok
}

// Never forwarded, whatever Connection says: hop-by-hop and the h2c upgrade's own.
const NEVER_FORWARDED = ['upgrade', 'http2-settings', 'keep-alive', 'te', 'trailer', 'proxy-connection']

function connectionTokens (values: readonly string[] | string | undefined): string[] {
  return [values ?? []].flat().join(',').split(',').map(s => s.trim().toLowerCase()).filter(s => s !== '')
}

/**
 * A body the client sent chunked may go on chunked, or with its Content-Length
 * when it had fully arrived before the upstream request started (undici then
 * knows the length); either way exactly one framing.
 */
function framedOnce (rec: Received, length: number): boolean {
  const te = rec.headers['transfer-encoding']
  const cl = rec.headers['content-length']
  return te === undefined ? cl === String(length) || (length === 0 && (cl === undefined || cl === '0')) : te === 'chunked' && cl === undefined
}

/**
 * What the upstream must have received for one client request: its method,
 * the path as routed, the body's bytes in one framing, a verified token, none
 * of the hop-by-hop headers or those Connection names, and every other header
 * the client sent with its value unchanged.
 */
function checkForwarded (t: Test, label: string, sent: RawRequestHead, rec: Received | undefined): void {
  if (rec === undefined) {
    t.fail(`${label}: never reached the upstream`)
    return
  }
  const [method = '', target = ''] = sent.requestLine.split(' ')
  t.equal(rec.method, method, `${label}: method`)
  t.equal(rec.url, mapped(target), `${label}: path as routed`)
  t.equal(rec.bodyBytes, sent.body.length, `${label}: body length`)
  t.equal(rec.bodySha256, sha256(sent.body), `${label}: body bytes intact`)
  t.ok(framedOnce(rec, sent.body.length), `${label}: one framing, chunked or the body's exact Content-Length`)
  t.ok(tokenVerified(rec), `${label}: one Authorization, a token that verifies`)
  const names = rec.rawHeaders.filter((_, i) => i % 2 === 0).map(n => n.toLowerCase())
  const named = connectionTokens(sent.headers.connection)
  const hopByHop = names.filter(n => NEVER_FORWARDED.includes(n) || named.includes(n))
  t.same(hopByHop, [], `${label}: no Upgrade, HTTP2-Settings or header named by Connection (${named.join(', ')}) forwarded`)
  t.notOk(connectionTokens(rec.headers.connection).some(v => v !== 'keep-alive' && v !== 'close'),
    `${label}: the upstream's Connection names nothing of the client's (${rec.headers.connection ?? 'none'})`)
  const end2end = Object.entries(sent.headers).filter(([name]) =>
    !['host', 'connection', 'content-length', 'transfer-encoding', 'authorization', ...NEVER_FORWARDED, ...named].includes(name))
  for (const [name, values] of end2end) {
    t.equal(rec.headers[name], values.join(', '), `${label}: ${name} forwarded unchanged`)
  }
}

/** The captured bytes with the Host header's port set to the proxy's (the capture server had its own). */
function withHostPort (request: Buffer, port: number): Buffer {
  return Buffer.from(request.toString('latin1').replace(/^(host:[ \t]*127\.0\.0\.1:)\d+/im, `$1${port}`), 'latin1')
}

const fixtures = readdirSync(FIXTURES).filter(f => f.endsWith('.bin')).sort()

t.test('the fixtures are all there and each parses into complete requests', async t => {
  t.same(fixtures, [
    'curl7.88-http2-get.bin', 'curl7.88-http2-post.bin', 'go1.19-nethttp.bin', 'java17-httpclient.bin', 'node20-fetch-get.bin',
    'node20-fetch-post.bin', 'python-requests2.34.bin', 'python3.11-urllib-get.bin', 'python3.11-urllib-post.bin',
  ])
  for (const file of fixtures) {
    const bytes = readFileSync(new URL(file, FIXTURES))
    const requests = parseRequests(bytes)
    t.ok(requests.length > 0 && requests.every(r => r.complete), `${file}: ${requests.length} complete request(s)`)
    t.equal(requests.reduce((n, r) => n + r.bytes.length, 0), bytes.length, `${file}: nothing after the last request`)
  }
  const java = parseRequests(readFileSync(new URL('java17-httpclient.bin', FIXTURES)))
  t.same(java.map(r => r.headers.upgrade), [['h2c'], ['h2c']], 'Java asks for h2c on both requests')
})

for (const file of fixtures) {
  t.test(`${file}: every request answered 200 on the client's own connection, forwarded signed and intact, nothing of an h2c upgrade passed on`, async t => {
    const { proxy, up } = await rig(t)
    const requests = parseRequests(readFileSync(new URL(file, FIXTURES)))
    const talk = await converse(proxy.port, requests.map(r => withHostPort(r.bytes, proxy.port)))
    t.notOk(talk.timedOut, 'no request left unanswered')
    t.equal(talk.finals.length, requests.length, `${requests.length} answer(s) on one connection`)
    t.equal(talk.responses.length, talk.finals.length, 'no interim response (never a 101)')
    t.equal(up.received.length, requests.length, 'each forwarded once')
    for (const [i, sent] of requests.entries()) {
      const label = `${file} #${i + 1} ${sent.requestLine}`
      const res = talk.finals[i]
      t.equal(res?.status, 200, `${label}: 200`)
      t.notOk(res !== undefined && headerNames(res).includes('upgrade'), `${label}: no Upgrade in the response`)
      checkForwarded(t, label, sent, up.received[i])
    }
    const asksToClose = connectionTokens(requests.at(-1)?.headers.connection).includes('close')
    if (asksToClose) {
      t.ok(talk.closedByPeer, 'Connection: close is honoured')
    } else {
      t.notOk(talk.closedByPeer, 'the connection is still open after the last answer')
      t.same(talk.finals.map(r => r.headers.connection), talk.finals.map(() => ['keep-alive']), 'every answer keeps the connection')
    }
  })
}

async function curl (args: readonly string[]): Promise<string> {
  const { stdout } = await execFileAsync('curl', ['--silent', '--show-error', '--max-time', '10', ...args], { timeout: 15_000 })
  return stdout
}

t.test('curl for real: --http2 (an h2c upgrade) GET and POST, two URLs on one connection, -I and --http1.0 all served and signed', async t => {
  const { proxy, up } = await rig(t)
  const out = ['--output', '/dev/null']
  const status = ['--write-out', '%{http_code} %{http_version} %{num_connects}\\n']

  t.equal(await curl(['--http2', ...out, ...status, `${proxy.url}/management/v1/clusters`]), '200 1.1 1\n', '--http2 GET: 200 over HTTP/1.1')
  t.equal(await curl(['--http2', ...out, ...status, '-H', 'content-type: application/json', '--data-binary', '{"a":1}', `${proxy.url}/optimize/v1/echo`]), '200 1.1 1\n', '--http2 POST: 200')
  t.equal(await curl(['--http2', ...status, ...out, ...out, `${proxy.url}/management/a`, `${proxy.url}/management/b`]), '200 1.1 1\n200 1.1 0\n',
    '--http2, two URLs: both 200, the second on the first one\'s connection')
  t.equal(await curl(['-I', ...out, ...status, `${proxy.url}/management/v1/clusters`]), '200 1.1 1\n', '-I (HEAD): 200')
  t.equal(await curl(['--http1.0', ...out, ...status, `${proxy.url}/management/v1/clusters`]), '200 1.1 1\n', '--http1.0: 200')

  t.same(up.received.map(r => `${r.method} ${r.url} ${r.bodyBytes}`), [
    'GET /mgmt-api/v1/clusters 0',
    'POST /opt-api/v2/v1/echo 7',
    'GET /mgmt-api/a 0',
    'GET /mgmt-api/b 0',
    'HEAD /mgmt-api/v1/clusters 0',
    'GET /mgmt-api/v1/clusters 0',
  ], 'the upstream got each request once, as routed')
  for (const rec of up.received) {
    const label = `${rec.method} ${rec.url}`
    t.ok(tokenVerified(rec), `${label}: a token that verifies`)
    t.match(rec.headers['user-agent'], /^curl\//, `${label}: curl's User-Agent passes`)
    t.notOk(rec.headers.upgrade !== undefined || rec.headers['http2-settings'] !== undefined, `${label}: nothing of the h2c upgrade forwarded`)
  }
  t.equal(up.received[1]?.bodySha256, sha256(Buffer.from('{"a":1}')), 'POST body intact')
})

t.test('Node fetch for real: a GET and a streamed (chunked) POST served and signed, body intact', async t => {
  const { proxy, up } = await rig(t)
  const get = await fetch(`${proxy.url}/management/v1/clusters`)
  t.equal(get.status, 200)
  t.same(await get.json(), { ok: true })
  const encoder = new TextEncoder()
  const body = new ReadableStream<Uint8Array>({
    start (controller) {
      controller.enqueue(encoder.encode('{"a":'))
      controller.enqueue(encoder.encode('1}'))
      controller.close()
    },
  })
  // `duplex` is required for a stream body and missing from the DOM RequestInit typings @types/node ships.
  const init: RequestInit & { duplex: 'half' } = { method: 'POST', body, duplex: 'half', headers: { 'content-type': 'application/json' } }
  const post = await fetch(`${proxy.url}/optimize/v1/echo`, init)
  t.equal(post.status, 200)
  await post.arrayBuffer()
  t.same(up.received.map(r => `${r.method} ${r.url}`), ['GET /mgmt-api/v1/clusters', 'POST /opt-api/v2/v1/echo'])
  const [getRec, postRec] = up.received
  t.ok(getRec !== undefined && tokenVerified(getRec), 'GET: a token that verifies')
  t.ok(postRec !== undefined && tokenVerified(postRec), 'POST: a token that verifies')
  t.ok(postRec !== undefined && framedOnce(postRec, 7), 'one framing for the streamed body')
  t.equal(postRec?.bodySha256, sha256(Buffer.from('{"a":1}')), 'body intact')
})
