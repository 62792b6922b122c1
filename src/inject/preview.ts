// `cos-auth-proxy inject --print`: a Pod or a workload with a pod template
// (Deployment, Job, …) as JSON on stdin, or several of them as a `List` (what
// `kubectl create --dry-run=client -o json -f` makes of a multi-document
// file) or a JSON array (`yq ea -o=json '[.]'`); on stdout the same, each pod
// as the webhook would let it be created, through the same answerReview as
// /mutate. Other kinds in a list pass unchanged. JSON only: a YAML parser
// would be carried by every sidecar for the sake of this preview.
import { answerReview, type InjectSettings, type PatchOperation } from './patch.js'

type Json = Record<string, unknown>

/** Printed, but a pod that asks for the sidecar is admitted without it (hostNetwork): what a pipeline should notice. */
export const NOT_INJECTED = 2

export interface Preview {
  /**
   * 0: printed (injected or, with a note, unchanged); 2 (NOT_INJECTED): printed, but a pod that asks for the sidecar
   * will not get it; 1: refused (nothing printed); 65: not JSON, or nothing the webhook can read. A list: the worst of its items.
   */
  readonly code: number
  readonly stdout: string
  readonly note: string
}

function isObject (v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

/** Applies the webhook's patch: only `add`, at paths it built itself (RFC 6902 semantics). */
function applyAdds (doc: Json, ops: readonly PatchOperation[]): Json {
  const out = structuredClone(doc)
  for (const op of ops) {
    const segments = op.path.split('/').slice(1).map(s => s.replaceAll('~1', '/').replaceAll('~0', '~'))
    const last = segments.pop() as string
    let parent: unknown = out
    for (const s of segments) parent = Array.isArray(parent) ? parent[Number(s)] : (parent as Json)[s]
    if (Array.isArray(parent)) parent.splice(last === '-' ? parent.length : Number(last), 0, structuredClone(op.value))
    else (parent as Json)[last] = structuredClone(op.value)
  }
  return out
}

const NOT_JSON = 'stdin must be JSON: a Pod, a workload, a List or an array of them. ' +
  'From YAML: kubectl create --dry-run=client -o json -f FILE (kubectl asks a cluster what the kinds are), or yq ea -o=json \'[.]\' FILE'

/** One object's outcome: the object to print, or why it cannot be. */
type One = { readonly ok: true, readonly code: 0 | typeof NOT_INJECTED, readonly object: unknown, readonly note: string } | { readonly ok: false, readonly code: number, readonly note: string }

/** The pod the webhook would see in an object: itself (a Pod), its pod template, or none (another kind). */
function podOf (object: unknown): { pod: Json, template: boolean } | undefined {
  if (!isObject(object)) return undefined
  const spec = isObject(object.spec) ? object.spec : undefined
  if (spec !== undefined && isObject(spec.template)) return { pod: { apiVersion: 'v1', kind: 'Pod', metadata: spec.template.metadata ?? {}, spec: spec.template.spec }, template: true }
  if (object.kind === 'Pod' || (object.kind === undefined && spec !== undefined)) return { pod: object, template: false }
  return undefined
}

function previewOne (object: unknown, settings: InjectSettings, label: string): One {
  const found = podOf(object)
  if (found === undefined) return { ok: true, code: 0, object, note: `${label}not a Pod or a workload with a pod template: unchanged` }
  const { pod, template } = found
  let answer
  try {
    answer = answerReview({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: { uid: 'preview', kind: { group: '', version: 'v1', kind: 'Pod' }, operation: 'CREATE', object: pod, dryRun: true },
    }, settings)
  } catch (err) {
    return { ok: false, code: 65, note: `${label}not a Pod the webhook can read: ${(err as Error).message}` }
  }
  const { outcome } = answer
  if (outcome.kind === 'refused') return { ok: false, code: 1, note: `${label}refused: ${outcome.annotation}: ${outcome.message}` }
  const patched = outcome.patch === undefined ? pod : applyAdds(pod, outcome.patch)
  const spec = (object as Json).spec as Json
  const result = template ? { ...object as Json, spec: { ...spec, template: { metadata: patched.metadata, spec: patched.spec } } } : patched
  const warnings = (outcome.warnings ?? []).map(w => w.message)
  if (outcome.kind === 'injected') return { ok: true, code: 0, object: result, note: `${label}injected (${settings.version})${warnings.map(w => `; warning: ${w}`).join('')}` }
  const why = warnings.length === 0 ? outcome.reason : `${outcome.reason}: ${warnings.join('; ')}`
  return { ok: true, code: outcome.reason === 'host_network' ? NOT_INJECTED : 0, object: result, note: `${label}not injected: ${why}` }
}

/** "Deployment/web: " for an item of a list. */
function labelOf (item: unknown, index: number): string {
  const meta = isObject(item) && isObject(item.metadata) ? item.metadata : {}
  const kind = isObject(item) && typeof item.kind === 'string' ? item.kind : `item ${index}`
  return `${kind}/${typeof meta.name === 'string' ? meta.name : typeof meta.generateName === 'string' ? `${meta.generateName}*` : `#${index}`}: `
}

export function preview (input: string, settings: InjectSettings): Preview {
  let parsed: unknown
  try {
    parsed = JSON.parse(input)
  } catch (err) {
    return { code: 65, stdout: '', note: `${NOT_JSON} (${(err as Error).message})` }
  }
  const list = Array.isArray(parsed) ? parsed : isObject(parsed) && Array.isArray(parsed.items) ? parsed.items as unknown[] : undefined
  if (list === undefined) {
    if (!isObject(parsed)) return { code: 65, stdout: '', note: NOT_JSON }
    const one = previewOne(parsed, settings, '')
    return one.ok ? { code: one.code, stdout: `${JSON.stringify(one.object, null, 2)}\n`, note: one.note } : { code: one.code, stdout: '', note: one.note }
  }
  const results = list.map((item, i) => previewOne(item, settings, labelOf(item, i)))
  const notes = results.map(r => r.note).join('\ncos-auth-proxy: ')
  const failed = results.find((r): r is Extract<One, { ok: false }> => !r.ok)
  if (failed !== undefined) return { code: failed.code, stdout: '', note: notes }
  const items = results.map(r => r.ok ? r.object : undefined)
  const out = Array.isArray(parsed) ? items : { ...parsed as Json, items }
  return { code: Math.max(...results.map(r => r.code), 0), stdout: `${JSON.stringify(out, null, 2)}\n`, note: notes }
}
