// The platforms the sidecar meets beyond a plain Linux node (issue 46):
// OpenShift's restricted-v2 SCC, which assigns the uid, gid and fsGroup from
// the namespace's range and refuses a pod that fixes others, and Windows nodes,
// where the Linux sidecar cannot run. Every pod the chart renders
// (test/fixtures/chart/pods-*.yaml, scripts/render-injector-fixture.sh, kept
// current by scripts/ci-packaging.sh) and every pod the real webhook injects
// over HTTPS is held to the SCC's rules, with and without the OpenShift switch.
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t, { type Test } from 'tap'
import { parseAllDocuments } from 'yaml'
import { ConfigError } from '../../src/config/config.js'
import { loadInjectConfig } from '../../src/inject/config.js'
import { answerReview, type InjectSettings } from '../../src/inject/patch.js'
import { injectSettings, parseSidecarFile } from '../../src/inject/template.js'
import { makePki } from '../support/tls-fixtures.js'
import { postToWebhook, startTestWebhook, type TestWebhook } from '../support/webhook.js'
import { appPod, applyResponsePatch, EXAMPLE_SETTINGS, EXAMPLE_SIDECAR_FILE, podReview } from './pods.js'

type Json = Record<string, unknown>
interface PodSpec { securityContext?: Json, containers: Json[], initContainers?: Json[], volumes?: Json[], nodeSelector?: Record<string, string>, [k: string]: unknown }

const FIXTURES = fileURLToPath(new URL('../fixtures/chart/', import.meta.url))
const OURS = /^(cos-auth-proxy|injector)$/
/** restricted-v2's volume types (its `volumes` list). */
const VOLUME_TYPES = ['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim', 'projected', 'secret']
const ASSIGNED = ['runAsUser', 'runAsGroup', 'fsGroup']

/**
 * What OpenShift's restricted-v2 SCC refuses in a pod, for the containers named
 * `only` (all when absent): privilege, escalation, capabilities beyond
 * NET_BIND_SERVICE, root, a seccomp profile other than the runtime's, host
 * namespaces and ports, other volume types. `assigned`: no uid, gid or fsGroup
 * of the pod's own either (the SCC picks them from the namespace's range; a
 * fixed one outside it gets the pod refused).
 */
function restrictedV2 (spec: PodSpec, assigned: boolean, only?: RegExp): string[] {
  const problems: string[] = []
  const pod = spec.securityContext ?? {}
  for (const field of ['hostNetwork', 'hostPID', 'hostIPC']) if (spec[field] === true) problems.push(`pod: ${field}`)
  if (assigned) for (const f of ASSIGNED) if (f in pod) problems.push(`pod: securityContext.${f} ${String(pod[f])}`)
  for (const c of [...spec.initContainers ?? [], ...spec.containers].filter(c => only === undefined || only.test(c.name as string))) {
    const sc = (c.securityContext ?? {}) as Json
    const caps = (sc.capabilities ?? {}) as { drop?: string[], add?: string[] }
    const where = `container ${String(c.name)}`
    if (sc.privileged === true) problems.push(`${where}: privileged`)
    if (sc.allowPrivilegeEscalation !== false) problems.push(`${where}: allowPrivilegeEscalation is not false`)
    if (!(caps.drop ?? []).includes('ALL')) problems.push(`${where}: capabilities.drop lacks ALL`)
    if ((caps.add ?? []).some(a => a !== 'NET_BIND_SERVICE')) problems.push(`${where}: capabilities.add ${String(caps.add)}`)
    if ((sc.runAsNonRoot ?? pod.runAsNonRoot) !== true) problems.push(`${where}: runAsNonRoot is not true`)
    if (((sc.seccompProfile ?? pod.seccompProfile) as Json | undefined)?.type !== 'RuntimeDefault') problems.push(`${where}: seccompProfile is not RuntimeDefault`)
    if (((c.ports ?? []) as Json[]).some(p => p.hostPort !== undefined)) problems.push(`${where}: hostPort`)
    if (assigned) for (const f of ASSIGNED) if (f in sc) problems.push(`${where}: securityContext.${f} ${String(sc[f])}`)
  }
  for (const v of spec.volumes ?? []) {
    const type = Object.keys(v).find(k => k !== 'name')
    if (type === undefined || !VOLUME_TYPES.includes(type)) problems.push(`volume ${String(v.name)}: ${String(type)}`)
  }
  return problems
}

function fixture (mode: 'default' | 'openshift'): Json[] {
  return parseAllDocuments(readFileSync(`${FIXTURES}pods-${mode}.yaml`, 'utf8')).map(d => d.toJS() as Json | null).filter((d): d is Json => d !== null)
}

/** The rendered Deployments' pod specs by name, and the injector's sidecar definition. */
function rendered (mode: 'default' | 'openshift'): { pods: Map<string, PodSpec>, definition: string, injectorEnv: Json[] } {
  const docs = fixture(mode)
  const pods = new Map(docs.filter(d => d.kind === 'Deployment').map(d => [(d.metadata as Json).name as string, (d.spec as { template: { spec: PodSpec } }).template.spec]))
  const map = docs.find(d => d.kind === 'ConfigMap') as { data: { 'sidecar.json': string } }
  const injector = pods.get('demo-cos-auth-proxy-injector')
  return { pods, definition: map.data['sidecar.json'], injectorEnv: (injector?.containers[0]?.env ?? []) as Json[] }
}

const pki = makePki()
t.teardown(() => { pki.cleanup() })

async function webhook (t: Test, settings: InjectSettings): Promise<TestWebhook> {
  return await startTestWebhook(t, { tls: { certFile: join(pki.dir, 'server.pem'), keyFile: join(pki.dir, 'server.key') }, settings })
}

interface Response { allowed: boolean, patchType?: string, patch?: string, warnings?: string[] }

async function review (port: number, pod: Json): Promise<Response> {
  const answer = await postToWebhook(port, pki.ca, JSON.stringify(podReview(pod)), { timeoutMs: 5000 })
  if (answer.status !== 200) throw new Error(`status ${answer.status}: ${answer.body}`)
  return (JSON.parse(answer.body) as { response: Response }).response
}

t.test('every pod the chart renders passes restricted-v2; with openshift (auto-detected) none fixes a uid, gid or fsGroup', async t => {
  const names = ['demo-cos-auth-proxy', 'demo-cos-auth-proxy-injector', 'demo-my-app']
  for (const mode of ['default', 'openshift'] as const) {
    const { pods } = rendered(mode)
    t.same([...pods.keys()].sort(), names, `${mode}: the parent's pod, the standalone Deployment and the injector`)
    for (const [name, spec] of pods) {
      // The parent's app container is the parent's own (the example runs it as uid 10001).
      const only = name === 'demo-my-app' ? OURS : undefined
      t.same(restrictedV2(spec, mode === 'openshift', only), [], `${mode}: ${name}`)
    }
  }
  // The rules can fail: the default renders fix the uid, as they always have.
  const standalone = rendered('default').pods.get('demo-cos-auth-proxy') as PodSpec
  t.same(restrictedV2(standalone, true), [
    'pod: securityContext.runAsUser 65532', 'pod: securityContext.runAsGroup 65532', 'pod: securityContext.fsGroup 65532',
    'container cos-auth-proxy: securityContext.runAsUser 65532', 'container cos-auth-proxy: securityContext.runAsGroup 65532',
  ], 'default: uid, gid and fsGroup 65532 (unchanged), which restricted-v2 would refuse')
  t.same(restrictedV2({ ...standalone, hostNetwork: true, containers: [{ name: 'x', securityContext: { capabilities: { add: ['NET_ADMIN'] } } }] }, false), [
    'pod: hostNetwork', 'container x: allowPrivilegeEscalation is not false', 'container x: capabilities.drop lacks ALL', 'container x: capabilities.add NET_ADMIN',
  ], 'and what the SCC refuses besides is seen')
})

t.test('openshift: the Secret volumes fall back to 0444 (the SCC\'s fsGroup is not known to the chart), and the injector gets COS_INJECT_OPENSHIFT', async t => {
  const modes = (mode: 'default' | 'openshift', name: string): unknown[] => (rendered(mode).pods.get(name)?.volumes ?? []).flatMap(v => v.secret === undefined ? [] : [(v.secret as Json).defaultMode])
  t.same(modes('default', 'demo-cos-auth-proxy'), [288], 'default: 0440 for fsGroup 65532')
  t.same(modes('openshift', 'demo-cos-auth-proxy'), [292], 'openshift: 0444')
  t.same(modes('openshift', 'demo-cos-auth-proxy-injector'), [292])
  t.same(modes('openshift', 'demo-my-app'), [292], 'a parent\'s pod: 0444 in both modes')
  t.same(rendered('openshift').injectorEnv.filter(e => e.name === 'COS_INJECT_OPENSHIFT'), [{ name: 'COS_INJECT_OPENSHIFT', value: 'true' }])
  t.same(rendered('default').injectorEnv.filter(e => e.name === 'COS_INJECT_OPENSHIFT'), [], 'default: not set')
})

t.test('injected over HTTPS by the real webhook: restricted-v2 in both modes; with COS_INJECT_OPENSHIFT no uid or gid, even from a definition that has them, and nothing at pod level', async t => {
  const example = readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8')
  const cases: [string, InjectSettings, boolean][] = [
    ['default: the example definition', EXAMPLE_SETTINGS, false],
    ['COS_INJECT_OPENSHIFT: the example definition (uid 65532 in it)', injectSettings(parseSidecarFile(example), true, 'cos-credentials', '0.1.0', true), true],
    ['openshift: the chart\'s definition', injectSettings(parseSidecarFile(rendered('openshift').definition), true, 'cos-credentials', '0.1.0', true), true],
    ['openshift: the chart\'s definition, plain sidecar', injectSettings(parseSidecarFile(rendered('openshift').definition), false, 'cos-credentials', '0.1.0', true), true],
  ]
  for (const [what, settings, assigned] of cases) {
    const { port } = await webhook(t, settings)
    const pod = appPod()
    const response = await review(port, pod)
    t.equal(response.allowed, true, what)
    const ops = JSON.parse(Buffer.from(response.patch ?? '', 'base64').toString('utf8')) as { path: string }[]
    t.notOk(ops.some(op => op.path.startsWith('/spec/securityContext')), `${what}: the patch never touches the pod's securityContext (no fsGroup, no uid)`)
    const { spec } = applyResponsePatch(pod, response)
    t.same(restrictedV2(spec, assigned, OURS), [], what)
    const sidecar = [...spec.initContainers ?? [], ...spec.containers].find(c => c.name === 'cos-auth-proxy') as { securityContext: Json }
    t.equal(sidecar.securityContext.runAsUser, assigned ? undefined : 65532, `${what}: runAsUser`)
    t.equal(sidecar.securityContext.runAsNonRoot, true, `${what}: runAsNonRoot stays`)
  }
  t.not(cases[1]?.[1].version, EXAMPLE_SETTINGS.version, 'the switch changes the injected-version annotation: pods injected before it show as out of date')
})

t.test('COS_INJECT_OPENSHIFT is a boolean setting, off by default; a bad value exits 78 naming it', async t => {
  const base = { COS_INJECT_SIDECAR_FILE: EXAMPLE_SIDECAR_FILE }
  const off = loadInjectConfig(base, { programVersion: '0.1.0', serving: false })
  t.equal(off.sidecar.openshift, undefined)
  t.equal((off.settings.template.container.securityContext as Json).runAsUser, 65532)
  const on = loadInjectConfig({ ...base, COS_INJECT_OPENSHIFT: 'true' }, { programVersion: '0.1.0', serving: false })
  t.equal(on.sidecar.openshift, true)
  t.equal((on.settings.template.container.securityContext as Json).runAsUser, undefined, 'the definition as read: no runAsUser')
  t.throws(() => loadInjectConfig({ ...base, COS_INJECT_OPENSHIFT: 'yes' }, { programVersion: '0.1.0', serving: false }), ConfigError)
  try { loadInjectConfig({ ...base, COS_INJECT_OPENSHIFT: 'yes' }, { programVersion: '0.1.0', serving: false }) } catch (err) { t.equal((err as ConfigError).variable, 'COS_INJECT_OPENSHIFT') }
})

t.test('the chart\'s own Deployment and the injector select Linux nodes, beside the user\'s node selector', async t => {
  const { pods } = rendered('default')
  t.same(pods.get('demo-cos-auth-proxy')?.nodeSelector, { 'kubernetes.io/os': 'linux', 'topology.kubernetes.io/zone': 'eu-1a' })
  t.same(pods.get('demo-cos-auth-proxy-injector')?.nodeSelector, { 'kubernetes.io/os': 'linux' })
  t.same(rendered('openshift').pods.get('demo-cos-auth-proxy-injector')?.nodeSelector, { 'kubernetes.io/os': 'linux' })
})

const NOT_INJECTED = 'cos-auth-proxy.io/not-injected'
const WINDOWS_TAIL = ': the pod is for Windows nodes, and the sidecar is a Linux container (its image has no Windows variant)'

function windowsPod (spec: Json): Json {
  const pod = appPod()
  Object.assign(pod.spec as Json, spec)
  return pod
}

const required = (...terms: Json[][]): Json => ({ affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: terms.map(matchExpressions => ({ matchExpressions })) } } } })
const os = (operator: string, ...values: string[]): Json => ({ key: 'kubernetes.io/os', operator, values })

t.test('a Windows pod is admitted unchanged, with the reason in an annotation, a warning, the log and skipped_total{reason="windows"}', async t => {
  const { port, metrics, logs } = await webhook(t, EXAMPLE_SETTINGS)
  const cases: [string, Json][] = [
    ['spec.os.name: windows', { os: { name: 'windows' } }],
    ['nodeSelector kubernetes.io/os: windows', { nodeSelector: { 'kubernetes.io/os': 'windows' } }],
    ['nodeSelector beta.kubernetes.io/os: windows', { nodeSelector: { 'beta.kubernetes.io/os': 'windows' } }],
    ['a required node affinity on kubernetes.io/os without linux', required([os('In', 'windows')])],
    ['a required node affinity on kubernetes.io/os without linux', required([os('NotIn', 'linux')], [{ key: 'x', operator: 'Exists' }, os('In', 'windows')])],
  ]
  for (const [how, spec] of cases) {
    const pod = windowsPod(spec)
    const response = await review(port, pod)
    t.equal(response.allowed, true, how)
    const patched = applyResponsePatch(pod, response)
    t.same(patched.spec, pod.spec, `${how}: the spec as it came`)
    t.same(patched.annotations, { 'cos-auth-proxy.io/inject': 'true', [NOT_INJECTED]: how + WINDOWS_TAIL }, `${how}: the annotation says why`)
    t.same(response.warnings, [`cos-auth-proxy: no sidecar injected: ${how}${WINDOWS_TAIL}`], `${how}: a warning kubectl prints`)
    t.ok((response.warnings?.[0]?.length ?? 0) <= 256, 'the warning fits what the API server passes on whole')
  }
  const text = await metrics.text()
  t.match(text, /cos_auth_proxy_inject_skipped_total\{reason="windows"\} 5\n/)
  t.match(text, /cos_auth_proxy_inject_warnings_total\{reason="windows"\} 5\n/)
  t.equal(logs.records.filter(l => l.msg === 'sidecar not injected' && l.reason === 'windows').length, 5, 'one warning line each')
})

t.test('a pod that may run on Linux nodes is injected as before: Linux selectors, affinity with a Linux term, preferred affinity', async t => {
  const cases: [string, Json][] = [
    ['spec.os.name: linux', { os: { name: 'linux' } }],
    ['nodeSelector kubernetes.io/os: linux', { nodeSelector: { 'kubernetes.io/os': 'linux' } }],
    ['one of two terms allows Linux', required([os('In', 'windows')], [os('In', 'linux')])],
    ['In [linux, windows]', required([os('In', 'linux', 'windows')])],
    ['a term on another label', required([{ key: 'disktype', operator: 'In', values: ['ssd'] }])],
    ['no terms', required()],
    ['preferred only', { affinity: { nodeAffinity: { preferredDuringSchedulingIgnoredDuringExecution: [{ weight: 1, preference: { matchExpressions: [os('In', 'windows')] } }] } } }],
  ]
  for (const [what, spec] of cases) t.equal(answerReview(podReview(windowsPod(spec)), EXAMPLE_SETTINGS).outcome.kind, 'injected', what)
})

t.test('a Windows pod is declined before anything else it carries is judged: hostNetwork, a bad annotation, a volume clash', async t => {
  const pod = windowsPod({ os: { name: 'windows' }, hostNetwork: true, volumes: [{ name: 'cos-auth-proxy-credentials', emptyDir: {} }] })
  ;(pod.metadata as { annotations: Json }).annotations['cos-auth-proxy.io/memory'] = '128MB'
  const { outcome } = answerReview(podReview(pod), EXAMPLE_SETTINGS)
  t.same([outcome.kind, outcome.kind === 'skipped' && outcome.reason], ['skipped', 'windows'])
})
