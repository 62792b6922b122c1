// Upgrade requests. The proxy never switches protocols: an h2c upgrade (Java's
// HttpClient, curl --http2) or any other non-WebSocket one is served as plain
// HTTP/1.1 (RFC 9110 §7.8 lets a server ignore Upgrade), nothing of it is
// forwarded, and the connection stays usable. h2c smuggling, where an upstream
// that answers 101 would leave the client holding a raw tunnel to it, must stay
// impossible.
import { createServer, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { listenOnLoopback, startProxy, startUpstream, type Received, type RunningProxy, type Upstream } from '../support/helpers.js'
import { converse, errorOf, headerNames, parseRequests, rawRequest } from '../support/raw.js'

const H = 'Host: 127.0.0.1\r\n'
const H2C = 'Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n'

interface Rig { readonly proxy: RunningProxy, readonly up: Upstream }

async function rig (t: Test, env: Record<string, string> = {}): Promise<Rig> {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, ...env })
  t.teardown(async () => { await proxy.close(); await up.close() })
  return { proxy, up }
}

function headerNamesOf (rec: Received): string[] {
  return rec.rawHeaders.filter((_, i) => i % 2 === 0).map(n => n.toLowerCase())
}

t.test('an h2c or other non-WebSocket upgrade is served as plain HTTP/1.1: no 101, nothing of the upgrade forwarded, the connection kept for the next request', async t => {
  const { proxy, up } = await rig(t)
  const cases: [name: string, requests: string[], forwardedBodies: number[]][] = [
    ['h2c GET, h2c POST, h2c chunked POST, plain GET on one connection', [
      `GET /a HTTP/1.1\r\n${H}${H2C}\r\n`,
      `POST /b HTTP/1.1\r\n${H}${H2C}Content-Length: 5\r\n\r\nhello`,
      `POST /c HTTP/1.1\r\n${H}${H2C}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n`,
      `GET /d HTTP/1.1\r\n${H}\r\n`,
    ], [0, 5, 3, 0]],
    ['Upgrade: h2c without Connection: upgrade, HTTP2-Settings not named by Connection', [
      `GET /e HTTP/1.1\r\n${H}Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n`,
      `GET /f HTTP/1.1\r\n${H}Connection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n`,
    ], [0, 0]],
    ['other protocols: TLS/1.2, two tokens, a header named by Connection', [
      `GET /g HTTP/1.1\r\n${H}Connection: Upgrade\r\nUpgrade: TLS/1.2\r\n\r\n`,
      `GET /h HTTP/1.1\r\n${H}Connection: Upgrade, X-Hop\r\nUpgrade: foo/1, bar\r\nX-Hop: not-for-the-upstream\r\n\r\n`,
    ], [0, 0]],
    ['HTTP/1.0 with an h2c upgrade and keep-alive', [
      `GET /i HTTP/1.0\r\n${H}Connection: keep-alive, Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n`,
      `GET /j HTTP/1.0\r\n${H}Connection: keep-alive\r\n\r\n`,
    ], [0, 0]],
  ]
  for (const [name, requests, bodies] of cases) {
    const before = up.received.length
    const talk = await converse(proxy.port, requests)
    t.equal(talk.finals.length, requests.length, `${name}: every request answered on the one connection`)
    t.equal(talk.responses.length, talk.finals.length, `${name}: no interim response (never a 101)`)
    t.same(talk.finals.map(r => r.status), requests.map(() => 200), `${name}: all 200`)
    t.notOk(talk.finals.some(r => headerNames(r).includes('upgrade')), `${name}: no Upgrade in any response`)
    t.notOk(talk.closedByPeer, `${name}: the connection is still open`)
    const got = up.received.slice(before)
    t.same(got.map(r => r.bodyBytes), bodies, `${name}: each forwarded once, bodies whole`)
    for (const rec of got) {
      const forwarded = headerNamesOf(rec)
      t.notOk(forwarded.some(n => n === 'upgrade' || n === 'http2-settings' || n === 'x-hop'), `${name} ${rec.url}: no Upgrade, HTTP2-Settings or Connection-named header forwarded (${forwarded.join(' ')})`)
      t.notOk(/upgrade/i.test(rec.headers.connection ?? ''), `${name} ${rec.url}: the upstream's Connection does not ask to upgrade`)
    }
  }
})

t.test('an upstream\'s Upgrade on an ordinary answer is not passed on to the client', async t => {
  const up = await startUpstream((_req, res) => {
    res.setHeader('connection', 'Upgrade')
    res.setHeader('upgrade', 'h2c')
    res.end('ok')
  })
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const talk = await converse(proxy.port, [`GET /a HTTP/1.1\r\n${H}${H2C}\r\n`, `GET /b HTTP/1.1\r\n${H}\r\n`])
  t.same(talk.finals.map(r => r.status), [200, 200])
  t.notOk(talk.finals.some(r => headerNames(r).includes('upgrade')), 'no Upgrade in the responses')
  t.same(talk.finals.map(r => r.headers.connection), [['keep-alive'], ['keep-alive']], 'the client\'s connection is kept, not switched')
})

/** A raw upstream that answers every request head with `answer` and keeps the connection open, recording every byte. */
async function switchingUpstream (t: Test, answer: Buffer): Promise<{ url: string, connections: Buffer[][] }> {
  const connections: Buffer[][] = []
  const sockets = new Set<Socket>()
  const server = createServer(socket => {
    const seen: Buffer[] = []
    connections.push(seen)
    sockets.add(socket)
    socket.on('error', () => undefined)
    socket.on('close', () => sockets.delete(socket))
    socket.on('data', (chunk: Buffer) => {
      seen.push(chunk)
      if (Buffer.concat(seen).includes('\r\n\r\n') && seen.length === 1) socket.write(answer)
    })
  })
  const port = await listenOnLoopback(server)
  t.teardown(() => new Promise<void>(resolve => { for (const s of sockets) s.destroy(); server.close(() => { resolve() }) }))
  return { url: `http://127.0.0.1:${port}`, connections }
}

// An HTTP/2 SETTINGS frame (empty payload), as a server that switched to h2c sends first.
const H2_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])
const PREFACE = 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'

t.test('an upstream answering 101 Switching Protocols cannot hand the client a tunnel (h2c smuggling): 502, never a 101, no client byte relayed raw', async t => {
  const answers: [string, Buffer][] = [
    ['101 to h2c, then HTTP/2 frames', Buffer.concat([Buffer.from('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n'), H2_SETTINGS])],
    ['bare 101 without Upgrade, then HTTP/2 frames', Buffer.concat([Buffer.from('HTTP/1.1 101 Switching Protocols\r\n\r\n'), H2_SETTINGS])],
    ['101 to websocket, then a frame', Buffer.from('HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x81\x02hi', 'latin1')],
  ]
  for (const [name, answer] of answers) {
    const upstream = await switchingUpstream(t, answer)
    const proxy = await startProxy({ COS_API_URL: upstream.url, COS_UPSTREAM_TIMEOUT_MS: '2000' })
    t.teardown(() => proxy.close())
    // The smuggler's moves: ask for h2c, then speak HTTP/2 and ask for an internal path on what it hopes is a tunnel.
    const talk = await converse(proxy.port, [
      `GET /management/x HTTP/1.1\r\n${H}${H2C}\r\n`,
      `POST /internal HTTP/1.1\r\n${H}Content-Length: ${PREFACE.length}\r\n\r\n${PREFACE}`,
    ], { timeoutMs: 4000 })
    t.equal(talk.responses.length, talk.finals.length, `${name}: no interim response reached the client (never a 101)`)
    t.same(talk.finals.map(r => r.status), [502, 502], `${name}: 502 for both requests`)
    t.same(talk.finals.map(r => errorOf(r)?.code), ['upstream_unavailable', 'upstream_unavailable'], `${name}: the proxy's own JSON error`)
    t.notOk(talk.finals.some(r => headerNames(r).includes('upgrade')), `${name}: no Upgrade header`)
    t.equal(talk.leftover.length, 0, `${name}: no stray bytes (an HTTP/2 or WebSocket frame) after the answers`)
    // Everything the upstream got is whole HTTP/1.1 requests the proxy wrote (signed), none asking to upgrade.
    for (const [i, conn] of upstream.connections.entries()) {
      const bytes = Buffer.concat(conn)
      const requests = parseRequests(bytes)
      t.equal(requests.reduce((n, r) => n + r.bytes.length, 0), bytes.length, `${name}: upstream connection ${i}: nothing but whole requests`)
      for (const r of requests) {
        t.match(r.requestLine, /^(GET \/management\/x|POST \/internal) HTTP\/1\.1$/, `${name}: ${r.requestLine}: a request of the client's, as routed`)
        t.ok(r.headers.authorization?.[0]?.startsWith('Bearer ') === true, `${name}: ${r.requestLine}: signed by the proxy`)
        t.notOk(r.headers.upgrade !== undefined || r.headers['http2-settings'] !== undefined || /upgrade/i.test(r.headers.connection?.join(',') ?? ''),
          `${name}: ${r.requestLine}: no upgrade asked of the upstream`)
      }
    }
    const after = await rawRequest(proxy.port, `GET /y HTTP/1.1\r\n${H}Connection: close\r\n\r\n`)
    t.equal(after.finals[0]?.status, 502, `${name}: the proxy answers the next connection too`)
  }
})

t.test('a client that starts speaking HTTP/2 without an upgrade (prior knowledge) gets 400 and is disconnected; nothing is forwarded', async t => {
  const { proxy, up } = await rig(t)
  const res = await rawRequest(proxy.port, [PREFACE, H2_SETTINGS], { timeoutMs: 2000 })
  t.ok(res.closedByPeer, 'connection closed')
  t.same(res.finals.map(r => [r.status, errorOf(r)?.code]), [[400, 'bad_request']], 'one 400 in the JSON shape')
  t.equal(up.received.length, 0, 'nothing forwarded')
  const after = await rawRequest(proxy.port, `GET /z HTTP/1.1\r\n${H}Connection: close\r\n\r\n`)
  t.equal(after.finals[0]?.status, 200, 'the proxy still serves')
})

t.test('a request pipelined behind an upgrade request in one packet is never half-read: answered, or dropped with the connection closed', async t => {
  // Node's parser stops reading a packet after a request that asks to upgrade
  // (it expects another protocol to follow) and, when nobody takes the
  // upgrade, drops the rest of that packet. A client asking for h2c must wait
  // for the answer before sending more (it could be a 101), so only a
  // misbehaving one loses a request here; the idle reaper then closes the
  // connection. Whatever Node does, nothing may be forwarded but whole requests.
  const { proxy, up } = await rig(t, { COS_KEEPALIVE_TIMEOUT_MS: '300' })
  const res = await rawRequest(proxy.port, `GET /first HTTP/1.1\r\n${H}${H2C}\r\nGET /second HTTP/1.1\r\n${H}\r\n`, { expect: 2, timeoutMs: 3000 })
  t.equal(res.finals[0]?.status, 200, 'the upgrade request is answered')
  t.equal(res.responses.length, res.finals.length, 'never a 101')
  const urls = up.received.map(r => r.url)
  if (res.finals.length === 2) {
    t.same(urls, ['/first', '/second'], 'both answered and forwarded')
  } else {
    t.same(urls, ['/first'], 'the dropped request was never forwarded')
    t.ok(res.closedByPeer && !res.timedOut, 'and the connection was closed rather than left hanging')
  }
})
