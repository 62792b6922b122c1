// scripts/kube-control-plane.sh keeps a pointer to the last plain run in
// $COS_KUBE_CACHE/current-run, so that a plain `stop` finds it. A run given by
// COS_KUBE_RUN (test/e2e/kubernetes/kubernetes.e2e.ts, kube-node.sh's control plane) must leave
// that pointer alone: before issue 37 its `start` rewrote it, and a plain `stop`
// elsewhere then stopped the wrong cluster (and its `clean` deleted the pointer).
//
// No built control plane needed: the cache holds stand-in binaries that exit at
// once, so `start` gets as far as launching etcd (the run directory made, the
// pointer decided, the throwaway PKI written) and then fails, stopping what it
// recorded. About 2 s, openssl and curl only; nothing is left running.
import { spawnSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'

const SCRIPT = join(import.meta.dirname, '../../scripts/kube-control-plane.sh')
const VERSION = 'v0.0.0-pointer-test'

async function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const address = s.address()
      s.close(() => {
        if (typeof address === 'object' && address !== null) resolve(address.port)
        else reject(new Error('no port'))
      })
    })
  })
}

/** A cache whose binaries are stand-ins that exit 3, and the env that points the script at it. */
async function sandbox (t: Test): Promise<{ dir: string, cache: string, env: NodeJS.ProcessEnv }> {
  const dir = mkdtempSync(join(tmpdir(), 'kube-pointer-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const cache = join(dir, 'cache')
  const bin = join(cache, VERSION, 'bin')
  mkdirSync(bin, { recursive: true })
  for (const name of ['etcd', 'kube-apiserver', 'kube-controller-manager']) {
    writeFileSync(join(bin, name), '#!/bin/sh\nexit 3\n')
    chmodSync(join(bin, name), 0o755)
  }
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    COS_KUBE_CACHE: cache,
    COS_KUBE_VERSION: VERSION,
    COS_KUBE_PORT: String(await freePort()),
    COS_KUBE_ETCD_PORT: String(await freePort()),
    COS_KUBE_KCM_PORT: String(await freePort()),
    TMPDIR: dir,
  }
  delete env.COS_KUBE_RUN
  return { dir, cache, env }
}

function run (command: string, env: NodeJS.ProcessEnv): { code: number | null, out: string } {
  const r = spawnSync('bash', [SCRIPT, command], { env, encoding: 'utf8', timeout: 60_000 })
  return { code: r.status, out: `${r.stdout}${r.stderr}` }
}

const pointer = (cache: string): string | undefined =>
  existsSync(join(cache, 'current-run')) ? readFileSync(join(cache, 'current-run'), 'utf8').trim() : undefined

t.test('a run given by COS_KUBE_RUN leaves the current-run pointer alone (a plain stop elsewhere would stop the wrong cluster)', async t => {
  const { dir, cache, env } = await sandbox(t)
  const other = join(dir, 'the-plain-run')
  writeFileSync(join(cache, 'current-run'), `${other}\n`)
  const mine = join(dir, 'my-run')
  const started = run('start', { ...env, COS_KUBE_RUN: mine })
  t.not(started.code, 0, 'start fails at the stand-in etcd')
  t.match(started.out, /etcd exited/, 'and says so')
  t.ok(existsSync(join(mine, 'pki', 'ca.crt')), 'after making its run directory and PKI')
  t.equal(pointer(cache), other, 'the pointer still names the plain run')

  const cleaned = run('clean', { ...env, COS_KUBE_RUN: mine })
  t.equal(cleaned.code, 0, 'clean of the given run')
  t.notOk(existsSync(mine), 'deletes the given run directory')
  t.equal(pointer(cache), other, 'and not the pointer of the plain run')
})

t.test('a plain start records its run, so a plain stop and clean find it', async t => {
  const { dir, cache, env } = await sandbox(t)
  const started = run('start', env)
  t.not(started.code, 0, 'start fails at the stand-in etcd')
  const made = readdirSync(dir).filter(name => name.startsWith('cos-kube.'))
  t.equal(made.length, 1, 'one run directory made under TMPDIR')
  t.equal(pointer(cache), join(dir, made[0] ?? ''), 'the pointer names it')

  const cleaned = run('clean', env)
  t.equal(cleaned.code, 0, 'a plain clean')
  t.notOk(existsSync(join(dir, made[0] ?? '')), 'deletes that run directory')
  t.equal(pointer(cache), undefined, 'and the pointer that named it')
})
