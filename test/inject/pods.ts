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
import { injectSettings, parseSidecarFile } from '../../src/inject/template.js'

type Json = Record<string, unknown>

const RENDERED = fileURLToPath(new URL('../../examples/sidecar-parent-chart/rendered/', import.meta.url))
/**
 * scripts/render-injector-fixture.sh: the definition shipped for deployments without the chart, rendered from
 * examples/injector/values.yaml (the example parent chart's values): what COS_INJECT_SIDECAR_FILE points at in the CLI tests.
 */
export const EXAMPLE_SIDECAR_FILE = fileURLToPath(new URL('../../examples/injector/sidecar.json', import.meta.url))
/** scripts/render-injector-fixture.sh: the example chart and the injector's ConfigMap, from helm/cos-auth-proxy/ci/injector-values.yaml. */
export const CHART_FIXTURE = fileURLToPath(new URL('../fixtures/chart/injector.yaml', import.meta.url))

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
  return withoutSidecar(chartPod('native'), annotations)
}

function withoutSidecar (pod: Json, annotations: Record<string, string>): Json {
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

/** The webhook's settings with the example definition: the sidecar the example chart's values give (examples/injector/). */
export const EXAMPLE_SETTINGS: InjectSettings = injectSettings(parseSidecarFile(readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8')), true, 'cos-credentials', '0.1.0')

function fixtureDocs (): Json[] {
  return parseAllDocuments(readFileSync(CHART_FIXTURE, 'utf8')).map(d => d.toJS() as Json | null).filter((d): d is Json => d !== null)
}

/** The sidecar definition as the chart renders it into the injector's ConfigMap. */
export function fixtureSidecarFile (): string {
  const map = fixtureDocs().find(d => d.kind === 'ConfigMap') as { data: { 'sidecar.json': string } }
  return map.data['sidecar.json']
}

/** The webhook's settings with the fixture's ConfigMap as COS_INJECT_SIDECAR_FILE. */
export function fixtureSettings (nativeSidecar = true): InjectSettings {
  return injectSettings(parseSidecarFile(fixtureSidecarFile()), nativeSidecar, 'cos-credentials', '0.1.0')
}

/** The example chart's pod, rendered with the same values: the chart's own sidecar. */
export function fixturePod (): Json {
  const deployment = fixtureDocs().find(d => d.kind === 'Deployment') as { spec: { template: Json } }
  return { apiVersion: 'v1', kind: 'Pod', ...clone(deployment.spec.template) }
}

/** fixturePod without its sidecar and volumes, asking for injection. */
export function fixtureAppPod (annotations: Record<string, string> = {}): Json {
  return withoutSidecar(fixturePod(), annotations)
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

/**
 * The review that costs JSON.parse the most and still passes the webhook's
 * scan (issue 33): as many members `"<n>":{"<n>":1}` as REVIEW_LIMITS allows
 * (each one small object with a key no other has: its own hidden class),
 * padded with a long annotation to just under the 3 MiB body limit.
 */
export function costliestReview (limits: { readonly items: number, readonly containers: number }): string {
  // Each member counts one object and three values and keys (two ':' and a ','); the review's own take a few hundred.
  const members = Math.min(Math.floor((limits.items - 1000) / 3), limits.containers - 200)
  const parts: string[] = []
  for (let i = 0; i < members; i++) parts.push(`"${i.toString(36)}":{"${i.toString(36)}":1}`)
  const base = JSON.stringify(podReview(appPod({ 'example.com/pad': '' })))
  const review = base.replace('"metadata":{', `"metadata":{"junk":{${parts.join(',')}},`)
  return review.replace('"example.com/pad":""', `"example.com/pad":"${'p'.repeat(3 * 1024 * 1024 - 100 - review.length)}"`)
}
