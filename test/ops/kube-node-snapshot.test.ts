// scripts/kube-node.sh compares the host with the snapshot `up` took, and
// `down` exits 1 naming anything left. Issue 43: the paths were listed in
// HOST_PATHS order and compared with the snapshot sorted, so on any machine
// where two of them existed before `up` in an order that is not sorted
// (/run/containerd, which containerd or Docker makes, and /etc/cni, which
// podman makes), `down` failed although it had left nothing. These run the
// script's own `snapshot` and `check` on paths in a temporary directory
// (COS_KUBE_HOST_PATHS), no cluster needed; a second or two each.
import { spawnSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'

const SCRIPT = join(import.meta.dirname, '../../scripts/kube-node.sh')

interface Host { dir: string, run: string, paths: readonly string[], env: NodeJS.ProcessEnv }

/** Host paths listed out of sorted order (z… before a…), both present, and a run directory. */
function host (t: Test): Host {
  const dir = mkdtempSync(join(tmpdir(), 'kube-snapshot-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const paths = [join(dir, 'z-run-containerd'), join(dir, 'a-etc-cni'), join(dir, 'm-made-by-up')]
  mkdirSync(paths[0] as string)
  mkdirSync(paths[1] as string)
  const run = join(dir, 'run')
  mkdirSync(run)
  return { dir, run, paths, env: { ...process.env, COS_KUBE_HOST_PATHS: paths.join(' ') } }
}

function script (h: Host, ...args: string[]): { status: number | null, stderr: string } {
  const r = spawnSync('bash', [SCRIPT, ...args], { env: h.env, encoding: 'utf8', timeout: 60_000 })
  return { status: r.status, stderr: r.stderr }
}

t.test('down does not fail when host paths existed before up in an order that is not sorted', async t => {
  const h = host(t)
  t.equal(script(h, 'snapshot', h.run).status, 0, 'snapshot taken')
  const listed = readFileSync(join(h.run, 'snapshot/paths'), 'utf8').trim().split('\n')
  t.same(listed, [h.paths[1], h.paths[0]], 'the snapshot lists the present paths, sorted')
  const check = script(h, 'check', h.run, 'paths')
  t.equal(check.status, 0, `an unchanged host passes (${check.stderr.trim()})`)
})

t.test('a snapshot written in HOST_PATHS order (before the fix) compares like with like', async t => {
  const h = host(t)
  t.equal(script(h, 'snapshot', h.run).status, 0, 'snapshot taken')
  writeFileSync(join(h.run, 'snapshot/paths'), `${h.paths[0] ?? ''}\n${h.paths[1] ?? ''}\n`)
  const check = script(h, 'check', h.run, 'paths')
  t.equal(check.status, 0, `the same paths in another order are the same host (${check.stderr.trim()})`)
})

t.test('a path left behind, or one removed, is still named', async t => {
  const h = host(t)
  t.equal(script(h, 'snapshot', h.run).status, 0, 'snapshot taken')
  mkdirSync(h.paths[2] as string)
  rmSync(h.paths[1] as string, { recursive: true })
  const check = script(h, 'check', h.run, 'paths')
  t.equal(check.status, 1, 'check exits 1')
  t.match(check.stderr, `> ${h.paths[2] ?? ''}`, 'names the path made since (>)')
  t.match(check.stderr, `< ${h.paths[1] ?? ''}`, 'names the path gone since (<)')
})

// test:compose (or this suite) may make a network namespace of its own while a
// node is up: that is not something `down` left (a cold CI run on a busy
// machine failed this way). The node's own names are compared: its namespace
// and the pods' (cni-*).
const canNetns = process.platform === 'linux' && spawnSync('ip', ['netns', 'list']).status === 0 && process.getuid?.() === 0
t.test('another job\'s network namespace made while the node is up is not counted as left by down', { skip: canNetns ? false : 'needs root and ip netns' }, async t => {
  const h = host(t)
  t.equal(script(h, 'snapshot', h.run).status, 0, 'snapshot taken')
  const other = `cos-compose-snapshot-test-${String(process.pid)}`
  t.teardown(() => { spawnSync('ip', ['netns', 'del', other]) })
  t.equal(spawnSync('ip', ['netns', 'add', other]).status, 0, 'another job makes a namespace')
  const check = script(h, 'check', h.run, 'mounts', 'netns')
  t.equal(check.status, 0, `not named as left (${check.stderr.trim()})`)
  const own = `cni-snapshot-test-${String(process.pid)}`
  t.teardown(() => { spawnSync('ip', ['netns', 'del', own]) })
  t.equal(spawnSync('ip', ['netns', 'add', own]).status, 0, 'a pod namespace (cni-*) is left')
  const left = script(h, 'check', h.run, 'netns')
  t.equal(left.status, 1, 'that one is named')
  t.match(left.stderr, `> ${own}`)
})
