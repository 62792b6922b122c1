// `cos-auth-proxy inject --print`: a Pod (or a workload with a pod template)
// as JSON on stdin, the Pod as the webhook would let it be created on stdout,
// through the same answerReview as /mutate. JSON only: the program carries
// no YAML parser (`kubectl create --dry-run=client -o json` converts).
import { answerReview, type InjectSettings, type PatchOperation } from './patch.js'

type Json = Record<string, unknown>

export interface Preview {
  /** 0: printed (injected or, with a note, unchanged); 1: refused; 65: not a Pod in JSON. */
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

export function preview (input: string, settings: InjectSettings): Preview {
  let object: unknown
  try {
    object = JSON.parse(input)
  } catch (err) {
    return { code: 65, stdout: '', note: `stdin must be a Pod in JSON (${(err as Error).message}); convert YAML with kubectl create --dry-run=client -o json -f pod.yaml` }
  }
  // A Deployment, Job, …: its pod template is what the webhook will see.
  const spec = isObject(object) && isObject(object.spec) ? object.spec : undefined
  const template = spec !== undefined && isObject(spec.template) ? spec.template : undefined
  const pod = template === undefined ? object : { apiVersion: 'v1', kind: 'Pod', metadata: template.metadata ?? {}, spec: template.spec }
  let answer
  try {
    answer = answerReview({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: { uid: 'preview', kind: { group: '', version: 'v1', kind: 'Pod' }, operation: 'CREATE', object: pod, dryRun: true },
    }, settings)
  } catch (err) {
    return { code: 65, stdout: '', note: `stdin is not a Pod the webhook can read: ${(err as Error).message}` }
  }
  const { outcome } = answer
  if (outcome.kind === 'refused') return { code: 1, stdout: '', note: `refused: ${outcome.annotation}: ${outcome.message}` }
  const patched = outcome.kind === 'injected' ? applyAdds(pod as Json, outcome.patch) : pod as Json
  const result = template === undefined ? patched : { ...object as Json, spec: { ...spec, template: { metadata: patched.metadata, spec: patched.spec } } }
  const note = outcome.kind === 'injected' ? `injected (${settings.version})` : `not injected: ${outcome.reason}`
  return { code: 0, stdout: `${JSON.stringify(result, null, 2)}\n`, note }
}
