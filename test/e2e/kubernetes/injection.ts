// The injector through the API server: the chart's MutatingWebhookConfiguration
// as helm installs it, its clientConfig pointed at `cos-auth-proxy inject` on
// 127.0.0.1 (no kube-proxy here to reach a Service), serving the certificate of
// the chart's Secret, injecting the chart's ConfigMap's sidecar. Deployments →
// the controller manager's ReplicaSets → Pod CREATE → AdmissionReview → the
// stored Pods are compared with `inject --print`.
import { execFileSync } from 'node:child_process'
import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Helm } from './helm.js'
import { contains, equal, ok, section } from '../harness/checks.js'
import { type Cluster, get, isObject, type Json, list, str } from '../harness/cluster.js'
import { ROOT, run, scratch, until } from '../harness/processes.js'
import { CLI, printInjected, Webhook, WebhookFiles } from './webhook.js'

export const CHART = join(ROOT, 'helm', 'cos-auth-proxy')
export const NS = 'cos-system'
export const RELEASE = 'cos'
export const NAME = 'cos-cos-auth-proxy-injector'
export const WEBHOOK = 'inject.cos-auth-proxy.io'
export const INJECT = 'cos-auth-proxy.io/inject'
export const INJECTED = 'cos-auth-proxy.io/injected-version'
export const VALUES = ['-f', join(CHART, 'ci', 'injector-values.yaml')]
export const MWC = `/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${NAME}`

export interface Context {
  readonly c: Cluster
  readonly helm: Helm
  readonly files: WebhookFiles
  readonly dir: string
  webhook: Webhook
  env: Record<string, string>
  version: string
  port: number
  adminPort: number
  readonly mwcName: string
  /** The first Deployment's pods, injected with the first definition. */
  firstPods: string[]
}

/** A CA and a serving certificate for 127.0.0.1 and the Service's name, in the Secret the chart would make. */
export function servingSecret (dir: string): Json {
  const sh = (args: string[]): void => { execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' }) }
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  sh(['req', '-x509', ...ec, '-days', '2', '-subj', '/CN=cos-test-injector-ca', '-keyout', 'ca.key', '-out', 'ca.crt'])
  writeFileSync(join(dir, 'leaf.ext'), `subjectAltName=IP:127.0.0.1,DNS:${NAME}.${NS}.svc\nextendedKeyUsage=serverAuth\n`)
  sh(['req', ...ec, '-subj', `/CN=${NAME}.${NS}.svc`, '-keyout', 'tls.key', '-out', 'tls.csr'])
  sh(['x509', '-req', '-in', 'tls.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', 'leaf.ext', '-out', 'tls.crt'])
  const b64 = (f: string): string => readFileSync(join(dir, f)).toString('base64')
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'kubernetes.io/tls',
    // Helm adopts an object with its release's ownership metadata; the chart's lookup then keeps its data.
    metadata: { name: `${NAME}-tls`, namespace: NS, labels: { 'app.kubernetes.io/managed-by': 'Helm' }, annotations: { 'meta.helm.sh/release-name': RELEASE, 'meta.helm.sh/release-namespace': NS } },
    data: { 'ca.crt': b64('ca.crt'), 'tls.crt': b64('tls.crt'), 'tls.key': b64('tls.key') },
  }
}

/** The chart's webhook, its clientConfig (only) pointed at the local webhook; waits until the API server calls it. */
export async function pointAtLocal (x: Context, probe: 'injected' | 'allowed' | 'none' = 'injected'): Promise<void> {
  const mwc = await x.c.read(MWC)
  const caBundle = str(mwc, 'webhooks', 0, 'clientConfig', 'caBundle')
  await x.c.patch(MWC, [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url: `https://127.0.0.1:${x.port}/mutate`, caBundle } }], 'json')
  if (probe === 'none') return
  // The configuration reaches the admission plugin through an informer: a dry run shows when.
  const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'probe', annotations: { [INJECT]: 'true' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1' }] } }
  await until(`the API server calling the webhook at 127.0.0.1:${x.port}`, 30_000, async () => {
    const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods?dryRun=All', pod)
    if (probe === 'allowed') return r.status === 201 ? true : undefined
    return r.status === 201 && str(r.body, 'metadata', 'annotations', INJECTED) === x.version ? true : undefined
  })
}

/**
 * helm upgrade of the injector. Helm merges its render into the live object, so the
 * clientConfig goes back to the rendered one first (a url beside the rendered service
 * is refused: "exactly one of url or service is required"); pointAtLocal after it.
 */
export async function upgrade (x: Context, set: readonly string[]): Promise<void> {
  const rendered = (await x.helm.manifest(RELEASE, NS)).find(o => o.kind === 'MutatingWebhookConfiguration')
  await x.c.patch(MWC, [{ op: 'replace', path: '/webhooks/0/clientConfig', value: get(rendered, 'webhooks', 0, 'clientConfig') }], 'json')
  await x.helm.must(['upgrade', RELEASE, CHART, ...VALUES, '--namespace', NS, ...set.flatMap(s => ['--set', s])])
}

export async function startWebhook (x: Context): Promise<void> {
  const l = await x.webhook.start()
  x.port = l.port
  x.adminPort = l.adminPort
  x.version = l.version
}

export function deployment (name: string, replicas: number): Json {
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name },
    spec: {
      replicas,
      selector: { matchLabels: { app: name } },
      template: {
        metadata: { labels: { app: name }, annotations: { [INJECT]: 'true' } },
        spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0', env: [{ name: 'APP_MODE', value: 'test' }] }] },
      },
    },
  }
}

/** The pod spec without what the ServiceAccount admission plugin adds (the kube-api-access-* token volume and mounts). */
function withoutToken (spec: unknown): Json {
  const s = structuredClone(isObject(spec) ? spec : {})
  const mine = (v: Json): boolean => !(typeof v.name === 'string' && v.name.startsWith('kube-api-access-'))
  if (Array.isArray(s.volumes)) s.volumes = list(s, 'volumes').filter(mine)
  for (const key of ['containers', 'initContainers']) {
    for (const k of list(s, key)) {
      if (!Array.isArray(k.volumeMounts)) continue
      k.volumeMounts = list(k, 'volumeMounts').filter(mine)
      if ((k.volumeMounts as Json[]).length === 0) delete k.volumeMounts
    }
  }
  return s
}

/** A stored pod is the template as `inject --print` printed it, field for field (the server's defaults aside). */
export function samePodAsPrinted (pod: Json, printed: Json, what: string): void {
  const expected = get(printed, 'spec', 'template', 'spec') ?? get(printed, 'spec')
  const diffs = contains(withoutToken(get(pod, 'spec')), expected)
  equal(diffs, [], `${what}: the stored pod's spec is inject --print's (sidecar, volumes, env, grace period)`)
  const printedVersion = str(printed, 'spec', 'template', 'metadata', 'annotations', INJECTED) ?? str(printed, 'metadata', 'annotations', INJECTED)
  equal(str(pod, 'metadata', 'annotations', INJECTED), printedVersion, `${what}: ${INJECTED} is ${printedVersion}`)
}

async function setup (x: Context): Promise<void> {
  await x.c.namespace(NS)
  await x.c.create(`/api/v1/namespaces/${NS}/secrets`, servingSecret(x.dir))
  await x.helm.must(['install', RELEASE, CHART, ...VALUES, '--namespace', NS])
  equal(await x.helm.status(RELEASE, NS), 'deployed', 'helm install of the injector (serving certificate in an existing Secret): deployed')
  const mwc = await x.c.read(MWC)
  const secret = await x.c.read(`/api/v1/namespaces/${NS}/secrets/${NAME}-tls`)
  equal(str(mwc, 'webhooks', 0, 'clientConfig', 'caBundle'), str(secret, 'data', 'ca.crt'), 'the chart kept the Secret and put its CA in the caBundle')
  equal(str(mwc, 'webhooks', 0, 'failurePolicy'), 'Fail', 'failurePolicy as rendered: Fail')
  await x.files.fromSecret(x.c, NS, `${NAME}-tls`)
  await x.files.fromConfigMap(x.c, NS, `${NAME}-sidecar`)
  x.env = await x.files.env(x.c, NS, NAME)
  x.webhook = new Webhook(x.env)
  await x.c.namespace('apps', { 'cos-auth-proxy.io/injection': 'enabled' })
  await x.c.namespace('elsewhere')
  await startWebhook(x)
  await pointAtLocal(x)
  ok(true, `the API server calls the chart's webhook at https://127.0.0.1:${x.port}/mutate (version ${x.version})`)
}

async function injectsDeployments (x: Context): Promise<void> {
  const d = deployment('demo', 2)
  await x.c.create('/apis/apps/v1/namespaces/apps/deployments', d)
  const pods = await x.c.waitPods('apps', 'app=demo', 2)
  x.firstPods = pods.map(p => str(p, 'metadata', 'name') ?? '')
  const printed = await printInjected(x.env, d)
  for (const pod of pods) samePodAsPrinted(pod, printed, str(pod, 'metadata', 'name') ?? '?')
  const pod = pods[0]
  const init = list(pod, 'spec', 'initContainers')
  equal(init.map(k => [k.name, k.restartPolicy]), [['cos-auth-proxy', 'Always']], 'a native sidecar: first init container, restartPolicy Always, kept by the server')
  const volumes = list(pod, 'spec', 'volumes').map(v => v.name)
  ok(volumes.includes('cos-auth-proxy-credentials') && volumes.includes('cos-auth-proxy-tls'), `the volumes it mounts are there (${volumes.join(', ')})`)
  const mounts = list(init[0], 'volumeMounts').map(m => [m.name, m.readOnly, m.subPath])
  ok(mounts.some(m => m[0] === 'cos-auth-proxy-credentials' && m[1] === true && m[2] === undefined), 'credentials mounted read-only, as a directory', mounts)
  // Issue 37: the ServiceAccount admission plugin mounts the pod's token into every container without a mount at its path.
  const tokenPath = '/var/run/secrets/kubernetes.io/serviceaccount'
  const appToken = list(pod, 'spec', 'containers', 0, 'volumeMounts').find(m => m.mountPath === tokenPath)
  const sidecarToken = list(init[0], 'volumeMounts').find(m => m.mountPath === tokenPath)
  ok(typeof appToken?.name === 'string' && appToken.name.startsWith('kube-api-access-'), `the app container has the pod's ServiceAccount token (${String(appToken?.name)})`)
  equal(sidecarToken?.name, 'cos-auth-proxy-no-api-token', 'the sidecar does not: an empty directory over the token\'s path')
  const url = list(pod, 'spec', 'containers', 0, 'env').find(e => e.name === 'COS_PROXY_URL')
  equal(url?.value, 'http://127.0.0.1:8080', 'the app container has COS_PROXY_URL')
  equal(list(pod, 'spec', 'containers', 0, 'env')[0], { name: 'APP_MODE', value: 'test' }, 'and keeps its own env')
  equal(str(pod, 'metadata', 'annotations', INJECTED), x.version, `${INJECTED} is the webhook's version`)
  const logged = x.webhook.lines('sidecar injected')
  ok(logged.length >= 2, `the webhook logged each injection (${logged.length} 'sidecar injected' lines)`, x.webhook.log.slice(-2000))
}

async function leavesOthers (x: Context): Promise<void> {
  await x.c.create('/apis/apps/v1/namespaces/elsewhere/deployments', deployment('demo', 1))
  const [pod] = await x.c.waitPods('elsewhere', 'app=demo', 1)
  equal(get(pod, 'spec', 'initContainers'), undefined, 'a namespace without the label: no sidecar')
  equal(str(pod, 'metadata', 'annotations', INJECTED), undefined, `and no ${INJECTED}`)
  const own = await x.c.waitPods(NS, `app.kubernetes.io/instance=${RELEASE}`, 2)
  equal(own.map(p => [list(p, 'spec', 'containers').map(k => k.name), get(p, 'spec', 'initContainers')]), [[['injector'], undefined], [['injector'], undefined]], 'the webhook\'s own pods: untouched')
}

async function notTwice (x: Context): Promise<void> {
  const base = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'twice', annotations: { [INJECT]: 'true' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0' }] } }
  const printed = await printInjected(x.env, base)
  const stored = await x.c.create('/api/v1/namespaces/apps/pods', printed)
  const names = [...list(stored, 'spec', 'initContainers'), ...list(stored, 'spec', 'containers')].map(k => k.name)
  equal(names, ['cos-auth-proxy', 'app'], 'a pod injected already (inject --print\'s output) is not injected twice')
  samePodAsPrinted(stored, printed, 'twice')
  // A sidecar of that name without the annotation (a chart's own sidecar) is left alone too.
  const own = structuredClone(base) as Json
  Object.assign(get(own, 'metadata') as Json, { name: 'own-sidecar' })
  Object.assign(get(own, 'spec') as Json, { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0' }, { name: 'cos-auth-proxy', image: 'registry.example.com/cos-auth-proxy:0.1.0' }] })
  const stored2 = await x.c.create('/api/v1/namespaces/apps/pods', own)
  equal([get(stored2, 'spec', 'initContainers'), list(stored2, 'spec', 'containers').length], [undefined, 2], 'a pod with its own cos-auth-proxy container gets no second one')
}

// Issue 43, findings 4 and 6: what the API server makes of the webhook's answers.
async function declinesAndRefuses (x: Context): Promise<void> {
  const app = [{ name: 'app', image: 'registry.example.com/app:1.0.0' }]
  const onHost = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'on-host', annotations: { [INJECT]: 'true' } }, spec: { hostNetwork: true, containers: app } }
  const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods', onHost)
  equal(r.status, 201, 'a hostNetwork pod asking for the sidecar is admitted')
  equal([get(r.body, 'spec', 'initContainers'), list(r.body, 'spec', 'containers').map(k => k.name)], [undefined, ['app']], 'without the sidecar: the node\'s loopback is not the pod\'s')
  const why = str(r.body, 'metadata', 'annotations', 'cos-auth-proxy.io/not-injected') ?? ''
  ok(why.startsWith('hostNetwork: the pod\'s 127.0.0.1 is the node\'s loopback'), `cos-auth-proxy.io/not-injected says why (${why})`)
  const warning = r.headers.warning ?? ''
  ok(warning.includes('cos-auth-proxy: no sidecar injected: hostNetwork: '), `the API server passes the webhook's warning on to the client (${warning})`)
  const printed = await run(process.execPath, [CLI, 'inject', '--print'], { env: { PATH: process.env.PATH, ...x.env }, input: JSON.stringify(onHost), timeoutMs: 30_000 })
  equal(printed.code, 2, `inject --print exits 2 for it (${printed.stderr.trim()})`)
  ok(x.webhook.lines('sidecar not injected').some(l => l.reason === 'host_network' && l.namespace === 'apps'), 'the webhook logged it (warn, reason host_network)', x.webhook.log.slice(-2000))
  // Gone before failures.ts counts the labelled namespace's pods that run without the sidecar (it would be one).
  await x.c.remove('/api/v1/namespaces/apps/pods/on-host?gracePeriodSeconds=0')
  await until('pod on-host deleted', 30_000, async () => await x.c.find('/api/v1/namespaces/apps/pods/on-host') === undefined ? true : undefined)

  const clash = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'clash', annotations: { [INJECT]: 'true' } }, spec: { containers: app, volumes: [{ name: 'cos-auth-proxy-credentials', emptyDir: {} }] } }
  const c = await x.c.call('POST', '/api/v1/namespaces/apps/pods', clash)
  equal([c.status, str(c.body, 'message')], [400, `admission webhook "${WEBHOOK}" denied the request: cos-auth-proxy.io/inject: cannot inject: the pod has a volume named "cos-auth-proxy-credentials" already, ` +
    'and the sidecar adds its own of that name (the API server would refuse the pod). If the pod carries the chart\'s sidecar (cos-auth-proxy.sidecar.volumes), remove this annotation; else rename the volume'],
  'a pod with a volume of the sidecar\'s name: refused, the message naming the clash')
  equal(await x.c.find('/api/v1/namespaces/apps/pods/clash'), undefined, 'and nothing stored')
}

async function refusesAndDryRuns (x: Context): Promise<void> {
  const bad = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'bad', annotations: { [INJECT]: 'true', 'cos-auth-proxy.io/memory': '128MB' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0' }] } }
  const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods', bad)
  equal([r.status, str(r.body, 'message')], [400, `admission webhook "${WEBHOOK}" denied the request: cos-auth-proxy.io/memory: must be a positive memory quantity like 128Mi or 1Gi, got "128MB"`],
    'a bad annotation: refused with the message docs/kubernetes.md shows')
  const good = structuredClone(bad)
  good.metadata.annotations['cos-auth-proxy.io/memory'] = '256Mi'
  const dry = await x.c.call('POST', '/api/v1/namespaces/apps/pods?dryRun=All', good)
  const sidecar = list(dry.body, 'spec', 'initContainers')[0]
  equal([dry.status, get(sidecar, 'resources', 'requests', 'memory')], [201, '256Mi'], 'a server-side dry run gets the same patch (memory request from the annotation)')
  equal(await x.c.find('/api/v1/namespaces/apps/pods/bad'), undefined, 'and stores nothing')
}

export async function injection (c: Cluster, helm: Helm, rest: (x: Context) => Promise<void>): Promise<void> {
  const dir = scratch('inject-')
  const x: Context = { c, helm, dir, files: new WebhookFiles(dir), webhook: new Webhook({}), env: {}, version: '', port: 0, adminPort: 0, mwcName: NAME, firstPods: [] }
  const kill = (): void => { x.webhook.kill() }
  process.on('exit', kill)
  try {
    await section('injector: installed, its webhook pointed at inject on 127.0.0.1', () => setup(x))
    if (x.port === 0) return
    await section('injector: a Deployment in a labelled namespace gets the sidecar inject --print shows', () => injectsDeployments(x))
    await section('injector: unlabelled namespaces and the webhook\'s own pods are untouched', () => leavesOthers(x))
    await section('injector: no double injection', () => notTwice(x))
    await section('injector: a hostNetwork pod admitted without the sidecar, a clashing volume refused', () => declinesAndRefuses(x))
    await section('injector: a bad annotation refused, a dry run patched', () => refusesAndDryRuns(x))
    await rest(x)
  } finally {
    await x.webhook.stop()
    process.off('exit', kill)
    rmSync(dir, { recursive: true, force: true })
  }
}
