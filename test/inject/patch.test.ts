// The webhook's pure core on real pod specs: every patch is applied with
// fast-json-patch and the resulting Pod validated against the Kubernetes
// schema (kubernetes-models); the injected sidecar is compared with the one
// the chart renders (examples/sidecar-parent-chart/rendered/*.yaml).
import t from 'tap'
import { answerReview, MalformedReview, type InjectSettings } from '../../src/inject/patch.js'
import { appPod, applyResponsePatch, chartPod, chartSidecar, EXAMPLE_SETTINGS, podReview } from './pods.js'

type Json = Record<string, unknown>

function inject (pod: Json, settings: InjectSettings = EXAMPLE_SETTINGS, extra: Json = {}): ReturnType<typeof answerReview> {
  return answerReview(podReview(pod, extra), settings)
}

function envOf (container: Json | undefined): { name: string, value?: string }[] {
  return (container?.env ?? []) as { name: string, value?: string }[]
}

t.test('the example chart\'s pod gets the sidecar the chart renders, first in initContainers', async t => {
  const pod = appPod()
  const { review, outcome } = inject(pod)
  t.equal(outcome.kind, 'injected')
  t.equal(review.response.uid, '705ab4f5-6393-11e8-b7cc-42010a800002')
  t.equal(review.response.allowed, true)
  const { spec, annotations } = applyResponsePatch(pod, review.response)
  const chart = chartPod('native').spec as { initContainers: Json[], volumes: Json[] }
  t.same(spec.initContainers, chart.initContainers, 'the injected container is the chart\'s, field for field')
  t.same(spec.volumes, chart.volumes, 'the Secret volume is the chart\'s: a directory, both keys')
  t.equal(spec.initContainers?.[0]?.restartPolicy, 'Always')
  t.same((spec.initContainers?.[0]?.startupProbe as Json).httpGet, { path: '/readyz', port: 9090 })
  t.same(envOf(spec.containers[0]).at(-1), { name: 'COS_PROXY_URL', value: 'http://127.0.0.1:8080' })
  t.equal(spec.terminationGracePeriodSeconds, 30, 'raised from 10 to the drain: 5 + 20 + 5 s')
  t.equal(annotations['cos-auth-proxy.io/injected-version'], EXAMPLE_SETTINGS.version)
  t.match(EXAMPLE_SETTINGS.version, /^0\.1\.0-[0-9a-f]{12}$/, 'program version and a short hash of the definition')
})

t.test('the credential Secret is mounted as a read-only directory, never through subPath, and the proxy reads files in it', async t => {
  const { review } = inject(appPod())
  const { spec } = applyResponsePatch(appPod(), review.response)
  const sidecar = spec.initContainers?.[0] as { volumeMounts: Json[] }
  t.same(sidecar.volumeMounts[0], { name: 'cos-auth-proxy-credentials', mountPath: '/var/run/secrets/cos', readOnly: true })
  const env = envOf(sidecar)
  t.equal(env.find(e => e.name === 'COS_ACCESS_KEY_FILE')?.value, '/var/run/secrets/cos/access-key')
  t.equal(env.find(e => e.name === 'COS_ACCESS_KEY_SECRET_FILE')?.value, '/var/run/secrets/cos/access-key-secret')
})

// Issue 37: the API server's ServiceAccount plugin mounts the pod's token into every container that has no
// mount at its path, the injected sidecar included; the proxy never calls the API server.
t.test('the injected sidecar does not get the app pod\'s ServiceAccount token: an empty directory is mounted over its path', async t => {
  const { review } = inject(appPod())
  const { spec } = applyResponsePatch(appPod(), review.response)
  const sidecar = spec.initContainers?.[0] as { volumeMounts: Json[] }
  const path = '/var/run/secrets/kubernetes.io/serviceaccount'
  t.same(sidecar.volumeMounts.filter(m => m.mountPath === path), [{ name: 'cos-auth-proxy-no-api-token', mountPath: path, readOnly: true }])
  t.same((spec.volumes ?? []).find(v => v.name === 'cos-auth-proxy-no-api-token'), { name: 'cos-auth-proxy-no-api-token', emptyDir: {} }, 'an empty directory, nothing written to it, no sizeLimit (the kubelet counts the directory\'s own 4 KiB block)')
  t.notOk((spec.containers[0]?.volumeMounts as Json[] | undefined)?.some(m => m.mountPath === path), 'the app container is left to the API server, which mounts the token there')
})

t.test('on clusters older than 1.29 the sidecar is a plain container with the chart\'s hardening and resources', async t => {
  const pod = appPod()
  const { review } = inject(pod, { ...EXAMPLE_SETTINGS, nativeSidecar: false })
  const { spec } = applyResponsePatch(pod, review.response)
  t.equal(spec.initContainers, undefined)
  const injected = spec.containers.at(-1) as Json
  t.equal(injected.name, 'cos-auth-proxy')
  t.equal(injected.restartPolicy, undefined)
  const chart = chartSidecar('plain')
  for (const field of ['securityContext', 'resources', 'startupProbe', 'readinessProbe', 'livenessProbe', 'ports', 'args', 'terminationMessagePolicy']) {
    t.same(injected[field], chart[field], field)
  }
})

t.test('a pod with init containers: the sidecar goes first and they get the variable too', async t => {
  const pod = appPod()
  const spec = pod.spec as Json
  spec.initContainers = [
    { name: 'migrate', image: 'registry.example.com/migrate:1', env: [{ name: 'A', value: '1' }] },
    { name: 'warm-cache', image: 'registry.example.com/warm:1' },
  ]
  const { review } = inject(pod)
  const patched = applyResponsePatch(pod, review.response)
  t.same(patched.spec.initContainers?.map(c => c.name), ['cos-auth-proxy', 'migrate', 'warm-cache'])
  t.same(envOf(patched.spec.initContainers?.[1]), [{ name: 'A', value: '1' }, { name: 'COS_PROXY_URL', value: 'http://127.0.0.1:8080' }])
  t.same(envOf(patched.spec.initContainers?.[2]), [{ name: 'COS_PROXY_URL', value: 'http://127.0.0.1:8080' }])
})

t.test('a container that already sets the variable keeps its own value', async t => {
  const pod = appPod({ 'cos-auth-proxy.io/env': 'COS_MANAGEMENT_URL' })
  const { review } = inject(pod)
  const { spec } = applyResponsePatch(pod, review.response)
  t.same(envOf(spec.containers[0]).filter(e => e.name === 'COS_MANAGEMENT_URL'), [{ name: 'COS_MANAGEMENT_URL', value: 'http://127.0.0.1:8080/management' }])
})

t.test('a re-submitted injected pod is allowed without a patch (reinvocation changes nothing)', async t => {
  const pod = appPod()
  const first = applyResponsePatch(pod, inject(pod).review.response)
  const { review, outcome } = inject(first.pod)
  t.same(outcome, { kind: 'skipped', reason: 'already_injected' })
  t.same(review.response, { uid: '705ab4f5-6393-11e8-b7cc-42010a800002', allowed: true })
})

t.test('a pod that carries the chart\'s sidecar already is left as is', async t => {
  const pod = chartPod('native')
  ;(pod.metadata as Json).annotations = { 'cos-auth-proxy.io/inject': 'true' }
  const { outcome, review } = inject(pod)
  t.match(outcome, { kind: 'skipped', reason: 'already_injected' })
  t.equal(review.response.patch, undefined, 'no patch (unsafe-pods.test.ts: and the warning that says why)')
})

t.test('a pod without the annotation, a non-Pod, a DELETE and an UPDATE are allowed without a patch', async t => {
  const plain = chartPod('plain')
  t.same(inject(plain).review.response, { uid: '705ab4f5-6393-11e8-b7cc-42010a800002', allowed: true })
  t.same(inject(appPod({ 'cos-auth-proxy.io/inject': 'false' })).outcome, { kind: 'skipped', reason: 'not_annotated' })
  t.same(inject(appPod(), EXAMPLE_SETTINGS, { kind: { group: 'apps', version: 'v1', kind: 'Deployment' } }).outcome, { kind: 'skipped', reason: 'not_a_pod' })
  t.same(inject(appPod(), EXAMPLE_SETTINGS, { subResource: 'ephemeralcontainers' }).outcome, { kind: 'skipped', reason: 'not_a_pod' })
  t.same(inject(appPod(), EXAMPLE_SETTINGS, { operation: 'DELETE', object: null, oldObject: appPod() }).outcome, { kind: 'skipped', reason: 'not_create' })
  t.same(inject(appPod(), EXAMPLE_SETTINGS, { operation: 'UPDATE' }).outcome, { kind: 'skipped', reason: 'not_create' })
})

t.test('a dry run gets the same patch as a real request', async t => {
  t.same(inject(appPod(), EXAMPLE_SETTINGS, { dryRun: true }).review, inject(appPod()).review)
})

t.test('ports the app declares are not taken: the proxy, its probes and the variable move to free ones', async t => {
  const pod = appPod()
  const app = (pod.spec as { containers: Json[] }).containers[0] as Json
  app.ports = [{ containerPort: 8080 }, { containerPort: 9090 }, { containerPort: 8081 }]
  const { spec } = applyResponsePatch(pod, inject(pod).review.response)
  const sidecar = spec.initContainers?.[0] as Json
  const env = envOf(sidecar)
  t.equal(env.find(e => e.name === 'COS_LISTEN_PORT')?.value, '8082')
  t.equal(env.find(e => e.name === 'COS_ADMIN_PORT')?.value, '9091')
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) t.equal(((sidecar[probe] as Json).httpGet as Json).port, 9091, probe)
  t.same(sidecar.ports, [{ name: 'cos-admin', containerPort: 9091, protocol: 'TCP' }])
  t.same(envOf(spec.containers[0]).at(-1), { name: 'COS_PROXY_URL', value: 'http://127.0.0.1:8082' })
})

t.test('the annotations set secret, variable, port, methods and resources', async t => {
  const pod = appPod({
    'cos-auth-proxy.io/secret': 'team-a-cos',
    'cos-auth-proxy.io/env': 'COS_URL',
    'cos-auth-proxy.io/port': '7000',
    'cos-auth-proxy.io/allowed-methods': 'get, head',
    'cos-auth-proxy.io/cpu': '2',
    'cos-auth-proxy.io/memory': '64Mi',
  })
  const { spec } = applyResponsePatch(pod, inject(pod).review.response)
  const sidecar = spec.initContainers?.[0] as Json
  t.equal(((spec.volumes?.[0] as Json).secret as Json).secretName, 'team-a-cos')
  t.same(envOf(spec.containers[0]).at(-1), { name: 'COS_URL', value: 'http://127.0.0.1:7000' })
  const env = envOf(sidecar)
  t.equal(env.find(e => e.name === 'COS_LISTEN_PORT')?.value, '7000')
  t.equal(env.find(e => e.name === 'COS_MANAGEMENT_ALLOWED_METHODS')?.value, 'GET,HEAD')
  t.equal(env.find(e => e.name === 'COS_OPTIMIZE_ALLOWED_METHODS')?.value, 'GET,HEAD')
  t.equal(env.find(e => e.name === 'COS_API_ALLOWED_METHODS'), undefined, 'no list for a route that is not configured (the proxy would exit 78)')
  t.same(sidecar.resources, { requests: { cpu: '2', memory: '64Mi' }, limits: { cpu: '2', memory: '128Mi' } }, 'a request above the default limit raises the limit')
})

t.test('a container with env: null gets the variable, not a crash', async t => {
  const pod = appPod()
  ;((pod.spec as { containers: Json[] }).containers[0] as Json).env = null
  const { spec } = applyResponsePatch(pod, inject(pod).review.response)
  t.same(envOf(spec.containers[0]), [{ name: 'COS_PROXY_URL', value: 'http://127.0.0.1:8080' }])
})

t.test('a pod that grants the drain enough time keeps its grace period', async t => {
  const pod = appPod()
  ;(pod.spec as Json).terminationGracePeriodSeconds = 120
  const { spec } = applyResponsePatch(pod, inject(pod).review.response)
  t.equal(spec.terminationGracePeriodSeconds, 120)
})

const BAD: [string, string, RegExp][] = [
  ['cos-auth-proxy.io/allowed-methods', 'GET,FETCH', /"FETCH"/],
  ['cos-auth-proxy.io/port', '9999999', /port number/],
  ['cos-auth-proxy.io/port', '8080', /clashes with a port of container "app"/],
  ['cos-auth-proxy.io/cpu', 'lots', /cpu quantity/],
  ['cos-auth-proxy.io/memory', '128MB', /memory quantity/],
  ['cos-auth-proxy.io/memory', '0', /positive/],
  ['cos-auth-proxy.io/secret', 'Team_A', /Secret name/],
  ['cos-auth-proxy.io/env', '1=x', /variable name/],
  ['cos-auth-proxy.io/log-level', 'verbose', /one of fatal, error, warn, info, debug, trace, silent/],
  ['cos-auth-proxy.io/access-log', 'some', /one of errors, all, off, got "some"/],
  ['cos-auth-proxy.io/env-from-configmap', 'Team_Env', /ConfigMap name/],
]

for (const [annotation, value, problem] of BAD) {
  t.test(`a bad ${annotation} (${JSON.stringify(value)}) is denied with a message naming it`, async t => {
    const pod = appPod({ [annotation]: value })
    ;((pod.spec as { containers: Json[] }).containers[0] as Json).ports = [{ containerPort: 8080 }]
    const { review, outcome } = inject(pod)
    t.equal(outcome.kind, 'refused')
    t.equal(review.response.allowed, false)
    t.equal(review.response.patch, undefined)
    t.equal(review.response.status?.code, 400)
    t.ok(review.response.status?.message.startsWith(`${annotation}: `), review.response.status?.message ?? '')
    t.match(review.response.status?.message, problem)
  })
}

t.test('a huge bad annotation value is not echoed whole in the refusal (an annotation may hold 256 KiB)', async t => {
  for (const annotation of ['cos-auth-proxy.io/log-level', 'cos-auth-proxy.io/secret', 'cos-auth-proxy.io/memory', 'cos-auth-proxy.io/allowed-methods']) {
    const { review } = inject(appPod({ [annotation]: 'X'.repeat(200_000) }))
    const message = review.response.status?.message ?? ''
    t.equal(review.response.allowed, false, annotation)
    t.ok(message.length < 400, `${annotation}: a ${message.length}-character message`)
    t.match(message, /"X{64}"… \(200000 characters\)/, `${annotation}: 64 characters of it, and its length`)
  }
  t.match(inject(appPod({ 'cos-auth-proxy.io/log-level': 'verbose' })).review.response.status?.message, /got "verbose"$/, 'a short value is quoted whole')
})

t.test('a pod that names no Secret, on a webhook without a default, is denied naming cos-auth-proxy.io/secret', async t => {
  const { defaultSecret: _omitted, ...noDefault } = EXAMPLE_SETTINGS
  const { review } = inject(appPod(), noDefault)
  t.equal(review.response.allowed, false)
  t.match(review.response.status?.message, /^cos-auth-proxy\.io\/secret: is required/)
})

t.test('malformed reviews throw MalformedReview, nothing else', async t => {
  const bad: unknown[] = [
    null, 'x', [], {}, { apiVersion: 'admission.k8s.io/v1beta1', kind: 'AdmissionReview', request: { uid: 'u' } },
    { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview' },
    { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { uid: 7 } },
    podReview({ metadata: { annotations: { 'cos-auth-proxy.io/inject': 'true' } } }),
    podReview({ spec: { containers: 'app' } }),
    podReview({ spec: { containers: [{ image: 'x' }] } }),
    podReview({ spec: { containers: [{ name: 'a' }], initContainers: {} } }),
    podReview({ metadata: { annotations: { 'cos-auth-proxy.io/inject': 'true' } }, spec: { containers: [{ name: 'a', ports: { http: 80 } }] } }),
    podReview({ metadata: { annotations: { 'cos-auth-proxy.io/inject': 'true' } }, spec: { containers: [{ name: 'a', env: 'A=1' }] } }),
    podReview({ metadata: { annotations: { 'cos-auth-proxy.io/inject': 'true' } }, spec: { containers: [{ name: 'a', env: [null] }] } }),
  ]
  for (const body of bad) t.throws(() => answerReview(body, EXAMPLE_SETTINGS), MalformedReview, JSON.stringify(body))
})

t.test('an annotation that is not a string is denied, not a crash', async t => {
  const pod = appPod()
  ;((pod.metadata as Json).annotations as Json)['cos-auth-proxy.io/port'] = 8080
  t.match(inject(pod).review.response.status?.message, /^cos-auth-proxy\.io\/port: must be a string/)
})
