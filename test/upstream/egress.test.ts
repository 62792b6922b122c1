// Corporate egress: upstream connections through a real forward proxy on
// 127.0.0.1 (CONNECT tunnels for https://, absolute-form for http://),
// NO_PROXY, proxy authentication, and failures that name the egress proxy.
import { copyFileSync } from 'node:fs'
import type { AddressInfo, Socket } from 'node:net'
import { createServer as createNetServer } from 'node:net'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { bypassesProxy, egressProxyFor, type Egress } from '../../src/upstream/egress.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer, upstreamsFor } from '../../src/proxy/proxy-server.js'
import { HeaderMinter, secretKey, verifyToken } from '../../src/token/token.js'
import { CREDS, run, start } from '../support/cli-process.js'
import { startForwardProxy, type ForwardProxy } from '../support/forward-proxy.js'
import { ACCESS_KEY, LogCapture, REFUSING_PORT, SECRET, json, listenOnLoopback, send, startProxy, startUpstream, testConfig, type RunningProxy, type Upstream } from '../support/helpers.js'
import { httpsUpstream, makePki, type HttpsUpstream } from '../support/tls-fixtures.js'

const key = secretKey(SECRET)
const PASSWORD = 'pRoXy-PaSs-marker'
const CREDENTIALS = { user: 'egress-user', password: PASSWORD }
// What the credentials look like in a proxy URL, and as the proxy must see them.
const USERINFO = `${CREDENTIALS.user}:${PASSWORD}`
const BASIC = `Basic ${Buffer.from(USERINFO).toString('base64')}`
const WRONG_USERINFO = `${CREDENTIALS.user}:not-${PASSWORD}`

function verifies (authorization: string | undefined): boolean {
  return verifyToken((authorization ?? '').slice(7), { accessKey: ACCESS_KEY, key }).ok
}

/** Whether the password shows, as such or inside its Basic credentials. */
function leaked (text: string): boolean {
  return [PASSWORD, USERINFO, WRONG_USERINFO].some(s => text.includes(s) || text.includes(Buffer.from(s).toString('base64')))
}

function withCredentials (proxy: ForwardProxy): string {
  return `http://${USERINFO}@127.0.0.1:${proxy.port}`
}

const portOf = (url: string): string => new URL(url).port

/** The proxy with an https upstream at / and an http one at /management, both through an egress proxy that wants CREDENTIALS. */
async function behindAuthenticatingProxy (t: Test): Promise<{ proxy: RunningProxy, egress: ForwardProxy, secure: HttpsUpstream, plain: Upstream }> {
  const pki = makePki()
  const secure = await httpsUpstream(pki, false)
  const plain = await startUpstream()
  const egress = await startForwardProxy({ credentials: CREDENTIALS })
  const proxy = await startProxy({
    COS_API_URL: secure.url, COS_MANAGEMENT_API_URL: plain.url, COS_CA_FILE: pki.caFile, HTTPS_PROXY: withCredentials(egress), HTTP_PROXY: withCredentials(egress),
  })
  t.teardown(async () => { await proxy.close(); await egress.close(); await secure.close(); await plain.close(); pki.cleanup() })
  return { proxy, egress, secure, plain }
}

/** An https upstream (its private CA in COS_CA_FILE) behind a forward proxy, and the sidecar sending to it through HTTPS_PROXY. */
async function tunnelled (t: Test, opts: { clientCertificate?: boolean, httpsProxy?: boolean } = {}): Promise<{ proxy: RunningProxy, egress: ForwardProxy, up: HttpsUpstream }> {
  const pki = makePki()
  const up = await httpsUpstream(pki, opts.clientCertificate === true)
  const egress = await startForwardProxy(opts.httpsProxy === true ? { tls: { key: pki.serverKey, cert: pki.serverCert } } : {})
  const clientCertificate: Record<string, string> = opts.clientCertificate === true ? { COS_CLIENT_CERT_FILE: pki.clientCertFile, COS_CLIENT_KEY_FILE: pki.clientKeyFile } : {}
  const proxy = await startProxy({ COS_API_URL: up.url, COS_CA_FILE: pki.caFile, HTTPS_PROXY: egress.url, ...clientCertificate })
  t.teardown(async () => { await proxy.close(); await egress.close(); await up.close(); pki.cleanup() })
  return { proxy, egress, up }
}

t.test('an https upstream is reached through a CONNECT tunnel, with COS_CA_FILE applied inside it', async t => {
  const { proxy: trusted, egress, up } = await tunnelled(t)

  const res = await send(`${trusted.url}/x`)
  t.equal(res.status, 200)
  t.same(egress.saw.map(s => [s.method, s.target]), [['CONNECT', `127.0.0.1:${portOf(up.url)}`]], 'the egress proxy saw a CONNECT to the upstream and nothing else')
  t.equal(up.received.length, 1)
  t.ok(verifies(up.received[0]?.authorization), 'the upstream got a token that verifies')
  t.equal(egress.saw[0]?.headers.authorization, undefined, 'the token is inside the tunnel, not on the CONNECT')

  // Without the private CA, the upstream's certificate is refused inside the tunnel: that is the upstream's failure, not the proxy's.
  const untrusted = await startProxy({ COS_API_URL: up.url, HTTPS_PROXY: egress.url })
  t.teardown(() => untrusted.close())
  const refused = await send(`${untrusted.url}/x`)
  t.equal(refused.status, 502)
  t.same(json(refused), { error: { code: 'upstream_unavailable', message: 'the upstream could not be reached' } })
  t.equal(egress.saw.length, 2, 'it went through the proxy too')
})

t.test('mutual TLS through the tunnel: the upstream sees the client certificate', async t => {
  const { proxy, egress } = await tunnelled(t, { clientCertificate: true })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 200)
  t.same(json(res), { client: 'client' })
  t.equal(egress.saw[0]?.method, 'CONNECT')
})

t.test('an http upstream goes to HTTP_PROXY as an absolute-form request, and its token still verifies', async t => {
  const up = await startUpstream()
  const egress = await startForwardProxy()
  // A name no resolver knows: only the egress proxy resolves it (to 127.0.0.1).
  const upstream = `http://cos-api.invalid:${portOf(up.url)}`
  const proxy = await startProxy({ COS_API_URL: `${upstream}/api/v1`, HTTP_PROXY: egress.url })
  t.teardown(async () => { await proxy.close(); await egress.close(); await up.close() })

  const res = await send(`${proxy.url}/things?a=1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"x":1}' })
  t.equal(res.status, 200)
  t.same(egress.saw.map(s => [s.method, s.target]), [['POST', `${upstream}/api/v1/things?a=1`]], 'the egress proxy saw the absolute URL')
  const seen = up.received[0]
  t.equal(seen?.url, '/api/v1/things?a=1', 'the upstream saw the origin-form path')
  t.equal(seen?.headers.host, `cos-api.invalid:${portOf(up.url)}`, 'and its own name as Host')
  t.equal(seen?.bodyBytes, 7)
  t.ok(verifies(seen?.headers.authorization), 'the token verifies')
  t.equal(egress.saw[0]?.headers.authorization, seen?.headers.authorization, 'the proxy saw the token it passed on (plain http: as it would without the sidecar)')
})

t.test('one tunnel serves consecutive requests: keep-alive holds through the egress proxy', async t => {
  const { proxy, egress, up } = await tunnelled(t)
  for (let i = 0; i < 3; i++) t.equal((await send(`${proxy.url}/x${i}`)).status, 200)
  t.equal(egress.saw.length, 1, 'one CONNECT for three requests')
  t.equal(up.received.length, 3)
})

t.test('NO_PROXY: exempt upstreams are reached directly, the others through the proxy', async t => {
  const up = await startUpstream()
  const egress = await startForwardProxy()
  t.teardown(async () => { await egress.close(); await up.close() })
  const port = Number(portOf(up.url))
  const cases: [upstream: string, noProxy: string, direct: boolean][] = [
    [up.url, '127.0.0.1', true],
    [up.url, 'example.com, 127.0.0.1', true],
    [up.url, '*', true],
    [up.url, '127.0.0.0/8', true],
    [up.url, `127.0.0.1:${port}`, true],
    [up.url, `127.0.0.1:${port + 1}`, false],
    [up.url, '10.0.0.0/8', false],
    [up.url, '127.0.0.2', false],
    [`http://localhost:${port}`, 'localhost', true],
    [`http://localhost:${port}`, '.localhost', true],
    [`http://localhost:${port}`, `localhost:${port}`, true],
    [`http://localhost:${port}`, 'otherhost,127.0.0.1', false],
  ]
  for (const [upstream, noProxy, direct] of cases) {
    const before = egress.saw.length
    const received = up.received.length
    const proxy = await startProxy({ COS_API_URL: upstream, HTTP_PROXY: egress.url, NO_PROXY: noProxy })
    const res = await send(`${proxy.url}/x`)
    await proxy.close()
    const label = `${upstream} with NO_PROXY=${noProxy}`
    t.equal(res.status, 200, label)
    t.equal(up.received.length, received + 1, `${label}: the upstream got it`)
    t.equal(egress.saw.length - before, direct ? 0 : 1, `${label}: ${direct ? 'directly' : 'through the proxy'}`)
  }
})

t.test('NO_PROXY matching, as curl (plus ports, as Go and undici)', async t => {
  const cases: [host: string, port: number, noProxy: string[], bypass: boolean][] = [
    ['api.example.com', 443, [], false],
    ['api.example.com', 443, ['*'], true],
    ['api.example.com', 443, ['example.com'], true],
    ['example.com', 443, ['example.com'], true],
    ['api.example.com', 443, ['.example.com'], true],
    ['example.com', 443, ['.example.com'], true],
    ['api.example.com', 443, ['*.example.com'], true],
    ['notexample.com', 443, ['example.com'], false],
    ['notexample.com', 443, ['.example.com'], false],
    ['example.com.evil.io', 443, ['example.com'], false],
    ['api.example.com.', 443, ['example.com.'], true],
    ['api.example.com', 443, ['api.example.com:443'], true],
    ['api.example.com', 8443, ['api.example.com:443'], false],
    ['api.example.com', 443, ['other.com', 'svc.cluster.local'], false],
    ['10.1.2.3', 443, ['10.0.0.0/8'], true],
    ['10.1.2.3', 443, ['10.1.2.3'], true],
    ['10.1.2.3', 443, ['10.1.2.4'], false],
    ['10.1.2.3', 443, ['10.0.0.0/33'], false],
    ['10.1.2.3', 443, ['10.1.2.3:443'], true],
    ['10.1.2.3', 443, ['10.1.2.3:80'], false],
    ['10.1.2.3', 443, ['1.2.3'], false],
    ['[fd00::1]', 443, ['fd00::/8'], true],
    ['[fd00::1]', 443, ['fd00::1'], true],
    ['[fd00::1]', 443, ['[fd00::1]'], true],
    ['[fd00::1]', 443, ['[fd00::1]:443'], true],
    ['[fd00::1]', 443, ['[fd00::1]:80'], false],
    ['[fd00::1]', 443, ['10.0.0.0/8'], false],
    ['api.example.com', 443, ['10.0.0.0/8'], false],
    ['api.example.com', 443, ['.', ':443', ''], false],
  ]
  for (const [host, port, noProxy, bypass] of cases) {
    t.equal(bypassesProxy(noProxy, host, port), bypass, `${host}:${port} with NO_PROXY=${noProxy.join(',')}`)
  }

  const proxy = { variable: 'HTTPS_PROXY', address: 'http://p:3128', url: 'http://p:3128' }
  const egress: Egress = { https: proxy, noProxy: ['internal.example.com'] }
  t.equal(egressProxyFor(egress, 'https://api.example.com'), proxy, 'https upstreams take HTTPS_PROXY')
  t.equal(egressProxyFor(egress, 'http://api.example.com'), undefined, 'http upstreams never fall back to HTTPS_PROXY')
  t.equal(egressProxyFor(egress, 'https://x.internal.example.com:8443'), undefined, 'NO_PROXY applies')
  t.equal(egressProxyFor({ https: proxy, noProxy: ['api.example.com:443'] }, 'https://api.example.com'), undefined, 'the default port counts')
})

t.test('proxy authentication: credentials in the proxy URL are sent as Basic Proxy-Authorization, never further', async t => {
  const { proxy, egress, secure, plain } = await behindAuthenticatingProxy(t)

  t.equal((await send(`${proxy.url}/x`)).status, 200, 'https upstream, through CONNECT')
  t.equal((await send(`${proxy.url}/management/x`)).status, 200, 'http upstream, absolute-form')
  t.same(egress.saw.map(s => [s.method, s.headers['proxy-authorization']]), [['CONNECT', BASIC], ['GET', BASIC]])
  t.equal(secure.received[0]?.['proxy-authorization'], undefined)
  t.equal(plain.received[0]?.headers['proxy-authorization'], undefined, 'the proxy took its credentials off')
})

t.test('credentials the egress proxy refuses (407) give 502 upstream_unavailable naming the proxy, never the password', async t => {
  const pki = makePki()
  const secure = await httpsUpstream(pki, false)
  const plain = await startUpstream()
  const egress = await startForwardProxy({ credentials: CREDENTIALS })
  t.teardown(async () => { await egress.close(); await secure.close(); await plain.close(); pki.cleanup() })
  const address = `http://127.0.0.1:${egress.port}`
  const wrong = `http://${WRONG_USERINFO}@127.0.0.1:${egress.port}`
  const cases: [env: Record<string, string>, message: string][] = [
    [{ HTTPS_PROXY: wrong }, `the egress proxy ${address} refused the credentials in HTTPS_PROXY (407)`],
    [{ https_proxy: egress.url }, `the egress proxy ${address} asks for credentials (407): give them in https_proxy as http://user:password@host:port`],
    [{ HTTP_PROXY: wrong }, `the egress proxy ${address} refused the credentials in HTTP_PROXY (407)`],
    [{ http_proxy: egress.url }, `the egress proxy ${address} asks for credentials (407): give them in http_proxy as http://user:password@host:port`],
  ]
  for (const [env, message] of cases) {
    const upstream = Object.keys(env)[0]?.toLowerCase() === 'https_proxy' ? secure.url : plain.url
    const proxy = await startProxy({ COS_API_URL: upstream, COS_CA_FILE: pki.caFile, ...env }, 'trace')
    const res = await send(`${proxy.url}/x`)
    await proxy.close()
    t.equal(res.status, 502, message)
    t.same(json(res), { error: { code: 'upstream_unavailable', message } })
    t.notOk(res.body.toString().includes(PASSWORD))
    t.notOk(leaked(proxy.logs.text), 'nor in the logs, at trace level')
  }
  t.equal(secure.received.length + plain.received.length, 0, 'nothing reached an upstream')
})

t.test('a dead egress proxy gives 502 upstream_unavailable naming it, for https and http upstreams', async t => {
  const port = REFUSING_PORT
  const up = await startUpstream()
  t.teardown(() => up.close())
  const dead = `http://${USERINFO}@127.0.0.1:${port}`
  const message = `the egress proxy http://127.0.0.1:${port} could not be reached`
  const cases: Record<string, string>[] = [{ COS_API_URL: 'https://127.0.0.1:1', HTTPS_PROXY: dead }, { COS_API_URL: up.url, HTTP_PROXY: dead }]
  for (const env of cases) {
    const proxy = await startProxy(env, 'trace')
    const res = await send(`${proxy.url}/x`)
    await proxy.close()
    t.equal(res.status, 502)
    t.same(json(res), { error: { code: 'upstream_unavailable', message } })
    t.notOk(leaked(proxy.logs.text), 'the password is not in the logs, at trace level')
  }
  t.equal(up.received.length, 0)
})

t.test('an egress proxy that refuses the tunnel gives 502 naming it and its answer', async t => {
  const egress = await startForwardProxy({ refuseConnect: 403 })
  const proxy = await startProxy({ COS_API_URL: 'https://127.0.0.1:1', HTTPS_PROXY: egress.url })
  t.teardown(async () => { await proxy.close(); await egress.close() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.same(json(res), { error: { code: 'upstream_unavailable', message: `the egress proxy http://127.0.0.1:${egress.port} refused the tunnel to the upstream (403)` } })
})

t.test('an egress proxy that never answers CONNECT gives 504 after COS_CONNECT_TIMEOUT_MS, naming it', async t => {
  const sockets = new Set<Socket>()
  const silent = createNetServer(s => { sockets.add(s); s.on('error', () => undefined) })
  const port = await listenOnLoopback(silent)
  const proxy = await startProxy({ COS_API_URL: 'https://127.0.0.1:1', HTTPS_PROXY: `127.0.0.1:${port}`, COS_CONNECT_TIMEOUT_MS: '300' })
  t.teardown(async () => { await proxy.close(); for (const s of sockets) s.destroy(); await new Promise(resolve => silent.close(resolve)) })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 504)
  t.same(json(res), { error: { code: 'upstream_timeout', message: `the egress proxy http://127.0.0.1:${port} did not answer in time` } })
})

t.test('COS_UPSTREAM_TIMEOUT_MS holds through the egress proxy: a silent upstream behind it gives 504', async t => {
  const sockets = new Set<Socket>()
  const silent = createNetServer(s => { sockets.add(s); s.on('error', () => undefined) })
  const port = await listenOnLoopback(silent)
  const egress = await startForwardProxy()
  const proxy = await startProxy({ COS_API_URL: `http://127.0.0.1:${port}`, HTTP_PROXY: egress.url, COS_UPSTREAM_TIMEOUT_MS: '300' })
  t.teardown(async () => { await proxy.close(); await egress.close(); for (const s of sockets) s.destroy(); await new Promise(resolve => silent.close(resolve)) })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 504)
  t.same(json(res), { error: { code: 'upstream_timeout', message: 'the upstream did not answer in time (COS_UPSTREAM_TIMEOUT_MS)' } }, 'the upstream was reached: not the proxy\'s fault')
  t.equal(egress.saw.length, 1)
})

t.test('a client\'s Proxy-Authorization header cannot break requests through the egress proxy, and is never forwarded', async t => {
  const { proxy, egress, secure, plain } = await behindAuthenticatingProxy(t)
  const headers = { 'proxy-authorization': 'Basic Y2xpZW50OmNsaWVudA==' }
  t.equal((await send(`${proxy.url}/x`, { headers })).status, 200)
  t.equal((await send(`${proxy.url}/management/x`, { headers })).status, 200)
  t.same(egress.saw.map(s => s.headers['proxy-authorization']), [BASIC, BASIC], 'the proxy saw the sidecar\'s credentials, not the client\'s')
  t.equal(secure.received[0]?.['proxy-authorization'], undefined)
  t.equal(plain.received[0]?.headers['proxy-authorization'], undefined)
})

t.test('a rotated COS_CA_FILE applies inside the tunnel without a restart', async t => {
  const pki = makePki()
  const up = await httpsUpstream(pki, false)
  const egress = await startForwardProxy()
  const caFile = join(pki.dir, 'bundle.pem')
  copyFileSync(pki.otherCaFile, caFile) // the wrong CA first
  const logger = createLogger('info', new LogCapture())
  const config = testConfig({ COS_API_URL: up.url, COS_CA_FILE: caFile, HTTPS_PROXY: egress.url })
  const upstreams = upstreamsFor(config, logger)
  const app = await buildProxyServer({ config, credentials: new CredentialStore(new HeaderMinter(ACCESS_KEY, key, 'url')), logger, upstreams })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  t.teardown(async () => { await app.close(); await egress.close(); await up.close(); pki.cleanup() })

  t.equal((await send(`${url}/x`)).status, 502, 'wrong CA')
  copyFileSync(pki.caFile, caFile)
  t.ok(await upstreams.reloadTls(), 'the new bundle is taken')
  t.equal((await send(`${url}/x`)).status, 200, 'the new CA is in use through the tunnel')
  t.ok(egress.saw.length >= 2 && egress.saw.every(s => s.method === 'CONNECT'), 'both went through the egress proxy')
})

t.test('an https:// egress proxy: its certificate is checked against COS_CA_FILE too, the tunnel inside its TLS', async t => {
  const { proxy, egress, up } = await tunnelled(t, { httpsProxy: true })
  t.match(egress.url, /^https:/)
  t.equal((await send(`${proxy.url}/x`)).status, 200)
  t.same(egress.saw.map(s => s.method), ['CONNECT'])
  t.ok(verifies(up.received[0]?.authorization))
})

t.test('an https:// egress proxy whose certificate is not trusted gives 502 naming the proxy', async t => {
  const pki = makePki()
  const up = await startUpstream()
  const egress = await startForwardProxy({ tls: { key: pki.serverKey, cert: pki.serverCert } })
  const proxy = await startProxy({ COS_API_URL: up.url, HTTP_PROXY: egress.url })
  t.teardown(async () => { await proxy.close(); await egress.close(); await up.close(); pki.cleanup() })
  const res = await send(`${proxy.url}/x`)
  t.equal(res.status, 502)
  t.same(json(res), { error: { code: 'upstream_unavailable', message: `the egress proxy https://127.0.0.1:${egress.port} could not be reached: TLS with it failed (is its CA in COS_CA_FILE?)` } })
  t.equal(up.received.length, 0)
})

t.test('the egress proxy password never appears in the start line, error bodies, metrics or `config`; the start line shows it redacted', async t => {
  const egress = await startForwardProxy({ credentials: CREDENTIALS })
  const up = await startUpstream()
  t.teardown(async () => { await egress.close(); await up.close() })
  const env = { ...CREDS, COS_API_URL: `http://cos-api.invalid:${new URL(up.url).port}`, HTTP_PROXY: withCredentials(egress), COS_LOG_LEVEL: 'debug' }
  const shown = `http://${CREDENTIALS.user}:[redacted]@127.0.0.1:${egress.port}`

  const config = await run(['config'], env)
  t.equal(config.code, 0)
  t.match(JSON.parse(config.stdout), { egress: { http: { variable: 'HTTP_PROXY', address: `http://127.0.0.1:${egress.port}`, url: shown, authorization: '[redacted]' }, noProxy: [] } })

  const { daemon, match } = await start(['serve'], env, /[^\n]*cos-auth-proxy listening[^\n]*/)
  t.teardown(() => daemon.child.kill('SIGKILL'))
  const listening = JSON.parse(match[0]) as { port: number, admin: { port: number }, routes: unknown[] }
  t.same(listening.routes, [{ name: 'api', prefix: '/', upstream: `${env.COS_API_URL}/`, egressProxy: shown }], 'the route names its egress proxy, redacted')
  const ok = await send(`http://127.0.0.1:${listening.port}/x`)
  t.equal(ok.status, 200, 'through the egress proxy, with its credentials, from the real environment')
  t.equal(egress.saw[0]?.headers['proxy-authorization'], BASIC)
  await egress.close()
  const failed = await send(`http://127.0.0.1:${listening.port}/x`)
  t.equal(failed.status, 502)
  t.same(json(failed), { error: { code: 'upstream_unavailable', message: `the egress proxy http://127.0.0.1:${egress.port} could not be reached` } })
  const metrics = await send(`http://127.0.0.1:${listening.admin.port}/metrics`)
  t.equal(metrics.status, 200)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const everything = [config.stdout, config.stderr, daemon.stdout(), daemon.stderr(), ok.body.toString(), failed.body.toString(), metrics.body.toString()].join('\n')
  t.notOk(leaked(everything), 'the password is nowhere, nor its Basic form')
})
