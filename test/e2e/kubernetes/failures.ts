// What a platform team meets: the webhook down with failurePolicy Fail (the pod
// is refused, naming the webhook; the webhook's own pods still start), with
// Ignore (the pod starts without the sidecar, and that shows), and the sidecar
// ConfigMap changed (new pods get the new definition, the version tells them apart).
import { uninstall } from './installs.js'
import { INJECT, INJECTED, MWC, NAME, NS, pointAtLocal, RELEASE, samePodAsPrinted, startWebhook, upgrade, WEBHOOK, type Context } from './injection.js'
import { equal, ok, section } from '../harness/checks.js'
import { get, type Json, list, str } from '../harness/cluster.js'
import { until } from '../harness/processes.js'
import { reinvoked } from './reinvocation.js'
import { printInjected } from './webhook.js'

const pod = (name: string): Json => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name, annotations: { [INJECT]: 'true' } }, spec: { containers: [{ name: 'app', image: 'registry.example.com/app:1.0.0' }] } })

/** The API server's count of calls that failed open, for this webhook. */
async function failOpen (x: Context): Promise<number> {
  const r = await x.c.call('GET', '/metrics')
  let n = 0
  for (const line of r.text.split('\n')) {
    if (line.startsWith('apiserver_admission_webhook_fail_open_count{') && line.includes(`name="${WEBHOOK}"`)) n += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return n
}

/** docs/kubernetes.md's check (its jq filter): pods annotated for injection that run without a cos-auth-proxy container. */
export function notInjected (pods: readonly Json[]): string[] {
  return pods.filter(p => str(p, 'metadata', 'annotations', INJECT) === 'true' &&
    ![...list(p, 'spec', 'initContainers'), ...list(p, 'spec', 'containers')].some(k => k.name === 'cos-auth-proxy'))
    .map(p => `${str(p, 'metadata', 'namespace') ?? ''}/${str(p, 'metadata', 'name') ?? ''}`)
}

async function hung (x: Context): Promise<void> {
  const timeout = Number(get(await x.c.read(MWC), 'webhooks', 0, 'timeoutSeconds'))
  x.webhook.pause()
  try {
    const t0 = Date.now()
    const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods', pod('hung'))
    const seconds = (Date.now() - t0) / 1000
    const message = str(r.body, 'message') ?? r.text
    ok(r.status >= 400 && message.includes(`failed calling webhook "${WEBHOOK}"`), `a webhook that never answers: refused (${r.status}), naming the webhook`, message)
    // The chart's timeoutSeconds, not the API server's 30 s request timeout (margin for a busy machine).
    ok(seconds >= timeout - 0.5 && seconds < timeout + 20, `after the chart's timeoutSeconds (${timeout} s): ${seconds.toFixed(1)} s`)
    console.log(`    (${message.slice(0, 300)})`)
  } finally {
    x.webhook.resume()
  }
  await pointAtLocal(x)
  ok(true, 'resumed, it injects again')
}

async function failClosed (x: Context): Promise<void> {
  equal(await x.webhook.stop(), 0, 'the webhook stopped (SIGTERM, drained, exit 0)')
  const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods', pod('refused'))
  ok(r.status >= 400, `failurePolicy Fail, webhook down: the pod is refused (${r.status})`)
  const message = str(r.body, 'message') ?? r.text
  ok(message.includes(`failed calling webhook "${WEBHOOK}"`), 'the message names the webhook', message)
  console.log(`    (${message.slice(0, 300)})`)
  // A Deployment's ReplicaSet says the same in an Event.
  await x.c.patch('/apis/apps/v1/namespaces/apps/deployments/demo', { spec: { replicas: 3 } })
  const event = await until('a FailedCreate event', 90_000, async () => (await x.c.items('/api/v1/namespaces/apps/events'))
    .find(e => e.reason === 'FailedCreate' && String(e.message).includes(WEBHOOK)))
  ok(true, `the ReplicaSet's FailedCreate event names it: ${String(event.message).slice(0, 160)}`)
  await x.c.patch('/apis/apps/v1/namespaces/apps/deployments/demo', { spec: { replicas: 2 } })
  // The webhook's own pods are outside its objectSelector: they start even in a labelled namespace.
  await x.c.patch(`/api/v1/namespaces/${NS}`, { metadata: { labels: { 'cos-auth-proxy.io/injection': 'enabled' } } })
  const [first] = await x.c.pods(NS, `app.kubernetes.io/instance=${RELEASE}`)
  const gone = str(first, 'metadata', 'name') ?? ''
  await x.c.remove(`/api/v1/namespaces/${NS}/pods/${gone}?gracePeriodSeconds=0`)
  const again = await until('a new injector pod', 90_000, async () => {
    const pods = await x.c.pods(NS, `app.kubernetes.io/instance=${RELEASE}`)
    return pods.length === 2 && pods.every(p => str(p, 'metadata', 'name') !== gone) ? pods : undefined
  })
  ok(again.length === 2, 'with the webhook down (Fail) and its namespace labelled, its own Deployment still makes its pods')
  await x.c.patch(`/api/v1/namespaces/${NS}`, { metadata: { labels: { 'cos-auth-proxy.io/injection': null } } })
}

async function failOpenVisibly (x: Context): Promise<void> {
  await upgrade(x, ['injector.failurePolicy=Ignore'])
  equal(str(await x.c.read(MWC), 'webhooks', 0, 'failurePolicy'), 'Ignore', 'helm upgrade --set injector.failurePolicy=Ignore')
  await pointAtLocal(x, 'allowed')
  const before = await failOpen(x)
  const stored = await x.c.create('/api/v1/namespaces/apps/pods', pod('unprotected'))
  equal([get(stored, 'spec', 'initContainers'), list(stored, 'spec', 'containers').map(k => k.name)], [undefined, ['app']], 'failurePolicy Ignore, webhook down: the pod is created, without the sidecar')
  equal([str(stored, 'metadata', 'annotations', INJECT), str(stored, 'metadata', 'annotations', INJECTED)], ['true', undefined], `visible on the pod: ${INJECT}=true without ${INJECTED}`)
  const missing = notInjected(await x.c.items('/api/v1/pods'))
  equal(missing.filter(m => m.startsWith('apps/')), ['apps/unprotected'], 'the check in docs/kubernetes.md lists that pod, the only one in the labelled namespace')
  ok(missing.some(m => m.startsWith('elsewhere/')), 'and the annotated pods of the unlabelled namespace (the other way to miss the sidecar)', missing)
  const after = await failOpen(x)
  ok(after > before, `and in the API server's apiserver_admission_webhook_fail_open_count{name="${WEBHOOK}"} (${before} → ${after})`)
}

async function newDefinition (x: Context): Promise<void> {
  // The webhook comes back with the definition it had; then the chart's values change.
  await startWebhook(x)
  const oldVersion = x.version
  await upgrade(x, ['injector.failurePolicy=Fail', 'logLevel=warn'])
  equal(str(await x.c.read(MWC), 'webhooks', 0, 'failurePolicy'), 'Fail', 'failurePolicy back to Fail')
  await pointAtLocal(x)
  // The kubelet would swap the mounted ConfigMap's file; here the test does.
  await x.files.fromConfigMap(x.c, NS, `${NAME}-sidecar`)
  const reloaded = await until('sidecar definition reloaded', 45_000, async () => x.webhook.lines('sidecar definition reloaded')[0])
  x.version = str(reloaded, 'version') ?? ''
  ok(x.version !== '' && x.version !== oldVersion, `the webhook reloaded the ConfigMap: ${oldVersion} → ${x.version}`)
  await x.c.patch('/apis/apps/v1/namespaces/apps/deployments/demo', { spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': new Date().toISOString() } } } } })
  const fresh = await until('a pod of the restarted Deployment', 90_000, async () => (await x.c.pods('apps', 'app=demo'))
    .find(p => str(p, 'metadata', 'annotations', 'kubectl.kubernetes.io/restartedAt') !== undefined))
  equal(str(fresh, 'metadata', 'annotations', INJECTED), x.version, `a new pod: ${INJECTED} ${x.version}`)
  const oldPod = await x.c.read(`/api/v1/namespaces/apps/pods/${x.firstPods[0] ?? '?'}`)
  equal(str(oldPod, 'metadata', 'annotations', INJECTED), oldVersion, `a pod from before keeps ${oldVersion}: the annotation tells them apart`)
  const level = list(fresh, 'spec', 'initContainers', 0, 'env').find(e => e.name === 'COS_LOG_LEVEL')
  equal(level?.value, 'warn', 'the new pod\'s sidecar has the new definition (COS_LOG_LEVEL=warn)')
  const d = await x.c.read('/apis/apps/v1/namespaces/apps/deployments/demo')
  samePodAsPrinted(fresh, await printInjected(x.env, d), 'new pod')
}

async function uninstalled (x: Context): Promise<void> {
  await x.webhook.stop()
  const manifest = await x.helm.manifest(RELEASE, NS)
  await uninstall(x.c, x.helm, RELEASE, NS, manifest)
  const r = await x.c.call('POST', '/api/v1/namespaces/apps/pods', pod('after-uninstall'))
  equal([r.status, get(r.body, 'spec', 'initContainers')], [201, undefined], 'after helm uninstall no webhook is called: an annotated pod is created as it is')
}

export async function failures (x: Context): Promise<void> {
  await section('injector: reinvoked after another webhook, it changes nothing', () => reinvoked(x))
  await section('failure: webhook hung, failurePolicy Fail', () => hung(x))
  await section('failure: webhook down, failurePolicy Fail', () => failClosed(x))
  await section('failure: webhook down, failurePolicy Ignore (visible)', () => failOpenVisibly(x))
  await section('failure: the sidecar ConfigMap changed', () => newDefinition(x))
  await section('helm uninstall of the injector', () => uninstalled(x))
}
