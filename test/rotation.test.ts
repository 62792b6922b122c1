// Key rotation without a dropped request: the CredentialWatcher against real
// files (the exact Kubernetes Secret layout and plain in-place rewrites), then
// the real proxy under steady load across rotations.
import { randomBytes, type KeyObject } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs'
import { Agent, request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { loadConfig, type Config } from '../src/config.js'
import { CredentialWatcher, type ReloadOutcome } from '../src/credential-watcher.js'
import { CredentialStore, readPair, readPairSync, type PairResult } from '../src/credentials.js'
import { createLogger } from '../src/logger.js'
import { buildProxyServer } from '../src/server.js'
import { HeaderMinter, parseToken, secretKey, verifyToken } from '../src/token.js'
import { LogCapture, json, send, startUpstream } from './helpers.js'

const tmp = mkdtempSync(join(tmpdir(), 'cos-rotation-'))
t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })

// Every log line of the file, at trace, for the leak check at the end.
const logs = new LogCapture()
const logger = createLogger('trace', logs)

interface Pair { readonly key: string, readonly secret: string, readonly hmac: KeyObject }
const allPairs: Pair[] = []
function newPair (): Pair {
  const n = allPairs.length
  // Marker text so a leak can never be a coincidence.
  const pair = { key: `AKROT${n}${randomBytes(4).toString('hex')}`, secret: `SeCrEt-RoTaTiOn-${n}-${randomBytes(8).toString('hex')}+/=` }
  const full = { ...pair, hmac: secretKey(pair.secret) }
  allPairs.push(full)
  return full
}

function inForce (store: CredentialStore, p: Pair): boolean {
  return store.current?.samePair(new HeaderMinter(p.key, p.hmac, 'url')) ?? false
}

/** Polls `cond` until it holds or `ms` pass (the contract's 2 s by default). */
async function until (cond: () => boolean, ms = 2000): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!cond()) {
    if (Date.now() > deadline) return false
    await sleep(10)
  }
  return true
}

interface Files { readonly keyFile: string, readonly secretFile: string }

/** A mounted Secret exactly as the kubelet writes it: `name -> ..data/name`, `..data -> ..<timestamp>`. */
class K8sSecret implements Files {
  readonly dir: string
  readonly keyFile: string
  readonly secretFile: string
  #generation = 0
  #current: string | undefined

  constructor (dir: string) {
    this.dir = dir
    this.keyFile = join(dir, 'access-key')
    this.secretFile = join(dir, 'access-key-secret')
  }

  get currentDir (): string | undefined { return this.#current === undefined ? undefined : join(this.dir, this.#current) }

  write (p: Pair): void {
    const name = `..2026_11_22_10_00_00.${String(++this.#generation).padStart(9, '0')}`
    mkdirSync(join(this.dir, name), { recursive: true })
    writeFileSync(join(this.dir, name, 'access-key'), p.key)
    writeFileSync(join(this.dir, name, 'access-key-secret'), p.secret)
    const old = this.#current
    this.#current = name
    if (old === undefined) {
      symlinkSync(name, join(this.dir, '..data'))
      symlinkSync('..data/access-key', this.keyFile)
      symlinkSync('..data/access-key-secret', this.secretFile)
      return
    }
    symlinkSync(name, join(this.dir, '..data_tmp'))
    renameSync(join(this.dir, '..data_tmp'), join(this.dir, '..data'))
    rmSync(join(this.dir, old), { recursive: true })
  }
}

/** Plain files rewritten in place, as docker and local use do. */
function plainFiles (dir: string): Files {
  mkdirSync(dir, { recursive: true })
  return { keyFile: join(dir, 'access-key'), secretFile: join(dir, 'access-key-secret') }
}
function writeInPlace (f: Files, p: Pair): void {
  writeFileSync(f.keyFile, p.key + '\n')
  writeFileSync(f.secretFile, p.secret + '\n')
}

function fileConfig (f: Files, env: Record<string, string> = {}): Config {
  return loadConfig({
    env: { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY_FILE: f.keyFile, COS_ACCESS_KEY_SECRET_FILE: f.secretFile, COS_LISTEN_PORT: '0', ...env },
    dotenv: false,
  })
}

interface Watched {
  readonly watcher: CredentialWatcher
  readonly store: CredentialStore
  readonly outcomes: ReloadOutcome[]
  /** Applied outcomes after which the store held no known pair: a key with the wrong secret. */
  readonly mixed: ReloadOutcome[]
}

function watcherFor (t: Test, config: Config, reloadMs = config.credentialsReloadMs, store = new CredentialStore()): Watched {
  const outcomes: ReloadOutcome[] = []
  const mixed: ReloadOutcome[] = []
  const watcher = new CredentialWatcher({
    credentials: config.credentials,
    encoding: config.tokenEncoding,
    store,
    reloadMs,
    logger,
    onOutcome: o => {
      outcomes.push(o)
      if (o.result === 'applied' && !allPairs.some(p => inForce(store, p))) mixed.push(o)
    },
  })
  t.teardown(() => { watcher.close() })
  return { watcher, store, outcomes, mixed }
}

function after (outcomes: readonly ReloadOutcome[], from: number, pred: (o: ReloadOutcome) => boolean): boolean {
  return outcomes.slice(from).some(pred)
}

t.test('readPairSync gives what readPair gives', async t => {
  const files = plainFiles(join(tmp, 'sync-parity'))
  const config = fileConfig(files)
  const p = newPair()
  const shape = (r: PairResult): unknown => r.ok ? { ok: true, accessKey: r.accessKey, secretMatches: r.key.equals(p.hmac) } : r
  const states: [string, () => void][] = [
    ['missing', () => undefined],
    ['valid', () => { writeInPlace(files, p) }],
    ['empty secret', () => { writeFileSync(files.secretFile, '\n') }],
    ['invalid key', () => { writeInPlace(files, p); writeFileSync(files.keyFile, 'a/b') }],
  ]
  for (const [name, setUp] of states) {
    setUp()
    t.same(shape(readPairSync(config.credentials, 'url')), shape(await readPair(config.credentials, 'url')), name)
  }
})

t.test('watcher', async t => {
  t.test('Kubernetes ..data swap: each new pair is applied within 2 s by the directory watch alone', async t => {
    const k8s = new K8sSecret(join(tmp, 'k8s-watch'))
    const first = newPair()
    k8s.write(first)
    // A 60 s fallback period: only the watch can apply the pair within 2 s.
    const { watcher, store, outcomes, mixed } = watcherFor(t, fileConfig(k8s), 60_000)
    t.same(await watcher.start(), { result: 'applied', accessKey: first.key })
    t.ok(inForce(store, first))
    for (let i = 1; i <= 2; i++) {
      const p = newPair()
      const oldDir = k8s.currentDir ?? ''
      k8s.write(p)
      t.notOk(existsSync(oldDir), 'the old timestamped directory is gone, as the kubelet leaves it')
      t.ok(await until(() => inForce(store, p)), `rotation ${i} in force within 2 s`)
      t.ok(outcomes.some(o => o.result === 'applied' && o.accessKey === p.key), 'reported as applied')
    }
    t.same(outcomes.filter(o => o.result === 'rejected'), [], 'an atomic swap is never seen half done')
    t.same(mixed, [])
  })

  t.test('in-place rewrite (docker/local) is applied; a pair written one file at a time is never applied mixed', async t => {
    const files = plainFiles(join(tmp, 'in-place'))
    const first = newPair()
    writeInPlace(files, first)
    const { watcher, store, mixed } = watcherFor(t, fileConfig(files))
    t.same(await watcher.start(), { result: 'applied', accessKey: first.key })

    const second = newPair()
    writeInPlace(files, second)
    t.ok(await until(() => inForce(store, second)), 'both files rewritten together: in force within 2 s')

    // The key first, the secret a moment later: the first read after the key
    // event sees the new key with the old secret; the settle re-read must not
    // let that pair in.
    const third = newPair()
    writeFileSync(files.keyFile, third.key)
    await sleep(30)
    writeFileSync(files.secretFile, third.secret)
    t.ok(await until(() => inForce(store, third)), 'in force within 2 s of the second file')
    t.same(mixed, [], 'no key was ever in force with another pair\'s secret')
  })

  t.test('empty, missing, invalid and half-written pairs are refused; the old pair stays in force', async t => {
    const files = plainFiles(join(tmp, 'refused'))
    const old = newPair()
    const next = newPair()
    writeInPlace(files, old)
    const { watcher, store, outcomes, mixed } = watcherFor(t, fileConfig(files))
    await watcher.start()
    const cases: [string, () => void, string, RegExp][] = [
      ['empty secret file', () => { writeFileSync(files.secretFile, '') }, 'COS_ACCESS_KEY_SECRET_FILE', /is empty/],
      ['missing key file', () => { unlinkSync(files.keyFile) }, 'COS_ACCESS_KEY_FILE', /\(ENOENT\)/],
      ['invalid access key', () => { writeFileSync(files.keyFile, 'has space:and colon') }, 'COS_ACCESS_KEY_FILE', /access key must be/],
      ['half written: new key, then the secret file deleted', () => { writeFileSync(files.keyFile, next.key); unlinkSync(files.secretFile) }, 'COS_ACCESS_KEY_SECRET_FILE', /\(ENOENT\)/],
      ['half written: new key, then the secret file emptied', () => { writeFileSync(files.keyFile, next.key); writeFileSync(files.secretFile, '') }, 'COS_ACCESS_KEY_SECRET_FILE', /is empty/],
    ]
    for (const [name, breakIt, variable, problem] of cases) {
      const from = outcomes.length
      const errorsBefore = logs.records.filter(r => r.level === 'error' && r.variable === variable).length
      breakIt()
      const refused = (o: ReloadOutcome): boolean => o.result === 'rejected' && o.variable === variable && problem.test(o.problem)
      t.ok(await until(() => after(outcomes, from, refused)), `${name}: reported as rejected`)
      t.ok(inForce(store, old), `${name}: the old pair stays in force`)
      const token = store.current?.next() ?? ''
      t.ok(verifyToken(token, { accessKey: old.key, key: old.secret }).ok, `${name}: tokens are still signed with the old secret`)
      t.ok(logs.records.filter(r => r.level === 'error' && r.variable === variable).length > errorsBefore, `${name}: logged as an error`)

      const restored = outcomes.length
      writeInPlace(files, old)
      t.ok(await until(() => after(outcomes, restored, o => o.result === 'unchanged')), `${name}: restored`)
    }
    t.same(mixed, [])
  })

  t.test('files missing at start: start() resolves rejected, the store stays empty, then the files appear', async t => {
    const files = plainFiles(join(tmp, 'appear'))
    const { watcher, store } = watcherFor(t, fileConfig(files))
    const outcome = await watcher.start()
    t.match(outcome, { result: 'rejected', variable: 'COS_ACCESS_KEY_FILE', problem: /ENOENT/ })
    t.equal(store.current, undefined)
    const p = newPair()
    writeInPlace(files, p)
    t.ok(await until(() => inForce(store, p)), 'applied within 2 s')
  })

  t.test('directory missing at start: created later with the Kubernetes layout, then rotated', async t => {
    const k8s = new K8sSecret(join(tmp, 'later', 'secret', 'cos'))
    const { watcher, store, outcomes } = watcherFor(t, fileConfig(k8s))
    t.match(await watcher.start(), { result: 'rejected', variable: 'COS_ACCESS_KEY_FILE' })
    t.equal(store.current, undefined)
    const p = newPair()
    k8s.write(p)
    t.ok(await until(() => inForce(store, p)), 'applied within 2 s of the directory appearing')
    t.ok(outcomes.some(o => o.result === 'applied' && o.accessKey === p.key))
    const q = newPair()
    k8s.write(q)
    t.ok(await until(() => inForce(store, q)), 'and a later rotation within 2 s')
  })

  t.test('literal values: start() applies them and nothing is watched or re-read', async t => {
    const p = newPair()
    const config = loadConfig({ env: { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY: p.key, COS_ACCESS_KEY_SECRET: p.secret }, dotenv: false })
    const { watcher, store, outcomes } = watcherFor(t, config, 20)
    t.same(await watcher.start(), { result: 'applied', accessKey: p.key })
    t.ok(inForce(store, p))
    await sleep(200)
    t.equal(outcomes.length, 1, 'no periodic re-reads')
    t.same(await watcher.reload(), { result: 'unchanged' })
  })

  t.test('reloadSync applies a changed pair at once and refuses an invalid one', async t => {
    const files = plainFiles(join(tmp, 'sync'))
    const first = newPair()
    writeInPlace(files, first)
    const { watcher, store } = watcherFor(t, fileConfig(files), 60_000)
    await watcher.start()
    const second = newPair()
    writeInPlace(files, second)
    t.same(watcher.reloadSync(), { result: 'applied', accessKey: second.key })
    t.ok(inForce(store, second), 'in force before any event is handled')
    t.same(watcher.reloadSync(), { result: 'unchanged' })
    writeFileSync(files.secretFile, '  \n')
    t.match(watcher.reloadSync(), { result: 'rejected', variable: 'COS_ACCESS_KEY_SECRET_FILE', problem: /is empty/ })
    t.ok(inForce(store, second), 'the pair in force stays')
  })

  t.test('reload() coalesces: calls during a read share one follow-up read', async t => {
    const files = plainFiles(join(tmp, 'coalesce'))
    writeInPlace(files, newPair())
    const { watcher, outcomes } = watcherFor(t, fileConfig(files), 60_000)
    await watcher.start()
    const before = outcomes.length
    const a = watcher.reload()
    const b = watcher.reload()
    const c = watcher.reload()
    t.not(a, b, 'a call during a read waits for a fresh one')
    t.equal(b, c, 'later calls share it')
    t.same(await Promise.all([a, b, c]), [{ result: 'unchanged' }, { result: 'unchanged' }, { result: 'unchanged' }])
    t.equal(outcomes.length - before, 2, 'two reads for three calls')
  })

  t.test('close() stops watching and re-reading, and is idempotent', async t => {
    const files = plainFiles(join(tmp, 'close'))
    const first = newPair()
    writeInPlace(files, first)
    const { watcher, store, outcomes } = watcherFor(t, fileConfig(files), 20)
    await watcher.start()
    watcher.close()
    watcher.close()
    const count = outcomes.length
    writeInPlace(files, newPair())
    await sleep(300)
    t.equal(outcomes.length, count, 'no outcomes after close')
    t.ok(inForce(store, first), 'nothing applied after close')
    t.same(await watcher.reload(), { result: 'unchanged' })
    t.same(watcher.reloadSync(), { result: 'unchanged' })
    t.equal(outcomes.length, count)
  })
})

/** GET over a keep-alive agent; resolves the status (or the error code). */
function get (url: string, agent: Agent): Promise<number | string> {
  return new Promise(resolve => {
    const req = httpRequest(url, { agent }, res => {
      res.resume()
      res.on('end', () => { resolve(res.statusCode ?? 0) })
      res.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? 'error') })
    })
    req.on('error', (err: NodeJS.ErrnoException) => { resolve(err.code ?? 'error') })
    req.end()
  })
}

type Verdict = 'ok' | 'unknown_key' | 'mixed' | 'bad'

/** The upstream's check: a known pair signed it, or a key from one pair carries another pair's signature. */
function verdict (authorization: string | undefined, pairs: readonly Pair[]): Verdict {
  const header = authorization ?? ''
  const parsed = parseToken(header)
  const pair = parsed.ok ? pairs.find(p => p.key === parsed.fields.accessKey) : undefined
  if (pair === undefined) return 'unknown_key'
  if (verifyToken(header, { accessKey: pair.key, key: pair.hmac }).ok) return 'ok'
  return pairs.some(o => o !== pair && verifyToken(header, { accessKey: pair.key, key: o.hmac }).ok) ? 'mixed' : 'bad'
}

t.test('through the proxy: steady load across three ..data rotations, no failed request, no mixed pair', async t => {
  const k8s = new K8sSecret(join(tmp, 'proxy-k8s'))
  const pairs = [newPair()]
  k8s.write(pairs[0] as Pair)
  const firstSeen = new Map<string, number>()
  const verdicts = new Map<Verdict, number>()
  const upstream = await startUpstream((req, res) => {
    const v = verdict(req.headers.authorization, pairs)
    verdicts.set(v, (verdicts.get(v) ?? 0) + 1)
    const key = parseToken(req.headers.authorization ?? '')
    if (v === 'ok' && key.ok && !firstSeen.has(key.fields.accessKey)) firstSeen.set(key.fields.accessKey, Date.now())
    res.statusCode = v === 'ok' ? 200 : 401
    res.end(v)
  })
  const config = fileConfig(k8s, { COS_API_URL: upstream.url })
  const { watcher, store } = watcherFor(t, config)
  const app = await buildProxyServer({ config, credentials: store, logger })
  t.same(await watcher.start(), { result: 'applied', accessKey: pairs[0]?.key })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/v1/clusters`
  const agent = new Agent({ keepAlive: true, maxSockets: 4 })
  t.teardown(async () => { agent.destroy(); await app.close(); await upstream.close() })

  let running = true
  let ok = 0
  const failures: (number | string)[] = []
  const client = async (): Promise<void> => {
    while (running) {
      const status = await get(url, agent)
      if (status === 200) ok++
      else failures.push(status)
    }
  }
  const clients = Array.from({ length: 4 }, client)

  t.ok(await until(() => ok > 20), 'traffic flows')
  for (let i = 1; i <= 3; i++) {
    const p = newPair()
    pairs.push(p) // known to the upstream before the files change
    const at = Date.now()
    k8s.write(p)
    t.ok(await until(() => firstSeen.has(p.key)), `rotation ${i}: the upstream sees the new key within 2 s`)
    t.comment(`rotation ${i}: new key at the upstream after ${(firstSeen.get(p.key) ?? NaN) - at} ms`)
    await sleep(200) // steady traffic on the new pair before the next rotation
  }
  running = false
  await Promise.all(clients)

  t.same(failures, [], 'no failed request')
  t.equal(verdicts.get('mixed') ?? 0, 0, 'no token signed with one pair\'s key and another\'s secret')
  t.same([...verdicts.keys()], ['ok'], 'every token verified')
  t.equal(verdicts.get('ok'), ok, 'every request reached the upstream once')
  t.comment(`${ok} requests through 3 rotations`)
})

t.test('through the proxy: files missing at start give 503 credentials_unavailable until they appear', async t => {
  const k8s = new K8sSecret(join(tmp, 'proxy-missing', 'secret'))
  const upstream = await startUpstream()
  const config = fileConfig(k8s, { COS_API_URL: upstream.url })
  const { watcher, store } = watcherFor(t, config)
  const app = await buildProxyServer({ config, credentials: store, logger })
  t.match(await watcher.start(), { result: 'rejected' })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/v1/clusters`
  t.teardown(async () => { await app.close(); await upstream.close() })

  const refused = await send(url)
  t.equal(refused.status, 503)
  t.match(json(refused), { error: { code: 'credentials_unavailable', message: String } })
  t.equal(upstream.received.length, 0, 'nothing forwarded')

  const p = newPair()
  k8s.write(p)
  // Poll through the proxy itself, with the contract's deadline.
  const deadline = Date.now() + 2000
  let status = 0
  while (status !== 200 && Date.now() < deadline) {
    status = (await send(url)).status
    if (status !== 200) await sleep(20)
  }
  t.equal(status, 200, 'files appear: 200 within 2 s')
  t.equal(upstream.received.length, 1)
  const auth = upstream.received[0]?.headers.authorization ?? ''
  t.ok(verifyToken(auth, { accessKey: p.key, key: p.hmac }).ok, 'signed with the pair that appeared')
})

t.test('logs over all of the above: pairs applied and refused are logged, no secret ever is', async t => {
  const records = logs.records
  t.ok(records.some(r => r.level === 'info' && typeof r.accessKey === 'string' && String(r.msg).includes('key pair in force')), 'applied pairs logged at info with the access key')
  t.ok(records.some(r => r.level === 'error' && typeof r.variable === 'string' && typeof r.problem === 'string'), 'refusals logged at error with variable and problem')
  const text = logs.text
  t.ok(allPairs.length >= 10)
  for (const p of allPairs) t.notOk(text.includes(p.secret), `secret of ${p.key} not logged`)
})
