// The sidecar's life as Kubernetes drives it, against the built CLI in a child
// process: probes, a Secret mounted late, drain on SIGTERM, /quitquitquit, wait.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { Agent, request as httpRequest } from 'node:http'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { json, send, stallingUpstream, startUpstream, streamForever, type SimpleResponse } from './support/helpers.js'
import { CLI, startSidecar as startSidecarIn, until, writeKeyPair } from './support/sidecar.js'
import { spawnNode } from './support/node-child.js'
import { TRAILER_PROBES, answerDeclaringTrailers, rawRequest, startRawUpstream } from './support/raw.js'

const CWD = mkdtempSync(join(tmpdir(), 'cos-life-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

const startSidecar = (env: Record<string, string>): ReturnType<typeof startSidecarIn> => startSidecarIn(env, { cwd: CWD })

const CREDS = { COS_ACCESS_KEY: 'AKIDLIFE', COS_ACCESS_KEY_SECRET: 'life-SeCrEt' }

t.test('probes: healthz 200, readyz 200 when ready, metrics in Prometheus text', async t => {
  const up = await startUpstream()
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  t.equal((await send(`${s.admin}/healthz`)).status, 200)
  const ready = await send(`${s.admin}/readyz`)
  t.equal(ready.status, 200)
  t.same(json(ready), { status: 'ready' })
  await send(`${s.proxy}/x`)
  const metrics = await send(`${s.admin}/metrics`)
  t.equal(metrics.status, 200)
  t.match(metrics.body.toString(), /cos_auth_proxy_requests_total\{[^}]*route="api"[^}]*\} 1/)
  t.match(metrics.body.toString(), /cos_auth_proxy_tokens_minted_total 1/)
  t.equal((await send(`${s.proxy}/healthz`)).status, 200, 'the proxy port forwards /healthz upstream: admin paths are not on it')
  t.equal(up.received.at(-1)?.url, '/healthz')
})

t.test('an upstream that declares a Trailer cannot take the sidecar down: every combination answered, then it still serves', async t => {
  const up = await startRawUpstream(answerDeclaringTrailers)
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  const port = Number(new URL(s.proxy).port)
  for (const p of TRAILER_PROBES) {
    const res = await rawRequest(port, p.request, { head: p.head })
    t.same(res.finals.map(r => [r.status, r.body.toString('latin1')]), [[p.status, p.body]], p.name)
  }
  t.equal(s.child.exitCode, null, 'the process is alive')
  t.equal((await send(`${s.admin}/healthz`)).status, 200, 'healthz answers')
  const after = await send(`${s.proxy}/typed`)
  t.equal(after.status, 200, 'the proxy still serves')
  t.equal(after.body.toString(), 'hello world')
  t.notOk(s.lines().some(l => l.level === 'error' || l.level === 'fatal'), 'nothing logged as an error')
})

t.test('credential files missing at start: the proxy starts unready, answers 503, then picks them up', async t => {
  const up = await startUpstream()
  const dir = mkdtempSync(join(tmpdir(), 'cos-late-'))
  const s = await startSidecar({
    COS_API_URL: up.url,
    COS_ACCESS_KEY_FILE: join(dir, 'secret', 'access-key'),
    COS_ACCESS_KEY_SECRET_FILE: join(dir, 'secret', 'access-key-secret'),
    COS_CREDENTIALS_RELOAD_MS: '200',
  })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close(); rmSync(dir, { recursive: true, force: true }) })
  const unready = await send(`${s.admin}/readyz`)
  t.equal(unready.status, 503)
  t.match(json(unready), { status: 'not_ready', reason: /credentials/ })
  const refused = await send(`${s.proxy}/x`)
  t.equal(refused.status, 503)
  t.match(json(refused), { error: { code: 'credentials_unavailable' } })
  t.equal(up.received.length, 0, 'nothing forwarded')

  const { mkdirSync } = await import('node:fs')
  mkdirSync(join(dir, 'secret'))
  writeFileSync(join(dir, 'secret', 'access-key'), 'AKIDLATE\n')
  writeFileSync(join(dir, 'secret', 'access-key-secret'), 'late-SeCrEt\n')
  await until('readiness', async () => (await send(`${s.admin}/readyz`)).status === 200)
  t.equal((await send(`${s.proxy}/x`)).status, 200)
  t.match(up.received[0]?.headers.authorization, /^Bearer AKIDLATE%2F/)
})

t.test('a FIFO in place of the secret file: the sidecar keeps its pair and stays ready, counts the refusal, and applies the next pair', async t => {
  const dir = mkdtempSync(join(tmpdir(), 'cos-fifo-'))
  const keyFile = join(dir, 'access-key')
  const secretFile = join(dir, 'access-key-secret')
  writeFileSync(keyFile, 'AKIDFIFO\n')
  writeFileSync(secretFile, 'fifo-SeCrEt\n')
  const up = await startUpstream((req, res) => { res.statusCode = req.url === '/denied' ? 401 : 200; res.end() })
  const s = await startSidecar({ COS_API_URL: up.url, COS_ACCESS_KEY_FILE: keyFile, COS_ACCESS_KEY_SECRET_FILE: secretFile, COS_CREDENTIALS_RELOAD_MS: '100' })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close(); rmSync(dir, { recursive: true, force: true }) })

  rmSync(secretFile)
  execFileSync('mkfifo', [secretFile])
  const refusals = /cos_auth_proxy_credential_reads_refused_total\{reason="not_a_regular_file"\} [1-9]/
  await until('the refusal to be counted', async () => refusals.test((await send(`${s.admin}/metrics`)).body.toString()))
  t.equal((await send(`${s.proxy}/denied`)).status, 401, 'an upstream 401 passes through (and asks for a re-read)')
  t.equal((await send(`${s.proxy}/ok`)).status, 200, 'the next request is served')
  t.match(up.received.at(-1)?.headers.authorization, /^Bearer AKIDFIFO%2F/, 'signed with the pair in force')
  t.equal((await send(`${s.admin}/readyz`)).status, 200, 'still ready')
  t.equal((await send(`${s.admin}/healthz`)).status, 200)

  rmSync(secretFile)
  writeFileSync(keyFile, 'AKIDNEXT\n')
  writeFileSync(secretFile, 'next-SeCrEt\n')
  await until('the next pair to sign', async () => {
    await send(`${s.proxy}/ok`)
    return /^Bearer AKIDNEXT%2F/.test(up.received.at(-1)?.headers.authorization ?? '')
  })
  const logged = s.lines().map(l => JSON.stringify(l))
  t.ok(logged.some(l => l.includes('is a FIFO, not a regular file')), 'the refusal is logged')
  t.notOk(logged.some(l => l.includes('SeCrEt')), 'no secret is')
})

/** A request that stays in flight until the upstream answers after `delayMs`. */
function slowUpstream (delayMs: number): Promise<Awaited<ReturnType<typeof startUpstream>>> {
  return startUpstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' })
    res.write('first ')
    setTimeout(() => res.end('last'), delayMs)
  })
}

t.test('SIGTERM drains: readiness 503 at once, health stays 200, the in-flight request completes, exit 0', async t => {
  const up = await slowUpstream(1500)
  // An idle keep-alive connection would be kept 60 s: an exit long before that did not wait on it.
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url, COS_SHUTDOWN_DELAY_MS: '500', COS_KEEPALIVE_TIMEOUT_MS: '60000', COS_ACCESS_LOG: 'all' })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  const agent = new Agent({ keepAlive: true })
  t.teardown(() => agent.destroy())
  // A keep-alive client with a request in flight (the response is streaming).
  const inFlight = new Promise<SimpleResponse>((resolve, reject) => {
    httpRequest(`${s.proxy}/slow`, { agent }, res => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks) }))
    }).on('error', reject).end()
  })
  await until('the request to reach the upstream', async () => up.received.length === 1)
  s.signal('SIGTERM')
  await until('readiness 503', async () => (await send(`${s.admin}/readyz`)).status === 503, 1000)
  t.match(json(await send(`${s.admin}/readyz`)), { reason: 'draining' })
  t.equal((await send(`${s.admin}/healthz`)).status, 200, 'healthz stays 200 while draining')
  t.equal((await send(`${s.proxy}/during-delay`)).status, 200, 'still serving during COS_SHUTDOWN_DELAY_MS')
  const res = await inFlight
  t.equal(res.status, 200)
  t.equal(res.body.toString(), 'first last', 'the streaming response completed')
  const { code, ms } = await s.exited
  t.equal(code, 0, 'exit 0')
  t.ok(ms < 30_000, `exited ${ms} ms after SIGTERM, without waiting on the idle keep-alive connection (kept 60 s)`)
  // Ordered by time: pino writes asynchronously, and under a pipe that pushes
  // back, lines a few ms apart can reach stdout out of order.
  const msgs = s.lines().sort((a, b) => String(a.time).localeCompare(String(b.time))).map(l => l.msg)
  t.ok(msgs.indexOf('draining: readiness is now 503') < msgs.lastIndexOf('request'), 'drain began before the in-flight request finished')
  t.equal(msgs.at(-1), 'stopped', JSON.stringify(s.lines().slice(-6)))
})

// What the exit must show is order, not speed: after the shutdown timeout
// (the cut came from it), and long before the upstream timeout would have
// ended the request (a drain that waited for the upstream). The gap between
// the two is the margin a busy machine gets.
const SHUTDOWN_TIMEOUT_MS = 1000
const UPSTREAM_TIMEOUT_MS = 30_000
const EXIT_BOUND_MS = UPSTREAM_TIMEOUT_MS / 2

for (const [upstreamDoes, answer] of [['never answers', undefined], ['streams a body forever', streamForever]] as const) {
  t.test(`COS_SHUTDOWN_TIMEOUT_MS bounds the exit when the upstream ${upstreamDoes}: both sides are cut, exit 0 after the timeout, not the upstream's`, async t => {
    const up = await stallingUpstream(answer)
    const dir = mkdtempSync(join(tmpdir(), 'cos-cut-'))
    const s = await startSidecar({
      COS_API_URL: up.url,
      // Files, so the credential watcher runs too: it must not hold the exit either.
      ...writeKeyPair(dir, 'AKIDCUT', 'cut-SeCrEt'),
      COS_SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS),
      COS_UPSTREAM_TIMEOUT_MS: String(UPSTREAM_TIMEOUT_MS),
    })
    t.teardown(async () => { s.child.kill('SIGKILL'); await up.close(); rmSync(dir, { recursive: true, force: true }) })
    let clientGot = ''
    const cut = new Promise<string>(resolve => {
      httpRequest(`${s.proxy}/forever`, { agent: false }, res => {
        res.on('data', (c: Buffer) => { clientGot += c.toString() })
        res.on('error', () => undefined)
        res.on('close', () => resolve(res.complete ? 'completed' : 'cut'))
      }).on('error', () => resolve('cut')).end()
    })
    // An admin request that never finishes sending its head must not hold the exit.
    const admin = connect(Number(new URL(s.admin).port), '127.0.0.1', () => admin.write('GET /metrics HTTP/1.1\r\nhost: x\r\n'))
    admin.on('error', () => undefined)
    t.teardown(() => admin.destroy())
    await until('the request to reach the upstream', async () => up.heads() === 1)
    if (answer !== undefined) await until('the stream to reach the client', async () => clientGot.includes('data:'))
    const signalledAt = s.signal('SIGTERM')
    // Bounded, so a drain that hangs fails here rather than at the file's timeout.
    const { code, ms } = await Promise.race([s.exited, sleep(EXIT_BOUND_MS + 3000).then(() => ({ code: null, ms: Infinity }))])
    t.equal(code, 0, 'exit 0')
    t.ok(ms >= SHUTDOWN_TIMEOUT_MS && ms < EXIT_BOUND_MS, `exited ${ms} ms after SIGTERM: after the shutdown timeout (${SHUTDOWN_TIMEOUT_MS} ms), long before the upstream's (${UPSTREAM_TIMEOUT_MS} ms)`)
    t.equal(await cut, 'cut', 'the client\'s request was cut')
    await until('the upstream to see its connection closed', async () => up.closedAt.length === 1, 1000)
    const upstreamCutMs = (up.closedAt[0] ?? Infinity) - signalledAt
    t.ok(upstreamCutMs < EXIT_BOUND_MS, `the upstream saw its connection closed ${upstreamCutMs} ms after SIGTERM`)
    const msgs = s.lines().sort((a, b) => String(a.time).localeCompare(String(b.time))).map(l => l.msg)
    t.ok(msgs.includes('shutdown timeout reached: cutting the requests still in flight'), 'the timeout cut')
    t.equal(msgs.at(-1), 'stopped', 'the drain finished: nothing was left hanging after the cut')
  })
}

t.test('a second signal exits at once', async t => {
  const up = await slowUpstream(30_000)
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  void send(`${s.proxy}/forever`).catch(() => undefined)
  await until('the request to reach the upstream', async () => up.received.length === 1)
  s.signal('SIGTERM')
  await until('readiness 503', async () => (await send(`${s.admin}/readyz`)).status === 503, 1000)
  s.signal('SIGINT')
  const { code, ms } = await s.exited
  t.equal(code, 1, 'a forced exit says so')
  // The drain would last until the shutdown timeout (25 s) or the upstream's answer (30 s).
  t.ok(ms < 12_500, `exited ${ms} ms after the second signal, not at the drain's end (25 s)`)
})

t.test('POST /quitquitquit drains like SIGTERM; wait exits 0 once ready and 1 on timeout', async t => {
  const up = await startUpstream()
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  const adminPort = new URL(s.admin).port

  const wait = spawnNode([CLI, 'wait', '--timeout', '5'], { cwd: CWD, env: { PATH: process.env.PATH, COS_ADMIN_PORT: adminPort } })
  t.equal(await new Promise(resolve => wait.on('close', resolve)), 0, 'wait: ready')

  t.equal((await send(`${s.admin}/quitquitquit`, { method: 'POST' })).status, 202)
  t.equal((await s.exited).code, 0)

  const waitFail = spawnNode([CLI, 'wait', '--timeout', '1'], { cwd: CWD, env: { PATH: process.env.PATH, COS_ADMIN_PORT: adminPort } })
  let err = ''
  waitFail.stderr.on('data', (d: Buffer) => { err += d.toString() })
  t.equal(await new Promise(resolve => waitFail.on('close', resolve)), 1, 'wait: nothing ready')
  t.match(err, /not ready after 1 s/)
})
