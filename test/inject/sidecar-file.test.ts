// `inject` with COS_INJECT_SIDECAR_FILE, as the chart runs it: the definition
// from the chart's ConfigMap (test/fixtures/chart/injector.yaml), a pod
// injected over real HTTPS with the upstream TLS Secret, the file swapped the
// way the kubelet swaps a ConfigMap volume (re-read; a bad one is refused and
// the previous definition kept), a bad file at start (exit 78), and
// `inject --print` running the same code on a pod from stdin.

import { mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { request as httpsRequest } from 'node:https'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { CLI, run, start } from '../support/cli-process.js'
import { makePki } from '../support/tls-fixtures.js'
import { spawnNode } from '../support/node-child.js'
import { answerReview } from '../../src/inject/patch.js'
import { applyResponsePatch, fixtureAppPod, fixtureSettings, fixtureSidecarFile, podReview } from './pods.js'

type Json = Record<string, unknown>
type Env = { name: string, value?: string }[]

const pki = makePki()
const dir = mkdtempSync(join(tmpdir(), 'cos-inject-file-'))
t.teardown(() => { pki.cleanup(); rmSync(dir, { recursive: true, force: true }) })
writeFileSync(join(dir, 'tls.crt'), pki.serverCert)
writeFileSync(join(dir, 'tls.key'), pki.serverKey)

let generation = 0
/** A ConfigMap volume's layout: sidecar.json -> ..data/sidecar.json, ..data -> a timestamped directory, swapped by rename. */
function writeDefinition (mount: string, text: string): void {
  const version = join(mount, `..gen${++generation}`)
  mkdirSync(version, { recursive: true })
  writeFileSync(join(version, 'sidecar.json'), text)
  symlinkSync(`..gen${generation}`, join(mount, '..data_tmp'))
  renameSync(join(mount, '..data_tmp'), join(mount, '..data'))
  if (generation === 1) symlinkSync('..data/sidecar.json', join(mount, 'sidecar.json'))
}

function definition (change: (d: { container: { env: Env, image: string } }) => void = () => {}): string {
  const d = JSON.parse(fixtureSidecarFile()) as { container: { env: Env, image: string } }
  change(d)
  return JSON.stringify(d)
}

function env (file: string): Record<string, string> {
  return {
    COS_INJECT_HOST: '127.0.0.1',
    COS_INJECT_PORT: '0',
    COS_INJECT_TLS_CERT_FILE: join(dir, 'tls.crt'),
    COS_INJECT_TLS_KEY_FILE: join(dir, 'tls.key'),
    COS_INJECT_SIDECAR_FILE: file,
    COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
    COS_SHUTDOWN_DELAY_MS: '0',
  }
}

function review (port: number, pod: Json): Promise<{ response: { allowed: boolean, patchType?: string, patch?: string } }> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest({ host: '127.0.0.1', port, path: '/mutate', method: 'POST', ca: pki.ca, agent: false, headers: { 'content-type': 'application/json' } }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { text += d })
      res.on('end', () => { resolve(JSON.parse(text) as { response: { allowed: boolean, patch?: string } }) })
    })
    req.on('error', reject)
    req.end(JSON.stringify(podReview(pod)))
  })
}

async function sidecarOf (port: number): Promise<{ env: Env, annotation: string | undefined, volumes: Json[] }> {
  const pod = fixtureAppPod()
  const { spec, annotations } = applyResponsePatch(pod, (await review(port, pod)).response)
  return { env: spec.initContainers?.[0]?.env as Env, annotation: annotations['cos-auth-proxy.io/injected-version'], volumes: spec.volumes ?? [] }
}

const valueOf = (e: Env, name: string): string | undefined => e.find(v => v.name === name)?.value

t.test('the webhook injects the chart\'s definition over HTTPS and follows the ConfigMap as it changes', async t => {
  const mount = join(dir, 'sidecar')
  writeDefinition(mount, definition())
  const { daemon, match } = await start(['inject'], env(join(mount, 'sidecar.json')), /"port":(\d+),"admin":\{"address":"[^"]+","port":(\d+)\}.*"version":"([^"]+)".*injection webhook listening/)
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const [, port, adminPort, version] = match as unknown as [string, string, string, string]
  const metrics = async (): Promise<string> => await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()

  const first = await sidecarOf(Number(port))
  t.equal(valueOf(first.env, 'COS_CA_FILE'), '/var/run/secrets/cos-tls/ca.crt')
  t.equal(valueOf(first.env, 'COS_CLIENT_CERT_FILE'), '/var/run/secrets/cos-tls/tls.crt')
  t.equal(valueOf(first.env, 'HTTPS_PROXY'), 'http://egress.example.com:3128')
  t.equal(valueOf(first.env, 'COS_REQUIRE_HEADER'), 'X-Cos-Client')
  t.ok(first.volumes.some(v => v.name === 'cos-auth-proxy-tls'), 'the TLS Secret volume')
  t.equal(first.annotation, version, 'the annotation is the version logged at start')
  t.match(await metrics(), new RegExp(`^cos_auth_proxy_inject_sidecar_definition_info\\{version="${version}"\\} 1$`, 'm'))

  writeDefinition(mount, definition(d => { d.container.image = 'registry.example.com/cos-auth-proxy:0.2.0' }))
  let text = ''
  for (const deadline = Date.now() + 5000; Date.now() < deadline && !/sidecar_reloads_total\{result="applied"\} 1$/m.test(text); await sleep(50)) text = await metrics()
  t.match(text, /^cos_auth_proxy_inject_sidecar_reloads_total\{result="applied"\} 1$/m)
  const second = await sidecarOf(Number(port))
  t.not(second.annotation, version, 'a new version for the new definition')
  t.match(text, `sidecar_definition_info{version="${second.annotation}"} 1`)
  t.notMatch(text, `version="${version}"`, 'only the current definition is reported')

  writeDefinition(mount, '{"container": ')
  for (const deadline = Date.now() + 5000; Date.now() < deadline && !/sidecar_reloads_total\{result="rejected"\} 1$/m.test(text); await sleep(50)) text = await metrics()
  t.match(text, /^cos_auth_proxy_inject_sidecar_reloads_total\{result="rejected"\} 1$/m)
  t.equal((await sidecarOf(Number(port))).annotation, second.annotation, 'a bad file keeps the previous definition')
  daemon.child.kill('SIGTERM')
  t.equal(await daemon.exited, 0)
  t.match(daemon.stdout(), /sidecar definition reloaded/)
  t.match(daemon.stdout(), /sidecar definition on disk is not usable: still injecting the previous one/)
})

t.test('a bad sidecar file at start is exit 78 with one line naming COS_INJECT_SIDECAR_FILE', async t => {
  const bad = join(dir, 'bad.json')
  writeFileSync(bad, definition(d => { d.container.env = d.container.env.filter(e => !e.name.endsWith('_API_URL')) }))
  const cases: [Record<string, string>, RegExp][] = [
    [env(bad), /^cos-auth-proxy: config: COS_INJECT_SIDECAR_FILE container\.env sets no COS_API_URL/],
    [env(join(dir, 'missing.json')), /^cos-auth-proxy: config: COS_INJECT_SIDECAR_FILE .*ENOENT/],
    [{ ...env(bad), COS_INJECT_IMAGE: 'x:1' }, /^cos-auth-proxy: config: COS_INJECT_IMAGE must not be set with COS_INJECT_SIDECAR_FILE/],
  ]
  for (const [caseEnv, line] of cases) {
    const r = await run(['inject'], caseEnv)
    t.equal(r.code, 78, r.stderr)
    t.equal(r.stderr.trim().split('\n').length, 1)
    t.match(r.stderr, line)
  }
})

function print (input: string, extraEnv: Record<string, string>): Promise<{ code: number | null, stdout: string, stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawnNode([CLI, 'inject', '--print'], { cwd: dir, env: { PATH: process.env.PATH, ...extraEnv } })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
    child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
    child.on('error', reject)
    child.on('close', code => { resolve({ code, stdout, stderr }) })
    child.stdin.end(input)
  })
}

t.test('`inject --print` prints the pod as the webhook would inject it, with the same code', async t => {
  const file = join(dir, 'print.json')
  writeFileSync(file, definition())
  const settings = { COS_INJECT_SIDECAR_FILE: file, COS_INJECT_DEFAULT_SECRET: 'cos-credentials' }
  const pod = fixtureAppPod()
  const r = await print(JSON.stringify(pod), settings)
  t.equal(r.code, 0, r.stderr)
  t.match(r.stderr, /^cos-auth-proxy: injected \(0\.1\.0-[0-9a-f]{12}\)$/m)
  const printed = JSON.parse(r.stdout) as { spec: { initContainers: { env: Env }[] } }
  const viaWebhook = applyResponsePatch(pod, answerReview(podReview(pod), fixtureSettings()).review.response).pod
  t.same(printed, viaWebhook, 'the same pod the webhook\'s patch gives')
  t.equal(valueOf((printed.spec.initContainers[0] as { env: Env }).env, 'COS_CA_FILE'), '/var/run/secrets/cos-tls/ca.crt')

  const deployment = { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'x' }, spec: { template: { metadata: pod.metadata, spec: pod.spec } } }
  const d = JSON.parse((await print(JSON.stringify(deployment), settings)).stdout) as { spec: { template: { spec: { initContainers: unknown[] } } } }
  t.equal(d.spec.template.spec.initContainers.length, 1, 'a Deployment\'s pod template is injected')

  const refused = await print(JSON.stringify(fixtureAppPod({ 'cos-auth-proxy.io/log-level': 'loud' })), settings)
  t.equal(refused.code, 1)
  t.match(refused.stderr, /^cos-auth-proxy: refused: cos-auth-proxy\.io\/log-level: must be one of/)
  const yaml = await print('apiVersion: v1\nkind: Pod\n', settings)
  t.equal(yaml.code, 65)
  t.match(yaml.stderr, /must be JSON: a Pod, a workload, a List or an array of them\. From YAML: kubectl create --dry-run=client -o json -f FILE .*yq ea -o=json '\[\.\]' FILE/)
  t.equal(yaml.stderr.trim().split('\n').length, 1, 'one line')
})

// Issue 37: a multi-document file through `kubectl create --dry-run=client -o json` is a List,
// which the preview refused with the webhook's "request.object must be a Pod with a spec".
t.test('`inject --print` previews a List (a multi-document file through kubectl) item by item instead of refusing it as not a Pod', async t => {
  const file = join(dir, 'print-list.json')
  writeFileSync(file, definition())
  const settings = { COS_INJECT_SIDECAR_FILE: file, COS_INJECT_DEFAULT_SECRET: 'cos-credentials' }
  const pod = fixtureAppPod()
  const deployment = { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web' }, spec: { selector: {}, template: { metadata: pod.metadata, spec: pod.spec } } }
  const service = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'web' }, spec: { ports: [{ port: 80 }] } }
  const plain = { apiVersion: 'batch/v1', kind: 'Job', metadata: { name: 'plain' }, spec: { template: { metadata: {}, spec: pod.spec } } }
  const list = { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items: [deployment, service, plain] }
  const r = await print(JSON.stringify(list), settings)
  t.equal(r.code, 0, r.stderr)
  const printed = JSON.parse(r.stdout) as { kind: string, items: Array<{ kind: string, spec: { template?: { spec: { initContainers?: unknown[] } } } }> }
  t.equal(printed.kind, 'List', 'a List comes out as a List')
  t.same(printed.items.map(i => i.kind), ['Deployment', 'Service', 'Job'], 'every item, in order')
  t.equal(printed.items[0]?.spec.template?.spec.initContainers?.length, 1, 'the annotated Deployment is injected')
  t.same(printed.items[1], service, 'the Service passes unchanged')
  t.equal(printed.items[2]?.spec.template?.spec.initContainers, undefined, 'the Job without the annotation is not injected')
  t.match(r.stderr, /^cos-auth-proxy: Deployment\/web: injected \(0\.1\.0-[0-9a-f]{12}\)$/m)
  t.match(r.stderr, /^cos-auth-proxy: Service\/web: not a Pod or a workload with a pod template: unchanged$/m)
  t.match(r.stderr, /^cos-auth-proxy: Job\/plain: not injected: /m)

  const array = await print(JSON.stringify([deployment, service]), settings)
  t.equal(array.code, 0, array.stderr)
  t.ok(Array.isArray(JSON.parse(array.stdout)), 'an array (yq ea -o=json \'[.]\') comes out as an array')

  const refusedItem = { ...deployment, metadata: { name: 'loud' }, spec: { ...deployment.spec, template: { metadata: fixtureAppPod({ 'cos-auth-proxy.io/log-level': 'loud' }).metadata, spec: pod.spec } } }
  const refused = await print(JSON.stringify({ ...list, items: [deployment, refusedItem] }), settings)
  t.equal(refused.code, 1, 'one refused item fails the preview')
  t.equal(refused.stdout, '', 'and nothing is printed')
  t.match(refused.stderr, /^cos-auth-proxy: Deployment\/loud: refused: cos-auth-proxy\.io\/log-level: must be one of/m)
})

// Issue 43: the preview says what the webhook does. A hostNetwork pod is printed as the webhook admits it
// (only the annotation that says why) with exit 2, so a pipeline notices a pod that asks for the sidecar and
// will not get it; a volume of the sidecar's names is refused (exit 1), where it printed "injected" and exit 0
// a pod the API server then rejected for two volumes of one name.
t.test('`inject --print` prints a hostNetwork pod without the sidecar and exits 2, and refuses a clashing volume with exit 1 instead of printing a pod the API server rejects', async t => {
  const file = join(dir, 'print-unsafe.json')
  writeFileSync(file, definition())
  const settings = { COS_INJECT_SIDECAR_FILE: file, COS_INJECT_DEFAULT_SECRET: 'cos-credentials' }
  const host = fixtureAppPod()
  ;(host.spec as Json).hostNetwork = true
  const r = await print(JSON.stringify(host), settings)
  t.equal(r.code, 2, r.stderr)
  t.equal(r.stderr, 'cos-auth-proxy: not injected: host_network: hostNetwork: the pod\'s 127.0.0.1 is the node\'s loopback, where every process on the node could use the sidecar\'s key\n')
  const printed = JSON.parse(r.stdout) as { spec: Json, metadata: { annotations: Record<string, string> } }
  t.same(printed.spec, host.spec, 'the pod as it came: no sidecar')
  t.match(printed.metadata.annotations['cos-auth-proxy.io/not-injected'], /^hostNetwork: /, 'with the annotation the webhook adds')

  const pod = fixtureAppPod()
  const deployment = { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web' }, spec: { selector: {}, template: { metadata: pod.metadata, spec: pod.spec } } }
  const agent = { ...deployment, metadata: { name: 'agent' }, spec: { ...deployment.spec, template: { metadata: pod.metadata, spec: { ...pod.spec as Json, hostNetwork: true } } } }
  const list = await print(JSON.stringify([deployment, agent]), settings)
  t.equal(list.code, 2, 'a list with one such pod: printed, exit 2')
  t.equal((JSON.parse(list.stdout) as unknown[]).length, 2)
  t.match(list.stderr, /^cos-auth-proxy: Deployment\/web: injected \(.*\)\ncos-auth-proxy: Deployment\/agent: not injected: host_network: hostNetwork: /)

  const clash = fixtureAppPod()
  ;(clash.spec as Json).volumes = [{ name: 'cos-auth-proxy-no-api-token', emptyDir: {} }]
  const refused = await print(JSON.stringify(clash), settings)
  t.equal(refused.code, 1)
  t.equal(refused.stdout, '', 'nothing printed')
  t.match(refused.stderr, /^cos-auth-proxy: refused: cos-auth-proxy\.io\/inject: cannot inject: the pod has a volume named "cos-auth-proxy-no-api-token" already/)

  const shared = fixtureAppPod()
  ;(shared.spec as Json).shareProcessNamespace = true
  const warned = await print(JSON.stringify(shared), settings)
  t.equal(warned.code, 0, 'shareProcessNamespace: injected')
  t.match(warned.stderr, /^cos-auth-proxy: injected \(0\.1\.0-[0-9a-f]{12}\); warning: shareProcessNamespace: a container running as the sidecar's uid 65532 can read its key files/)
})
