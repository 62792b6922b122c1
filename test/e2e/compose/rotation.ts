// The README's second recipe, "against the real API": the unedited examples/compose.yaml with
// COS_MANAGEMENT_API_URL, COS_OPTIMIZE_API_URL and COS_CREDENTIALS_DIR set, `up -d app` (the
// proxy but not the mock). The "real API" is test/e2e/kubelet/upstream.ts inside the namespace
// (reached from the containers at the compose network's gateway, 172.28.0.1): it verifies every
// token against the pairs it is told to accept, as the COS API does across a rotation (the new
// key issued first, the old one revoked after). `mock-api` cannot stand in here: it reads its
// one pair at start and never again. Proof 5: the key files rewritten in place on the host reach
// the running proxy with no failed request; a rename over them does not (the container's file
// bind mount keeps the old file); then `down` (proof 6 again).
import { spawn, type ChildProcess } from 'node:child_process'
import { chmodSync, mkdirSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { equal, ok, section } from '../harness/checks.js'
import { ROOT, seconds, sleep } from '../harness/processes.js'
import { metric } from '../kubelet/node.js'
import { clean, containers, curl, EXAMPLE, inEngineAsync, podmanExec, say, secret, serviceLog, waitFor, type Compose, type Engine } from './engine.js'
import { appStatuses, downClean, upInOrder } from './example.js'
import { accessKeyHint } from '../../../src/credentials/credentials.js'

const PORT = 18082
const GATEWAY = '172.28.0.1'
const APPLIED = ['cos_auth_proxy_credential_reloads_total', { result: 'applied' }] as const
const LOOP = 120 // requests across the swap, one every ~0.1 s

interface Pair { key: string, secret: string }
interface Seen { t: number, key: string, status: number, path: string }

// Keys of 32+ characters: the log's hint of one (accessKeyHint) keeps 4 at each end, enough to tell them apart.
const newPair = (name: string): Pair => ({ key: `compose-${name}-${randomBytes(12).toString('hex')}`, secret: secret(`SeCrEt-${name}-${randomBytes(18).toString('base64')}`) })

/** test/e2e/kubelet/upstream.ts in the namespace, on every address there (its loopback and the compose bridges only). */
function startUpstream (netns: string): { child: ChildProcess, seen: Seen[], say: (line: string) => void, output: () => string } {
  const child = spawn('nsenter', [`--net=/run/netns/${netns}`, process.execPath, '--import', 'tsx', 'test/e2e/kubelet/upstream.ts', '0.0.0.0', String(PORT)],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] })
  const seen: Seen[] = []
  let output = ''
  const keep = (l: string): void => { output += `${l}\n` }
  createInterface({ input: child.stdout }).on('line', l => {
    keep(l)
    try {
      const o = JSON.parse(l) as { t?: string, key?: string, status?: number, path?: string }
      if (o.status !== undefined) seen.push({ t: Date.parse(o.t ?? ''), key: o.key ?? '', status: o.status, path: o.path ?? '' })
    } catch { /* not a request line */ }
  })
  createInterface({ input: child.stderr }).on('line', keep)
  return { child, seen, say: line => { child.stdin.write(`${line}\n`) }, output: () => output }
}

function writePair (dir: string, p: Pair, how: 'create' | 'in place' | 'rename'): void {
  for (const [file, value] of [['access-key', p.key], ['access-key-secret', p.secret]] as const) {
    if (how === 'rename') {
      writeFileSync(join(dir, `.${file}.new`), value, { mode: 0o444 })
      renameSync(join(dir, `.${file}.new`), join(dir, file))
    } else {
      writeFileSync(join(dir, file), value) // O_TRUNC on the file that is there: the same inode
      if (how === 'create') chmodSync(join(dir, file), 0o444)
    }
  }
}

/** `onChild` is given the upstream's stop at once, for an interrupted run. */
export async function rotation (e: Engine, work: string, onChild: (child: { stop: () => void }) => void): Promise<void> {
  const dir = join(work, 'real-credentials')
  mkdirSync(dir)
  const [a, b, c] = [newPair('a'), newPair('b'), newPair('c')]
  writePair(dir, a, 'create')
  const upstream = startUpstream(e.netns)
  const stop = (): void => { if (upstream.child.exitCode === null) upstream.child.kill('SIGTERM') }
  onChild({ stop })
  upstream.say(`accept ${a.key} ${a.secret}`)
  const api = `http://${GATEWAY}:${PORT}`
  const cmp: Compose = { files: [EXAMPLE], env: { COS_MANAGEMENT_API_URL: `${api}/management`, COS_OPTIMIZE_API_URL: `${api}/optimize`, COS_CREDENTIALS_DIR: dir } }
  const metrics = (): string => curl(e, 'http://127.0.0.1:9090/metrics').body
  const ino = (): number[] => ['access-key', 'access-key-secret'].map(f => statSync(join(dir, f)).ino)

  await section('against a "real" API: up -d app brings up the proxy, not the mock (proof 1 again)', async () => {
    await upInOrder(e, cmp, ['app'], 'examples/compose.yaml, COS_*_API_URL and COS_CREDENTIALS_DIR set')
    equal([...(await containers(e)).keys()].sort(), ['app', 'cos-auth-proxy'], 'only app and cos-auth-proxy run')
    const statuses = await waitFor('two requests in the app\'s log', 60, () => {
      const s = appStatuses(serviceLog(e, cmp, 'app'))
      return s.length >= 2 ? s : undefined
    })
    ok(statuses.every(s => s === '200') && upstream.seen.some(s => s.key === a.key && s.status === 200),
      `the app's log: ${statuses.map(s => `-> HTTP ${s}`).join(', ')}; the upstream verified pair a`)
  })

  await section('the key pair rewritten in place on the host: in force with no failed request (proof 5)', async () => {
    const app = (await containers(e)).get('app')?.Id ?? '?'
    const applied0 = metric(metrics(), ...APPLIED)
    const t0 = Date.now()
    const loop = inEngineAsync(e, ['podman', 'exec', app, 'sh', '-c',
      `i=0; while [ $i -lt ${LOOP} ]; do curl -sS -o /dev/null -m 10 -w '%{http_code}\\n' http://cos-auth-proxy:8080/management/v1/clusters; i=$((i+1)); sleep 0.1; done`],
    { timeoutMs: 300_000 })
    await waitFor('5 requests of the loop with pair a', 60, () => upstream.seen.filter(s => s.t >= t0 && s.key === a.key).length >= 5 ? true : undefined)
    upstream.say(`accept ${b.key} ${b.secret}`) // the new key issued at the API first
    const inodes = ino()
    const tSwap = Date.now()
    writePair(dir, b, 'in place')
    equal(ino(), inodes, 'access-key and access-key-secret rewritten in place (same inodes: what the bind mounts hold)')
    const applied = await waitFor('the proxy to apply pair b', 60, () => metric(metrics(), ...APPLIED) > applied0 ? Date.now() : undefined)
    ok(metric(metrics(), ...APPLIED) === applied0 + 1, `cos_auth_proxy_credential_reloads_total{result="applied"} ${applied0} -> ${applied0 + 1}, within ${((applied - tSwap) / 1000).toFixed(1)} s`)
    upstream.say(`revoke ${a.key}`) // and the old one revoked once the proxy uses the new one
    const tRevoke = Date.now()
    const r = await loop.done
    const codes = r.stdout.trim().split('\n')
    ok(r.code === 0 && codes.length === LOOP && codes.every(s => s === '200'), `${codes.length} requests from the app's container across the swap (${seconds(t0)}): all 200`,
      clean(`${r.stdout}${r.stderr}`.slice(-500), 'the loop'))
    const during = upstream.seen.filter(s => s.t >= t0)
    const afterRevoke = during.filter(s => s.t > tRevoke + 200)
    ok(during.every(s => s.status === 200) && afterRevoke.length >= 5 && afterRevoke.every(s => s.key === b.key),
      `the upstream: ${during.filter(s => s.key === a.key).length} with pair a, then ${during.filter(s => s.key === b.key).length} with pair b (${afterRevoke.length} after a was revoked), none refused`)
    const log = serviceLog(e, cmp, 'cos-auth-proxy')
    ok(log.includes('credentials: key pair in force') && log.includes(`"accessKey":"${accessKeyHint(b.key)}"`) && !log.includes(b.key),
      `the proxy's log: "credentials: key pair in force" with accessKey ${accessKeyHint(b.key)} (never the whole key)`)
    ok(appStatuses(serviceLog(e, cmp, 'app')).every(s => s === '200'), 'the app\'s own loop: every request 200')
  })

  await section('a rename over the key files is not seen (the file bind mount keeps the old file)', async () => {
    const proxy = (await containers(e)).get('cos-auth-proxy')?.Id ?? '?'
    const applied0 = metric(metrics(), ...APPLIED)
    const inodes = ino()
    writePair(dir, c, 'rename')
    ok(ino().every((n, i) => n !== inodes[i]), 'new files renamed over both (new inodes)')
    await sleep(5000) // five reload periods (COS_CREDENTIALS_RELOAD_MS 1000) and the settling read
    equal(metric(metrics(), ...APPLIED), applied0, 'after 5 s the proxy has applied nothing new')
    const inside = podmanExec(e, proxy, ['/nodejs/bin/node', '-e', 'process.stdout.write(require("node:fs").readFileSync("/run/secrets/cos_access_key","utf8"))'])
    equal(inside.stdout, b.key, 'the container still reads the old access key at /run/secrets/cos_access_key')
    const t = Date.now()
    const app = (await containers(e)).get('app')?.Id ?? '?'
    const r = podmanExec(e, app, ['curl', '-sS', '-o', '/dev/null', '-m', '10', '-w', '%{http_code}', 'http://cos-auth-proxy:8080/optimize/v1/workloads/recommendations'])
    await sleep(200)
    ok(r.stdout === '200' && upstream.seen.filter(s => s.t >= t - 50).every(s => s.key === b.key), 'requests are still signed with pair b')
  })

  await section('no secret in a log or in this output', async () => {
    const text = ['cos-auth-proxy', 'app'].map(s => serviceLog(e, cmp, s)).join('\n')
    ok(text.length > 1000, `the services' logs read (${text.length} bytes, secrets checked by the final section)`)
    clean(upstream.output(), 'the upstream\'s output')
    say(`    upstream: ${upstream.seen.length} requests verified`)
  })

  await section('down (proof 6 again)', async () => {
    await downClean(e, cmp, '"real" API')
    stop()
  })
}
