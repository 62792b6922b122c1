// scripts/lib/common.sh's undo journal, which scripts/kube-node.sh's `up` and
// scripts/kube-control-plane.sh's `start` write and their `down`/`stop` (and a
// failed bring-up) replay (issue 45): each step appends its own inverse as soon
// as it has succeeded, and the replay runs them newest first. Stub steps that
// make files and note their undoing stand in for the namespace, containerd and
// the daemons: no cluster, no root, a second or so each. Also the library's
// zombie-aware `alive` (`kill -0` succeeds on a zombie) and its `render`.
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'

const LIB = join(import.meta.dirname, '../../scripts/lib/common.sh')

interface Bash { status: number | null, stdout: string, stderr: string }

/** A scratch directory, and a bash script run in it that sources the library. */
function sandbox (t: Test): { dir: string, bash: (script: string, opts?: { timeoutMs?: number }) => Bash, notes: () => string[] } {
  const dir = mkdtempSync(join(tmpdir(), 'kube-journal-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  // step N makes file N and journals its inverse: note the undoing, remove the file
  const prelude = `set -euo pipefail
LOG_TAG=stub
. ${JSON.stringify(LIB)}
cd ${JSON.stringify(dir)}
JOURNAL=$PWD/journal
note() { printf '%s\\n' "$*" >>notes; }
step() { touch "made-$1"; note "did $1"; journal note "undo $1"; journal rm -f "made-$1"; }
`
  const bash = (script: string, opts: { timeoutMs?: number } = {}): Bash => {
    const r = spawnSync('bash', ['-c', prelude + script], { encoding: 'utf8', timeout: opts.timeoutMs ?? 30_000 })
    return { status: r.status, stdout: r.stdout, stderr: r.stderr }
  }
  const notes = (): string[] => existsSync(join(dir, 'notes')) ? readFileSync(join(dir, 'notes'), 'utf8').trim().split('\n') : []
  return { dir, bash, notes }
}

t.test('the journal replays newest first, and a second replay finds nothing left to undo', async t => {
  const { dir, bash, notes } = sandbox(t)
  const up = bash('on_failure undo; step one; step two; step three; step four; on_failure -')
  t.equal(up.status, 0, `the bring-up succeeds (${up.stderr.trim()})`)
  t.same(notes(), ['did one', 'did two', 'did three', 'did four'])
  t.ok(existsSync(join(dir, 'made-four')), 'and what it made stays up')

  const down = bash('undo')
  t.equal(down.status, 0, `the replay succeeds (${down.stderr.trim()})`)
  t.same(notes().slice(4), ['undo four', 'undo three', 'undo two', 'undo one'], 'the inverses ran newest first')
  for (const n of ['one', 'two', 'three', 'four']) t.notOk(existsSync(join(dir, `made-${n}`)), `made-${n} is gone`)
  t.notOk(existsSync(join(dir, 'journal')), 'the journal is consumed')
  t.ok(existsSync(join(dir, 'journal.undone')), 'and kept as journal.undone')

  const again = bash('undo')
  t.equal(again.status, 0, 'a second replay succeeds')
  t.equal(notes().length, 8, 'and undoes nothing twice')
})

t.test('a failing step in the middle of up undoes exactly the steps before it', async t => {
  const { dir, bash, notes } = sandbox(t)
  // the third step makes its file, then fails before it has succeeded: its inverse was never journaled
  const up = bash('on_failure undo; step one; step two; touch made-three; (exit 7); step four; on_failure -')
  t.equal(up.status, 7, 'up exits with the failing command\'s status')
  t.same(notes(), ['did one', 'did two', 'undo two', 'undo one'], 'the two steps before it undone, newest first; the step after it never ran')
  t.notOk(existsSync(join(dir, 'made-one')), 'made-one is gone')
  t.notOk(existsSync(join(dir, 'made-two')), 'made-two is gone')
  t.ok(existsSync(join(dir, 'made-three')), 'the failed step\'s own leftover is not touched by another\'s inverse')
  t.notOk(existsSync(join(dir, 'made-four')), 'the step after it did nothing')

  const died = sandbox(t)
  const r = died.bash('on_failure undo; step one; die "the second step cannot"; step two')
  t.equal(r.status, 1, 'die exits 1')
  t.match(r.stderr, '[stub] ERROR: the second step cannot')
  t.same(died.notes(), ['did one', 'undo one'], 'and what was done before it is undone')
})

t.test('an interrupted bring-up undoes its steps and says so on its own stderr, not in a redirected step\'s file', async t => {
  const { dir, bash, notes } = sandbox(t)
  // the INT arrives while a function runs with its output redirected (kube-node.sh's control-plane
  // step: `in_ns bash kube-control-plane.sh start >control-plane.out 2>&1`)
  const up = bash(`on_failure undo; step one; journal log "undoing one"
f() { "$@"; }
( sleep 0.3; kill -INT $$ ) &
f sleep 2 >redirected.out 2>&1
step two`)
  t.equal(up.status, 130, 'exits 130')
  t.same(notes(), ['did one', 'undo one'], 'the step before the interruption undone')
  t.match(up.stderr, '[stub] undoing one', 'the inverses log to the script\'s own stderr')
  t.notMatch(readFileSync(join(dir, 'redirected.out'), 'utf8'), 'undoing', 'not into the step\'s redirection')
})

t.test('an inverse that fails does not stop the ones before it, and the replay says so', async t => {
  const { bash, notes } = sandbox(t)
  const up = bash('step one; journal false; step two')
  t.equal(up.status, 0)
  const down = bash('undo')
  t.equal(down.status, 1, 'undo returns 1')
  t.match(down.stderr, "undo: 'false ' failed")
  t.same(notes().slice(2), ['undo two', 'undo one'], 'both other inverses ran')
})

t.test('an inverse gets its arguments as they were (spaces, quotes, dollars)', async t => {
  const { dir, bash } = sandbox(t)
  const odd = 'a b\'c"$HOME;`x`'
  const r = bash(`journal touch ${JSON.stringify(odd).replace(/\$/g, '\\$').replace(/`/g, '\\`')}; undo`)
  t.equal(r.status, 0, r.stderr)
  t.ok(existsSync(join(dir, odd)), 'the file named by the odd argument exists')
})

t.test('alive is false for a killed child not yet reaped (kill -0 succeeds on a zombie)', async t => {
  const { dir, bash } = sandbox(t)
  // the parent execs into a sleep that never waits: its killed child stays a zombie
  const parent = spawn('bash', ['-c', `sleep 100 & echo $! >${JSON.stringify(join(dir, 'child.pid'))}; exec sleep 30`], { stdio: 'ignore' })
  t.teardown(() => { parent.kill('SIGKILL') })
  const pidFile = join(dir, 'child.pid')
  for (let i = 0; i < 100 && !existsSync(pidFile); i++) await new Promise(resolve => setTimeout(resolve, 50))
  const before = bash('alive . child && echo alive')
  t.equal(before.stdout.trim(), 'alive', 'the child is alive')
  const pid = Number(readFileSync(pidFile, 'utf8'))
  process.kill(pid, 'SIGKILL')
  let zombie = false
  for (let i = 0; i < 100 && !zombie; i++) {
    zombie = /\) Z /.test(readFileSync(`/proc/${String(pid)}/stat`, 'utf8'))
    if (!zombie) await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.ok(zombie, 'the killed child is a zombie')
  const after = bash(`kill -0 ${String(pid)} && echo kill-0-says-yes; alive . child || echo not-alive; running ${String(pid)} || echo not-running`)
  t.same(after.stdout.trim().split('\n'), ['kill-0-says-yes', 'not-alive', 'not-running'], 'kill -0 lies; alive and running do not')
})

t.test('render fills only the names it is given and refuses a template naming another', async t => {
  const { dir, bash } = sandbox(t)
  writeFileSync(join(dir, 'tmpl'), 'root = "${C}/root"\nsubnet: ${POD_CIDR} & $HOME ${C}\n')
  const ok = bash('C=\'/x & y\' POD_CIDR=10.88.0.0/16 render tmpl C POD_CIDR')
  t.equal(ok.status, 0, ok.stderr)
  t.equal(ok.stdout, 'root = "/x & y/root"\nsubnet: 10.88.0.0/16 & $HOME /x & y\n', 'each ${NAME} replaced, & kept literal, $HOME untouched')
  const missing = bash('C=/x render tmpl C')
  t.equal(missing.status, 1, 'a ${...} left over fails')
  t.match(missing.stderr, 'render: tmpl has a ${...} not in: C')
})

t.test('kube-node.sh\'s templates render with every name they use given', async t => {
  const { bash } = sandbox(t)
  const node = join(import.meta.dirname, '../../scripts/kube-node.sh')
  // the two config writers, taken from the script, run against a scratch run directory
  const r = bash(`TEMPLATES=${JSON.stringify(join(import.meta.dirname, '../../scripts/kube-node'))}
. <(sed -n '/^write_containerd_config()/,/^}/p;/^write_node_configs()/,/^}/p;/^minor()/p' ${JSON.stringify(node)})
PAUSE_IMAGE=p:1 BRIDGE=cni0 NODE_IP=10.88.0.1 POD_CIDR=10.88.0.0/16 NODE=n K8S_VERSION=v1.37.2
write_containerd_config "$PWD/run" && write_node_configs "$PWD/run"
grep -c 'failCgroupV1: false' run/kubelet-config.yaml; grep -h -c "$PWD/run" run/containerd/config.toml run/cni/net.d/10-cos-kube-node.conflist run/kube-proxy-config.yaml`)
  t.equal(r.status, 0, r.stderr)
  const counts = r.stdout.trim().split('\n').map(Number)
  t.equal(counts[0], 1, 'the 1.31+ kubelet field is set for v1.37')
  t.ok(counts.slice(1).every(n => n > 0), 'each config names the run directory')
})
