// Web pages in a developer's browser must not be able to use the key: a page
// from another site (Origin, Sec-Fetch-Site), a page whose name was rebound
// to 127.0.0.1 (Host), a form posting to /quitquitquit. The requests are the
// ones Chromium really sent (test/fixtures/browser/, captured by
// scripts/capture-browser-requests.mjs) and hand-written ones for each rule
// and each exemption, all through the real proxy; a refusal forwards nothing.
import { readFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { buildAdminServer } from '../../src/admin/admin.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { startProxy } from '../support/helpers.js'
import { errorOf, rawRequest, startCountingUpstream, type CountingUpstream } from '../support/raw.js'

/** A request Chromium 156 sent, byte for byte (CRLF line ends, body included). */
function chromium (name: string): Buffer {
  return readFileSync(new URL(`../fixtures/browser/${name}.http`, import.meta.url))
}

interface Rig { readonly port: number, readonly up: CountingUpstream }

async function rig (t: Test, env: Record<string, string> = {}): Promise<Rig> {
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, ...env })
  t.teardown(async () => { await proxy.close(); await up.close() })
  return { port: proxy.port, up }
}

/** Sends `bytes`; asserts a JSON 403 with `code` and that nothing reached the upstream. */
async function expectRefused (t: Test, r: Rig, name: string, bytes: string | Buffer, code: string): Promise<void> {
  const seen = r.up.started()
  const res = await rawRequest(r.port, bytes)
  t.equal(res.finals[0]?.status, 403, `${name}: 403`)
  t.equal(errorOf(res.finals[0])?.code, code, `${name}: ${code}`)
  t.equal(r.up.started() - seen, 0, `${name}: nothing forwarded`)
}

/** Sends `bytes`; asserts the upstream's 200 and that exactly this request was forwarded. */
async function expectForwarded (t: Test, r: Rig, name: string, bytes: string | Buffer): Promise<void> {
  const seen = r.up.started()
  const res = await rawRequest(r.port, bytes)
  t.equal(res.finals[0]?.status, 200, `${name}: forwarded (${res.finals[0]?.status ?? 'no answer'} ${res.finals[0]?.body.toString() ?? ''})`)
  t.equal(r.up.started() - seen, 1, `${name}: one request reached the upstream`)
}

const request = (head: string, extra = ''): string => `${head}\r\n${extra}Connection: close\r\n\r\n`
const post = (extra: string): string => `POST /management/v1/clusters HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n${extra}Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`

t.test("a page on another site cannot use the key: Chromium's image GET, no-cors fetch POST and form POST are refused, nothing forwarded", async t => {
  const r = await rig(t)
  await expectRefused(t, r, '<img> GET (Sec-Fetch-Site: cross-site, no Origin)', chromium('cross-site-img-get'), 'forbidden_origin')
  await expectRefused(t, r, 'no-cors fetch POST (Origin)', chromium('cross-site-fetch-no-cors-post'), 'forbidden_origin')
  await expectRefused(t, r, 'form POST to /quitquitquit (Origin)', chromium('cross-site-form-post-quitquitquit'), 'forbidden_origin')
  t.same(r.up.seen, [], 'the upstream saw nothing')
})

t.test("DNS rebinding cannot read the answers: Chromium's same-origin requests to a rebound name are refused, nothing forwarded", async t => {
  const r = await rig(t)
  // Chromium sends no Sec-Fetch-* to a plain-http name and no Origin on a same-origin GET: only Host gives it away.
  await expectRefused(t, r, 'rebound GET whose answer the page reads', chromium('rebound-fetch-get'), 'forbidden_host')
  await expectRefused(t, r, 'rebound POST', chromium('rebound-fetch-post'), 'forbidden_origin')
  t.same(r.up.seen, [])
})

t.test("the developer's own browser still works: Chromium's address-bar GET (Sec-Fetch-Site: none) is forwarded", async t => {
  const r = await rig(t)
  await expectForwarded(t, r, 'URL typed in the address bar', chromium('address-bar-get'))
  t.equal(r.up.received[0]?.headers['sec-fetch-site'], 'none', 'forwarded as sent')
})

t.test('Origin: refused unless listed in COS_ALLOWED_ORIGINS (compared case-insensitively); Origin: null always', async t => {
  const r = await rig(t, { COS_ALLOWED_ORIGINS: 'https://app.example:3000' })
  await expectRefused(t, r, 'POST from https://evil.example', post('Origin: https://evil.example\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'GET with Origin: null', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1', 'Origin: null\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'a listed host on another port', post('Origin: https://app.example:3001\r\nSec-Fetch-Site: cross-site\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'a listed host over http', post('Origin: http://app.example:3000\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'the proxy\'s own origin (same-origin POST)', post('Origin: http://127.0.0.1:8080\r\nSec-Fetch-Site: same-origin\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'Origin sent twice', post('Origin: https://app.example:3000\r\nOrigin: https://evil.example\r\n'), 'forbidden_origin')
  await expectForwarded(t, r, 'the listed origin, cross-site', post('Origin: HTTPS://App.Example:3000\r\nSec-Fetch-Site: cross-site\r\n'))
  t.equal(r.up.received.at(-1)?.headers.origin, 'HTTPS://App.Example:3000', 'its Origin is forwarded unchanged')
})

t.test('Sec-Fetch-Site: cross-site and same-site refused; none, same-origin and its absence pass', async t => {
  const r = await rig(t)
  await expectRefused(t, r, 'cross-site', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: cross-site\r\n'), 'forbidden_origin')
  await expectRefused(t, r, 'same-site', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: same-site\r\n'), 'forbidden_origin')
  await expectForwarded(t, r, 'none', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: none\r\nSec-Fetch-Mode: navigate\r\n'))
  await expectForwarded(t, r, 'same-origin GET', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: same-origin\r\n'))
  await expectForwarded(t, r, 'a non-browser client (no Origin, no Sec-Fetch-*)', request('GET /x HTTP/1.1\r\nHost: 127.0.0.1:8080', 'User-Agent: curl/8.5.0\r\n'))
  // Node's own fetch sends Sec-Fetch-Mode: cors (and no Origin, no Sec-Fetch-Site): a program, not a page.
  const res = await fetch(`http://127.0.0.1:${r.port}/node-fetch`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } })
  t.equal(res.status, 200, "Node's fetch POST is forwarded")
  await res.arrayBuffer()
  t.equal(r.up.received.at(-1)?.headers['sec-fetch-mode'], 'cors')
})

t.test('Host on a loopback listener: any other name is refused; loopback names and addresses pass in every form, with any port', async t => {
  const r = await rig(t)
  for (const host of ['rebind.attacker.example:8080', 'rebind.attacker.example', 'a', 'app.localhost', 'localhost.example', '127.0.0.1.nip.io', '10.0.0.5:8080', '[::2]', 'evil.example@127.0.0.1', '127.0.0.1/x']) {
    await expectRefused(t, r, `Host: ${host}`, request(`GET /x HTTP/1.1\r\nHost: ${host}`), 'forbidden_host')
  }
  for (const host of ['127.0.0.1', '127.0.0.1:1', 'localhost:8080', 'LOCALHOST', 'localhost.:8080', '127.0.0.2', '127.1:8080', '[::1]:8080', '[0:0:0:0:0:0:0:1]', '[::ffff:127.0.0.1]']) {
    await expectForwarded(t, r, `Host: ${host}`, request(`GET /x HTTP/1.1\r\nHost: ${host}`))
  }
  await expectForwarded(t, r, 'HTTP/1.0 without Host', 'GET /x HTTP/1.0\r\n\r\n')
  await expectForwarded(t, r, 'an empty Host', request('GET /x HTTP/1.1\r\nHost: '))
  // The first Host of a connection is remembered when it passes: a second, other one is still checked.
  const res = await rawRequest(r.port, 'GET /first HTTP/1.1\r\nHost: localhost\r\n\r\nGET /second HTTP/1.1\r\nHost: rebind.attacker.example\r\n\r\n', { expect: 2 })
  t.same(res.finals.map(f => f.status), [200, 403], 'a rebound Host after a good one on the same connection')
  t.notOk(r.up.seen.includes('GET /second'), 'and the second was not forwarded')
})

t.test('a page rebound to a proxy beyond loopback gets no signed answer', async t => {
  // The compose case of issue 43: the proxy on 0.0.0.0, a page in the host's browser whose name
  // now resolves to the container. Chromium's capture carries that name in Host (rebind.test).
  const wide = await rig(t, { COS_LISTEN_HOST: '0.0.0.0' })
  await expectRefused(t, wide, "Chromium's rebound fetch GET", chromium('rebound-fetch-get'), 'forbidden_host')
  for (const host of ['rebind.attacker.example:8080', '172-28-0-2.nip.io', 'x.svc.attacker.example', 'cos-auth-proxy.apps']) {
    await expectRefused(t, wide, `Host: ${host}`, request(`GET /management/v1/clusters HTTP/1.1\r\nHost: ${host}`), 'forbidden_host')
  }
  const res = await rawRequest(wide.port, request('GET /x HTTP/1.1\r\nHost: rebind.attacker.example'))
  t.match(errorOf(res.finals[0])?.message, /list it in COS_ALLOWED_HOSTS/, 'the refusal says how to admit a name')
  t.same(wide.up.seen, [], 'no request reached the upstream: nothing was signed')
  // What clients there do use still passes, and is signed.
  for (const host of ['cos-auth-proxy:8080', 'cos-auth-proxy.apps.svc:8080', 'cos-auth-proxy.apps.svc.cluster.local', 'proxy.internal', '172.28.0.2:8080', '[fd00::1]:8080', 'localhost:8080']) {
    await expectForwarded(t, wide, `Host: ${host}`, request(`GET /x HTTP/1.1\r\nHost: ${host}`))
  }
  t.ok(wide.up.received.every(r => (r.headers.authorization ?? '') !== ''), 'each forwarded with the proxy\'s token')
  // A good Host remembered on a connection does not let a rebound one through after it.
  const both = await rawRequest(wide.port, 'GET /first HTTP/1.1\r\nHost: cos-auth-proxy\r\n\r\nGET /second HTTP/1.1\r\nHost: rebind.attacker.example\r\n\r\n', { expect: 2 })
  t.same(both.finals.map(f => f.status), [200, 403], 'a rebound Host after a service name on the same connection')
  t.notOk(wide.up.seen.includes('GET /second'), 'and the second was not forwarded')
})

t.test('COS_ALLOWED_HOSTS admits the names it lists with any port, and then only those (and loopback) on any listener', async t => {
  const listed = await rig(t, { COS_ALLOWED_HOSTS: 'proxy.internal, fd00::1' })
  await expectForwarded(t, listed, 'a listed name', request('GET /x HTTP/1.1\r\nHost: proxy.internal:8080'))
  await expectForwarded(t, listed, 'a listed IPv6 address', request('GET /x HTTP/1.1\r\nHost: [fd00::1]:8080'))
  await expectForwarded(t, listed, 'loopback still', request('GET /x HTTP/1.1\r\nHost: localhost'))
  await expectRefused(t, listed, 'a name not listed', request('GET /x HTTP/1.1\r\nHost: other.internal'), 'forbidden_host')
  // The test proxy listens on 127.0.0.1 whatever COS_LISTEN_HOST says; the guard goes by the setting.
  const wide = await rig(t, { COS_LISTEN_HOST: '0.0.0.0' })
  await expectForwarded(t, wide, 'a service name on a listener beyond loopback', request('GET /x HTTP/1.1\r\nHost: cos-auth-proxy.team.svc:8080'))
  await expectRefused(t, wide, 'but not a page from another site', post('Origin: https://evil.example\r\n'), 'forbidden_origin')
  const wideListed = await rig(t, { COS_LISTEN_HOST: '0.0.0.0', COS_ALLOWED_HOSTS: 'cos-auth-proxy.team.svc' })
  await expectForwarded(t, wideListed, 'the listed name beyond loopback', request('GET /x HTTP/1.1\r\nHost: cos-auth-proxy.team.svc:8080'))
  for (const host of ['other.team.svc', 'cos-auth-proxy', '10.0.0.5']) {
    await expectRefused(t, wideListed, `${host}: not in the list given (the list replaces the default)`, request(`GET /x HTTP/1.1\r\nHost: ${host}`), 'forbidden_host')
  }
})

t.test("the admin listener answers no web page: Chromium's form POST to /quitquitquit does not drain the proxy", async t => {
  let quits = 0
  const admin = buildAdminServer({ metrics: new ProxyMetrics({ defaultMetrics: false }), readiness: () => ({ ready: true }), onQuit: () => { quits++ } })
  await admin.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(() => admin.close())
  const port = (admin.server.address() as AddressInfo).port
  const refused = async (name: string, bytes: string | Buffer): Promise<void> => {
    const res = await rawRequest(port, bytes)
    t.equal(res.finals[0]?.status, 403, `${name}: 403`)
    t.equal(errorOf(res.finals[0])?.code, 'forbidden_origin', `${name}: forbidden_origin`)
  }
  await refused('cross-site form POST /quitquitquit', chromium('cross-site-form-post-quitquitquit'))
  await refused('POST /quitquitquit with any Origin', request('POST /quitquitquit HTTP/1.1\r\nHost: 127.0.0.1', `Origin: http://127.0.0.1:${port}\r\nContent-Length: 0\r\n`))
  await refused('same-origin GET /metrics (a rebound page)', request('GET /metrics HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: same-origin\r\n'))
  await refused('cross-site GET /healthz', request('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1', 'Sec-Fetch-Site: cross-site\r\n'))
  t.equal(quits, 0, 'no drain was started')
  const typed = await rawRequest(port, request('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:9090', 'Sec-Fetch-Site: none\r\n'))
  t.equal(typed.finals[0]?.status, 200, '/healthz typed in the address bar')
  const curl = await rawRequest(port, request('POST /quitquitquit HTTP/1.1\r\nHost: 127.0.0.1:9090', 'Content-Length: 0\r\n'))
  t.equal(curl.finals[0]?.status, 202, 'curl -X POST /quitquitquit still drains')
  t.equal(quits, 1)
})
