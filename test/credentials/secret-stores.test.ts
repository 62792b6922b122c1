// The key pair as the secret stores people use deliver it (docs/kubernetes.md,
// "Credentials from a secret store"), written step for step as each store's
// own writer does (test/mounted/volume.ts), followed by the real watcher and
// signed by the real proxy under steady load. Upstream, the mock API verifies
// every token, one instance per pair the API accepts (the old pair stays valid
// across a rotation, as the real API's does), behind a front that hands each
// request to the instance of its access key: a token with a known key whose
// signature the mock API refuses (`bad_signature`) was signed with another
// pair's secret, a mixed pair. External Secrets Operator writes a Kubernetes
// Secret, which reaches the pod through the kubelet's atomic writer: that is
// rotation.test.ts's Kubernetes case, not repeated here.
//  - The Secrets Store CSI driver: its copy of the kubelet's atomic writer
//    (one `..data` rename for both files), with its own details.
//  - Vault Agent (consul-template): each file its own template, each renamed
//    into place on its own, so the key and the secret change in two renames,
//    possibly far apart; the pair must not be signed with half done.
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, statSync } from 'node:fs'
import { Agent, request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import type { FastifyInstance } from 'fastify'
import { loadConfig } from '../../src/config/config.js'
import { CredentialWatcher, PARTIAL_PAIR_HOLD_MS } from '../../src/credentials/credential-watcher.js'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildMockApi } from '../../src/mock-api/mock-api.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { HeaderMinter, parseToken, secretKey } from '../../src/token/token.js'
import { keepAliveGet, LogCapture, startUpstream, until } from '../support/helpers.js'
import { Volume } from '../mounted/volume.js'

const tmp = mkdtempSync(join(tmpdir(), 'cos-stores-'))
t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })
const logs = new LogCapture()
const logger = createLogger('debug', logs)

const KEY = 'access-key'
const SECRET = 'access-key-secret'
interface Pair { readonly key: string, readonly secret: string }
let made = 0
function newPair (): Pair {
  made++
  return { key: `AKSTORE${made}${randomBytes(4).toString('hex')}`, secret: `SeCrEt-StOrE-${made}-${randomBytes(8).toString('hex')}` }
}
const files = (p: Pair): Record<string, string> => ({ [KEY]: p.key, [SECRET]: p.secret })

type Verdict = 'ok' | 'mixed' | 'unknown'

interface Running {
  readonly store: CredentialStore
  readonly url: string
  /** The API accepts `p` from now on (a mock API for it), the pairs before it still. */
  readonly accept: (p: Pair) => Promise<void>
  readonly verdicts: Map<Verdict, number>
  /** Each access key the mock API accepted a token of, in the order first seen. */
  readonly keysSeen: string[]
}

/** The real proxy and watcher on `volume`'s files, upstream the mock API for each accepted pair. */
async function running (t: Test, volume: Volume, first: Pair): Promise<Running> {
  const mocks = new Map<string, { readonly app: FastifyInstance, readonly port: number }>()
  const verdicts = new Map<Verdict, number>()
  const keysSeen: string[] = []
  const count = (v: Verdict): void => { verdicts.set(v, (verdicts.get(v) ?? 0) + 1) }
  const accept = async (p: Pair): Promise<void> => {
    const app = buildMockApi({ accessKey: p.key, key: secretKey(p.secret) })
    await app.listen({ host: '127.0.0.1', port: 0 })
    mocks.set(p.key, { app, port: (app.server.address() as AddressInfo).port })
  }
  await accept(first)
  const upstream = await startUpstream((req, res) => {
    const parsed = parseToken(req.headers.authorization ?? '')
    const mock = parsed.ok ? mocks.get(parsed.fields.accessKey) : undefined
    if (mock === undefined || !parsed.ok) { count('unknown'); res.writeHead(401).end('unknown key'); return }
    const key = parsed.fields.accessKey
    const forward = httpRequest({ host: '127.0.0.1', port: mock.port, method: req.method, path: req.url, headers: req.headers }, answer => {
      const chunks: Buffer[] = []
      answer.on('data', (c: Buffer) => chunks.push(c))
      answer.on('end', () => {
        const body = Buffer.concat(chunks)
        if (answer.statusCode === 200) {
          count('ok')
          if (!keysSeen.includes(key)) keysSeen.push(key)
        } else count(body.toString().includes('"bad_signature"') ? 'mixed' : 'unknown')
        res.writeHead(answer.statusCode ?? 502, { 'content-type': answer.headers['content-type'] ?? 'application/json' }).end(body)
      })
    })
    forward.on('error', () => { count('unknown'); res.writeHead(502).end() })
    forward.end()
  })
  const config = loadConfig({
    env: { COS_API_URL: upstream.url, COS_ACCESS_KEY_FILE: volume.path(KEY), COS_ACCESS_KEY_SECRET_FILE: volume.path(SECRET), COS_LISTEN_PORT: '0' },
    dotenv: false,
  })
  const store = new CredentialStore()
  // The poll far off: the stores' writers are followed by their events.
  const watcher = new CredentialWatcher({ credentials: config.credentials, encoding: config.tokenEncoding, store, reloadMs: 600_000, logger })
  const app = await buildProxyServer({ config, credentials: store, logger, resyncCredentials: () => { watcher.nudge() } })
  t.same(await watcher.start(), { result: 'applied', accessKey: first.key }, 'the first pair in force')
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(async () => {
    watcher.close()
    await app.close()
    await upstream.close()
    await Promise.all([...mocks.values()].map(m => m.app.close()))
  })
  return { store, url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/management/v1/clusters`, accept, verdicts, keysSeen }
}

function inForce (store: CredentialStore, p: Pair): boolean {
  return store.current?.samePair(new HeaderMinter(p.key, secretKey(p.secret), 'url')) === true
}

/** Four clients sending GETs over keep-alive until stopped; what did not come back 200 is kept. */
function load (url: string): { readonly ok: () => number, readonly stop: () => Promise<(number | string)[]> } {
  const agent = new Agent({ keepAlive: true, maxSockets: 4 })
  let running = true
  let ok = 0
  const failures: (number | string)[] = []
  const clients = Array.from({ length: 4 }, async () => {
    while (running) {
      const status = await keepAliveGet(url, agent)
      if (status === 200) ok++
      else failures.push(status)
    }
  })
  return {
    ok: () => ok,
    stop: async () => { running = false; await Promise.all(clients); agent.destroy(); return failures },
  }
}

t.test('Vault Agent: a key rendered into place before its secret never signs a request with the new key and the old secret', async t => {
  const volume = new Volume(join(tmp, 'vault-secrets'))
  const pairs = [newPair()]
  for (const [name, text] of Object.entries(files(pairs[0] as Pair))) volume.renderTemplate(name, text, 0o440)
  const r = await running(t, volume, pairs[0] as Pair)
  const traffic = load(r.url)
  t.ok(await until(() => traffic.ok() > 20), 'traffic flows')
  // Both orders: Vault Agent renders its templates one after the other, in its
  // configuration's order; the second rename lands a render later: 300 ms here,
  // six times the watcher's settling, as a second Vault read or a second run can.
  for (const order of [[KEY, SECRET], [SECRET, KEY]] as const) {
    const next = newPair()
    pairs.push(next)
    await r.accept(next) // the new pair is valid before it is delivered; the old one stays valid
    const text = files(next)
    volume.renderTemplate(order[0], text[order[0]] ?? '', 0o440)
    await sleep(300)
    volume.renderTemplate(order[1], text[order[1]] ?? '', 0o440)
    t.ok(await until(() => inForce(r.store, next), 5000), `${order[0]} first: the new pair is in force`)
    t.ok(await until(() => r.keysSeen.includes(next.key), 2000), `${order[0]} first: the upstream sees the new key`)
    await sleep(200)
  }
  const failures = await traffic.stop()
  t.equal(r.verdicts.get('mixed') ?? 0, 0, 'no token signed with one pair\'s key and another\'s secret')
  t.same(failures, [], 'no failed request')
  t.same(r.keysSeen, pairs.map(p => p.key), 'each pair signed in turn')
  t.equal(statSync(volume.path(SECRET)).mode & 0o777, 0o440, 'the files keep the template\'s perms')
  t.comment(`${traffic.ok()} requests through 2 rotations`)
})

t.test('Vault Agent: a key that changes alone is put in force once the hold for its secret ends', async t => {
  const volume = new Volume(join(tmp, 'vault-key-only'))
  const first = newPair()
  for (const [name, text] of Object.entries(files(first))) volume.renderTemplate(name, text)
  const r = await running(t, volume, first)
  // The key corrected, the secret the same (no rotation): nothing else will come.
  const corrected = { key: `${first.key}X`, secret: first.secret }
  volume.renderTemplate(KEY, corrected.key)
  await sleep(PARTIAL_PAIR_HOLD_MS / 4)
  t.ok(inForce(r.store, first), 'held: the pair in force stays while its secret may still come')
  t.ok(await until(() => inForce(r.store, corrected), PARTIAL_PAIR_HOLD_MS + 3000), 'then the changed key is put in force with the secret as it is')
  t.match(logs.text, /credentials: key pair in force/)
  t.notOk(logs.text.includes(first.secret), 'no secret in any log line')
})

t.test('Secrets Store CSI driver: its atomic writer (symlinks made before the ..data rename, files 0644) rotates under load with no failed request', async t => {
  const volume = new Volume(join(tmp, 'csi-mount'))
  const pairs = [newPair()]
  volume.csiDriverSwap(files(pairs[0] as Pair))
  const r = await running(t, volume, pairs[0] as Pair)
  const traffic = load(r.url)
  t.ok(await until(() => traffic.ok() > 20), 'traffic flows')
  for (let i = 1; i <= 2; i++) {
    const next = newPair()
    pairs.push(next)
    await r.accept(next)
    volume.csiDriverSwap(files(next))
    t.ok(await until(() => r.keysSeen.includes(next.key), 2000), `rotation ${i}: the upstream sees the new key within 2 s`)
    await sleep(200)
  }
  const failures = await traffic.stop()
  t.same(failures, [], 'no failed request')
  t.equal(r.verdicts.get('mixed') ?? 0, 0, 'no mixed pair')
  t.same(r.keysSeen, pairs.map(p => p.key), 'each pair signed in turn')
  t.equal(statSync(volume.path(KEY)).mode & 0o777, 0o644, 'the provider\'s mode, through the symlink')
  t.notOk(logs.text.includes(pairs[0]?.secret ?? '-'), 'no secret in any log line')
})
