// Key rotation without a dropped request: the CredentialWatcher against real
// files (the exact Kubernetes Secret layout and plain in-place rewrites), then
// the real proxy under steady load across rotations. Then what an operator
// can put at a credential or TLS path by mistake (a FIFO, a directory, a
// device, a huge file, a file system that stops answering): none may block
// the event loop, wedge the watcher or be read whole; what is in force stays.
import { execFileSync } from 'node:child_process'
import { randomBytes, type KeyObject } from 'node:crypto'
import { closeSync, constants, copyFileSync, existsSync, mkdirSync, mkdtempSync, openSync, renameSync, rmSync, symlinkSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs'
import { open, type FileHandle } from 'node:fs/promises'
import { Agent } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { readBoundedFile, readBoundedFileSync, type FileRead } from '../../src/mounted/bounded-file.js'
import { ConfigError, loadConfig, type Config } from '../../src/config/config.js'
import { CredentialWatcher, type ReloadOutcome } from '../../src/credentials/credential-watcher.js'
import { CREDENTIAL_FILE_MAX_BYTES, CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { HeaderMinter, parseToken, secretKey, verifyToken } from '../../src/token/token.js'
import { readTlsMaterial, TLS_FILE_MAX_BYTES } from '../../src/upstream/upstream-pool.js'
import { Upstreams } from '../../src/upstream/upstream.js'
import { keepAliveGet, LogCapture, json, send, startUpstream, until } from '../support/helpers.js'
import { makePki } from '../support/tls-fixtures.js'

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

/**
 * Symlinks into a directory the watcher does not watch: rewriting the real
 * files makes no event where it looks, so only a re-read finds the change.
 */
function unwatchedFiles (name: string): { readonly real: Files, readonly linked: Files } {
  const real = plainFiles(join(tmp, name, 'real'))
  const linked = plainFiles(join(tmp, name, 'linked'))
  symlinkSync(real.keyFile, linked.keyFile)
  symlinkSync(real.secretFile, linked.secretFile)
  return { real, linked }
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

function watcherFor (t: Test, config: Config, reloadMs = config.credentialsReloadMs, store = new CredentialStore(), readTimeoutMs?: number): Watched {
  const outcomes: ReloadOutcome[] = []
  const mixed: ReloadOutcome[] = []
  const watcher = new CredentialWatcher({
    credentials: config.credentials,
    encoding: config.tokenEncoding,
    store,
    reloadMs,
    ...(readTimeoutMs === undefined ? {} : { readTimeoutMs }),
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

  t.test('nudge() re-reads in the background at most once per 250 ms and applies a pair no event announced', async t => {
    const { real, linked } = unwatchedFiles('nudge')
    const first = newPair()
    writeInPlace(real, first)
    // A 60 s period: only a nudge can find the change within the test.
    const { watcher, store, outcomes } = watcherFor(t, fileConfig(linked), 60_000)
    await watcher.start()
    const second = newPair()
    writeInPlace(real, second)
    await sleep(100)
    t.ok(inForce(store, first), 'no event where the watcher looks: the change is not seen by itself')
    const before = outcomes.length
    for (let i = 0; i < 50; i++) watcher.nudge()
    t.ok(inForce(store, first), 'nudge() returns before anything is read')
    t.ok(await until(() => inForce(store, second)), 'applied after the nudges')
    await sleep(100)
    t.same(outcomes.slice(before), [{ result: 'applied', accessKey: second.key }], 'fifty nudges at once: one reload')
    await sleep(250)
    watcher.nudge()
    t.ok(await until(() => outcomes.length > before + 1), 'a nudge 250 ms later reads again')
    t.same(outcomes.slice(before + 1), [{ result: 'unchanged' }])
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
    watcher.nudge()
    await sleep(50)
    t.equal(outcomes.length, count)
  })
})


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
      const status = await keepAliveGet(url, agent)
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

t.test('through the proxy: a 401 after a rotation the watcher has not seen starts a background re-read; a request in flight across the swap is resent once with the new pair', async t => {
  const { real, linked } = unwatchedFiles('proxy-401')
  const old = newPair()
  const next = newPair()
  writeInPlace(real, old)
  let accepted = old
  const { watcher, store } = watcherFor(t, fileConfig(linked), 60_000)
  const upstream = await startUpstream((req, res, received) => {
    const ok = verifyToken(received.headers.authorization ?? '', { accessKey: accepted.key, key: accepted.hmac }).ok
    const answer = (): void => { res.statusCode = ok ? 200 : 401; res.end(ok ? 'ok' : 'unauthorized') }
    // Held at the upstream until the proxy has the new pair in force.
    if (req.url === '/in-flight' && !ok) void until(() => inForce(store, next)).then(answer)
    else answer()
  })
  const config = fileConfig(linked, { COS_API_URL: upstream.url })
  const app = await buildProxyServer({ config, credentials: store, logger, resyncCredentials: () => { watcher.nudge() } })
  await watcher.start()
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  t.teardown(async () => { await app.close(); await upstream.close() })

  t.equal((await send(`${url}/before`)).status, 200)
  // The key is rotated and the old one revoked; the watcher sees no event.
  writeInPlace(real, next)
  accepted = next
  const inFlight = send(`${url}/in-flight`)
  t.ok(await until(() => upstream.received.length === 2), 'the request is at the upstream, signed with the old pair')
  const first = await send(`${url}/first-401`)
  t.equal(first.status, 401, 'the first 401 after the rotation passes through: nothing is read while it waits')
  t.ok(await until(() => inForce(store, next)), 'it started a re-read that applied the new pair')
  const resent = await inFlight
  t.equal(resent.status, 200, 'the request in flight across the swap is resent with the new pair')
  t.equal(resent.body.toString(), 'ok')
  t.equal((await send(`${url}/after`)).status, 200)
  t.same(upstream.received.map(r => r.url), ['/before', '/in-flight', '/first-401', '/in-flight', '/after'], 'one resend, nothing else')
  const signers = upstream.received.map(r => parseToken(r.headers.authorization ?? '')).map(p => p.ok ? p.fields.accessKey : '')
  t.same(signers, [old.key, old.key, old.key, next.key, next.key])
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

// ── files that are not what they should be ──────────────────────────────────

/** Node has no mkfifo. Replaces whatever is at `path`. */
function mkfifo (path: string): void {
  rmSync(path, { recursive: true, force: true })
  execFileSync('mkfifo', [path])
}

/** Replaces both files, whatever is at the paths now (writing into a FIFO would block the test). */
function replaceFiles (f: Files, p: Pair): void {
  for (const path of [f.keyFile, f.secretFile]) rmSync(path, { recursive: true, force: true })
  writeInPlace(f, p)
}

/** Counts 10 ms setInterval ticks: a blocked event loop counts none. */
function ticker (t: Test): () => number {
  let ticks = 0
  const timer = setInterval(() => { ticks++ }, 10)
  t.teardown(() => { clearInterval(timer) })
  return () => ticks
}

const refusedAs = (refusal: string, variable: string, problem: RegExp) => (o: ReloadOutcome): boolean =>
  o.result === 'rejected' && o.refusal === refusal && o.variable === variable && problem.test(o.problem)

/** A watcher over plain files in `name`, started with a first pair in force. */
async function watching (t: Test, name: string, opts: { readonly reloadMs?: number, readonly readTimeoutMs?: number, readonly env?: Record<string, string> } = {}): Promise<Watched & { readonly files: Files, readonly config: Config, readonly old: Pair }> {
  const files = plainFiles(join(tmp, name))
  const old = newPair()
  writeInPlace(files, old)
  const config = fileConfig(files, opts.env)
  const w = watcherFor(t, config, opts.reloadMs ?? 50, new CredentialStore(), opts.readTimeoutMs)
  t.same(await w.watcher.start(), { result: 'applied', accessKey: old.key })
  return { ...w, files, config, old }
}

/** The pair in force stayed; a valid new pair written in place of whatever is there is applied. */
async function rotationStillWorks (t: Test, w: Watched & { readonly files: Files, readonly old: Pair }): Promise<void> {
  t.ok(inForce(w.store, w.old), 'the pair in force stayed')
  const next = newPair()
  replaceFiles(w.files, next)
  t.ok(await until(() => inForce(w.store, next)), 'a valid new pair written in its place is applied within 2 s')
}

t.test('a FIFO in place of the secret file cannot block the event loop or stop rotation', async t => {
  // Every request to /denied gets 401: each asks for a re-read.
  const upstream = await startUpstream((req, res) => { res.statusCode = req.url === '/denied' ? 401 : 200; res.end() })
  const w = await watching(t, 'fifo', { env: { COS_API_URL: upstream.url } })
  // Wired as serve() wires it.
  const app = await buildProxyServer({ config: w.config, credentials: w.store, logger, resyncCredentials: () => { w.watcher.nudge() } })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  t.teardown(async () => { await app.close(); await upstream.close() })

  mkfifo(w.files.secretFile)
  const ticks = ticker(t)
  const statuses: number[] = []
  const deadline = Date.now() + 300 // past the 250 ms nudge interval: several 401s ask for a re-read
  while (Date.now() < deadline || statuses.length < 20) {
    statuses.push((await send(`${url}/denied`)).status, (await send(`${url}/ok`)).status)
    await sleep(5)
  }
  t.same([...new Set(statuses)].sort(), [200, 401], `all ${statuses.length} requests answered: the 401s passed through`)
  const signers = new Set(upstream.received.map(r => parseToken(r.headers.authorization ?? '')).map(p => p.ok ? p.fields.accessKey : ''))
  t.same([...signers], [w.old.key], 'every one signed with the pair in force')
  t.ok(ticks() >= 5, `a 10 ms interval kept firing (${ticks()} ticks)`)
  t.ok(w.outcomes.some(refusedAs('not_a_regular_file', 'COS_ACCESS_KEY_SECRET_FILE', /is a FIFO, not a regular file/)), 'refused as a FIFO')
  t.ok(logs.records.some(r => r.level === 'error' && typeof r.problem === 'string' && r.problem.includes('is a FIFO')), 'logged with its problem')
  await rotationStillWorks(t, w)
})

t.test('a FIFO at start-up: start() resolves rejected, no pair is in force (readiness 503), then valid files are applied', async t => {
  const files = plainFiles(join(tmp, 'fifo-at-start'))
  writeFileSync(files.keyFile, 'AKIDSTART\n')
  mkfifo(files.secretFile)
  const { watcher, store } = watcherFor(t, fileConfig(files), 50)
  t.match(await watcher.start(), { result: 'rejected', refusal: 'not_a_regular_file', variable: 'COS_ACCESS_KEY_SECRET_FILE' })
  t.equal(store.current, undefined)
  const p = newPair()
  replaceFiles(files, p)
  t.ok(await until(() => inForce(store, p)), 'applied within 2 s')
})

t.test('an oversized secret file is refused without reading it whole', async t => {
  t.test('the reader stops one byte past the bound, whatever the size', async t => {
    const huge = join(tmp, 'sparse-8g')
    writeFileSync(huge, 'x')
    truncateSync(huge, 8 * 1024 ** 3) // sparse: 8 GiB of nothing, cheap to make
    const before = process.memoryUsage().arrayBuffers
    const results: [string, FileRead][] = [['async', await readBoundedFile(huge, 4096)], ['sync', readBoundedFileSync(huge, 4096)]]
    for (const [name, r] of results) t.same(r, { ok: false, refusal: 'too_large', problem: `${JSON.stringify(huge)} is larger than 4096 bytes` }, name)
    t.ok(process.memoryUsage().arrayBuffers - before < 1024 * 1024, 'nothing near the file\'s size was allocated')

    const limit = join(tmp, 'limit')
    writeFileSync(limit, 'a'.repeat(4096))
    t.same(await readBoundedFile(limit, 4096), { ok: true, text: 'a'.repeat(4096) }, 'exactly the bound is read')
    t.match(await readBoundedFile(limit, 4095), { ok: false, refusal: 'too_large' }, 'one byte over is refused')
  })

  t.test('an 80 MB secret file: refused, the pair in force stays, rotation goes on', async t => {
    const w = await watching(t, 'huge')
    const intruder = newPair()
    writeFileSync(w.files.secretFile, intruder.secret)
    truncateSync(w.files.secretFile, 80 * 1024 * 1024)
    const tooLarge = refusedAs('too_large', 'COS_ACCESS_KEY_SECRET_FILE', new RegExp(`larger than ${CREDENTIAL_FILE_MAX_BYTES} bytes`))
    t.ok(await until(() => w.outcomes.some(tooLarge)), 'refused as too large')
    const from = w.outcomes.length
    writeFileSync(w.files.secretFile, intruder.secret + ' '.repeat(CREDENTIAL_FILE_MAX_BYTES))
    t.ok(await until(() => after(w.outcomes, from, tooLarge)), 'a secret padded with whitespace past the bound is refused too')
    await rotationStillWorks(t, w)
  })
})

t.test('a directory or a symlink to /dev/zero in place of a credential file is refused', async t => {
  t.ok(existsSync('/dev/zero'))
  const w = await watching(t, 'not-regular')
  const { keyFile, secretFile } = w.files
  const cases: [string, () => void, string, RegExp][] = [
    ['a directory as the key file', () => { rmSync(keyFile); mkdirSync(keyFile) }, 'COS_ACCESS_KEY_FILE', /is a directory, not a regular file/],
    ['a symlink to /dev/zero as the secret file', () => { replaceFiles(w.files, w.old); rmSync(secretFile); symlinkSync('/dev/zero', secretFile) }, 'COS_ACCESS_KEY_SECRET_FILE', /is a device, not a regular file/],
  ]
  for (const [name, place, variable, problem] of cases) {
    const from = w.outcomes.length
    place()
    t.ok(await until(() => after(w.outcomes, from, refusedAs('not_a_regular_file', variable, problem))), `${name}: refused`)
    t.ok(inForce(w.store, w.old), `${name}: the pair in force stays`)
  }
  await rotationStillWorks(t, w)
})

t.test('a credential read that never ends cannot wedge the watcher', async t => {
  const w = await watching(t, 'stuck', { reloadMs: 100, readTimeoutMs: 200 })
  // Every libuv thread blocked in open() on a FIFO nobody writes to: the
  // watcher's next read queues behind them and does not end by itself, as on
  // a hung network file system.
  const threads = Number(process.env.UV_THREADPOOL_SIZE ?? 4)
  const fifos = Array.from({ length: threads }, (_, i) => join(tmp, 'stuck', `blocker-${i}`))
  for (const f of fifos) mkfifo(f)
  const blocked: Promise<FileHandle>[] = fifos.map(f => open(f, 'r'))
  let released = false
  const release = async (): Promise<void> => {
    if (released) return
    released = true
    // A writer end lets each blocked open() return.
    const writers = fifos.map(f => openSync(f, constants.O_WRONLY | constants.O_NONBLOCK))
    for (const handle of await Promise.all(blocked)) await handle.close()
    for (const fd of writers) closeSync(fd)
  }
  t.teardown(release)
  await sleep(50) // the threads take the opens up

  const ticks = ticker(t)
  const from = w.outcomes.length
  const timedOut = refusedAs('read_timeout', 'COS_ACCESS_KEY_FILE and COS_ACCESS_KEY_SECRET_FILE', /could not be read within 200 ms/)
  t.ok(await until(() => after(w.outcomes, from, timedOut)), 'reported as a read that did not end in time')
  const stuckAt = w.outcomes.length
  t.ok(await until(() => w.outcomes.length >= stuckAt + 3), 'the periodic re-reads go on reporting rather than waiting')
  t.ok(w.outcomes.slice(stuckAt).every(timedOut), 'without starting more reads behind the stuck one')
  t.ok(ticks() >= 5, `the event loop kept turning (${ticks()} ticks)`)

  await release()
  await rotationStillWorks(t, w)
})

t.test('a FIFO or an oversized file at a TLS path is refused without blocking: a ConfigError at start, the previous material kept on a re-read', async t => {
  const pki = makePki()
  t.teardown(() => { pki.cleanup() })
  const fifo = join(tmp, 'ca-fifo.pem')
  mkfifo(fifo)
  const huge = join(tmp, 'ca-huge.pem')
  copyFileSync(pki.caFile, huge)
  truncateSync(huge, TLS_FILE_MAX_BYTES + 1)
  const atStart: [string, Config['tls'], string, RegExp][] = [
    ['a FIFO as COS_CA_FILE', { caFile: fifo }, 'COS_CA_FILE', /is a FIFO, not a regular file/],
    ['a FIFO as COS_CLIENT_KEY_FILE', { clientCertFile: pki.clientCertFile, clientKeyFile: fifo }, 'COS_CLIENT_KEY_FILE', /is a FIFO/],
    ['a directory as COS_CLIENT_CERT_FILE', { clientCertFile: tmp, clientKeyFile: pki.clientKeyFile }, 'COS_CLIENT_CERT_FILE', /is a directory/],
    ['a CA bundle past 1 MiB', { caFile: huge }, 'COS_CA_FILE', /is larger than 1048576 bytes/],
  ]
  for (const [name, tls, variable, problem] of atStart) {
    t.throws(() => readTlsMaterial(tls), ConfigError, name)
    t.throws(() => readTlsMaterial(tls), { variable, message: problem }, name)
  }

  const caFile = join(tmp, 'ca-rotating.pem')
  copyFileSync(pki.caFile, caFile)
  const upstreams = new Upstreams({ connectTimeoutMs: 1000, headersTimeoutMs: 1000, bodyIdleTimeoutMs: 1000, maxConnections: 32, tls: { caFile }, tlsReloadMs: 20, logger })
  upstreams.watch()
  t.teardown(() => upstreams.close())
  const ticks = ticker(t)
  const lines = logs.lines.length
  const logged = (msg: string): boolean => logs.records.slice(lines).some(r => r.msg === msg)
  mkfifo(caFile)
  t.ok(await until(() => logged('TLS files changed but cannot be used; keeping the previous ones')), 'a FIFO on a re-read: refused, the previous material kept')
  await sleep(100) // more polls find the FIFO
  t.ok(ticks() >= 3, `the event loop kept turning (${ticks()} ticks)`)
  rmSync(caFile)
  copyFileSync(pki.otherCaFile, caFile)
  t.ok(await until(() => logged('TLS files changed: new upstream connections use them')), 'a valid bundle in its place is used')
})

t.test('logs over all of the above: pairs applied and refused are logged, no secret ever is', async t => {
  const records = logs.records
  t.ok(records.some(r => r.level === 'info' && typeof r.accessKey === 'string' && String(r.msg).includes('key pair in force')), 'applied pairs logged at info with the access key')
  t.ok(records.some(r => r.level === 'error' && typeof r.variable === 'string' && typeof r.problem === 'string'), 'refusals logged at error with variable and problem')
  const text = logs.text
  t.ok(allPairs.length >= 10)
  for (const p of allPairs) t.notOk(text.includes(p.secret), `secret of ${p.key} not logged`)
})
