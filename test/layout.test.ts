// The layout stays what docs/development.md says it is: every folder its
// "Layout" section names exists and every folder of src/ is named there (with
// a README saying what it owns), every file it names exists, each folder is
// small enough to read in one sitting, no module is over 300 lines, tests
// sit in the folder of the same name, and src/'s imports have no cycle.
// bench/ is held to its own README the same way.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, normalize, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const SRC = join(ROOT, 'src')
const BENCH = join(ROOT, 'bench')
const MAX_FILES = 10
const MAX_LINES = 300
// Test folders that are not one src/ folder's: attacks through a real proxy,
// the operations docs against a real process, shared helpers, captured data,
// the release's fast checks (npm test), and the end-to-end suites (test/e2e/: tap
// files not in npm test, one folder per suite and one harness, held below to the
// same rules as src/).
const CROSS_CUTTING_TESTS = new Set(['security', 'ops', 'support', 'fixtures', 'release', 'e2e'])
const E2E = join(ROOT, 'test', 'e2e')

/** docs/development.md from "## Layout" to the next "## " heading. */
function layoutSection (): string {
  const text = readFileSync(join(ROOT, 'docs', 'development.md'), 'utf8')
  const start = text.indexOf('\n## Layout\n')
  if (start < 0) throw new Error('docs/development.md has no "## Layout" section')
  const end = text.indexOf('\n## ', start + 1)
  return text.slice(start, end < 0 ? undefined : end)
}

const dirs = (dir: string): string[] => readdirSync(dir, { withFileTypes: true }).filter(e => e.isDirectory()).map(e => e.name)
const modules = (dir: string): string[] => readdirSync(dir).filter(f => f.endsWith('.ts'))

/** Every src/ module, relative to src/. */
function allModules (dir = SRC): string[] {
  return [...modules(dir).map(f => relative(SRC, join(dir, f))), ...dirs(dir).flatMap(d => allModules(join(dir, d)))]
}

t.test('the folders docs/development.md names are the folders of src/, each with a README', async t => {
  const section = layoutSection()
  const named = new Set([...section.matchAll(/`src\/([\w-]+)\/`/g)].map(m => m[1] as string))
  const actual = dirs(SRC)
  t.ok(actual.length >= 5, `src/ has ${actual.length} folders`)
  for (const name of named) t.ok(actual.includes(name), `src/${name}/ (named in the layout) exists`)
  for (const name of actual) {
    t.ok(named.has(name), `src/${name}/ is named in docs/development.md's layout`)
    const readme = join(SRC, name, 'README.md')
    t.ok(existsSync(readme) && readFileSync(readme, 'utf8').trim().split('\n').length >= 2, `src/${name}/README.md says what the folder owns`)
  }
})

t.test('every file the layout names exists', async t => {
  const paths = [...layoutSection().matchAll(/`((?:src|test)\/[\w./-]+)`/g)].map(m => m[1] as string)
  t.ok(paths.length > 20, `${paths.length} paths named`)
  for (const p of paths) t.ok(existsSync(join(ROOT, p)), `${p} exists`)
})

t.test(`no folder of src/ holds more than ${MAX_FILES} modules, and no module is over ${MAX_LINES} lines`, async t => {
  for (const dir of ['', ...dirs(SRC)]) {
    const n = modules(join(SRC, dir)).length
    t.ok(n <= MAX_FILES, `src/${dir}${dir === '' ? '' : '/'}: ${n} modules`)
  }
  for (const file of allModules()) {
    const lines = readFileSync(join(SRC, file), 'utf8').replace(/\n$/, '').split('\n').length
    t.ok(lines <= MAX_LINES, `src/${file}: ${lines} lines`)
  }
})

t.test('each test folder is a src/ folder\'s, or one of the cross-cutting ones', async t => {
  const source = new Set(dirs(SRC))
  for (const name of dirs(join(ROOT, 'test'))) {
    t.ok(source.has(name) || CROSS_CUTTING_TESTS.has(name), `test/${name}/ matches src/${name}/`)
  }
})

t.test(`test/e2e/ is held to the same rules: each folder named in the layout, at most ${MAX_FILES} modules, none over ${MAX_LINES} lines, none in npm test`, async t => {
  const section = layoutSection()
  const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts
  const folders = dirs(E2E)
  t.ok(folders.includes('harness') && folders.length >= 5, `test/e2e/: ${folders.join(', ')}`)
  for (const name of folders) {
    t.ok(section.includes(`\`test/e2e/${name}/\``), `test/e2e/${name}/ is named in docs/development.md's layout`)
    const files = readdirSync(join(E2E, name)).filter(f => /\.(?:ts|mjs)$/.test(f))
    t.ok(files.length <= MAX_FILES, `test/e2e/${name}/: ${files.length} modules`)
    for (const file of files) {
      const lines = readFileSync(join(E2E, name, file), 'utf8').replace(/\n$/, '').split('\n').length
      t.ok(lines <= MAX_LINES, `test/e2e/${name}/${file}: ${lines} lines`)
      t.notOk(file.endsWith('.test.ts'), `test/e2e/${name}/${file} is not a *.test.ts (npm test runs those)`)
      if (file.endsWith('.e2e.ts')) t.ok(Object.values(scripts).some(s => s.includes(`tap --timeout=0 test/e2e/${name}/${file}`)), `test/e2e/${name}/${file} is run by an npm script, on tap`)
    }
  }
})

/** The src/ modules a module imports (type-only imports too), relative to src/. */
function importsOf (file: string): string[] {
  const text = readFileSync(join(SRC, file), 'utf8')
  const specs = [...text.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)'(\.\.?\/[^']+)\.js'/g)].map(m => m[1] as string)
  return specs.map(s => normalize(join(dirname(file), `${s}.ts`))).filter(f => !f.startsWith('..') && existsSync(join(SRC, f)) && statSync(join(SRC, f)).isFile())
}

/** One cycle among the imports, as a path, or undefined. */
function findCycle (graph: Map<string, string[]>): string[] | undefined {
  const state = new Map<string, 'open' | 'done'>()
  const stack: string[] = []
  const visit = (node: string): string[] | undefined => {
    if (state.get(node) === 'done') return undefined
    if (state.get(node) === 'open') return [...stack.slice(stack.indexOf(node)), node]
    state.set(node, 'open')
    stack.push(node)
    for (const next of graph.get(node) ?? []) {
      const cycle = visit(next)
      if (cycle !== undefined) return cycle
    }
    stack.pop()
    state.set(node, 'done')
    return undefined
  }
  for (const node of graph.keys()) {
    const cycle = visit(node)
    if (cycle !== undefined) return cycle
  }
  return undefined
}

t.test('src/\'s imports have no cycle', async t => {
  const graph = new Map(allModules().map(f => [f, importsOf(f)]))
  t.ok([...graph.values()].some(list => list.length > 0), 'imports were read')
  t.equal(findCycle(graph)?.join(' → '), undefined, 'no module imports itself through others')
  t.same(findCycle(new Map([['a', ['b']], ['b', ['c']], ['c', ['a']]])), ['a', 'b', 'c', 'a'], 'the cycle finder finds one')
})

t.test('src/\'s folders import one another one way only', async t => {
  const folderOf = (file: string): string => file.includes('/') ? file.slice(0, file.indexOf('/')) : '(top)'
  const graph = new Map<string, string[]>()
  for (const file of allModules()) {
    const from = folderOf(file)
    const to = importsOf(file).map(folderOf).filter(f => f !== from)
    graph.set(from, [...new Set([...(graph.get(from) ?? []), ...to])])
  }
  t.equal(findCycle(graph)?.join(' → '), undefined, 'no folder imports itself through others: the tree reads top-down')
})

/** Every .ts and .mjs file under bench/ but results/, relative to the repository. */
function benchFiles (dir = BENCH): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap(e => {
    const path = join(dir, e.name)
    if (e.isDirectory()) return path === join(BENCH, 'results') ? [] : benchFiles(path)
    return /\.(?:ts|mjs)$/.test(e.name) ? [relative(ROOT, path)] : []
  })
}

t.test(`bench/ is laid out as its README says, no file over ${MAX_LINES} lines`, async t => {
  const named = new Set([...readFileSync(join(BENCH, 'README.md'), 'utf8').matchAll(/`(bench\/[\w./-]+)`/g)].map(m => m[1] as string))
  t.ok(named.size > 20, `${named.size} paths named in bench/README.md`)
  for (const p of named) t.ok(existsSync(join(ROOT, p)), `${p} (named in bench/README.md) exists`)
  const files = benchFiles()
  t.ok(files.length > 20, `${files.length} files in bench/`)
  for (const file of files) {
    t.ok(named.has(file), `${file} is named in bench/README.md`)
    const lines = readFileSync(join(ROOT, file), 'utf8').replace(/\n$/, '').split('\n').length
    t.ok(lines <= MAX_LINES, `${file}: ${lines} lines`)
  }
})
