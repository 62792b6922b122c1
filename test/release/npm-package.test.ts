// The npm package of a release (scripts/npm-package.mjs, issue 44): the bundle
// with its map, notices, README and LICENSE, a manifest without dependencies,
// and a repository root that refuses to be published itself. Offline: npm is
// pointed at a closed loopback port, with a cache of its own.
// Runs on the bundle `npm test` builds first (npx tap alone: `npm run build` before).
import { execFile } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t from 'tap'

const run = promisify(execFile)
const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const APP = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { name: string, version: string, license: string }

interface Failure { code: number, stdout: string, stderr: string }
const outcome = async (p: Promise<{ stdout: string, stderr: string }>): Promise<Failure> =>
  await p.then(r => ({ code: 0, ...r }), (e: unknown) => e as Failure)

const work = mkdtempSync(join(tmpdir(), 'cos-npm-package-test-'))
t.teardown(() => { rmSync(work, { recursive: true, force: true }) })

/** A loopback port nothing listens on: any request npm makes is refused at once. */
async function closedPort (): Promise<number> {
  const s = createServer()
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  const { port } = s.address() as { port: number }
  await new Promise<void>(resolve => s.close(() => { resolve() }))
  return port
}
const NPM_ENV = {
  ...process.env,
  npm_config_registry: `http://127.0.0.1:${await closedPort()}/`,
  npm_config_cache: join(work, 'npm-cache'),
  npm_config_userconfig: join(work, 'no-npmrc'),
  npm_config_fetch_retries: '0',
  npm_config_update_notifier: 'false',
  npm_config_audit: 'false',
  npm_config_fund: 'false',
}

const packed = await run(process.execPath, [join(ROOT, 'scripts/npm-package.mjs'), '--out', join(work, 'out')], { cwd: ROOT, env: NPM_ENV })
const tgz = packed.stdout.trim().split('\n').at(-1) ?? ''
await run('tar', ['-xzf', tgz, '-C', work])
const PACKAGE = join(work, 'package')
const manifest = JSON.parse(readFileSync(join(PACKAGE, 'package.json'), 'utf8')) as Record<string, unknown>

t.test('the tarball holds the bundle, its map, its licence notices, README.md, LICENSE and the manifest: nothing else', async t => {
  t.equal(tgz, join(work, 'out', `cos-auth-proxy-${APP.version}-npm.tgz`), 'the last line of stdout is its path, named apart from the chart\'s cos-auth-proxy-<version>.tgz')
  const { stdout } = await run('tar', ['-tzf', tgz])
  t.same(stdout.trim().split('\n').sort(), [
    'package/LICENSE',
    'package/README.md',
    'package/dist/cos-auth-proxy.licenses.txt',
    'package/dist/cos-auth-proxy.mjs',
    'package/dist/cos-auth-proxy.mjs.map',
    'package/package.json',
  ])
  t.equal(readFileSync(join(PACKAGE, 'dist/cos-auth-proxy.mjs'), 'utf8'), readFileSync(join(ROOT, 'dist/cos-auth-proxy.mjs'), 'utf8'), 'the bundle is the one built')
})

t.test('the manifest has no dependencies, no scripts, no tool config and is not private', async t => {
  for (const field of ['dependencies', 'devDependencies', 'optionalDependencies', 'peerDependencies', 'bundleDependencies', 'scripts', 'tap', 'files', 'private', 'overrides']) {
    t.notOk(field in manifest, `no ${field}`)
  }
  t.match(manifest, { name: 'cos-auth-proxy', version: APP.version, license: 'Apache-2.0', type: 'module', bin: { 'cos-auth-proxy': 'dist/cos-auth-proxy.mjs' }, engines: { node: '>=22' } })
  t.match(manifest.repository, { type: 'git', url: /^git\+https:\/\/github\.com\/cos-auth-proxy\/cos-auth-proxy\.git$/ }, 'a repository (npm provenance checks it against the workflow\'s)')
})

t.test('LICENSE is the Apache License 2.0 that package.json names', async t => {
  const text = readFileSync(join(PACKAGE, 'LICENSE'), 'utf8')
  t.equal(APP.license, 'Apache-2.0')
  t.match(text, /^\s*Apache License\s+Version 2\.0, January 2004\s+http:\/\/www\.apache\.org\/licenses\//)
  t.match(text, /END OF TERMS AND CONDITIONS/, 'the full text')
  t.equal(text, readFileSync(join(ROOT, 'LICENSE'), 'utf8'), 'the repository\'s LICENSE')
})

t.test('the packed bin answers --version with package.json\'s version, with no node_modules', async t => {
  // Run as npm links it: the file itself, through its #! line (tar kept its mode).
  const { stdout } = await run(join(PACKAGE, 'dist/cos-auth-proxy.mjs'), ['--version'], { cwd: PACKAGE, env: { ...process.env, NODE_PATH: '' } })
  t.equal(stdout.trim(), `cos-auth-proxy ${APP.version}`)
})

t.test('publishing the repository root is refused before anything leaves the machine; the staged package is not', async t => {
  const root = await outcome(run('npm', ['publish', '--dry-run'], { cwd: ROOT, env: NPM_ENV }))
  t.not(root.code, 0, 'npm publish --dry-run at the root fails')
  t.match(root.stderr, /the repository root is not the npm package.*scripts\/release\.sh/, 'saying why, and what publishes')
  t.notMatch(root.stderr, /ECONNREFUSED|Publishing to/, 'before npm talks to any registry')
  const staged = await outcome(run('npm', ['publish', '--dry-run', tgz], { cwd: ROOT, env: NPM_ENV }))
  t.equal(staged.code, 0, `the packed tarball passes the same dry run, even from the root (${staged.stderr.trim().split('\n').at(-1) ?? ''})`)
  t.match(staged.stdout, `+ cos-auth-proxy@${APP.version}`)
})
