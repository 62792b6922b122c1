// The documentation stays true to the code: docs/configuration.md documents
// exactly the settings the configuration accepts, and the relative links of
// README.md and docs/*.md lead to files (and headings) that exist.
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { parseAllDocuments } from 'yaml'
import { VARIABLES } from '../src/config/config.js'
import { INJECT_VARIABLES } from '../src/inject/config.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const CONFIGURATION = join(ROOT, 'docs', 'configuration.md')
const ACCEPTED = new Set([...Object.keys(VARIABLES), ...Object.keys(INJECT_VARIABLES)])
const MARKDOWN = [join(ROOT, 'README.md'), ...readdirSync(join(ROOT, 'docs')).filter(f => f.endsWith('.md')).map(f => join(ROOT, 'docs', f))]

/** The text outside fenced code blocks, line by line (a link or heading inside a block is an example). */
function prose (text: string): string[] {
  let fenced = false
  return text.split('\n').filter(line => {
    if (/^\s*(```|~~~)/.test(line)) {
      fenced = !fenced
      return false
    }
    return !fenced
  })
}

/** The names in backticks in the first cell of every table row: the variables a table documents. */
function tableVariables (text: string): string[] {
  return prose(text)
    .filter(line => line.startsWith('|') && !/^\|\s*:?-/.test(line))
    .flatMap(line => [...(line.split('|')[1] ?? '').matchAll(/`([A-Za-z_][A-Za-z0-9_]*)`/g)].map(m => m[1] as string))
}

t.test('every variable the configuration accepts is documented in a table of docs/configuration.md', async t => {
  const documented = new Set(tableVariables(readFileSync(CONFIGURATION, 'utf8')))
  for (const name of ACCEPTED) t.ok(documented.has(name), `${name} is documented`)
})

t.test('every variable documented in docs/configuration.md is one the configuration accepts', async t => {
  const text = readFileSync(CONFIGURATION, 'utf8')
  const listed = tableVariables(text)
  t.ok(listed.length >= ACCEPTED.size, `the tables list ${listed.length} names`)
  for (const name of listed) t.ok(ACCEPTED.has(name), `${name} (a table row) is accepted`)
  t.same(listed.filter((name, i) => listed.indexOf(name) !== i), [], 'no variable documented twice')
  // Any COS_ name in the prose too, except patterns such as COS_SHUTDOWN_* or COS_*_ALLOWED_METHODS.
  const mentioned = new Set(prose(text).flatMap(line => [...line.matchAll(/\bCOS_[A-Z0-9]+(?:_[A-Z0-9]+)*\b(?![_*])/g)].map(m => m[0])))
  for (const name of mentioned) t.ok(ACCEPTED.has(name), `${name} (mentioned) is accepted`)
})

t.test('the settings table of README.md names only accepted variables', async t => {
  const listed = tableVariables(readFileSync(join(ROOT, 'README.md'), 'utf8')).filter(name => name.startsWith('COS_'))
  t.ok(listed.length >= 10, `the README lists ${listed.length} settings`)
  for (const name of listed) t.ok(ACCEPTED.has(name), `${name} is accepted`)
})

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2, … */
function anchors (text: string): Set<string> {
  const seen = new Map<string, number>()
  const out = new Set<string>()
  for (const line of prose(text)) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1]
    if (heading === undefined) continue
    const slug = heading.toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').trim().replace(/\s/g, '-')
    const n = seen.get(slug) ?? 0
    seen.set(slug, n + 1)
    out.add(n === 0 ? slug : `${slug}-${n}`)
  }
  return out
}

/** Inline links and images, [text](target) or [text](target "title"), outside code blocks and code spans. */
function links (text: string): string[] {
  return prose(text).flatMap(line => [...line.replace(/`[^`]*`/g, '').matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map(m => m[1] as string))
}

t.test('relative links in README.md and docs/*.md lead to files that exist, and anchors to headings that exist', async t => {
  let checked = 0
  for (const file of MARKDOWN) {
    const name = relative(ROOT, file)
    for (const link of links(readFileSync(file, 'utf8'))) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue // https:, mailto:
      const [path = '', fragment] = link.split('#', 2)
      const target = path === '' ? file : join(dirname(file), decodeURIComponent(path))
      checked++
      t.ok(target.startsWith(ROOT), `${name}: ${link} stays inside the repository`)
      if (!existsSync(target)) {
        t.fail(`${name}: ${link} points at ${relative(ROOT, target)}, which does not exist`)
        continue
      }
      if (fragment !== undefined && target.endsWith('.md')) {
        t.ok(anchors(readFileSync(target, 'utf8')).has(fragment), `${name}: ${link}: ${relative(ROOT, target)} has a heading #${fragment}`)
      }
    }
  }
  t.ok(checked > 20, `${checked} relative links checked`)
})

t.test('the link checker reads GitHub\'s anchors and skips code', async t => {
  t.same([...anchors('# Kubernetes\n## The `inject` webhook\n## Drain\n### Drain\n```\n# not a heading\n```\n')], ['kubernetes', 'the-inject-webhook', 'drain', 'drain-1'])
  t.same(links('see [a](a.md) and [b](../b.md#x "t")\n`[c](c.md)`\n```\n[d](d.md)\n```\n[e](https://x)'), ['a.md', '../b.md#x', 'https://x'])
})

/**
 * The code blocks of a Markdown file marked `<!-- snippet: path -->`: each
 * is an excerpt of that file, its runs of lines between `# …` markers
 * verbatim and in order.
 */
function snippets (text: string): Array<{ path: string, runs: string[][] }> {
  const out: Array<{ path: string, runs: string[][] }> = []
  for (const m of text.matchAll(/<!-- snippet: (\S+) -->\n```[a-z]*\n([\s\S]*?)\n```/g)) {
    const runs: string[][] = [[]]
    for (const line of (m[2] as string).split('\n')) {
      if (line.trim() === '# …') runs.push([])
      else (runs.at(-1) as string[]).push(line.trimEnd())
    }
    out.push({ path: m[1] as string, runs: runs.filter(run => run.length > 0) })
  }
  return out
}

/** Where the run of lines starts in lines, at or after from; -1 when it is not there. */
function findRun (lines: string[], run: string[], from: number): number {
  for (let i = from; i + run.length <= lines.length; i++) {
    if (run.every((line, j) => lines[i + j] === line)) return i
  }
  return -1
}

/** The lines of the example's pod template that put the proxy into the pod: both branches, their ends, the volumes. */
function proxyPlacing (lines: string[]): string[] {
  return lines.filter((line, i) => /sidecar\.native|sidecar\.container|sidecar\.volumes/.test(line) ||
    (/^\s*\{\{-? end -?\}\}$/.test(line) && /sidecar\.container/.test(lines[i - 1] ?? '')))
}

const SNIPPETS: Record<string, string[]> = {
  'README.md': ['examples/sidecar-parent-chart/Chart.yaml', 'examples/sidecar-parent-chart/values.yaml', 'examples/sidecar-parent-chart/templates/deployment.yaml'],
  'docs/kubernetes.md': ['examples/sidecar-parent-chart/Chart.yaml', 'examples/sidecar-parent-chart/templates/deployment.yaml'],
}

t.test('the chart snippets of README.md and docs/kubernetes.md are the example parent chart\'s own lines, in order, both sidecar branches included', async t => {
  for (const [doc, paths] of Object.entries(SNIPPETS)) {
    const found = snippets(readFileSync(join(ROOT, doc), 'utf8'))
    t.same(found.map(s => s.path), paths, `${doc}: the pieces a parent chart needs`)
    for (const { path, runs } of found) {
      const lines = readFileSync(join(ROOT, path), 'utf8').split('\n').map(line => line.trimEnd())
      let at = 0
      for (const run of runs) {
        const i = findRun(lines, run, at)
        t.ok(i >= 0, `${doc}: ${path}: "${run[0] ?? ''}" and the ${run.length - 1} lines after it are there, in order`)
        if (i >= 0) at = i + run.length
      }
      // An excerpt that leaves out the plain-container branch renders no proxy with sidecar.native=false.
      if (path.endsWith('deployment.yaml')) {
        const placing = proxyPlacing(lines)
        t.ok(placing.length >= 7, `${path}: ${placing.length} lines place the proxy`)
        t.same(proxyPlacing(runs.flat()), placing, `${doc}: the excerpt keeps every line that places the proxy (native and plain branches, the volumes)`)
      }
    }
  }
  t.equal(findRun(['a', 'b', 'c'], ['b', 'c'], 0), 1, 'a run is found where it is')
  t.equal(findRun(['a', 'b', 'c'], ['c', 'b'], 0), -1, 'and not when out of order')
  const withoutPlain = ['{{- if $cos.Values.sidecar.native }}', '{{- include "cos-auth-proxy.sidecar.container" $cos | nindent 8 }}', '{{- end }}', '{{- include "cos-auth-proxy.sidecar.volumes" $cos | nindent 8 }}']
  t.equal(proxyPlacing(withoutPlain).length, 4, 'the check sees an excerpt with the native branch only as four lines, short of the template\'s')
})

/** The expression of a rule in a PrometheusRule template, Helm's actions taken out. */
function ruleExpression (template: string, alert: string): string | undefined {
  const plain = template.replace(/\{\{-?[\s\S]*?-?\}\}/g, '')
  return new RegExp(`- alert: ${alert}\\n\\s+expr: (.*)`).exec(plain)?.[1]
}

t.test('docs/kubernetes.md quotes the fail-open alert\'s expression as the chart has it', async t => {
  const expr = ruleExpression(readFileSync(join(ROOT, 'helm/cos-auth-proxy/templates/prometheusrule.yaml'), 'utf8'), 'CosAuthProxyInjectorFailOpen')
  t.ok(expr?.includes('apiserver_admission_webhook_fail_open_count') === true, `the chart's expression: ${expr ?? 'none'}`)
  // test:kubernetes (doc blocks) holds the same quote against what helm renders.
  t.ok(readFileSync(join(ROOT, 'docs/kubernetes.md'), 'utf8').includes(`(\`${expr ?? '?'}\`)`), 'docs/kubernetes.md quotes it whole')
})

t.test('the example chart, rendered in both modes by CI, puts the proxy where each mode needs it', async t => {
  // rendered/*.yaml are held current by scripts/ci-packaging.sh (helm-check).
  for (const mode of ['native', 'plain'] as const) {
    const docs = parseAllDocuments(readFileSync(join(ROOT, 'examples/sidecar-parent-chart/rendered', `${mode}.yaml`), 'utf8')).map(d => d.toJS() as { kind?: string, spec?: { template?: { spec?: PodSpec } } })
    const pod = docs.find(d => d.kind === 'Deployment')?.spec?.template?.spec
    if (pod === undefined) {
      t.fail(`${mode}: a Deployment`)
      continue
    }
    // The proxy by its image (ci/plain-values.yaml names its container auth-proxy).
    const isProxy = (c: Container): boolean => c.image.includes('/cos-auth-proxy:')
    const init = (pod.initContainers ?? []).find(isProxy)
    const plain = pod.containers.find(isProxy)
    if (mode === 'native') {
      t.equal(init?.restartPolicy, 'Always', 'native: an init container with restartPolicy Always (a native sidecar)')
      t.equal(plain, undefined, 'native: not also a plain container')
    } else {
      t.equal(init, undefined, 'plain: never a classic init container (it would never exit)')
      t.ok(plain, 'plain: a container beside the app')
      t.equal(plain?.restartPolicy, undefined, 'plain: no container-level restartPolicy')
    }
    t.ok(pod.containers.some(c => c.name === 'app'), `${mode}: the app is there`)
  }
})

interface Container { name: string, image: string, restartPolicy?: string }
interface PodSpec { initContainers?: Container[], containers: Container[] }

t.test('the Node versions the README states are the ones package.json accepts and CI runs the suite on', async t => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } }
  t.equal(pkg.engines.node, '>=22', 'engines: the oldest supported is 22')
  t.match(readFileSync(join(ROOT, 'README.md'), 'utf8'), /Node 22 or 24 \(CI tests both/, 'the README says 22 or 24')
  t.match(readFileSync(join(ROOT, '.ci/run'), 'utf8'), /scripts\/node-runtime\.sh 22/, 'CI runs npm test on 22')
  t.match(readFileSync(join(ROOT, 'scripts/ci-packaging.sh'), 'utf8'), /node24-tests/, 'and again on 24')
})
