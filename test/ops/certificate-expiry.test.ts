// The certificate expiry gauges as Prometheus scrapes them from real
// processes (the bundle: `serve` and `inject`), their files in a volume
// rotated the way Kubernetes does it (the `..data` swap): the notAfter of the
// certificates in use after start, the new one after a rotation, the old one
// kept when the new files are refused (the old certificate is still the one
// in use), and no series for a file that is not set.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { CREDS, start } from '../support/cli-process.js'
import { startUpstream } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'
import { datedCertificate } from '../support/tls-fixtures.js'
import { fixtureSidecarFile } from '../inject/pods.js'
import { Volume } from '../mounted/volume.js'

const dir = mkdtempSync(join(tmpdir(), 'cos-cert-expiry-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const client3d = datedCertificate(dir, 'client3d', 3)
const client60d = datedCertificate(dir, 'client60d', 60)
const ca10d = datedCertificate(dir, 'ca10d', 10)
const ca400d = datedCertificate(dir, 'ca400d', 400)

/** The value of `name{certificate="<which>"}` in a scrape; undefined: no such series. */
function gauge (text: string, name: string, which: string): number | undefined {
  const m = new RegExp(`^${name}\\{certificate="${which}"\\} (\\S+)$`, 'm').exec(text)
  return m === null ? undefined : Number(m[1])
}

const scrape = async (adminPort: string): Promise<string> => await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()

/** Scrapes until `done` holds (or 10 s, scaled); the last scrape. */
async function scrapeUntil (adminPort: string, done: (text: string) => boolean): Promise<string> {
  let text = await scrape(adminPort)
  for (const deadline = Date.now() + scaled(10_000); Date.now() < deadline && !done(text); await sleep(50)) text = await scrape(adminPort)
  return text
}

const PROXY = 'cos_auth_proxy_certificate_expiration_timestamp_seconds'
const INJECT = 'cos_auth_proxy_inject_certificate_expiration_timestamp_seconds'
const LISTENING = /[^\n]*"msg":"cos-auth-proxy listening"[^\n]*/
const adminPort = (match: RegExpMatchArray): string => String((JSON.parse(match[0]) as { admin: { port: number } }).admin.port)

t.test('the proxy exports the notAfter of its upstream client certificate and the earliest of its CA bundle, after start and after each rotation', async t => {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const volume = new Volume(join(dir, 'upstream-tls'))
  // A bundle of two CAs: the one that expires first is the one to renew.
  volume.swapData({ 'tls.crt': client3d.cert, 'tls.key': client3d.key, 'ca.crt': ca400d.cert + ca10d.cert })
  const { daemon, match } = await start(['serve'], {
    ...CREDS,
    COS_API_URL: upstream.url,
    COS_LISTEN_PORT: '0',
    COS_CA_FILE: volume.path('ca.crt'),
    COS_CLIENT_CERT_FILE: volume.path('tls.crt'),
    COS_CLIENT_KEY_FILE: volume.path('tls.key'),
  }, LISTENING)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const admin = adminPort(match)
  let text = await scrape(admin)
  t.ok(client3d.isNotAfter(gauge(text, PROXY, 'client')), 'client: the certificate read at start')
  t.ok(ca10d.isNotAfter(gauge(text, PROXY, 'ca')), 'ca: the earliest of the bundle')

  volume.swapData({ 'tls.crt': client60d.cert, 'tls.key': client60d.key, 'ca.crt': ca400d.cert })
  text = await scrapeUntil(admin, s => client60d.isNotAfter(gauge(s, PROXY, 'client')) && ca400d.isNotAfter(gauge(s, PROXY, 'ca')))
  t.ok(client60d.isNotAfter(gauge(text, PROXY, 'client')), 'client: the rotated certificate')
  t.ok(ca400d.isNotAfter(gauge(text, PROXY, 'ca')), 'ca: the rotated bundle')

  // Refused (the key file holds no key): the certificates in use stay, and so do their values.
  volume.swapData({ 'tls.crt': client3d.cert, 'tls.key': 'not a key', 'ca.crt': ca10d.cert })
  await scrapeUntil(admin, () => /TLS files changed but cannot be used/.test(daemon.stdout()))
  t.match(daemon.stdout(), /TLS files changed but cannot be used/, 'the new files were read and refused')
  text = await scrape(admin)
  t.ok(client60d.isNotAfter(gauge(text, PROXY, 'client')), 'client: still the certificate in use')
  t.ok(ca400d.isNotAfter(gauge(text, PROXY, 'ca')), 'ca: still the bundle in use')
})

t.test('a proxy without TLS files exports the family and no series', async t => {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const { daemon, match } = await start(['serve'], { ...CREDS, COS_API_URL: upstream.url, COS_LISTEN_PORT: '0' }, LISTENING)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const text = await scrape(adminPort(match))
  t.match(text, `# TYPE ${PROXY} gauge`)
  t.notMatch(text, new RegExp(`^${PROXY}\\{`, 'm'))
})

t.test('the injector exports the notAfter of its serving certificate, after start and after a rotation; a pair refused keeps it', async t => {
  const volume = new Volume(join(dir, 'serving'))
  volume.swapData({ 'tls.crt': client3d.cert, 'tls.key': client3d.key })
  const sidecar = join(dir, 'sidecar.json')
  writeFileSync(sidecar, fixtureSidecarFile())
  const { daemon, match } = await start(['inject'], {
    COS_INJECT_HOST: '127.0.0.1',
    COS_INJECT_PORT: '0',
    COS_INJECT_TLS_CERT_FILE: volume.path('tls.crt'),
    COS_INJECT_TLS_KEY_FILE: volume.path('tls.key'),
    COS_INJECT_SIDECAR_FILE: sidecar,
    COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
    COS_SHUTDOWN_DELAY_MS: '0',
  }, /"admin":\{"address":"[^"]+","port":(\d+)\}.*injection webhook listening/)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const admin = match[1] ?? ''
  let text = await scrape(admin)
  t.ok(client3d.isNotAfter(gauge(text, INJECT, 'serving')), 'the certificate read at start')

  volume.swapData({ 'tls.crt': client60d.cert, 'tls.key': client60d.key })
  text = await scrapeUntil(admin, s => client60d.isNotAfter(gauge(s, INJECT, 'serving')))
  t.ok(client60d.isNotAfter(gauge(text, INJECT, 'serving')), 'the rotated certificate')
  t.match(text, /^cos_auth_proxy_inject_certificate_reloads_total\{result="applied"\} 1$/m)

  // Half a rotation: a new certificate with the old key is not a pair; the one served stays.
  volume.swapData({ 'tls.crt': ca10d.cert, 'tls.key': client60d.key })
  text = await scrapeUntil(admin, s => /certificate_reloads_total\{result="rejected"\} 1$/m.test(s))
  t.match(text, /^cos_auth_proxy_inject_certificate_reloads_total\{result="rejected"\} 1$/m)
  t.ok(client60d.isNotAfter(gauge(text, INJECT, 'serving')), 'still the certificate served')
})
