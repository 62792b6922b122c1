// Real pod specs for the webhook's tests: the example chart's Deployment (as
// rendered, kept current by scripts/ci-packaging.sh) with and without its
// sidecar, reviews around them, and the check every patched pod gets: the
// JSONPatch applied with fast-json-patch, the result validated against the
// Kubernetes schema with kubernetes-models.
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import jsonpatch from 'fast-json-patch'
import { Pod } from 'kubernetes-models/v1/Pod'
import { parseAllDocuments } from 'yaml'
import type { InjectSettings } from '../../src/inject/patch.js'

type Json = Record<string, unknown>

const RENDERED = fileURLToPath(new URL('../../examples/sidecar-parent-chart/rendered/', import.meta.url))

function clone<T> (v: T): T {
  return structuredClone(v)
}

/** The pod template of the example chart's Deployment, rendered with ci/<variant>-values.yaml. */
export function chartPod (variant: 'native' | 'plain'): Json {
  const docs = parseAllDocuments(readFileSync(`${RENDERED}${variant}.yaml`, 'utf8')).map(d => d.toJS() as Json)
  const deployment = docs.find(d => d.kind === 'Deployment') as { spec: { template: Json } }
  return { apiVersion: 'v1', kind: 'Pod', ...clone(deployment.spec.template) }
}

/** The chart's sidecar container, as its templates render it. */
export function chartSidecar (variant: 'native' | 'plain'): Json {
  const spec = chartPod(variant).spec as { initContainers?: Json[], containers: Json[] }
  const all = [...spec.initContainers ?? [], ...spec.containers]
  const found = all.find(c => c.name === 'cos-auth-proxy' || c.name === 'auth-proxy')
  if (found === undefined) throw new Error('no sidecar in the rendered example')
  return found
}

/** The example's app pod as its team would write it without the sidecar, asking for injection. */
export function appPod (annotations: Record<string, string> = {}): Json {
  const pod = chartPod('native')
  const spec = pod.spec as Json
  delete spec.initContainers
  delete spec.volumes
  // What the pod needs without the proxy: the app's own 10 s.
  spec.terminationGracePeriodSeconds = 10
  const metadata = pod.metadata as Json
  metadata.annotations = { 'cos-auth-proxy.io/inject': 'true', ...annotations }
  return pod
}

export function podReview (pod: Json, extra: Json = {}): Json {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: '705ab4f5-6393-11e8-b7cc-42010a800002',
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      requestKind: { group: '', version: 'v1', kind: 'Pod' },
      requestResource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'apps',
      operation: 'CREATE',
      userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller' },
      object: pod,
      oldObject: null,
      dryRun: false,
      options: { apiVersion: 'meta.k8s.io/v1', kind: 'CreateOptions' },
      ...extra,
    },
  }
}

/** What the example chart's values give its sidecar, as the webhook's settings. */
export const EXAMPLE_SETTINGS: InjectSettings = {
  image: 'registry.example.com/cos-auth-proxy:0.1.0',
  nativeSidecar: true,
  defaultSecret: 'cos-credentials',
  upstreamEnv: [
    { name: 'COS_MANAGEMENT_API_URL', value: 'https://management.cos.example.com/api' },
    { name: 'COS_OPTIMIZE_API_URL', value: 'https://optimize.cos.example.com/api' },
  ],
  extraEnv: [],
  shutdownDelayMs: 5000,
  shutdownTimeoutMs: 20000,
  logLevel: 'info',
}

export interface PatchedPod {
  readonly pod: Json
  readonly spec: { containers: Json[], initContainers?: Json[], volumes?: Json[], terminationGracePeriodSeconds?: number }
  readonly annotations: Record<string, string>
}

/** Applies a response's base64 JSONPatch to the pod and validates the result against the Pod schema. */
export function applyResponsePatch (pod: Json, response: { patchType?: string, patch?: string }): PatchedPod {
  if (response.patchType !== 'JSONPatch' || response.patch === undefined) throw new Error('no JSONPatch in the response')
  const ops = JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8')) as jsonpatch.Operation[]
  // validate = true: every operation is checked against the document (a bad path throws).
  const patched = jsonpatch.applyPatch(clone(pod), ops, true, false).newDocument
  new Pod(patched).validate()
  return {
    pod: patched,
    spec: patched.spec as PatchedPod['spec'],
    annotations: (patched.metadata as { annotations: Record<string, string> }).annotations,
  }
}
