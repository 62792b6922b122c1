// scripts/validate-manifests.mjs: rendered Kubernetes objects checked
// offline, with no cluster, against the models of the npm packages
// kubernetes-models (built-in kinds), @kubernetes-models/prometheus-operator
// and @kubernetes-models/cert-manager (generated from their OpenAPI schemas).
// Run it through scripts/tools/validate-manifests.sh, which installs them
// (scripts/tools/package-lock.json) and passes their directory in COS_TOOLS_MODULES.
//
// Each object:
//   - is YAML that Kubernetes reads (YAML 1.1: `on` is a boolean; a key given
//     twice is an error), with apiVersion, kind and metadata.name
//   - appears once (apiVersion, kind, namespace, name)
//   - uses no API removed in --kube-version (default 1.29) or earlier
//   - has a model: a kind none of the packages knows fails (a typo, or a
//     custom resource nobody can check)
//   - passes the model's schema: types, required fields, enums, int32/int64
//   - has no field its type does not declare, at any depth: the schema
//     validators let unknown fields through (as a lenient API server would drop
//     them), so every mapping is walked beside its TypeScript type from the
//     package's .d.ts (TypeScript's checker; maps and free-form fields stay open)
//   - a CustomResourceDefinition: every version has a schema
//
// usage: node validate-manifests.mjs [--kube-version X.Y] [--quiet] FILE|- ...
// exit:  0 valid, 1 problems (one "FAIL file:line Kind/name: ..." line each), 2 usage
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const MODULES = process.env.COS_TOOLS_MODULES
if (!MODULES) { console.error('validate-manifests: COS_TOOLS_MODULES is not set (run validate-manifests.sh)'); process.exit(2) }
const fromTools = (file) => import(pathToFileURL(join(MODULES, 'node_modules', file)).href)

const argv = process.argv.slice(2)
let kube = '1.29'
let quiet = false
const files = []
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--kube-version') kube = String(argv[++i] ?? '').replace(/^v/, '')
  else if (argv[i] === '--quiet') quiet = true
  else if (argv[i].startsWith('--')) { console.error(`validate-manifests: unknown option ${argv[i]}`); process.exit(2) }
  else files.push(argv[i])
}
const kubeMinor = Number(/^1\.(\d+)$/.exec(kube)?.[1])
if (!Number.isInteger(kubeMinor)) { console.error(`validate-manifests: --kube-version ${kube}: want 1.N`); process.exit(2) }
if (files.length === 0) files.push('-')

const YAML = (await fromTools('yaml/dist/index.js')).default
const ts = (await fromTools('typescript/lib/typescript.js')).default

// --- the objects, each with the line of every path in its file -----------------
let problems = 0
const fail = (o, path, msg) => {
  problems++
  const line = o?.lines?.get(path) ?? o?.line ?? 0
  const who = o?.obj ? ` ${o.obj.kind ?? '?'}/${o.obj.metadata?.name ?? '?'}` : ''
  console.log(`FAIL ${o?.file ?? '?'}:${line}${who}: ${msg}`)
}

function linesOf (node, lc, prefix, into) {
  if (!node) return into
  if (node.range) into.set(prefix, lc.linePos(node.range[0]).line)
  if (YAML.isMap(node)) {
    for (const pair of node.items) {
      const path = `${prefix}/${YAML.isScalar(pair.key) ? String(pair.key.value) : String(pair.key)}`
      if (pair.key?.range) into.set(path, lc.linePos(pair.key.range[0]).line)
      if (pair.value) linesOf(pair.value, lc, path, into)
    }
  } else if (YAML.isSeq(node)) node.items.forEach((item, i) => linesOf(item, lc, `${prefix}/${i}`, into))
  return into
}

const objects = []
for (const file of files) {
  const name = file === '-' ? '<stdin>' : file
  let text
  try { text = readFileSync(file === '-' ? 0 : file, 'utf8') } catch (e) { fail({ file: name }, '', `cannot read: ${e.message}`); continue }
  const lc = new YAML.LineCounter()
  const docs = YAML.parseAllDocuments(text, {
    version: '1.1', uniqueKeys: true, lineCounter: lc,
    // Kubernetes keeps timestamps as strings
    customTags: tags => tags.filter(tag => tag.tag !== 'tag:yaml.org,2002:timestamp'),
  })
  for (const doc of docs) {
    const line = doc.contents?.range ? lc.linePos(doc.contents.range[0]).line : 1
    if (doc.errors.length > 0) {
      for (const e of doc.errors) fail({ file: name, line: lc.linePos(e.pos[0]).line }, '', `YAML: ${e.message.split('\n')[0]}`)
      continue
    }
    const obj = doc.toJS({ maxAliasCount: 50 })
    if (obj == null) continue
    if (typeof obj !== 'object' || Array.isArray(obj)) { fail({ file: name, line }, '', 'a document that is not a mapping'); continue }
    const lines = linesOf(doc.contents, lc, '', new Map())
    if (obj.kind === 'List' && Array.isArray(obj.items)) {
      obj.items.forEach((item, i) => objects.push({ file: name, line: lines.get(`/items/${i}`) ?? line, obj: item, lines: new Map([...lines].filter(([p]) => p.startsWith(`/items/${i}/`)).map(([p, l]) => [p.slice(`/items/${i}`.length), l])) }))
    } else objects.push({ file: name, line, obj, lines })
  }
}

// --- the model of each kind ------------------------------------------------------
const PACKAGES = { // API group -> package; the core group and the other built-in ones: kubernetes-models
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator',
  'cert-manager.io': '@kubernetes-models/cert-manager',
  'acme.cert-manager.io': '@kubernetes-models/cert-manager',
}
/** The version index module of an apiVersion ("apps/v1" -> kubernetes-models/apps/v1), or null. */
function versionModule (apiVersion) {
  const m = /^(?:([a-z0-9.-]+)\/)?(v[0-9]+(?:(?:alpha|beta)[0-9]+)?)$/.exec(apiVersion)
  if (!m) return null
  const [, group, version] = m
  return group ? `${PACKAGES[group] ?? 'kubernetes-models'}/${group}/${version}` : `kubernetes-models/${version}`
}
// The built-in APIs that stopped being served, with the minor version that removed
// them (the Kubernetes deprecated API migration guide); kubernetes-models still has them.
const REMOVED_IN = {
  'extensions/v1beta1': 22, 'apps/v1beta1': 16, 'apps/v1beta2': 16,
  'networking.k8s.io/v1beta1': 22, 'rbac.authorization.k8s.io/v1beta1': 22, 'rbac.authorization.k8s.io/v1alpha1': 22,
  'admissionregistration.k8s.io/v1beta1': 22, 'apiextensions.k8s.io/v1beta1': 22, 'apiregistration.k8s.io/v1beta1': 22,
  'authentication.k8s.io/v1beta1': 22, 'authorization.k8s.io/v1beta1': 22, 'certificates.k8s.io/v1beta1': 22,
  'coordination.k8s.io/v1beta1': 22, 'scheduling.k8s.io/v1beta1': 22, 'scheduling.k8s.io/v1alpha1': 22,
  'storage.k8s.io/v1beta1': 22, 'policy/v1beta1': 25, 'batch/v1beta1': 25, 'autoscaling/v2beta1': 25,
  'autoscaling/v2beta2': 26, 'discovery.k8s.io/v1beta1': 25, 'events.k8s.io/v1beta1': 25, 'node.k8s.io/v1beta1': 25,
  'flowcontrol.apiserver.k8s.io/v1beta1': 26, 'flowcontrol.apiserver.k8s.io/v1beta2': 29, 'flowcontrol.apiserver.k8s.io/v1beta3': 32,
}

const seen = new Map()
const typed = [] // { o, module, kind }: objects whose fields are walked below
for (const o of objects) {
  const { apiVersion, kind, metadata } = o.obj
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') { fail(o, '', 'no apiVersion or kind'); continue }
  if (typeof metadata?.name !== 'string' && typeof metadata?.generateName !== 'string') fail(o, '/metadata', 'no metadata.name')
  const id = [apiVersion, kind, metadata?.namespace ?? '', metadata?.name ?? ''].join(' ')
  if (seen.has(id)) fail(o, '', `the same object as at line ${seen.get(id)}`)
  else seen.set(id, o.line)
  const removed = REMOVED_IN[apiVersion]
  if (removed !== undefined && removed <= kubeMinor) fail(o, '/apiVersion', `${apiVersion} is not served since Kubernetes 1.${removed} (checked for ${kube})`)
  if (kind === 'CustomResourceDefinition') {
    for (const [i, v] of (o.obj.spec?.versions ?? []).entries()) {
      if (v?.schema?.openAPIV3Schema == null) fail(o, `/spec/versions/${i}`, `version ${v?.name}: no schema.openAPIV3Schema`)
    }
  }
  const module = versionModule(apiVersion)
  let Model
  if (module) {
    try { Model = (await fromTools(`${module}/index.js`))[kind] } catch (e) { if (e.code !== 'ERR_MODULE_NOT_FOUND') throw e }
  }
  if (typeof Model !== 'function' || Model.kind !== kind) { fail(o, '/kind', `no model of ${apiVersion} ${kind}: unknown kind, or a custom resource nothing here can check`); continue }
  try {
    new Model(o.obj).validate()
  } catch (e) {
    const errors = Array.isArray(e.errors) ? e.errors : []
    if (errors.length === 0) fail(o, '', `schema: ${e.message}`)
    for (const er of errors) {
      const detail = er.params?.allowedValues ? `: one of ${er.params.allowedValues.join(', ')}` : ''
      fail(o, er.instancePath, `schema: ${er.instancePath || '/'} ${er.message}${detail}`)
    }
  }
  typed.push({ o, module, kind })
}

// --- unknown fields: each mapping beside its declared type -----------------------
if (typed.length > 0) {
  const modules = [...new Set(typed.map(x => x.module))]
  const kinds = [...new Set(typed.map(x => `${modules.indexOf(x.module)} ${x.kind}`))]
  const source = [
    ...modules.map((m, i) => `import type * as M${i} from ${JSON.stringify(m)};`),
    ...kinds.map((k, i) => { const [m, kind] = k.split(' '); return `export type K${i} = M${m}.I${kind};` }),
  ].join('\n')
  const fileName = join(MODULES, '__manifest_types__.ts')
  const options = { noEmit: true, strict: true, skipLibCheck: true, types: [], target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler }
  const host = ts.createCompilerHost(options, true)
  const { getSourceFile, fileExists, readFile } = host
  host.getSourceFile = (f, ...rest) => f === fileName ? ts.createSourceFile(f, source, ts.ScriptTarget.ES2022, true) : getSourceFile.call(host, f, ...rest)
  host.fileExists = f => f === fileName || fileExists.call(host, f)
  host.readFile = f => f === fileName ? source : readFile.call(host, f)
  const program = ts.createProgram([fileName], options, host)
  const checker = program.getTypeChecker()
  const sf = program.getSourceFile(fileName)
  const broken = ts.getPreEmitDiagnostics(program, sf)
  if (broken.length > 0) {
    for (const d of broken) console.error(`validate-manifests: ${ts.flattenDiagnosticMessageText(d.messageText, ' ')}`)
    process.exit(2)
  }
  const aliasType = new Map()
  for (const st of sf.statements) if (ts.isTypeAliasDeclaration(st)) aliasType.set(st.name.text, checker.getTypeAtLocation(st.name))

  const OBJECTISH = ts.TypeFlags.Object | ts.TypeFlags.Intersection | ts.TypeFlags.NonPrimitive
  const OPEN = ts.TypeFlags.Any | ts.TypeFlags.Unknown | ts.TypeFlags.NonPrimitive
  const parts = t => (t.isUnion() ? t.types : [t])
  const walk = (o, value, type, path) => {
    const members = parts(checker.getNonNullableType(type))
    if (members.some(m => m.flags & OPEN)) return
    if (Array.isArray(value)) {
      const arrays = members.filter(m => checker.isArrayType(m) || checker.isTupleType(m))
      if (arrays.length === 0) return // a type mismatch: the schema said so
      value.forEach((item, i) => walk(o, item, checker.getIndexTypeOfType(arrays[0], ts.IndexKind.Number) ?? checker.getTypeArguments(arrays[0])[0], `${path}/${i}`))
      return
    }
    if (value === null || typeof value !== 'object') return
    const shapes = members.filter(m => (m.flags & OBJECTISH) && !checker.isArrayType(m))
    if (shapes.length === 0) return
    const index = shapes.map(m => checker.getIndexTypeOfType(m, ts.IndexKind.String)).find(Boolean)
    // `{}` and the like: no declared property and no index, so anything goes
    if (!index && shapes.every(m => checker.getPropertiesOfType(m).length === 0)) return
    for (const [key, v] of Object.entries(value)) {
      const prop = shapes.map(m => checker.getPropertyOfType(m, key)).find(Boolean)
      if (prop) walk(o, v, checker.getTypeOfSymbol(prop), `${path}/${key}`)
      else if (index) walk(o, v, index, `${path}/${key}`)
      else {
        const known = checker.getPropertiesOfType(shapes[0]).map(s => s.name)
        fail(o, `${path}/${key}`, `unknown field ${path}/${key} (${path || '/'} has ${known.slice(0, 12).join(', ')}${known.length > 12 ? ', …' : ''})`)
      }
    }
  }
  for (const { o, module, kind } of typed) {
    const type = aliasType.get(`K${kinds.indexOf(`${modules.indexOf(module)} ${kind}`)}`)
    walk(o, o.obj, type, '')
  }
}

const summary = problems > 0 ? `validate-manifests: ${problems} problem(s) in ${objects.length} object(s)` : `validate-manifests: ${objects.length} object(s) valid`
if (!quiet || problems > 0) console.log(summary)
else console.log(`   ${summary}`)
process.exit(problems > 0 ? 1 : 0)
