// helm install of everything the chart makes, against a real API server: each
// release reaches `deployed`, every object of its manifest is stored (validated
// and defaulted by the server), the controller manager makes the Deployments'
// Pods, and `helm uninstall` leaves none of it behind.
import { X509Certificate } from 'node:crypto'
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { objectPath, parseYamlDocs, type Helm } from './helm.js'
import { equal, ok, section } from '../harness/checks.js'
import { type Cluster, get, type Json, list, str } from '../harness/cluster.js'
import { ROOT, until } from '../harness/processes.js'

const CHART = join(ROOT, 'helm', 'cos-auth-proxy')
const PARENT = join(ROOT, 'examples', 'sidecar-parent-chart')

function kinds (manifest: readonly Json[]): string[] {
  return [...new Set(manifest.map(o => str(o, 'kind') ?? '?'))].sort()
}

/** Installs, checks `deployed` and every object stored; returns the manifest. */
export async function install (c: Cluster, helm: Helm, release: string, ns: string, args: readonly string[], expected: readonly string[]): Promise<Json[]> {
  await helm.must(['install', release, ...args, '--namespace', ns, '--create-namespace'])
  equal(await helm.status(release, ns), 'deployed', `helm install ${release}: deployed`)
  const manifest = await helm.manifest(release, ns)
  const have = kinds(manifest)
  ok(expected.every(k => have.includes(k)), `${release} made ${have.join(', ')}`, { expected })
  const missing: string[] = []
  for (const o of manifest) if (await c.find(objectPath(o, ns)) === undefined) missing.push(objectPath(o, ns))
  equal(missing, [], `${release}: all ${manifest.length} objects are stored`)
  return manifest
}

/** Uninstalls; every object of the manifest and the pods of the release are gone. */
export async function uninstall (c: Cluster, helm: Helm, release: string, ns: string, manifest: readonly Json[], podSelector = `app.kubernetes.io/instance=${release}`): Promise<void> {
  await helm.must(['uninstall', release, '--namespace', ns])
  const left = await until(`${release}'s objects deleted`, 60_000, async () => {
    const still: string[] = []
    for (const o of manifest) if (await c.find(objectPath(o, ns)) !== undefined) still.push(objectPath(o, ns))
    return still.length === 0 ? still : undefined
  }).catch((err: unknown) => [String(err)])
  equal(left, [], `helm uninstall ${release}: none of its ${manifest.length} objects is left`)
  // ReplicaSets and Pods are the controller manager's: its garbage collector removes them.
  const pods = await until(`${release}'s pods collected`, 90_000, async () => {
    const p = await c.pods(ns, podSelector)
    const rs = await c.items(`/apis/apps/v1/namespaces/${ns}/replicasets?labelSelector=${encodeURIComponent(podSelector)}`)
    return p.length + rs.length === 0 ? 0 : undefined
  }).catch(() => -1)
  equal(pods, 0, `${release}: its ReplicaSets and Pods are garbage-collected`)
  equal(await helm.status(release, ns), undefined, `${release}: helm no longer knows the release`)
}

async function crds (c: Cluster): Promise<void> {
  const docs = parseYamlDocs(readFileSync(join(ROOT, 'test', 'e2e', 'kubernetes', 'prometheus-operator-crds.yaml'), 'utf8'))
  for (const crd of docs) {
    await c.create('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', crd)
    const name = str(crd, 'metadata', 'name') ?? ''
    await until(`CRD ${name} established`, 60_000, async () => {
      const got = await c.read(`/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${name}`)
      return list(got, 'status', 'conditions').some(k => k.type === 'Established' && k.status === 'True') ? true : undefined
    })
  }
  // Served as soon as discovery has them.
  await until('monitoring.coreos.com/v1 served', 60_000, async () => (await c.call('GET', '/apis/monitoring.coreos.com/v1')).status === 200 ? true : undefined)
  ok(true, `${docs.length} prometheus-operator CRDs established (ServiceMonitor, PodMonitor, PrometheusRule)`)
}

/** The example parent chart, native and plain; its dependency built for the run. */
async function parentChart (c: Cluster, helm: Helm, variant: 'native' | 'plain'): Promise<void> {
  const release = `parent-${variant}`
  const ns = `parent-${variant}`
  const manifest = await install(c, helm, release, ns, [PARENT, '-f', join(PARENT, 'ci', `${variant}-values.yaml`)], ['Deployment'])
  const pods = await c.waitPods(ns, `app.kubernetes.io/instance=${release}`, 2)
  const pod = pods[0]
  if (variant === 'native') {
    const init = list(pod, 'spec', 'initContainers')
    equal(init.map(k => [k.name, k.restartPolicy]), [['cos-auth-proxy', 'Always']], 'the stored pod keeps the proxy as a native sidecar (initContainers, restartPolicy: Always)')
  } else {
    const names = list(pod, 'spec', 'containers').map(k => k.name)
    equal(names, ['app', 'auth-proxy'], 'the stored pod has the proxy as a plain container')
    equal(get(pod, 'spec', 'initContainers'), undefined, 'and no init container')
  }
  const volumes = list(pod, 'spec', 'volumes').map(v => v.name)
  ok(volumes.includes('cos-auth-proxy-credentials'), `the pod mounts the credentials volume (${volumes.join(', ')})`)
  await uninstall(c, helm, release, ns, manifest)
}

async function standalone (c: Cluster, helm: Helm): Promise<void> {
  const ns = 'standalone'
  const manifest = await install(c, helm, 'standalone', ns, [CHART, '-f', join(CHART, 'ci', 'standalone-values.yaml')],
    ['ConfigMap', 'Deployment', 'HorizontalPodAutoscaler', 'NetworkPolicy', 'PodDisruptionBudget', 'PrometheusRule', 'Service', 'ServiceAccount', 'ServiceMonitor'])
  const hpa = manifest.find(o => o.kind === 'HorizontalPodAutoscaler')
  const stored = await c.read(objectPath(hpa ?? {}, ns))
  equal(str(stored, 'apiVersion'), 'autoscaling/v2', 'the HorizontalPodAutoscaler is served as autoscaling/v2')
  const pods = await c.waitPods(ns, 'app.kubernetes.io/instance=standalone', 3)
  ok(pods.every(p => str(p, 'spec', 'priorityClassName') === 'system-cluster-critical'), '3 pods made by the controller manager, priority class kept')
  // examples/podmonitor.yaml, in the namespace it names.
  const podMonitor = parseYamlDocs(readFileSync(join(ROOT, 'examples', 'podmonitor.yaml'), 'utf8'))[0] ?? {}
  await c.create('/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'monitoring' } })
  await c.create('/apis/monitoring.coreos.com/v1/namespaces/monitoring/podmonitors', podMonitor)
  ok(await c.find('/apis/monitoring.coreos.com/v1/namespaces/monitoring/podmonitors/cos-auth-proxy-sidecars') !== undefined, 'examples/podmonitor.yaml is stored')
  await uninstall(c, helm, 'standalone', ns, manifest)
}

/** Sidecar mode with the alert rules and the dashboard (ci/alerts-values.yaml): no workload. */
async function alerts (c: Cluster, helm: Helm): Promise<void> {
  const manifest = await install(c, helm, 'alerts', 'shop', [CHART, '-f', join(CHART, 'ci', 'alerts-values.yaml')], ['ConfigMap', 'PrometheusRule'])
  const dashboard = manifest.find(o => o.kind === 'ConfigMap')
  equal(str(dashboard, 'metadata', 'namespace'), 'monitoring', 'the dashboard ConfigMap goes to grafanaDashboard.namespace')
  await uninstall(c, helm, 'alerts', 'shop', manifest)
}

/** The injector with the CA and certificate Helm generates (no cert-manager). */
async function injectorHelmCa (c: Cluster, helm: Helm): Promise<void> {
  const ns = 'cos-ca'
  const manifest = await install(c, helm, 'ca', ns, [CHART, '-f', join(CHART, 'ci', 'injector-values.yaml')],
    ['ConfigMap', 'Deployment', 'MutatingWebhookConfiguration', 'PodDisruptionBudget', 'Secret', 'Service', 'ServiceAccount'])
  const secret = await c.read(`/api/v1/namespaces/${ns}/secrets/ca-cos-auth-proxy-injector-tls`)
  const data = (k: string): string => Buffer.from(str(secret, 'data', k) ?? '', 'base64').toString()
  const ca = new X509Certificate(data('ca.crt'))
  const cert = new X509Certificate(data('tls.crt'))
  const mwc = await c.read('/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/ca-cos-auth-proxy-injector')
  equal(str(mwc, 'webhooks', 0, 'clientConfig', 'caBundle'), str(secret, 'data', 'ca.crt'), 'the webhook\'s caBundle is the Secret\'s Helm-made CA')
  ok(cert.verify(ca.publicKey) && cert.checkIssued(ca), 'the serving certificate is signed by that CA')
  equal(cert.checkHost('ca-cos-auth-proxy-injector.cos-ca.svc'), 'ca-cos-auth-proxy-injector.cos-ca.svc', 'for the name the API server calls (<service>.<namespace>.svc)')
  await c.waitPods(ns, 'app.kubernetes.io/instance=ca', 2)
  // An upgrade keeps the Secret (looked up), so the caBundle still matches running pods.
  await helm.must(['upgrade', 'ca', CHART, '-f', join(CHART, 'ci', 'injector-values.yaml'), '--namespace', ns, '--set', 'logLevel=info'])
  const after = await c.read(`/api/v1/namespaces/${ns}/secrets/ca-cos-auth-proxy-injector-tls`)
  equal(get(after, 'data'), get(secret, 'data'), 'helm upgrade keeps the CA and certificate')
  await uninstall(c, helm, 'ca', ns, manifest)
}

export async function installs (c: Cluster, helm: Helm): Promise<void> {
  const charts = join(PARENT, 'charts')
  const made = !existsSync(charts) || !readdirSync(charts).some(f => f.startsWith('cos-auth-proxy-'))
  if (made) await helm.must(['dependency', 'build', PARENT])
  try {
    await section('prometheus-operator CRDs', () => crds(c))
    await section('helm install: the example parent chart, native sidecar', () => parentChart(c, helm, 'native'))
    await section('helm install: the example parent chart, plain sidecar', () => parentChart(c, helm, 'plain'))
    await section('helm install: standalone (mode=deployment, every option)', () => standalone(c, helm))
    await section('helm install: alert rules and dashboard', () => alerts(c, helm))
    await section('helm install: the injector with its Helm-made CA', () => injectorHelmCa(c, helm))
  } finally {
    if (made) rmSync(charts, { recursive: true, force: true })
  }
}
