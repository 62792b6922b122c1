// The SBOM of the image (scripts/sbom.mjs, issue 44): the packages esbuild put
// in dist/cos-auth-proxy.mjs and the Node runtime, not npm's dependency tree.
// Runs on the bundle `npm test` builds first (npx tap alone: `npm run build` before).
import { execFile } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { packagesOfMetafile, type Metafile } from '../../scripts/sbom.mjs'

const run = promisify(execFile)
const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const SCRIPT = join(ROOT, 'scripts/sbom.mjs')
const METAFILE = join(ROOT, 'dist/cos-auth-proxy.meta.json')
const BUNDLE = join(ROOT, 'dist/cos-auth-proxy.mjs')
const APP = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { name: string, version: string }
/** In the bundle, and missed by `npm sbom --omit dev` (issue 44). */
const MISSED_BY_NPM_SBOM = ['ajv', 'ajv-formats', 'fast-deep-equal', 'fast-uri', 'json-schema-traverse', 'semver', 'ws']

interface Component { type: string, 'bom-ref': string, name: string, version: string, purl: string, cpe?: string, hashes?: { alg: string, content: string }[], licenses?: { license?: { id?: string } }[] }
interface Bom {
  specVersion: string
  serialNumber: string
  metadata: { timestamp?: string, component: Component, properties: { name: string, value: string }[] }
  components: Component[]
  dependencies: { ref: string, dependsOn: string[] }[]
}

function tempDir (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'cos-sbom-'))
  t.teardown(() => { rmSync(dir, { recursive: true, force: true }) })
  return dir
}

async function sbom (args: string[]): Promise<{ text: string, bom: Bom }> {
  const { stdout } = await run(process.execPath, [SCRIPT, '--metafile', METAFILE, '--bundle', BUNDLE, ...args], { cwd: ROOT })
  return { text: stdout, bom: JSON.parse(stdout) as Bom }
}

const IMAGE = ['--node-version', '24.11.1', '--platform', 'linux/arm64']

/** The package directories of the files named by the bundle's source map: what esbuild wrote, read without the metafile. */
function packagesOfSourceMap (): Set<string> {
  const map = JSON.parse(readFileSync(`${BUNDLE}.map`, 'utf8')) as { sources: string[] }
  const dirs = new Set<string>()
  for (const source of map.sources) {
    const path = source.replace(/^(\.\.\/)+/, '')
    const last = [...path.matchAll(/(?<=^|\/)node_modules\/(?:@[^/]+\/)?[^/]+(?=\/)/g)].at(-1)
    if (last !== undefined) dirs.add(path.slice(0, last.index + last[0].length))
  }
  const ids = new Set<string>()
  for (const dir of dirs) {
    const pkg = JSON.parse(readFileSync(join(ROOT, dir, 'package.json'), 'utf8')) as { name: string, version: string }
    ids.add(`${pkg.name}@${pkg.version}`)
  }
  return ids
}

t.test('the metafile scripts/bundle.mjs writes beside the bundle accounts for the bundle', async t => {
  const meta = JSON.parse(readFileSync(METAFILE, 'utf8')) as Metafile
  t.equal(meta.outputs?.['dist/cos-auth-proxy.mjs']?.bytes, statSync(BUNDLE).size, 'its output is dist/cos-auth-proxy.mjs, byte for byte')
  t.ok(Object.keys(meta.inputs).some(i => i.startsWith('src/')), 'its inputs are the sources')
})

t.test('the SBOM lists exactly the packages in the bundle, with the ones npm sbom misses and none of the ones esbuild left out', async t => {
  const { bom } = await sbom(IMAGE)
  const npm = bom.components.filter(c => c.purl.startsWith('pkg:npm/'))
  const listed = new Set(npm.map(c => `${c.name}@${c.version}`))
  const inBundle = packagesOfSourceMap()
  t.same([...listed].sort(), [...inBundle].sort(), 'the same name@version set as the bundle\'s source map')
  t.equal(listed.size, npm.length, 'each package once')
  for (const name of MISSED_BY_NPM_SBOM) t.ok(npm.some(c => c.name === name), `${name} is listed`)
  // npm's production tree, as `npm sbom --omit dev` lists it: what is in it and not in the bundle must not be listed.
  const { stdout } = await run('npm', ['ls', '--omit', 'dev', '--all', '--parseable', '--long'], { cwd: ROOT, maxBuffer: 8 << 20 })
  const tree = new Set(stdout.split('\n').slice(1).map(l => l.split(':')[1]).filter((id): id is string => id !== undefined && id !== ''))
  const leftOut = [...tree].filter(id => !inBundle.has(id) && !id.startsWith(`${APP.name}@`))
  t.ok(leftOut.length > 0, `npm's production tree has packages esbuild left out (${leftOut.join(', ')})`)
  for (const id of leftOut) t.notOk(listed.has(id), `${id} (not in the bundle) is not listed`)
  for (const dev of ['esbuild', 'tap', 'typescript']) t.notOk(npm.some(c => c.name === dev), `${dev} (a devDependency) is not listed`)
  for (const c of npm) {
    t.equal(c['bom-ref'], c.purl, `${c.name}: bom-ref is the purl`)
    t.equal(c.purl, `pkg:npm/${c.name.replace(/^@/, '%40')}@${c.version}`, `${c.name}: purl`)
  }
  t.ok(npm.some(c => c.name.startsWith('@fastify/') && c.purl.startsWith('pkg:npm/%40fastify/')), 'a scoped package keeps its scope, %40-encoded in the purl')
  t.equal(npm.filter(c => c.name === 'fast-uri').length, 2, 'fast-uri twice: the top-level 3.x and the 4.x nested under node_modules/*/node_modules')
  t.ok(npm.every(c => c.licenses?.[0]?.license?.id !== undefined), 'every package has an SPDX licence id')
})

t.test('the SBOM describes the bundle, the Node runtime and the platform', async t => {
  const { bom } = await sbom(IMAGE)
  t.equal(bom.specVersion, '1.6')
  const app = bom.metadata.component
  t.match(app, { type: 'application', name: APP.name, version: APP.version })
  t.same(app.hashes, [{ alg: 'SHA-256', content: createHash('sha256').update(readFileSync(BUNDLE)).digest('hex') }], 'the bundle\'s sha-256')
  const node = bom.components.filter(c => c.name === 'node')
  t.same(node.map(c => [c.type, c.version, c.purl, c.cpe]), [['platform', '24.11.1', 'pkg:generic/node@24.11.1', 'cpe:2.3:a:nodejs:node.js:24.11.1:*:*:*:*:*:*:*']], 'the runtime, once')
  t.same(bom.metadata.properties, [{ name: 'cos-auth-proxy:platform', value: 'linux/arm64' }], 'the platform')
  const refs = new Set([app['bom-ref'], ...bom.components.map(c => c['bom-ref'])])
  t.ok(bom.dependencies.every(d => refs.has(d.ref) && d.dependsOn.every(r => refs.has(r))), 'dependencies name only components')
  t.ok(bom.dependencies.find(d => d.ref === app['bom-ref'])?.dependsOn.includes('pkg:generic/node@24.11.1'), 'the bundle depends on the runtime')
  t.ok(bom.dependencies.find(d => d.ref.startsWith('pkg:npm/ajv@'))?.dependsOn.some(r => r.startsWith('pkg:npm/fast-deep-equal@')), 'ajv depends on fast-deep-equal, as the bundle\'s imports say')
})

t.test('the same inputs give the same bytes; the serial number follows the content; a timestamp only when asked', async t => {
  const a = await sbom(IMAGE)
  const b = await sbom(IMAGE)
  t.equal(a.text, b.text, 'byte for byte')
  t.match(a.bom.serialNumber, /^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'a version-5 UUID URN')
  t.equal(a.bom.metadata.timestamp, undefined, 'no timestamp')
  const amd = await sbom(['--node-version', '24.11.1', '--platform', 'linux/amd64'])
  t.not(amd.bom.serialNumber, a.bom.serialNumber, 'another platform, another serial number')
  const dated = await sbom([...IMAGE, '--timestamp', '2026-05-01T12:00:00Z'])
  t.equal(dated.bom.metadata.timestamp, '2026-05-01T12:00:00.000Z', '--timestamp sets it')
  const dir = tempDir(t)
  await run(process.execPath, [SCRIPT, '--metafile', METAFILE, '--bundle', BUNDLE, ...IMAGE, '--out', join(dir, 'sbom.cdx.json')], { cwd: ROOT })
  t.equal(readFileSync(join(dir, 'sbom.cdx.json'), 'utf8'), a.text, '--out writes what stdout shows')
})

t.test('a missing or malformed argument is one line and exit 2', async t => {
  for (const [args, names] of [[['--node-version', '24.11.1'], '--platform'], [['--node-version', 'latest', '--platform', 'linux/arm64'], '--node-version'], [[...IMAGE, '--timestamp', 'yesterday'], '--timestamp']] as const) {
    const err = await run(process.execPath, [SCRIPT, '--metafile', METAFILE, '--bundle', BUNDLE, ...args], { cwd: ROOT }).then(() => undefined, (e: unknown) => e as { code: number, stderr: string, stdout: string })
    t.equal(err?.code, 2, `${names}: exit 2`)
    t.match(err?.stderr, new RegExp(`^sbom\\.mjs: ${names}[^\\n]*\\n$`), `${names}: one line naming it`)
    t.equal(err?.stdout, '', `${names}: nothing on stdout`)
  }
})

t.test('packagesOfMetafile: nested node_modules, scopes, esbuild namespaces, one entry per name@version', async t => {
  const root = tempDir(t)
  const pkg = (dir: string, json: Record<string, unknown>): void => {
    mkdirSync(join(root, dir), { recursive: true })
    writeFileSync(join(root, dir, 'package.json'), JSON.stringify(json))
  }
  pkg('node_modules/a', { name: 'a', version: '1.0.0', license: 'MIT' })
  pkg('node_modules/b', { name: 'b', version: '2.0.0', license: '(MIT OR Apache-2.0)' })
  pkg('node_modules/b/node_modules/a', { name: 'a', version: '3.0.0', license: 'ISC' })
  pkg('node_modules/c/node_modules/a', { name: 'a', version: '3.0.0', license: 'ISC' })
  pkg('node_modules/@s/d', { name: '@s/d', version: '0.1.0', licenses: [{ type: 'BSD-3-Clause' }] })
  pkg('node_modules/@s/d/lib', { type: 'module' }) // a package.json that is not a package's
  pkg('node_modules/e', { name: 'e', version: '1.0.0' })
  pkg('node_modules/unused', { name: 'unused', version: '1.0.0' })
  const meta: Metafile = {
    inputs: {
      'src/cli.ts': { imports: [{ path: 'node_modules/a/index.js' }, { path: 'node:fs', external: true }] },
      'node_modules/a/index.js': {},
      'node_modules/b/lib/x.js': {},
      'node_modules/b/node_modules/a/index.js': {},
      'node_modules/c/node_modules/a/index.js': {},
      'node_modules/@s/d/lib/y.js': {},
      'stand-in:node_modules/e/index.js': {},
      'precompiled-config:env-schema': {},
    },
  }
  t.same(packagesOfMetafile(meta, root), [
    { name: '@s/d', version: '0.1.0', license: 'BSD-3-Clause', purl: 'pkg:npm/%40s/d@0.1.0', dirs: ['node_modules/@s/d'] },
    { name: 'a', version: '1.0.0', license: 'MIT', purl: 'pkg:npm/a@1.0.0', dirs: ['node_modules/a'] },
    { name: 'a', version: '3.0.0', license: 'ISC', purl: 'pkg:npm/a@3.0.0', dirs: ['node_modules/b/node_modules/a', 'node_modules/c/node_modules/a'] },
    { name: 'b', version: '2.0.0', license: '(MIT OR Apache-2.0)', purl: 'pkg:npm/b@2.0.0', dirs: ['node_modules/b'] },
    { name: 'e', version: '1.0.0', license: undefined, purl: 'pkg:npm/e@1.0.0', dirs: ['node_modules/e'] },
  ])
  t.throws(() => packagesOfMetafile({ inputs: { 'node_modules/gone/index.js': {} } }, root), /node_modules\/gone: no package\.json/, 'a package that is not there is an error, not a gap')
})
