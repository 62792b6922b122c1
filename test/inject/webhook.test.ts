// The webhook over real HTTPS on 127.0.0.1: reviews in, patches out (applied
// and validated), malformed reviews, the certificate swapped on disk, an
// untrusted client; and the `inject` command as a process.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { run, start } from '../support/cli-process.js'
import { jsonLines } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'
import { makePki, type Pki } from '../support/tls-fixtures.js'
import { postToWebhook, startTestWebhook, type TestWebhook } from '../support/webhook.js'
import { appPod, applyResponsePatch, chartPod, EXAMPLE_SIDECAR_FILE, podReview } from './pods.js'

type Json = Record<string, unknown>

const first = makePki()
const second = makePki()
t.teardown(() => { first.cleanup(); second.cleanup() })

/** The serving pair as files, where the webhook reads them (copied: the test overwrites them). */
function certDir (pki: Pki): { dir: string, certFile: string, keyFile: string } {
  const dir = mkdtempSync(join(tmpdir(), 'cos-inject-'))
  const files = { dir, certFile: join(dir, 'tls.crt'), keyFile: join(dir, 'tls.key') }
  writeFileSync(files.certFile, pki.serverCert)
  writeFileSync(files.keyFile, pki.serverKey)
  return files
}

async function startWebhook (t: Test, files: { certFile: string, keyFile: string }, logger = pino({ level: 'silent' })): Promise<TestWebhook> {
  return await startTestWebhook(t, { tls: files, logger, certificateCheckMs: 25 })
}

interface Answer { status: number, body: string }

/** One POST on a new connection (agent: false), trusting `ca` only. */
async function post (port: number, ca: string, body: string, path = '/mutate'): Promise<Answer> {
  return await postToWebhook(port, ca, body, { path, timeoutMs: 5000 })
}

interface Response { uid: string, allowed: boolean, patchType?: string, patch?: string, status?: { message: string }, warnings?: string[] }

async function postReview (port: number, ca: string, review: Json): Promise<{ response: Response }> {
  const r = await post(port, ca, JSON.stringify(review))
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`)
  return JSON.parse(r.body) as { response: Response }
}

t.test('a review over HTTPS gets a JSONPatch that yields a valid Pod with the chart\'s sidecar', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { port, metrics } = await startWebhook(t, files)
  const pod = appPod()
  const answer = await postReview(port, first.ca, podReview(pod))
  t.equal(answer.response.allowed, true)
  const { spec } = applyResponsePatch(pod, answer.response)
  t.same(spec.initContainers, (chartPod('native').spec as Json).initContainers)

  const again = await postReview(port, first.ca, podReview(applyResponsePatch(pod, answer.response).pod))
  t.same(again.response, { uid: '705ab4f5-6393-11e8-b7cc-42010a800002', allowed: true }, 'the injected pod re-submitted: no patch')
  const denied = await postReview(port, first.ca, podReview(appPod({ 'cos-auth-proxy.io/cpu': 'lots' })))
  t.equal(denied.response.allowed, false)
  t.match(denied.response.status?.message, /^cos-auth-proxy\.io\/cpu: /)

  const text = await metrics.text()
  t.match(text, /^cos_auth_proxy_inject_injected_total 1$/m)
  t.match(text, /^cos_auth_proxy_inject_skipped_total\{reason="already_injected"\} 1$/m)
  t.match(text, /^cos_auth_proxy_inject_refused_total\{annotation="cos-auth-proxy.io\/cpu"\} 1$/m)
})

// Issue 43, findings 4 and 6, through the real listener: what the API server gets back, and what the operator sees.
t.test('over HTTPS a hostNetwork pod gets no sidecar (the node\'s loopback is not the pod\'s) and a clashing volume is refused: answer, metrics, log', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const lines: Json[] = []
  const logger = pino({ level: 'info' }, { write: (line: string) => { lines.push(JSON.parse(line) as Json) } })
  const { port, metrics } = await startWebhook(t, files, logger)

  const host = appPod()
  ;(host.spec as Json).hostNetwork = true
  const skipped = await postReview(port, first.ca, podReview(host))
  t.equal(skipped.response.allowed, true)
  t.match(skipped.response.warnings, [/^cos-auth-proxy: no sidecar injected: hostNetwork: the pod's 127\.0\.0\.1 is the node's loopback/])
  const { spec, annotations } = applyResponsePatch(host, skipped.response)
  t.same(spec, host.spec, 'no sidecar, no volume, no variable')
  t.match(annotations['cos-auth-proxy.io/not-injected'], /^hostNetwork: /)

  const clash = appPod()
  ;(clash.spec as Json).volumes = [{ name: 'cos-auth-proxy-credentials', emptyDir: {} }]
  const refused = await postReview(port, first.ca, podReview(clash))
  t.equal(refused.response.allowed, false)
  t.match(refused.response.status?.message, /^cos-auth-proxy\.io\/inject: cannot inject: the pod has a volume named "cos-auth-proxy-credentials" already/)

  const shared = appPod()
  ;(shared.spec as Json).shareProcessNamespace = true
  const injected = await postReview(port, first.ca, podReview(shared))
  t.ok(injected.response.patch, 'shareProcessNamespace: injected')
  t.match(injected.response.warnings, [/^cos-auth-proxy: shareProcessNamespace: /])

  const text = await metrics.text()
  t.match(text, /^cos_auth_proxy_inject_skipped_total\{reason="host_network"\} 1$/m)
  t.match(text, /^cos_auth_proxy_inject_warnings_total\{reason="host_network"\} 1$/m)
  t.match(text, /^cos_auth_proxy_inject_warnings_total\{reason="share_process_namespace"\} 1$/m)
  t.match(text, /^cos_auth_proxy_inject_refused_total\{annotation="cos-auth-proxy.io\/inject"\} 1$/m)
  t.match(text, /^cos_auth_proxy_inject_injected_total 1$/m)
  t.match(lines.find(l => l.msg === 'sidecar not injected'), { level: 40, reason: 'host_network', namespace: 'apps', warnings: [/^hostNetwork: /] }, 'a warn line says which pod and why')
  t.match(lines.find(l => l.msg === 'pod refused'), { level: 40, annotation: 'cos-auth-proxy.io/inject', problem: /volume named "cos-auth-proxy-credentials"/ })
  t.match(lines.find(l => l.msg === 'sidecar injected'), { level: 30, warnings: [/^shareProcessNamespace: /] })
})

t.test('a malformed review is a 400 JSON error, never a crash, and the next review is answered', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { port, metrics } = await startWebhook(t, files)
  const bodies = ['{"apiVersion":', '[]', '{}', '"AdmissionReview"', JSON.stringify(podReview({ spec: { containers: 7 } })), JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: null })]
  for (const body of bodies) {
    const r = await post(port, first.ca, body)
    t.equal(r.status, 400, body)
    const error = (JSON.parse(r.body) as { error: { code: string, message: string } }).error
    t.ok(error.code === 'malformed_review' || error.code === 'bad_request', error.code)
    t.type(error.message, 'string')
  }
  t.equal((await post(port, first.ca, '{}', '/other')).status, 404)
  const ok = await postReview(port, first.ca, podReview(appPod()))
  t.equal(ok.response.allowed, true)
  t.match(await metrics.text(), new RegExp(`^cos_auth_proxy_inject_errors_total\\{kind="malformed"\\} ${bodies.length}$`, 'm'))
})

t.test('a certificate swapped on disk is served to the next connection', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { port, metrics } = await startWebhook(t, files)
  t.equal((await post(port, first.ca, '{}')).status, 400, 'served: the first certificate')
  await t.rejects(post(port, second.ca, '{}'), 'a client of the second CA does not trust the first certificate')

  writeFileSync(files.keyFile, second.serverKey)
  writeFileSync(files.certFile, second.serverCert)
  const deadline = Date.now() + 3000
  let served = false
  while (!served && Date.now() < deadline) {
    served = await post(port, second.ca, '{}').then(() => true, () => false)
    if (!served) await sleep(25)
  }
  t.ok(served, 'a new connection gets the second certificate')
  await t.rejects(post(port, first.ca, '{}'), 'and no longer the first')
  t.match(await metrics.text(), /^cos_auth_proxy_inject_certificate_reloads_total\{result="applied"\} 1$/m)
})

t.test('a mismatched pair on disk does not replace the certificate served', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { port, metrics } = await startWebhook(t, files)
  // Half a swap: the new certificate, the old key.
  writeFileSync(files.certFile, second.serverCert)
  const deadline = Date.now() + 3000
  while (!/result="rejected"\} 1$/m.test(await metrics.text()) && Date.now() < deadline) await sleep(25)
  t.match(await metrics.text(), /^cos_auth_proxy_inject_certificate_reloads_total\{result="rejected"\} 1$/m)
  t.equal((await post(port, first.ca, '{}')).status, 400, 'still the first certificate')
})

t.test('a client that does not trust the webhook\'s CA is refused', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { port } = await startWebhook(t, files)
  // A CA of its own: what a caller not configured with the webhook's caBundle has.
  await t.rejects(post(port, second.ca, JSON.stringify(podReview(appPod()))), { code: /UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED|CERT/ })
})

const INJECT_ENV = (files: { certFile: string, keyFile: string }): Record<string, string> => ({
  COS_INJECT_HOST: '127.0.0.1',
  COS_INJECT_PORT: '0',
  COS_INJECT_TLS_CERT_FILE: files.certFile,
  COS_INJECT_TLS_KEY_FILE: files.keyFile,
  COS_INJECT_SIDECAR_FILE: EXAMPLE_SIDECAR_FILE,
  COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
  COS_MANAGEMENT_API_URL: 'https://management.cos.example.com/api',
})

t.test('`inject` with a missing or bad setting exits 78 with one line naming it', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const env = INJECT_ENV(files)
  const without = (name: string): Record<string, string> => Object.fromEntries(Object.entries(env).filter(([k]) => k !== name))
  const noUpstream = join(files.dir, 'no-upstream.json')
  const definition = JSON.parse(readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8')) as { container: { env: { name: string }[] } }
  definition.container.env = definition.container.env.filter(e => !e.name.endsWith('_API_URL'))
  writeFileSync(noUpstream, JSON.stringify(definition))
  const cases: [Record<string, string>, RegExp][] = [
    [without('COS_INJECT_TLS_CERT_FILE'), /^cos-auth-proxy: config: COS_INJECT_TLS_CERT_FILE is required/],
    [without('COS_INJECT_TLS_KEY_FILE'), /^cos-auth-proxy: config: COS_INJECT_TLS_KEY_FILE is required/],
    [without('COS_INJECT_SIDECAR_FILE'), /^cos-auth-proxy: config: COS_INJECT_SIDECAR_FILE is required/],
    // The sidecars' upstream is the definition's (the webhook's own COS_*_URL reach no sidecar).
    [{ ...env, COS_INJECT_SIDECAR_FILE: noUpstream }, /^cos-auth-proxy: config: COS_INJECT_SIDECAR_FILE container\.env sets no COS_API_URL.* the sidecars need an upstream/],
    [{ ...env, COS_INJECT_TLS_KEY_FILE: '/nonexistent/tls.key' }, /^cos-auth-proxy: config: COS_INJECT_TLS_KEY_FILE .*ENOENT/],
    [{ ...env, COS_INJECT_PORT: '84430' }, /^cos-auth-proxy: config: COS_INJECT_PORT must be a port number/],
    [{ ...env, COS_INJECT_NATIVE_SIDECAR: 'yes' }, /^cos-auth-proxy: config: COS_INJECT_NATIVE_SIDECAR must be true/],
    [{ ...env, COS_INJECT_DEFAULT_SECRET: 'Cos_Credentials' }, /^cos-auth-proxy: config: COS_INJECT_DEFAULT_SECRET must be a Secret name/],
    [{ ...env, COS_MANAGEMENT_API_URL: 'ftp://x' }, /^cos-auth-proxy: config: COS_MANAGEMENT_API_URL/],
  ]
  for (const [caseEnv, line] of cases) {
    const r = await run(['inject'], caseEnv)
    t.equal(r.code, 78, r.stderr.trim())
    t.equal(r.stderr.split('\n').filter(l => l !== '').length, 1, 'one line')
    t.match(r.stderr, line)
  }
})

t.test('`inject` serves reviews, its admin port answers /readyz and /metrics, and SIGTERM drains and exits 0', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { daemon, match } = await start(['inject'], { ...INJECT_ENV(files), COS_SHUTDOWN_TIMEOUT_MS: '2000' }, /"port":(\d+),"admin":\{"address":"[^"]+","port":(\d+)\}.*injection webhook listening/)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const [, port, adminPort] = match
  const answer = await postReview(Number(port), first.ca, podReview(appPod()))
  t.equal(answer.response.allowed, true)
  t.ok(answer.response.patch)
  t.equal((await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status, 200)
  t.match(await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text(), /^cos_auth_proxy_inject_injected_total 1$/m)
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  const lines = jsonLines(daemon.stdout())
  t.ok(lines.some(l => l.msg === 'sidecar injected'), 'JSON log line for the injection')
  t.ok(lines.some(l => l.msg === 'stopped'))
})

t.test('`inject` shares serve\'s lifecycle: POST /quitquitquit turns readiness 503 draining, the webhook drains and the process exits 0', async t => {
  const files = certDir(first)
  t.teardown(() => rmSync(files.dir, { recursive: true, force: true }))
  const { daemon, match } = await start(['inject'], { ...INJECT_ENV(files), COS_SHUTDOWN_DELAY_MS: String(scaled(1000)), COS_SHUTDOWN_TIMEOUT_MS: '2000' }, /"port":(\d+),"admin":\{"address":"[^"]+","port":(\d+)\}.*injection webhook listening/)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const [, , adminPort] = match
  t.equal((await fetch(`http://127.0.0.1:${adminPort}/quitquitquit`, { method: 'POST' })).status, 202)
  const ready = await fetch(`http://127.0.0.1:${adminPort}/readyz`)
  t.equal(ready.status, 503, 'not ready once the drain began')
  t.match(await ready.json(), { reason: 'draining' })
  t.equal(await daemon.exited, 0, 'exits 0 after the drain')
  t.ok(daemon.stdout().split('\n').some(l => l.includes('"msg":"stopped"')), 'the drain ran to its end')
})
