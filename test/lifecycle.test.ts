// The sidecar's life as Kubernetes drives it, against the built CLI in a child
// process: probes, a Secret mounted late, drain on SIGTERM, /quitquitquit, wait.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { Agent, request as httpRequest } from 'node:http'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { json, send, stallingUpstream, startUpstream, streamForever, type SimpleResponse } from './helpers.js'

const CLI = fileURLToPath(new URL('../dist/cli.js', import.meta.url))
const CWD = mkdtempSync(join(tmpdir(), 'cos-life-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

interface Sidecar {
  readonly child: ChildProcessWithoutNullStreams
  readonly proxy: string
  readonly admin: string
  readonly exited: Promise<{ code: number | null, ms: number }>
  lines: () => Record<string, unknown>[]
  signal: (s: NodeJS.Signals) => number
}

async function startSidecar (env: Record<string, string>): Promise<Sidecar> {
  const child = spawn(process.execPath, [CLI, 'serve'], {
    cwd: CWD,
    env: { PATH: process.env.PATH, COS_LISTEN_PORT: '0', COS_ADMIN_PORT: '0', ...env },
  })
  let out = ''
  let err = ''
  let signalledAt = 0
  child.stderr.on('data', (d: Buffer) => { err += d.toString() })
  const exited = new Promise<{ code: number | null, ms: number }>(resolve => child.on('close', code => resolve({ code, ms: Date.now() - signalledAt })))
  const listening = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`no listening line: ${out}${err}`)) }, 10_000)
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const line = out.split('\n').find(l => l.includes('"cos-auth-proxy listening"'))
      if (line !== undefined) { clearTimeout(timer); resolve(JSON.parse(line) as Record<string, unknown>) }
    })
    void exited.then(({ code }) => { clearTimeout(timer); reject(new Error(`exited ${code}: ${out}${err}`)) })
  })
  const admin = listening.admin as { port: number }
  return {
    child,
    proxy: `http://127.0.0.1:${listening.port as number}`,
    admin: `http://127.0.0.1:${admin.port}`,
    exited,
    lines: () => out.split('\n').filter(l => l !== '').map(l => JSON.parse(l) as Record<string, unknown>),
    signal: (s) => { signalledAt = Date.now(); child.kill(s); return signalledAt },
  }
}

const CREDS = { COS_ACCESS_KEY: 'AKIDLIFE', COS_ACCESS_KEY_SECRET: 'life-SeCrEt' }

async function until (what: string, check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

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
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url, COS_SHUTDOWN_DELAY_MS: '500' })
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
  t.ok(ms < 5000, `exited ${ms} ms after SIGTERM, without waiting on the idle keep-alive connection`)
  // Ordered by time: pino writes asynchronously, and under a pipe that pushes
  // back, lines a few ms apart can reach stdout out of order.
  const msgs = s.lines().sort((a, b) => String(a.time).localeCompare(String(b.time))).map(l => l.msg)
  t.ok(msgs.indexOf('draining: readiness is now 503') < msgs.lastIndexOf('request'), 'drain began before the in-flight request finished')
  t.equal(msgs.at(-1), 'stopped', JSON.stringify(s.lines().slice(-6)))
})

// The bound is the contract (timeout + 1 s), not a performance figure; the
// upstream timeout is longer, so a drain that waited for the upstream fails it.
const SHUTDOWN_TIMEOUT_MS = 1000
const EXIT_BOUND_MS = SHUTDOWN_TIMEOUT_MS + 1000

for (const [upstreamDoes, answer] of [['never answers', undefined], ['streams a body forever', streamForever]] as const) {
  t.test(`COS_SHUTDOWN_TIMEOUT_MS bounds the exit when the upstream ${upstreamDoes}: both sides are cut, exit 0 within the timeout + 1 s`, async t => {
    const up = await stallingUpstream(answer)
    const dir = mkdtempSync(join(tmpdir(), 'cos-cut-'))
    writeFileSync(join(dir, 'access-key'), 'AKIDCUT\n')
    writeFileSync(join(dir, 'access-key-secret'), 'cut-SeCrEt\n')
    const s = await startSidecar({
      COS_API_URL: up.url,
      // Files, so the credential watcher runs too: it must not hold the exit either.
      COS_ACCESS_KEY_FILE: join(dir, 'access-key'),
      COS_ACCESS_KEY_SECRET_FILE: join(dir, 'access-key-secret'),
      COS_SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS),
      COS_UPSTREAM_TIMEOUT_MS: '8000',
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
    t.ok(ms < EXIT_BOUND_MS, `exited ${ms} ms after SIGTERM (timeout ${SHUTDOWN_TIMEOUT_MS} ms)`)
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
  t.ok(ms < 2000, `exited ${ms} ms after the second signal`)
})

t.test('POST /quitquitquit drains like SIGTERM; wait exits 0 once ready and 1 on timeout', async t => {
  const up = await startUpstream()
  const s = await startSidecar({ ...CREDS, COS_API_URL: up.url })
  t.teardown(async () => { s.child.kill('SIGKILL'); await up.close() })
  const adminPort = new URL(s.admin).port

  const wait = spawn(process.execPath, [CLI, 'wait', '--timeout', '5'], { cwd: CWD, env: { PATH: process.env.PATH, COS_ADMIN_PORT: adminPort } })
  t.equal(await new Promise(resolve => wait.on('close', resolve)), 0, 'wait: ready')

  t.equal((await send(`${s.admin}/quitquitquit`, { method: 'POST' })).status, 202)
  t.equal((await s.exited).code, 0)

  const waitFail = spawn(process.execPath, [CLI, 'wait', '--timeout', '1'], { cwd: CWD, env: { PATH: process.env.PATH, COS_ADMIN_PORT: adminPort } })
  let err = ''
  waitFail.stderr.on('data', (d: Buffer) => { err += d.toString() })
  t.equal(await new Promise(resolve => waitFail.on('close', resolve)), 1, 'wait: nothing ready')
  t.match(err, /not ready after 1 s/)
})
