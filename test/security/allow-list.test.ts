// COS_ALLOW_FROM: the socket's peer address decides, nothing the client
// writes. Clients bound to 127.0.0.2 stand in for "another host"; a proxy on
// `::` sees IPv4 clients as IPv4-mapped IPv6 addresses.
import { createServer, type AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import type { FastifyInstance } from 'fastify'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { LogCapture, listenOnLoopback, startProxy, testConfig } from '../support/helpers.js'
import { errorOf, get, rawRequest, startCountingUpstream, type CountingUpstream } from '../support/raw.js'

const OTHER = '127.0.0.2'

async function ipv6Works (): Promise<boolean> {
  return new Promise(resolve => {
    const s = createServer()
    s.once('error', () => { resolve(false) })
    s.listen(0, '::1', () => { s.close(() => { resolve(true) }) })
  })
}

async function canBind (address: string): Promise<boolean> {
  const s = createServer()
  const port = await listenOnLoopback(s)
  const res = await rawRequest(port, '', { localAddress: address, timeoutMs: 300 }).catch(() => undefined)
  await new Promise<void>(resolve => s.close(() => { resolve() }))
  return res?.error === undefined
}

async function expectForbidden (t: Test, port: number, up: CountingUpstream, label: string, bytes: string, localAddress = OTHER): Promise<void> {
  const before = up.seen.length
  const res = await rawRequest(port, Buffer.from(bytes, 'latin1'), { localAddress, expect: 2, settleMs: 100 })
  await new Promise(resolve => setTimeout(resolve, 30))
  t.equal(res.finals[0]?.status, 403, `${label}: 403`)
  t.equal(errorOf(res.finals[0])?.code, 'forbidden_source', `${label}: forbidden_source (got ${JSON.stringify(res.finals[0]?.body.toString('utf8').slice(0, 120))})`)
  t.ok(res.finals.every(f => f.status >= 400), `${label}: nothing but refusals on this connection`)
  t.same(up.seen.slice(before), [], `${label}: nothing forwarded`)
}

t.test('COS_ALLOW_FROM=127.0.0.1/32: 127.0.0.1 is served, 127.0.0.2 gets 403 whatever it claims', async t => {
  if (!await canBind(OTHER)) { t.pass('skipped: cannot bind 127.0.0.2 here'); return }
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, COS_ALLOW_FROM: '127.0.0.1/32' })
  t.teardown(async () => { await proxy.close(); await up.close() })

  const ok = await rawRequest(proxy.port, get('/x'), { localAddress: '127.0.0.1' })
  t.equal(ok.finals[0]?.status, 200, '127.0.0.1 → 200')
  t.equal(up.received.length, 1)

  await expectForbidden(t, proxy.port, up, 'plain GET', get('/x'))
  await expectForbidden(t, proxy.port, up, 'X-Forwarded-For / Forwarded / X-Real-IP: 127.0.0.1',
    get('/x', 'X-Forwarded-For: 127.0.0.1\r\nForwarded: for=127.0.0.1\r\nX-Real-IP: 127.0.0.1\r\nX-Client-IP: 127.0.0.1\r\nTrue-Client-IP: 127.0.0.1\r\n'))
  await expectForbidden(t, proxy.port, up, 'POST with a body', 'POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello')
  await expectForbidden(t, proxy.port, up, 'pipelined keep-alive requests', 'GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n')
  await expectForbidden(t, proxy.port, up, 'a WebSocket upgrade', 'GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n')
  await expectForbidden(t, proxy.port, up, 'a dot-segment path', get('/../x'))
  await expectForbidden(t, proxy.port, up, 'TRACE', 'TRACE /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n')
  await expectForbidden(t, proxy.port, up, 'a malformed percent-escape', get('/%zz'))
  await expectForbidden(t, proxy.port, up, 'a malformed percent-escape after a good request', 'GET /a HTTP/1.1\r\nHost: a\r\n\r\n' + get('/%zz'))

  // What Node's parser or the CONNECT handler would refuse is never parsed
  // either: the connection was refused when it was accepted.
  await expectForbidden(t, proxy.port, up, 'CONNECT', 'CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\n\r\n')
  await expectForbidden(t, proxy.port, up, 'ambiguous framing', 'POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n')
  await expectForbidden(t, proxy.port, up, 'garbage', 'NOT HTTP AT ALL\r\n\r\n')
  const again = await rawRequest(proxy.port, get('/y'), { localAddress: '127.0.0.1' })
  t.equal(again.finals[0]?.status, 200, '127.0.0.1 still served')
})

t.test('the default allow-list admits 127.0.0.0/8; a list without it does not', async t => {
  if (!await canBind(OTHER)) { t.pass('skipped: cannot bind 127.0.0.2 here'); return }
  const up = await startCountingUpstream()
  const open = await startProxy({ COS_API_URL: up.url })
  const v6only = await startProxy({ COS_API_URL: up.url, COS_ALLOW_FROM: '::1/128' })
  t.teardown(async () => { await open.close(); await v6only.close(); await up.close() })
  t.equal((await rawRequest(open.port, get('/x'), { localAddress: OTHER })).finals[0]?.status, 200, 'default list: 127.0.0.2 → 200')
  await expectForbidden(t, v6only.port, up, 'COS_ALLOW_FROM=::1/128, client 127.0.0.1', get('/x'), '127.0.0.1')
  await expectForbidden(t, v6only.port, up, 'COS_ALLOW_FROM=::1/128, client 127.0.0.2', get('/x'), OTHER)
})

interface DualStack { readonly port: number, readonly app: FastifyInstance, readonly peers: string[] }

/** The real proxy on `::` (dual stack), recording each connection's peer address as the server sees it. */
async function startDualStack (t: Test, env: Record<string, string>): Promise<DualStack> {
  const config = testConfig(env)
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger: createLogger('silent', new LogCapture()) })
  const peers: string[] = []
  // Every connection accepted: a refused one is answered and closed before any 'connection' listener sees it.
  const emit = app.server.emit.bind(app.server) as (event: string | symbol, ...args: unknown[]) => boolean
  const recording = (event: string | symbol, ...args: unknown[]): boolean => {
    if (event === 'connection') peers.push((args[0] as { remoteAddress?: string }).remoteAddress ?? '')
    return emit(event, ...args)
  }
  app.server.emit = recording as typeof app.server.emit
  await app.listen({ host: '::', port: 0 })
  t.teardown(() => app.close())
  return { port: (app.server.address() as AddressInfo).port, app, peers }
}

t.test('a proxy on :: sees IPv4 clients as ::ffff:a.b.c.d and matches them as IPv4', async t => {
  if (!await ipv6Works()) { t.pass('skipped: no IPv6 loopback here'); return }
  const up = await startCountingUpstream()
  t.teardown(() => up.close())

  const v4 = await startDualStack(t, { COS_API_URL: up.url, COS_ALLOW_FROM: '127.0.0.1/32' })
  const ok = await rawRequest(v4.port, get('/mapped'), { host: '127.0.0.1', localAddress: '127.0.0.1' })
  t.equal(v4.peers.at(-1), '::ffff:127.0.0.1', 'the server saw the IPv4-mapped address')
  t.equal(ok.finals[0]?.status, 200, '::ffff:127.0.0.1 matches 127.0.0.1/32 → 200')
  if (await canBind(OTHER)) {
    await expectForbidden(t, v4.port, up, '::ffff:127.0.0.2 against 127.0.0.1/32', get('/mapped'))
    t.equal(v4.peers.at(-1), '::ffff:127.0.0.2')
  }
  const v6 = await rawRequest(v4.port, get('/v6'), { host: '::1' })
  t.equal(v4.peers.at(-1), '::1')
  t.equal(v6.finals[0]?.status, 403, '::1 against 127.0.0.1/32 → 403')

  const mappedList = await startDualStack(t, { COS_API_URL: up.url, COS_ALLOW_FROM: '::ffff:127.0.0.1/128' })
  t.equal((await rawRequest(mappedList.port, get('/x'), { host: '127.0.0.1' })).finals[0]?.status, 200, 'a mapped CIDR admits the IPv4 client')
  if (await canBind(OTHER)) await expectForbidden(t, mappedList.port, up, 'a mapped /128 does not admit 127.0.0.2', get('/x'))

  const defaults = await startDualStack(t, { COS_API_URL: up.url })
  t.equal((await rawRequest(defaults.port, get('/x'), { host: '::1' })).finals[0]?.status, 200, 'default list admits ::1')
  t.equal((await rawRequest(defaults.port, get('/x'), { host: '127.0.0.1' })).finals[0]?.status, 200, 'default list admits ::ffff:127.0.0.1')
})

// POST /quitquitquit's sources: test/admin/quitquitquit.test.ts.
