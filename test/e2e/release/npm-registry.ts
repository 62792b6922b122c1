// The npm package as a user gets it (issue 44): published to a registry on
// loopback (verdaccio, from scripts/tools/package-lock.json: no uplinks, so
// nothing is asked of the public registry; one user, added through its API,
// may publish cos-auth-proxy and nothing else), then `npx --yes
// cos-auth-proxy@<version> demo` from an empty directory with an empty npm
// cache and no user config, and a request through the demo's proxy answered
// 200. Counts the packages npx installed (the manifest has no dependencies:
// 1) and the seconds from npx's start to that answer. Stops every process
// it started (each in a process group of its own) and removes its
// temporary directories, however it ends.
//
// Used by test/e2e/release/release.e2e.ts (npm run test:release) inside a section; by hand:
//   node --import tsx test/e2e/release/npm-registry.ts --tgz dist/release/cos-auth-proxy-X.Y.Z-npm.tgz --version X.Y.Z
// (node scripts/npm-package.mjs --out DIR makes the tarball).
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join, resolve } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { ok, section } from '../harness/checks.js'
import { freePort, ROOT, seconds, sh, until } from '../harness/processes.js'
import { scaled } from '../../support/time-scale.js'

const PACKAGE = 'cos-auth-proxy'
const PUBLISHER = { name: 'release-test', password: 'release-test-only-password' }

/** The environment without npm's (npm run sets npm_config_* for its scripts) or the proxy's settings, plus `extra`. */
function cleanEnv (extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(npm_|cos_)/i.test(k)))
  // The Node this runs on first: npx's #!/usr/bin/env node, and the bin's, find it.
  env.PATH = [dirname(process.execPath), env.PATH ?? ''].join(delimiter)
  return { ...env, ...extra }
}

/** A child in a process group of its own, its output kept (the last 8 kB of each stream). */
function start (cmd: string, args: string[], opts: { cwd: string, env: NodeJS.ProcessEnv }): { child: ChildProcess, out: () => string, err: () => string, exited: Promise<number | null> } {
  const child = spawn(cmd, args, { ...opts, detached: true, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stdout.on('data', (b: Buffer) => { out = (out + b.toString()).slice(-8192) })
  child.stderr.on('data', (b: Buffer) => { err = (err + b.toString()).slice(-8192) })
  const exited = new Promise<number | null>(resolve => child.on('exit', code => { resolve(code) }))
  return { child, out: () => out, err: () => err, exited }
}

const groupAlive = (pid: number): boolean => {
  try { process.kill(-pid, 0); return true } catch { return false }
}

/** SIGTERM to the child's process group, SIGKILL after 10 s (scaled); true when nothing of the group is left. */
async function stopGroup (child: ChildProcess): Promise<boolean> {
  const pid = child.pid
  if (pid === undefined) return true
  try { process.kill(-pid, 'SIGTERM') } catch { return !groupAlive(pid) }
  const end = Date.now() + scaled(10_000)
  while (groupAlive(pid) && Date.now() < end) await sleep(100)
  if (groupAlive(pid)) { try { process.kill(-pid, 'SIGKILL') } catch { /* gone meanwhile */ } }
  for (let i = 0; i < 50 && groupAlive(pid); i++) await sleep(100)
  return !groupAlive(pid)
}

/** The proxy's address the demo prints on stderr; undefined when npx ends first or after 120 s (scaled). */
async function demoAddress (demo: ReturnType<typeof start>): Promise<string | undefined> {
  const end = Date.now() + scaled(120_000)
  while (Date.now() < end && demo.child.exitCode === null && demo.child.signalCode === null) {
    const address = /^\s*proxy\s+(http:\/\/\S+)/m.exec(demo.err())?.[1]
    if (address !== undefined) return address
    await sleep(100)
  }
  return undefined
}

/** verdaccio as scripts/tools/package-lock.json pins it, installed with npm ci --ignore-scripts (scripts/tools/common.sh). */
function verdaccioBin (): string {
  const r = sh('bash', ['-c', 'source "$0" && npm_tools', join(ROOT, 'scripts/tools/common.sh')], { timeoutMs: 600_000 })
  if (r.code !== 0) throw new Error(`npm_tools: ${r.stderr.trim().split('\n').slice(-3).join(' / ')}`)
  return join(r.stdout.trim(), 'node_modules/verdaccio/bin/verdaccio')
}

function verdaccioConfig (dir: string): string {
  const file = join(dir, 'config.yaml')
  writeFileSync(file, `# written by test/e2e/release/npm-registry.ts
storage: ${JSON.stringify(join(dir, 'storage'))}
auth:
  htpasswd:
    file: ${JSON.stringify(join(dir, 'htpasswd'))}
    max_users: 1
# No uplinks: a package not published here is a 404, never fetched from outside.
uplinks: {}
packages:
  '${PACKAGE}':
    access: $all
    publish: $authenticated
    unpublish: $authenticated
  '**':
    access: $all
    publish: nobody-publishes-this
web:
  enable: false
middlewares:
  audit:
    enabled: false
log: { type: stdout, format: json, level: warn }
`)
  return file
}

export async function npmFromRegistry (opts: { tgz: string, version: string }): Promise<void> {
  const tgz = resolve(opts.tgz)
  const work = mkdtempSync(join(tmpdir(), 'cos-release-npm-'))
  const started: ChildProcess[] = []
  try {
    const t0 = Date.now()
    const bin = verdaccioBin()
    const port = await freePort()
    const url = `http://127.0.0.1:${port}/`
    mkdirSync(join(work, 'registry'))
    const registry = start(process.execPath, [bin, '--config', verdaccioConfig(join(work, 'registry')), '--listen', `127.0.0.1:${port}`], { cwd: join(work, 'registry'), env: cleanEnv({}) })
    started.push(registry.child)
    await until(`verdaccio answering on ${url} (${registry.err().trim().split('\n').at(-1) ?? ''})`, scaled(60_000), () => fetch(`${url}-/ping`).then(r => r.status === 200 ? true : undefined, () => undefined), 200)
    ok(true, `verdaccio on 127.0.0.1:${port}, its storage in a temporary directory (${seconds(t0)})`)
    const outside = await fetch(`${url}left-pad`)
    ok(outside.status === 404, `no uplink: a package not published here is ${outside.status} (404), nothing fetched from outside`)

    const user = await fetch(`${url}-/user/org.couchdb.user:${PUBLISHER.name}`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: PUBLISHER.name, password: PUBLISHER.password }) })
    const { token } = await user.json() as { token?: string }
    ok(user.status === 201 && typeof token === 'string', `a publisher added through the registry's API (${user.status})`)
    const npmrc = join(work, 'publisher.npmrc')
    writeFileSync(npmrc, `//127.0.0.1:${port}/:_authToken=${token ?? ''}\n`, { mode: 0o600 })
    const publish = sh('npm', ['publish', tgz, '--registry', url, '--userconfig', npmrc, '--cache', join(work, 'publisher-cache')], { env: cleanEnv({ npm_config_update_notifier: 'false' }), timeoutMs: scaled(120_000) })
    ok(publish.code === 0, `npm publish ${tgz.replace(ROOT, '')} to it`, publish.stderr.trim().split('\n').slice(-5).join('\n'))
    const packument = await (await fetch(`${url}${PACKAGE}`)).json() as { versions?: Record<string, { dependencies?: unknown }> }
    const published = packument.versions?.[opts.version]
    ok(published !== undefined && published.dependencies === undefined, `the registry serves ${PACKAGE}@${opts.version}, without dependencies`)

    // The user: an empty directory, an empty cache, no npmrc, this registry.
    const empty = join(work, 'empty')
    const cache = join(work, 'npm-cache')
    mkdirSync(empty)
    const t1 = Date.now()
    const demo = start('npx', ['--yes', `${PACKAGE}@${opts.version}`, 'demo'], {
      cwd: empty,
      env: cleanEnv({
        HOME: join(work, 'home'),
        npm_config_cache: cache,
        npm_config_registry: url,
        npm_config_userconfig: join(work, 'no-user-npmrc'),
        npm_config_globalconfig: join(work, 'no-global-npmrc'),
        npm_config_update_notifier: 'false',
        npm_config_fund: 'false',
        npm_config_audit: 'false',
        COS_LISTEN_HOST: '127.0.0.1',
        COS_LISTEN_PORT: '0',
        COS_ADMIN_HOST: '127.0.0.1',
        COS_ADMIN_PORT: '0',
        COS_MOCK_HOST: '127.0.0.1',
        COS_LOG_FORMAT: 'json',
      }),
    })
    started.push(demo.child)
    const proxy = await demoAddress(demo)
    ok(proxy !== undefined, `npx --yes ${PACKAGE}@${opts.version} demo started (${seconds(t1)})`, demo.err().trim().split('\n').slice(-8).join('\n'))
    if (proxy === undefined) return
    const res = await fetch(`${proxy}/management/v1/clusters`)
    const answered = seconds(t1)
    ok(res.status === 200, `npx --yes ${PACKAGE}@${opts.version} demo from an empty directory and an empty cache: GET ${proxy}/management/v1/clusters through it: ${res.status} (200), ${answered} from npx's start`, await res.text())
    const installs = readdirSync(join(cache, '_npx'))
    const installed = installs.flatMap(d => Object.keys((JSON.parse(readFileSync(join(cache, '_npx', d, 'package-lock.json'), 'utf8')) as { packages: Record<string, unknown> }).packages).filter(p => p !== ''))
    ok(installs.length === 1 && installed.length === 1, `npx installed ${installed.length} package${installed.length === 1 ? '' : 's'} (1): ${installed.join(', ')}`)
  } finally {
    const left = []
    for (const child of started.reverse()) if (!await stopGroup(child)) left.push(child.pid)
    rmSync(work, { recursive: true, force: true })
    ok(left.length === 0, `verdaccio and npx stopped (no process left in their groups), temporary directories removed${left.length === 0 ? '' : `: left ${left.join(', ')}`}`)
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values } = parseArgs({ options: { tgz: { type: 'string' }, version: { type: 'string' } }, strict: true })
  if (values.tgz === undefined || values.version === undefined) {
    console.error('usage: node --import tsx test/e2e/release/npm-registry.ts --tgz FILE --version X.Y.Z')
    process.exit(2)
  }
  const { tgz, version } = values
  await section('the npm package, from a registry on loopback', async () => { await npmFromRegistry({ tgz, version }) })
}
