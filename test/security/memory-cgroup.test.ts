// `serve` and `inject`, each in a real Linux memory cgroup at the chart's
// limit (as the kubelet sets a container's), run as the image runs them, under
// every per-connection attack of issue 33 at once (for `inject` also issue
// 43's: a review of 99,000 containers, and answers nobody reads), with a probe
// answering throughout: no OOM kill, and the process alive and answering. The cgroup's
// peak is printed. Where no cgroup can be made (not Linux, not root, no
// memory controller), each test is skipped and says why.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { chartLimitMiB, createCgroup, type Cgroup } from '../../bench/cgroup.js'
import { alive, drain, injectEnv, INJECT_LISTENING, manyContainersReview, NEAR_BOUND, pipelineUnread, postOnce, postUnread, probe, statusOf, trickleBodies, unfinishedUploads, type Attacker, type Trickle } from '../support/attacks.js'
import { cgroupUnavailable } from '../support/cgroup.js'
import { start } from '../support/cli-process.js'
import { startUpstream } from '../support/helpers.js'
import { startSidecar, writeKeyPair } from '../support/sidecar.js'
import { makePki } from '../support/tls-fixtures.js'

const CWD = mkdtempSync(join(tmpdir(), 'cos-memory-cgroup-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

const MiB = 1024 * 1024
const LIMIT_MIB = chartLimitMiB()
const GET = (path: string, host = 'x'): string => `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`
const SLOW_BODY = 'POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n'

const unavailable = cgroupUnavailable(LIMIT_MIB * MiB)

/** A cgroup at the chart's limit, removed after the test (and after its processes, which the test kills first). */
function cgroupFor (t: Test, purpose: string, kill: () => Promise<unknown>): Cgroup {
  const cgroup = createCgroup(LIMIT_MIB * MiB, purpose)
  t.teardown(async () => { await kill(); cgroup.remove() })
  return cgroup
}

function report (t: Test, what: string, cgroup: Cgroup): void {
  t.comment(`${what} in a ${LIMIT_MIB}Mi memory cgroup (v${cgroup.version}): peak ${(cgroup.peak() / 1e6).toFixed(1)} MB, now ${(cgroup.usage() / 1e6).toFixed(1)} MB, failcnt ${cgroup.failcnt()}, OOM kills ${cgroup.oomKills()}`)
}

async function finish (attackers: readonly Attacker[], trickles: readonly Trickle[]): Promise<void> {
  for (const trickle of trickles) trickle.stop()
  await Promise.all(attackers.map(a => drain(a, 5000)))
}

t.test('serve in a memory cgroup at the chart\'s limit survives every per-connection attack at once, /healthz answering throughout', { skip: unavailable ?? false }, async t => {
  const body = Buffer.alloc(16_000, 'x')
  const up = await startUpstream((_req, res) => { res.end(body) })
  let kill = async (): Promise<void> => { await up.close() }
  const cgroup = cgroupFor(t, 'test-serve', () => kill())
  const s = await startSidecar({ COS_API_URL: up.url, ...writeKeyPair(CWD, 'AKIDCGROUP', 'cgroup-SeCrEt') }, { cwd: CWD, asImage: true, cgroupDir: cgroup.dir })
  kill = async () => { s.child.kill('SIGKILL'); await s.exited; await up.close() }
  const admin = Number(new URL(s.admin).port)
  const proxy = Number(new URL(s.proxy).port)

  const trickles = [trickleBodies(admin, SLOW_BODY, 64, 500)]
  const attackers = [
    ...await pipelineUnread(admin, GET('/metrics').repeat(1500), 8),
    ...await pipelineUnread(proxy, GET('/item', '127.0.0.1').repeat(1300), 10),
  ]
  const statuses = await probe(`${s.admin}/healthz`, 20, 250)
  t.same(statuses, Array(20).fill(200), '/healthz answered every probe during the attacks')
  await finish(attackers, trickles)
  await sleep(200)
  report(t, 'serve', cgroup)
  t.equal(cgroup.oomKills(), 0, 'no OOM kill')
  t.ok(alive(s.child), 'the proxy is alive')
  t.equal(await statusOf(`${s.proxy}/after`), 200, 'and forwards')
})

t.test('inject in a memory cgroup at the chart\'s limit survives every per-connection attack at once, /healthz answering throughout', { skip: unavailable ?? false }, async t => {
  const pki = makePki()
  let kill = (): Promise<void> => { pki.cleanup(); return Promise.resolve() }
  const cgroup = cgroupFor(t, 'test-inject', () => kill())
  // v2 charges the kernel's socket buffers to the group (answers written and not read); v1 only
  // once they have a limit of their own: the same limit, so that both count what a pod's would.
  const tcp = join(cgroup.dir, 'memory.kmem.tcp.limit_in_bytes')
  if (cgroup.version === 1 && existsSync(tcp)) writeFileSync(tcp, String(LIMIT_MIB * MiB))
  const { daemon, match } = await start(['inject'], injectEnv(pki.dir), INJECT_LISTENING, { asImage: true, cgroupDir: cgroup.dir })
  kill = async () => { daemon.child.kill('SIGKILL'); await daemon.exited; pki.cleanup() }
  const webhook = Number(match[1])
  const admin = Number(match[2])

  // Issue 43 first (the uploads below take the bodies' budget): one review of 99,000 containers (a
  // 15.3 MB answer before the fix, OOM-killed here), then 128 clients posting a pod near the answer's
  // bound (NEAR_BOUND containers) and never reading.
  const found = await postOnce(webhook, pki.ca, '/mutate', manyContainersReview(99_000))
  t.equal(found.status, 200, 'the 99,000-container review is answered')
  t.match(found.body, /"allowed":false.*99000 containers/, 'with a refusal naming the bound')
  const unread = await postUnread(webhook, pki.ca, '/mutate', manyContainersReview(NEAR_BOUND), 128)
  await sleep(1000)
  // 60 uploads of the largest body the webhook takes, all but its last 100 bytes sent.
  const uploads = unfinishedUploads(webhook, pki.ca, '/mutate', 3_145_628, 100, 60)
  const trickles = [trickleBodies(admin, SLOW_BODY, 64, 500), uploads]
  const attackers = [...unread, ...await pipelineUnread(admin, GET('/metrics').repeat(1500), 8)]
  const statuses = await probe(`http://127.0.0.1:${admin}/healthz`, 20, 250)
  t.same(statuses, Array(20).fill(200), '/healthz answered every probe during the attacks')
  t.ok((uploads.delivered?.() ?? 0) > 0, `uploads got all but their last bytes to the webhook (${uploads.delivered?.() ?? 0} of ${uploads.connections()} connections)`)
  await finish(attackers, trickles)
  await sleep(200)
  report(t, 'inject', cgroup)
  const tcpPeak = join(cgroup.dir, 'memory.kmem.tcp.max_usage_in_bytes')
  if (existsSync(tcpPeak)) t.comment(`of which the kernel's socket buffers: peak ${(Number(readFileSync(tcpPeak, 'utf8')) / 1e6).toFixed(1)} MB`)
  t.equal(cgroup.oomKills(), 0, 'no OOM kill')
  t.ok(alive(daemon.child), 'the webhook is alive')
  t.equal(await statusOf(`http://127.0.0.1:${admin}/readyz`), 200, 'and ready')
})
