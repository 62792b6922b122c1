// Upstream faults map to the contract: refused/reset/TLS → 502 upstream_unavailable,
// no connection or no headers in time → 504 upstream_timeout. The proxy keeps serving.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createServer as createHttpsServer } from 'node:https'
import { createServer as createNetServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { errors } from 'undici'
import { upstreamErrorStatus } from '../../src/proxy/forward-response.js'
import { REFUSING_PORT, json, listenOnLoopback, send, startProxy, startUpstream } from '../support/helpers.js'

/** A TCP server that does `onSocket` with every connection, and tracks them for teardown. */
async function tcpServer (onSocket: (s: Socket) => void): Promise<{ port: number, close: () => Promise<void> }> {
  const sockets = new Set<Socket>()
  const server = createNetServer(s => { sockets.add(s); s.on('close', () => sockets.delete(s)); s.on('error', () => undefined); onSocket(s) })
  const port = await listenOnLoopback(server)
  return { port, close: () => new Promise(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }) }
}

t.test('connection refused → 502 upstream_unavailable with x-request-id, then the proxy serves on', async t => {
  const good = await startUpstream()
  const port = REFUSING_PORT
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: `http://127.0.0.1:${port}`, COS_API_URL: good.url })
  t.teardown(async () => { await proxy.close(); await good.close() })
  const res = await send(`${proxy.url}/management/x`, { headers: { 'x-request-id': 'refused-1' } })
  t.equal(res.status, 502)
  t.same(json(res), { error: { code: 'upstream_unavailable', message: 'the upstream could not be reached' } })
  t.equal(res.headers['x-request-id'], 'refused-1')
  const next = await send(`${proxy.url}/other`)
  t.equal(next.status, 200, 'next request served')
})

t.test('connection reset → 502', async t => {
  const reset = await tcpServer(s => s.once('data', () => s.resetAndDestroy()))
  const proxy = await startProxy({ COS_API_URL: `http://127.0.0.1:${reset.port}` })
  t.teardown(async () => { await proxy.close(); await reset.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.match(json(res), { error: { code: 'upstream_unavailable' } })
})

t.test('connection closed without an answer → 502', async t => {
  const hangup = await tcpServer(s => s.once('data', () => s.end()))
  const proxy = await startProxy({ COS_API_URL: `http://127.0.0.1:${hangup.port}` })
  t.teardown(async () => { await proxy.close(); await hangup.close() })
  const res = await send(`${proxy.url}/x`, { method: 'POST', body: 'x' })
  t.equal(res.status, 502)
})

t.test('https:// to a plain-HTTP port → 502 whose message points at the URL\'s scheme', async t => {
  const plain = await startUpstream()
  const proxy = await startProxy({ COS_API_URL: plain.url.replace('http://', 'https://') })
  t.teardown(async () => { await proxy.close(); await plain.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.match(json(res), { error: { code: 'upstream_unavailable', message: /does not speak TLS on that port .*https:\/\/ for a plain-HTTP port\? check its scheme/ } })
})

t.test('silent upstream: no response headers within COS_UPSTREAM_TIMEOUT_MS → 504 upstream_timeout', async t => {
  const silent = await tcpServer(() => undefined)
  const good = await startUpstream()
  const proxy = await startProxy({ COS_OPTIMIZE_API_URL: `http://127.0.0.1:${silent.port}`, COS_API_URL: good.url, COS_UPSTREAM_TIMEOUT_MS: '300' })
  t.teardown(async () => { await proxy.close(); await silent.close(); await good.close() })
  const res = await send(`${proxy.url}/optimize/slow`)
  t.equal(res.status, 504)
  t.same(json(res), { error: { code: 'upstream_timeout', message: 'the upstream did not answer in time (COS_UPSTREAM_TIMEOUT_MS)' } })
  t.equal((await send(`${proxy.url}/fine`)).status, 200, 'next request served')
})

t.test('no connection within COS_CONNECT_TIMEOUT_MS → 504 (a TLS handshake that never completes)', async t => {
  // On loopback a TCP connect cannot be made to hang, but undici's connect
  // phase includes the TLS handshake: a server that accepts and stays mute does it.
  const mute = await tcpServer(() => undefined)
  const proxy = await startProxy({ COS_API_URL: `https://127.0.0.1:${mute.port}`, COS_CONNECT_TIMEOUT_MS: '300', COS_UPSTREAM_TIMEOUT_MS: '10000' })
  t.teardown(async () => { await proxy.close(); await mute.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 504)
  t.match(json(res), { error: { code: 'upstream_timeout' } })
})

t.test('TLS failure (certificate not trusted) → 502, and certificates are verified', async t => {
  const dir = mkdtempSync(join(tmpdir(), 'cos-tls-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1',
    '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem')], { stdio: 'ignore' })
  let reached = 0
  const server = createHttpsServer({ key: readFileSync(join(dir, 'key.pem')), cert: readFileSync(join(dir, 'cert.pem')) }, (_req, res) => { reached++; res.end('tls ok') })
  const port = await listenOnLoopback(server)
  const proxy = await startProxy({ COS_API_URL: `https://127.0.0.1:${port}` })
  t.teardown(async () => { await proxy.close(); server.closeAllConnections(); await new Promise(resolve => server.close(resolve)) })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.match(json(res), { error: { code: 'upstream_unavailable' } })
  t.equal(reached, 0, 'an untrusted server never receives the signed request')
})

t.test('error classification, on the errors undici fails an exchange with', async t => {
  const sys = (code: string): Error => Object.assign(new Error(code), { code })
  t.equal(upstreamErrorStatus(new errors.ConnectTimeoutError()), 504)
  t.equal(upstreamErrorStatus(new errors.HeadersTimeoutError()), 504)
  t.equal(upstreamErrorStatus(new errors.BodyTimeoutError()), 502, 'a body that stalls after the head is not a 504 in the contract')
  t.equal(upstreamErrorStatus(sys('ECONNREFUSED')), 502)
  t.equal(upstreamErrorStatus(sys('ENOTFOUND')), 502, 'an unresolvable host is 502')
  t.equal(upstreamErrorStatus(sys('DEPTH_ZERO_SELF_SIGNED_CERT')), 502)
  t.equal(upstreamErrorStatus(new errors.SocketError('other side closed')), 502)
})
