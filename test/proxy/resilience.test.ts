// Upstream faults a long-lived sidecar meets: safe retries with fresh tokens,
// a 401 after rotation, long streams under short timeouts, private CAs, mTLS.
import { copyFileSync } from 'node:fs'
import type { ServerResponse } from 'node:http'
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net'
import { join } from 'node:path'
import t from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer, upstreamsFor } from '../../src/proxy/proxy-server.js'
import { HeaderMinter, parseToken, secretKey, verifyToken } from '../../src/token/token.js'
import { ACCESS_KEY, LogCapture, SECRET, json, listenOnLoopback, send, startProxy, startUpstream, testConfig } from '../support/helpers.js'
import { httpsUpstream, makePki } from '../support/tls-fixtures.js'

const key = secretKey(SECRET)

/** An HTTP upstream on a raw TCP server: the first `failFirst` connections are reset after the request arrives. */
async function flakyUpstream (failFirst: number): Promise<{ url: string, tokens: string[], connections: () => number, close: () => Promise<void> }> {
  const tokens: string[] = []
  let connections = 0
  const sockets = new Set<Socket>()
  const server = createNetServer(socket => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => undefined)
    const n = ++connections
    socket.once('data', (chunk: Buffer) => {
      const auth = /\r\nauthorization: ([^\r]+)/i.exec(chunk.toString('latin1'))?.[1] ?? ''
      tokens.push(auth)
      if (n <= failFirst) socket.resetAndDestroy()
      else socket.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok')
    })
  })
  const port = await listenOnLoopback(server)
  return {
    url: `http://127.0.0.1:${port}`,
    tokens,
    connections: () => connections,
    close: () => new Promise(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }),
  }
}

t.test('a GET whose connection is reset is retried once, with a fresh token', async t => {
  const up = await flakyUpstream(1)
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 200)
  t.equal(up.connections(), 2, 'two attempts')
  t.equal(up.tokens.length, 2)
  t.not(up.tokens[0], up.tokens[1], 'the retry carries a new token')
  for (const auth of up.tokens) t.ok(verifyToken(auth.slice(7), { accessKey: ACCESS_KEY, key }).ok, 'both tokens verify')
})

t.test('a GET is retried once only: two resets give 502', async t => {
  const up = await flakyUpstream(5)
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.equal(up.connections(), 2)
})

t.test('a POST is never retried, nor a GET with a body', async t => {
  const up = await flakyUpstream(1)
  const proxy = await startProxy({ COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const post = await send(`${proxy.url}/x`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } })
  t.equal(post.status, 502)
  t.equal(up.connections(), 1, 'one attempt for the POST')
  const postNoBody = await send(`${proxy.url}/x`, { method: 'POST' })
  t.equal(postNoBody.status, 200, 'the next connection is fine')
  t.equal(up.connections(), 2)
})

t.test('after a 401, a request signed with a pair replaced meanwhile is re-signed and resent once; otherwise the 401 passes through and a re-read is asked for', async t => {
  const newSecret = 'rotated-SeCrEt-marker'
  const newKey = secretKey(newSecret)
  const oldMinter = new HeaderMinter(ACCESS_KEY, key, 'url')
  const store = new CredentialStore(oldMinter)
  let swapOnArrival = false
  // The API already accepts only the new pair.
  const up = await startUpstream((req, res) => {
    // The watcher applies the new pair while this request is at the upstream.
    if (swapOnArrival) { swapOnArrival = false; store.swap(new HeaderMinter('AKIDNEW', newKey, 'url')) }
    const ok = verifyToken((req.headers.authorization ?? '').slice(7), { accessKey: 'AKIDNEW', key: newKey }).ok
    res.statusCode = ok ? 200 : 401
    res.end(ok ? 'new pair' : 'unauthorized')
  })
  const config = testConfig({ COS_API_URL: up.url })
  let resyncs = 0
  const app = await buildProxyServer({ config, credentials: store, logger: createLogger('silent'), resyncCredentials: () => { resyncs++ } })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  t.teardown(async () => { await app.close(); await up.close() })

  const stale = await send(`${url}/a`)
  t.equal(stale.status, 401, 'signed with the pair in force: the 401 is the answer')
  t.equal(up.received.length, 1, 'sent once')
  t.equal(resyncs, 1, 'a background re-read is asked for')

  swapOnArrival = true
  const post = await send(`${url}/b`, { method: 'POST', body: 'x' })
  t.equal(post.status, 401, 'a request with a body is not resent')
  t.equal(up.received.length, 2)
  t.equal(resyncs, 1, 'the pair was replaced already: no re-read asked for')

  store.swap(oldMinter)
  swapOnArrival = true
  const fixed = await send(`${url}/c`)
  t.equal(fixed.status, 200)
  t.equal(fixed.body.toString(), 'new pair')
  t.equal(up.received.length, 4, 'the 401 and the re-signed resend')
  const parsed = parseToken((up.received[3]?.headers.authorization ?? '').slice(7))
  t.equal(parsed.ok && parsed.fields.accessKey, 'AKIDNEW')
  t.equal(resyncs, 1)
})

t.test('long responses are not cut while bytes flow; a body that stalls past COS_BODY_IDLE_TIMEOUT_MS is', async t => {
  const up = await startUpstream((req, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    let n = 0
    const stallAfter = req.url === '/stall' ? 2 : Infinity
    const tick = setInterval(() => {
      if (n === stallAfter) { clearInterval(tick); return } // goes silent, connection open
      res.write(`data: ${n}\n\n`)
      if (++n === 8) { clearInterval(tick); res.end() }
    }, 150)
    res.on('close', () => clearInterval(tick))
  })
  // 8 × 150 ms = 1.2 s of stream: four times the header timeout, each gap under the idle timeout.
  const proxy = await startProxy({ COS_API_URL: up.url, COS_UPSTREAM_TIMEOUT_MS: '300', COS_BODY_IDLE_TIMEOUT_MS: '500' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const events = await send(`${proxy.url}/events`)
  t.equal(events.status, 200)
  t.equal(events.body.toString().match(/data: \d/g)?.length, 8, 'all eight events arrived')

  const stalled = await send(`${proxy.url}/stall`).then(r => r.body.toString(), (err: unknown) => `error: ${(err as Error).message}`)
  t.notOk(stalled.includes('data: 2'), 'the stalled stream was cut after its last bytes')
  t.match(stalled, /data: 1|error/)
})

t.test('HTTPS with COS_CA_FILE: a private CA is trusted when given, refused when not', async t => {
  const pki = makePki()
  const up = await httpsUpstream(pki, false)
  t.teardown(async () => { await up.close(); pki.cleanup() })
  const without = await startProxy({ COS_API_URL: up.url })
  t.equal((await send(`${without.url}/x`)).status, 502, 'unknown CA: 502')
  await without.close()
  const withCa = await startProxy({ COS_API_URL: up.url, COS_CA_FILE: pki.caFile })
  const res = await send(`${withCa.url}/x`)
  t.equal(res.status, 200, 'private CA trusted')
  await withCa.close()
})

t.test('mutual TLS with COS_CLIENT_CERT_FILE / COS_CLIENT_KEY_FILE', async t => {
  const pki = makePki()
  const up = await httpsUpstream(pki, true)
  t.teardown(async () => { await up.close(); pki.cleanup() })
  const anonymous = await startProxy({ COS_API_URL: up.url, COS_CA_FILE: pki.caFile })
  t.equal((await send(`${anonymous.url}/x`)).status, 502, 'no client certificate: refused by the upstream')
  await anonymous.close()
  const mtls = await startProxy({ COS_API_URL: up.url, COS_CA_FILE: pki.caFile, COS_CLIENT_CERT_FILE: pki.clientCertFile, COS_CLIENT_KEY_FILE: pki.clientKeyFile })
  const res = await send(`${mtls.url}/x`)
  t.equal(res.status, 200)
  t.same(json(res), { client: 'client' }, 'the upstream saw the client certificate')
  await mtls.close()
})

t.test('COS_CA_FILE is re-read on change: a rotated bundle takes effect without a restart', async t => {
  const pki = makePki()
  const up = await httpsUpstream(pki, false)
  const caFile = join(pki.dir, 'bundle.pem')
  copyFileSync(pki.otherCaFile, caFile) // the wrong CA first
  const logs = new LogCapture()
  const logger = createLogger('info', logs)
  const config = testConfig({ COS_API_URL: up.url, COS_CA_FILE: caFile, COS_CREDENTIALS_RELOAD_MS: '100' })
  const upstreams = upstreamsFor(config, logger)
  upstreams.watch()
  const app = await buildProxyServer({ config, credentials: new CredentialStore(new HeaderMinter(ACCESS_KEY, key, 'url')), logger, upstreams })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  t.teardown(async () => { await app.close(); await up.close(); pki.cleanup() })

  t.equal((await send(`${url}/x`)).status, 502, 'wrong CA')
  copyFileSync(pki.caFile, caFile)
  const deadline = Date.now() + 3000
  let status = 0
  while (Date.now() < deadline && status !== 200) {
    await new Promise(resolve => setTimeout(resolve, 100))
    status = (await send(`${url}/x`)).status
  }
  t.equal(status, 200, 'the new CA is in use')
  t.ok(logs.records.some(r => r.msg === 'TLS files changed: new upstream connections use them'))
})
