// What one connection may cost (issue 33): a listener bounds how many
// connections it holds, and each connection is bounded too, whatever it
// pipelines or however slowly it sends. Each attack runs against the built
// CLI in a child process with the image's Node flags (a 64 MiB old space):
// before the bounds, the first and the last aborted the process with
// "JavaScript heap out of memory" within about two seconds, and the slow
// bodies kept /healthz from answering for as long as they were sent.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { MAX_OUTSTANDING_PER_CONNECTION } from '../../src/client/connections.js'
import { alive, drain, injectEnv, INJECT_LISTENING, pipelineUnread, probe, statusOf, trickleBodies } from '../support/attacks.js'
import { start } from '../support/cli-process.js'
import { send, startUpstream } from '../support/helpers.js'
import { startSidecar, writeKeyPair, type Sidecar } from '../support/sidecar.js'
import { scaled } from '../support/time-scale.js'
import { makePki } from '../support/tls-fixtures.js'

const CWD = mkdtempSync(join(tmpdir(), 'cos-per-connection-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

const GET = (path: string, host = 'x'): string => `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`

async function imageSidecar (t: Test, env: Record<string, string> = {}): Promise<Sidecar> {
  const s = await startSidecar({
    COS_API_URL: 'http://127.0.0.1:1',
    ...writeKeyPair(CWD, 'AKIDBOUND', 'bound-SeCrEt'),
    ...env,
  }, { cwd: CWD, asImage: true })
  t.teardown(() => { s.child.kill('SIGKILL') })
  return s
}

t.test('pipelined scrapes cannot exhaust the heap: 1,500 GET /metrics in one write on one admin connection, never read', async t => {
  const s = await imageSidecar(t)
  const [attacker] = await pipelineUnread(Number(new URL(s.admin).port), GET('/metrics').repeat(1500), 1)
  if (attacker === undefined) throw new Error('no attacker')
  t.same(await probe(`${s.admin}/healthz`, 10, 200), Array(10).fill(200), '/healthz answers on another connection throughout')
  const got = await drain(attacker)
  t.ok(got.closed, 'the proxy closes the attacker\'s connection')
  t.ok(got.statuses.filter(status => status === 200).length <= MAX_OUTSTANDING_PER_CONNECTION, `at most ${MAX_OUTSTANDING_PER_CONNECTION} scrapes answered (${got.statuses.length} answers: ${[...new Set(got.statuses)].join(', ')})`)
  t.ok(alive(s.child), 'the process is alive')
  t.equal(await statusOf(`${s.admin}/metrics`), 200, 'and scrapes on a new connection')
  t.notMatch(s.lines().map(l => l.msg).join('\n'), /could not be read within/, 'the credential watcher was never starved')
})

t.test('pipelined scrapes on the webhook\'s admin port cannot exhaust its heap: 8 connections × 1,500 GET /metrics', async t => {
  const pki = makePki()
  t.teardown(() => { pki.cleanup() })
  const { daemon, match } = await start(['inject'], injectEnv(pki.dir), INJECT_LISTENING, { asImage: true })
  t.teardown(() => { daemon.child.kill('SIGKILL') })
  const admin = Number(match[2])
  const attackers = await pipelineUnread(admin, GET('/metrics').repeat(1500), 8)
  t.same(await probe(`http://127.0.0.1:${admin}/healthz`, 10, 200), Array(10).fill(200), '/healthz answers on another connection throughout')
  const got = await Promise.all(attackers.map(a => drain(a)))
  t.ok(got.every(g => g.closed), 'every attacker\'s connection is closed by the webhook')
  t.ok(got.every(g => g.statuses.filter(status => status === 200).length <= MAX_OUTSTANDING_PER_CONNECTION), `at most ${MAX_OUTSTANDING_PER_CONNECTION} scrapes answered per connection`)
  t.ok(alive(daemon.child), 'the webhook process is alive')
  t.equal(await statusOf(`http://127.0.0.1:${admin}/metrics`), 200, 'and scrapes on a new connection')
})

t.test('pipelined requests whose answers are not read cannot exhaust the heap: 10 connections × 1,300 GETs, 16,000-byte answers', async t => {
  const body = Buffer.alloc(16_000, 'x')
  const up = await startUpstream((_req, res) => { res.end(body) })
  let forwarded = 0
  up.server.on('request', () => { forwarded++ })
  const s = await imageSidecar(t, { COS_API_URL: up.url })
  t.teardown(() => up.close())
  const attackers = await pipelineUnread(Number(new URL(s.proxy).port), GET('/item', '127.0.0.1').repeat(1300), 10)
  // Until the proxy has read the attack (its request lines), then until the upstream has seen all it will see: nothing new for half a second (scaled to the load).
  const deadline = Date.now() + scaled(15_000)
  const read = (): number => s.lines().filter(l => l.msg === 'request').length
  while (read() < 10 && Date.now() < deadline) await sleep(50)
  for (let last = -1; forwarded !== last && Date.now() < deadline;) {
    last = forwarded
    await sleep(scaled(500))
  }
  t.ok(read() >= 10, `the proxy read the attack (${read()} request lines)`)
  // None when the ten are read in one turn (opened at once, a burst is accepted before it is read:
  // src/client/accept-bursts.ts): each is cut off before its first request reaches the upstream.
  t.ok(forwarded <= 10 * MAX_OUTSTANDING_PER_CONNECTION, `the upstream saw ${forwarded} requests: at most ${MAX_OUTSTANDING_PER_CONNECTION} per connection, none the proxy cannot answer`)
  t.same(await probe(`${s.admin}/healthz`, 5, 100), Array(5).fill(200), '/healthz answers')
  const got = await Promise.all(attackers.map(a => drain(a)))
  t.ok(got.every(g => g.statuses.filter(status => status === 200).length <= MAX_OUTSTANDING_PER_CONNECTION), 'no attacker got more answers than the bound')
  t.ok(alive(s.child), 'the proxy is alive')
  t.equal((await send(`${s.proxy}/after`)).status, 200, 'and forwards a request on a new connection')
})

t.test('slow request bodies cannot lock a probe out of the admin port: 64 connections trickling a body each', async t => {
  const s = await imageSidecar(t)
  const port = Number(new URL(s.admin).port)
  // Half to a route that takes no body, half to the one that takes a small one (its body never completes: no drain starts).
  const metrics = trickleBodies(port, 'POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n', 32, 500)
  const quit = trickleBodies(port, 'POST /quitquitquit HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n', 32, 500)
  t.teardown(() => { metrics.stop(); quit.stop() })
  await sleep(1000)
  const statuses = await probe(`${s.admin}/healthz`, 20, 250)
  t.same(statuses, Array(20).fill(200), `/healthz answered every probe while ${metrics.connections() + quit.connections()} slow-body connections came and went`)
  t.equal(await statusOf(`${s.admin}/readyz`), 200, 'and the proxy is ready (no trickled /quitquitquit completed)')
  metrics.stop()
  quit.stop()
  t.ok(alive(s.child), 'the proxy is alive')
})
