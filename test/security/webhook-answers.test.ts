// What the injection webhook writes (issue 43, finding 1), over real TLS
// sockets on 127.0.0.1 against the real server: the answer to one review has
// a bound (a pod whose patch would pass it is denied with a reason naming
// the bound, counted and logged, and its patch is never built: one review of
// 99,000 tiny containers got a 15.3 MB answer and the webhook OOM-killed),
// answers their clients do not read are bounded across the listener (the
// connections holding the oldest are closed to make room, so a client that
// reads is always answered), and the built CLI under the image's flags holds
// the attack as found (its peak RSS printed).
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { ByteBudget } from '../../src/client/bytes-in-flight.js'
import { REVIEW_LIMITS, WEBHOOK_LIMITS, type WebhookLimits } from '../../src/inject/limits.js'
import { InjectMetrics } from '../../src/inject/metrics.js'
import { alive, injectEnv, INJECT_LISTENING, type Attacker, manyContainersReview, NEAR_BOUND, postUnread, probe, statusOf } from '../support/attacks.js'
import { start } from '../support/cli-process.js'
import { until } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'
import { makePki } from '../support/tls-fixtures.js'
import { postToWebhook, startTestWebhook, type TestWebhook } from '../support/webhook.js'
import { appPod, applyResponsePatch, podReview } from '../inject/pods.js'

const MiB = 1024 * 1024
const pki = makePki()
t.teardown(() => { pki.cleanup() })

interface Webhook extends TestWebhook { answers: ByteBudget }

async function startWebhook (t: Test, limits: Partial<WebhookLimits> = {}): Promise<Webhook> {
  const answers = new ByteBudget(limits.answerBytesInFlight ?? WEBHOOK_LIMITS.answerBytesInFlight)
  const webhook = await startTestWebhook(t, { tls: { certFile: join(pki.dir, 'server.pem'), keyFile: join(pki.dir, 'server.key') }, limits, budgets: { answers } })
  return { ...webhook, answers }
}

interface Answer { status: number, body: string }

/** A POST on its own connection, read whole. */
async function post (port: number, body: string): Promise<Answer> {
  return await postToWebhook(port, pki.ca, body, { timeoutMs: scaled(20_000) })
}

/** Resumes a paused attacker and reads until the server closes the connection or `ms` pass: the bytes received. */
async function readAll (attacker: Attacker, ms = 5000): Promise<number> {
  let bytes = 0
  attacker.socket.on('data', (d: Buffer) => { bytes += d.length })
  attacker.socket.resume()
  await Promise.race([attacker.closed, sleep(scaled(ms))])
  return bytes
}

interface Response { uid: string, allowed: boolean, patch?: string, status?: { code: number, message: string } }

function responseOf (answer: Answer): Response {
  return (JSON.parse(answer.body) as { response: Response }).response
}

async function counter (metrics: InjectMetrics, name: string): Promise<number> {
  return Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(await metrics.registry.getSingleMetricAsString(name))?.[1] ?? Number.NaN)
}

const TOO_LARGE = 'cos_auth_proxy_inject_patch_too_large_total'
const CUT = 'cos_auth_proxy_inject_unread_answers_cut_total'

t.test('a pod with thousands of containers gets a refusal naming the bound, not a patch that grows with it', async t => {
  const { port, metrics, logs } = await startWebhook(t)
  const body = manyContainersReview(15_000)
  t.ok(body.length < REVIEW_LIMITS.bodyBytes, `${body.length} bytes: under the 3 MiB body limit`)
  const answer = await post(port, body)
  t.equal(answer.status, 200, 'an admission answer, not an error')
  t.ok(answer.body.length < 1024, `the answer is ${answer.body.length} bytes (before the fix: ~2.3 MB)`)
  const response = responseOf(answer)
  t.equal(response.allowed, false, 'denied: the pod asked for the sidecar, and does not get created without it')
  t.equal(response.patch, undefined, 'no patch')
  t.equal(response.status?.code, 400)
  t.match(response.status?.message, /15000 containers and init containers/)
  t.match(response.status?.message, new RegExp(`bound of ${WEBHOOK_LIMITS.patchBytes} for one answer`))
  t.equal(await counter(metrics, TOO_LARGE), 1, 'counted')
  t.equal(await counter(metrics, 'cos_auth_proxy_inject_injected_total'), 0, 'not counted as injected')
  const line = logs.records.find(r => r.msg === 'pod refused: its patch would pass the bound of one answer')
  t.equal(line?.level, 'warn', 'logged as a warning')
  t.equal(line?.containers, 15_000)
  t.equal(line?.bound, WEBHOOK_LIMITS.patchBytes)
  t.equal(line?.namespace, 'apps')

  // The same pod without the annotation is not the webhook's: allowed unchanged, as any other.
  const plain = responseOf(await post(port, body.replace('"cos-auth-proxy.io/inject":"true"', '"example.com/team":"a"')))
  t.equal(plain.allowed, true, 'a pod not asking for injection is allowed')
  t.equal(plain.patch, undefined, 'unchanged')
  t.equal(await counter(metrics, TOO_LARGE), 1, 'and not counted')
})

t.test('a long env annotation cannot multiply the patch either', async t => {
  const { port, metrics, logs } = await startWebhook(t)
  const name = 'A'.repeat(20_000)
  // 22 KB of review; before the fix a 2.7 MB answer (the name once per container).
  const body = manyContainersReview(100, { 'cos-auth-proxy.io/env': name })
  const answer = await post(port, body)
  t.ok(answer.body.length < 1024, `${answer.body.length} bytes for a ${body.length}-byte review`)
  const response = responseOf(answer)
  t.equal(response.allowed, false)
  t.match(response.status?.message, /100 containers and init containers/)
  t.equal(await counter(metrics, TOO_LARGE), 1)
  t.notOk(logs.text.includes(name.slice(0, 100)), 'the name is neither logged nor echoed')
  t.notOk(answer.body.includes(name.slice(0, 100)))
})

t.test('a pod under the bound is injected as before', async t => {
  const { port, metrics } = await startWebhook(t)
  const body = manyContainersReview(NEAR_BOUND)
  const response = responseOf(await post(port, body))
  t.equal(response.allowed, true)
  t.ok((response.patch?.length ?? 0) <= WEBHOOK_LIMITS.patchBytes, `a ${response.patch?.length ?? 0}-byte patch`)
  const ops = JSON.parse(Buffer.from(response.patch ?? '', 'base64').toString('utf8')) as { path: string }[]
  t.equal(ops.filter(o => /^\/spec\/containers\/\d+\/env$/.test(o.path)).length, NEAR_BOUND, 'one env operation per container')
  // The example chart's pod, patched and valid.
  const pod = appPod()
  const real = responseOf(await post(port, JSON.stringify(podReview(pod))))
  t.ok(applyResponsePatch(pod, real).spec.initContainers?.some(c => c.name === 'cos-auth-proxy'), 'the example app gets its sidecar')
  t.equal(await counter(metrics, TOO_LARGE), 0)
})

t.test('a patch found over the bound once built is denied as well', async t => {
  // Only the env operations are estimated before building; the sidecar and its volumes are measured after.
  const { port, metrics } = await startWebhook(t, { patchBytes: 2048 })
  const response = responseOf(await post(port, JSON.stringify(podReview(appPod()))))
  t.equal(response.allowed, false)
  t.match(response.status?.message, /^the patch that injects the sidecar is \d+ bytes \(1 containers and init containers\), over the webhook's bound of 2048/)
  t.equal(await counter(metrics, TOO_LARGE), 1)
})

t.test('answers their clients do not read cannot hold more than the unread-answers budget, nor lock a reader out', async t => {
  // Answers larger than what the kernel's socket buffers take on loopback (a few MB a
  // connection), so that they stay in the process: the patch bound is raised for it.
  const budget = 16 * MiB
  const { port, answers, metrics, logs } = await startWebhook(t, { patchBytes: 64 * MiB, answerBytesInFlight: budget })
  const review = manyContainersReview(40_000)
  const size = (await post(port, review)).body.length
  t.ok(size > 5 * MiB, `a ${size}-byte answer, read`)
  t.ok(await until(() => answers.inFlight === 0), 'given back once read')
  let most = 0
  const sampler = setInterval(() => { most = Math.max(most, answers.inFlight) }, 2)
  t.teardown(() => { clearInterval(sampler) })
  const CLIENTS = 5
  const unread = await postUnread(port, pki.ca, '/mutate', review, CLIENTS)
  t.teardown(() => { for (const u of unread) u.socket.destroy() })
  t.ok(await until(() => logs.records.filter(r => r.msg === 'sidecar injected').length >= CLIENTS + 1, 30_000), 'their reviews are answered')
  // At most two answers fit: each newer one closes the connection of the oldest.
  const cuts = CLIENTS - Math.floor(budget / size)
  t.ok(await until(() => logs.records.filter(r => r.msg === 'connection closed: its answers were not read and the unread answers were at their bound').length >= cuts, 10_000), 'the oldest are cut')
  t.equal(await counter(metrics, CUT), cuts, `${cuts} connections cut, counted`)
  t.ok(most <= budget, `unread answers held at most ${most} bytes (bound ${budget})`)
  t.ok(most > size, 'answers were held unread')
  // Paused, they see the close once they read: the cut ones, part of an answer at most.
  const received = await Promise.all(unread.map(u => readAll(u)))
  t.equal(received.filter(bytes => bytes < size).length, cuts, `the cut ones got no whole answer (${received.join(', ')} bytes)`)
  const line = logs.records.find(r => r.msg === 'connection closed: its answers were not read and the unread answers were at their bound')
  t.equal(line?.level, 'warn', 'each cut is logged')
  t.ok(Number(line?.bytes) >= size, `with what it held (${String(line?.bytes)} bytes)`)
  const reader = await post(port, review)
  t.equal(responseOf(reader).allowed, true, 'a client that reads gets its answer while unread ones fill the budget')
  t.equal(reader.body.length, size)
  t.ok(await until(() => answers.inFlight === 0, 5000), `every byte given back (${answers.inFlight} left)`)
})

t.test('an answer larger than the whole budget closes its own connection, unsent', async t => {
  const { port, answers } = await startWebhook(t, { patchBytes: 64 * MiB, answerBytesInFlight: MiB })
  await t.rejects(post(port, manyContainersReview(10_000)), 'no answer: the connection is closed')
  t.equal(answers.inFlight, 0, 'nothing held')
  t.equal((await post(port, JSON.stringify(podReview(appPod())))).status, 200, 'an answer that fits is sent')
})

t.test('the built webhook under the image\'s flags survives one review of 99,000 containers and answers nobody reads', async t => {
  const { daemon, match } = await start(['inject'], injectEnv(pki.dir), INJECT_LISTENING, { asImage: true })
  t.teardown(async () => { daemon.child.kill('SIGKILL'); await daemon.exited })
  const port = Number(match[1])
  const admin = Number(match[2])
  const pid = daemon.child.pid ?? 0
  const status = (): string => readFileSync(`/proc/${pid}/status`, 'utf8')
  const mb = (field: string): number => Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status())?.[1] ?? Number.NaN) / 1024
  const before = mb('VmHWM')
  // The review as found: 1.6 MB, 99,000 containers (before the fix: a 15.3 MB answer, VmHWM 69 -> 190 MB;
  // OOM-killed in the chart's 128Mi).
  const found = await post(port, manyContainersReview(99_000))
  t.equal(responseOf(found).allowed, false, 'denied')
  t.match(responseOf(found).status?.message, /99000 containers/)
  const afterOne = mb('VmHWM')
  // Then as many clients as the webhook holds connections, each posting a pod near the bound (NEAR_BOUND
  // containers: a ~110 KB answer) and never reading (before the fix, eight unread 15.3 MB answers: RSS 364 MB).
  const unread = await postUnread(port, pki.ca, '/mutate', manyContainersReview(NEAR_BOUND), WEBHOOK_LIMITS.maxConnections)
  t.teardown(() => { for (const u of unread) u.socket.destroy() })
  const probes = await probe(`http://127.0.0.1:${admin}/healthz`, 10, 200)
  t.same(probes, Array(10).fill(200), '/healthz answered throughout')
  t.equal(responseOf(await post(port, JSON.stringify(podReview(appPod())))).allowed, true, 'an ordinary review is answered meanwhile')
  t.ok(alive(daemon.child), 'the webhook is alive')
  const peak = mb('VmHWM')
  t.comment(`VmHWM ${before.toFixed(1)} MB at start, ${afterOne.toFixed(1)} MB after the 99,000-container review, ${peak.toFixed(1)} MB after ${unread.length} clients not reading; VmRSS now ${mb('VmRSS').toFixed(1)} MB`)
  // VmHWM counts the node binary's ~50 MB of file pages too; memory-cgroup.test.ts has what the
  // chart's limit sees. Before the fix: 190 MB for the one review, 388 MB for eight unread answers.
  t.ok(afterOne < before + 40, `one review cost ${(afterOne - before).toFixed(1)} MB of peak RSS`)
  t.ok(peak < 160, `peak RSS ${peak.toFixed(1)} MB`)
  for (const u of unread) u.socket.destroy()
  t.equal(await statusOf(`http://127.0.0.1:${admin}/readyz`), 200, 'and ready')
})
