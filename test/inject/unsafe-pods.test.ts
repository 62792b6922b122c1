// Pods the webhook must not put the sidecar into, or cannot (issue 43): a
// hostNetwork pod (its 127.0.0.1 is the node's loopback), a pod that has one of
// the names the sidecar brings (the API server would refuse two), and pods whose
// processes can see the sidecar's (shareProcessNamespace, hostPID). Every
// patch is applied and the result validated as in patch.test.ts.
import t from 'tap'
import { answerReview, type InjectSettings } from '../../src/inject/patch.js'
import { appPod, applyResponsePatch, chartPod, EXAMPLE_SETTINGS, fixtureAppPod, fixtureSettings, podReview } from './pods.js'

type Json = Record<string, unknown>

function inject (pod: Json, settings: InjectSettings = EXAMPLE_SETTINGS, extra: Json = {}): ReturnType<typeof answerReview> {
  return answerReview(podReview(pod, extra), settings)
}

function withSpec (pod: Json, fields: Json): Json {
  Object.assign(pod.spec as Json, fields)
  return pod
}

const NOT_INJECTED = 'cos-auth-proxy.io/not-injected'

t.test('a hostNetwork pod gets no sidecar: the node\'s loopback is not the pod\'s', async t => {
  for (const [what, settings] of [['native', EXAMPLE_SETTINGS], ['plain', { ...EXAMPLE_SETTINGS, nativeSidecar: false }], ['the chart\'s definition', fixtureSettings()]] as const) {
    const pod = withSpec(what === 'the chart\'s definition' ? fixtureAppPod() : appPod(), { hostNetwork: true })
    const { review, outcome } = inject(pod, settings)
    t.same([outcome.kind, outcome.kind === 'skipped' && outcome.reason], ['skipped', 'host_network'], what)
    t.equal(review.response.allowed, true, `${what}: admitted`)
    const patched = applyResponsePatch(pod, review.response)
    t.same(patched.spec, pod.spec, `${what}: the spec as it came: no container, no volume, no variable, the same grace period`)
    t.same(patched.annotations, { 'cos-auth-proxy.io/inject': 'true', [NOT_INJECTED]: 'hostNetwork: the pod\'s 127.0.0.1 is the node\'s loopback, where every process on the node could use the sidecar\'s key' },
      `${what}: only the annotation that says why (kubectl describe pod shows it)`)
    t.same(review.response.warnings, [`cos-auth-proxy: no sidecar injected: ${patched.annotations[NOT_INJECTED]}`], `${what}: and a warning kubectl prints`)
    // Reinvoked (reinvocationPolicy: IfNeeded) it gets the same answer: the same value again.
    t.same(inject(patched.pod, settings).review.response, review.response, `${what}: a reinvocation changes nothing more`)
    t.same(inject(pod, settings, { dryRun: true }).review.response, review.response, `${what}: a dry run gets the same answer`)
  }
  // Only `true` is hostNetwork: false and the absent field inject as always.
  t.equal(inject(withSpec(appPod(), { hostNetwork: false })).outcome.kind, 'injected')
})

t.test('a hostNetwork pod is declined whatever its other annotations say: a bad one does not turn it into a refusal', async t => {
  const pod = withSpec(appPod({ 'cos-auth-proxy.io/memory': '128MB' }), { hostNetwork: true })
  const { outcome } = inject(pod)
  t.same([outcome.kind, outcome.kind === 'skipped' && outcome.reason], ['skipped', 'host_network'])
})

t.test('a pod with a volume of the sidecar\'s name is refused naming it, never patched into a pod the API server rejects', async t => {
  const cases: [string, InjectSettings, Json][] = [
    ['cos-auth-proxy-credentials', EXAMPLE_SETTINGS, appPod()],
    ['cos-auth-proxy-no-api-token', EXAMPLE_SETTINGS, appPod()],
    // With upstream.tls.existingSecret the chart's definition brings a third.
    ['cos-auth-proxy-tls', fixtureSettings(), fixtureAppPod()],
  ]
  for (const [name, settings, pod] of cases) {
    withSpec(pod, { volumes: [{ name: 'data', emptyDir: {} }, { name, secret: { secretName: 'theirs' } }] })
    const { review, outcome } = inject(pod, settings)
    t.equal(outcome.kind, 'refused', name)
    t.same([review.response.allowed, review.response.patch, review.response.status?.code], [false, undefined, 400], `${name}: denied, no patch`)
    t.equal(review.response.status?.message,
      `cos-auth-proxy.io/inject: cannot inject: the pod has a volume named "${name}" already, and the sidecar adds its own of that name (the API server would refuse the pod). ` +
      'If the pod carries the chart\'s sidecar (cos-auth-proxy.sidecar.volumes), remove this annotation; else rename the volume', `${name}: the message names the clash`)
  }
  // Volumes of other names are the pod's own: the sidecar's are added beside them.
  const pod = withSpec(appPod(), { volumes: [{ name: 'data', emptyDir: {} }] })
  const { spec } = applyResponsePatch(pod, inject(pod).review.response)
  t.same(spec.volumes?.map(v => v.name), ['data', 'cos-auth-proxy-credentials', 'cos-auth-proxy-no-api-token'])
})

t.test('a pod that carries the chart\'s sidecar under another name and asks for injection is refused, not given a second proxy', async t => {
  // examples/sidecar-parent-chart with ci/plain-values.yaml: the container is `auth-proxy`, the volumes the chart's.
  const pod = chartPod('plain')
  ;(pod.metadata as Json).annotations = { 'cos-auth-proxy.io/inject': 'true' }
  const { review } = inject(pod)
  t.equal(review.response.allowed, false)
  t.match(review.response.status?.message, /^cos-auth-proxy\.io\/inject: cannot inject: the pod has volumes named "cos-auth-proxy-credentials", "cos-auth-proxy-no-api-token" already, and the sidecar adds its own of those names .* else rename them$/)
})

t.test('a container or init container of the sidecar\'s name: no second one, and a warning says why', async t => {
  const native = chartPod('native')
  ;(native.metadata as Json).annotations = { 'cos-auth-proxy.io/inject': 'true' }
  const foreign = withSpec(appPod(), { initContainers: [{ name: 'cos-auth-proxy', image: 'registry.example.com/something-else:1' }] })
  const plain = appPod()
  ;(plain.spec as { containers: Json[] }).containers.push({ name: 'cos-auth-proxy', image: 'registry.example.com/cos-auth-proxy:0.1.0' })
  for (const [what, pod] of [['the chart\'s native sidecar', native], ['an init container', foreign], ['a container', plain]] as const) {
    const { review, outcome } = inject(pod)
    t.same([outcome.kind, outcome.kind === 'skipped' && outcome.reason], ['skipped', 'already_injected'], what)
    t.same(review.response, {
      uid: '705ab4f5-6393-11e8-b7cc-42010a800002',
      allowed: true,
      warnings: ['cos-auth-proxy: no sidecar injected: the pod has a container named "cos-auth-proxy" already, taken for the sidecar (the chart\'s own?); cos-auth-proxy.io/inject is not needed'],
    }, `${what}: admitted as it is, with the warning`)
  }
})

t.test('shareProcessNamespace or hostPID: injected, with a warning that a process of the sidecar\'s uid can read its key files', async t => {
  const plain = inject(appPod()).review.response
  t.equal(plain.warnings, undefined, 'an ordinary pod: no warning')
  const shared = inject(withSpec(appPod(), { shareProcessNamespace: true }))
  t.equal(shared.outcome.kind, 'injected')
  t.ok(shared.review.response.patch, 'the sidecar is injected')
  t.same(shared.review.response.warnings, ['cos-auth-proxy: shareProcessNamespace: a container running as the sidecar\'s uid 65532 can read its key files through /proc/<pid>/root; run the app as another uid'])
  const both = inject(withSpec(appPod(), { shareProcessNamespace: true, hostPID: true })).review.response
  t.equal(both.warnings?.length, 2)
  t.equal(both.warnings?.[1], 'cos-auth-proxy: hostPID: any process on the node running as the sidecar\'s uid 65532 can read its key files through /proc/<pid>/root')
  t.match(inject(withSpec(fixtureAppPod(), { shareProcessNamespace: true }), fixtureSettings()).review.response.warnings, [/the sidecar's uid 65532 can read/],
    'the chart\'s definition too, with the uid its securityContext gives the sidecar')
})

t.test('every warning fits what the API server passes on whole (256 characters)', async t => {
  const pods = [
    withSpec(appPod(), { hostNetwork: true }),
    withSpec(appPod(), { shareProcessNamespace: true, hostPID: true }),
    withSpec(appPod(), { initContainers: [{ name: 'cos-auth-proxy', image: 'x' }] }),
  ]
  const warnings = pods.flatMap(p => inject(p).review.response.warnings ?? [])
  t.equal(warnings.length, 4)
  for (const w of warnings) t.ok(w.length <= 256, `${w.length} characters: ${w}`)
})
