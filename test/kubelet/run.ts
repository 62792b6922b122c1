// Pods a kubelet runs (issue 34), first part: the parent-chart example installed by helm on a
// real one-node cluster (scripts/kube-node.sh: containerd, the control plane, kubelet,
// kube-scheduler and kube-proxy, all inside the network namespace the script makes), the
// project's image as its sidecar, the mock API inside that namespace as the token-verifying
// upstream. Proves: native sidecar started (and its startup probe passed) before the app, the
// app's requests through 127.0.0.1:8080 answered 200, the kubelet's probes on the admin port;
// plain-container mode works too; `down` leaves the host as it was.
//
// Not part of `npm test` (tap runs test/**/*.test.ts; this file is not named so). Run as root:
//   node --import tsx test/kubelet/run.ts
// Ends with "N passed, N failed"; without the node's binaries, helm or the image it says how
// to get them and exits 2 (0 passed, 0 failed, 1 skipped: never green by accident).
// env: HELM (default helm on PATH), COS_KUBELET_IMAGE (podman image of this repository's
// Dockerfile, default localhost/cos-auth-proxy:kubelet), COS_KUBE_VERSION and the other
// COS_KUBE_* that scripts/kube-node.sh reads, COS_KUBELET_TIMEOUT_S (default 900).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes } from 'node:crypto'
import { ok, section, summary } from '../kubernetes/report.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..')
const NODE_SCRIPT = join(ROOT, 'scripts/kube-node.sh')
const CLI = join(ROOT, 'dist/cos-auth-proxy.mjs')
const NETNS = process.env.COS_KUBE_NETNS ?? 'cos-kube-node'
const NODE_IP = '10.88.0.1'
const MOCK_PORT = 18081
const IMAGE = process.env.COS_KUBELET_IMAGE ?? 'localhost/cos-auth-proxy:kubelet'
const APP_IMAGE = 'localhost/cos-kube-app:1'
const HELM = process.env.HELM ?? 'helm'

interface Run { code: number, stdout: string, stderr: string }
function sh (cmd: string, args: readonly string[], opts: { env?: NodeJS.ProcessEnv, timeoutMs?: number, input?: string } = {}): Run {
  const r = spawnSync(cmd, args, { encoding: 'utf8', env: opts.env ?? process.env, timeout: opts.timeoutMs ?? 300_000, input: opts.input, maxBuffer: 64 << 20 })
  return { code: r.status ?? 1, stdout: r.stdout, stderr: r.stderr }
}
const node = (args: readonly string[], timeoutMs?: number): Run => sh('bash', [NODE_SCRIPT, ...args], { timeoutMs })
/** kubectl (or any command) inside the namespace, KUBECONFIG set by kube-node.sh exec. */
const inNs = (args: readonly string[], timeoutMs?: number): Run => node(['exec', ...args], timeoutMs)
const kubectl = (...args: string[]): Run => inNs(['kubectl', ...args])

function skipped (why: string, how: string): never {
  console.log(`kubelet: SKIPPED: ${why}\n${how}`)
  console.log('0 passed, 0 failed, 1 skipped')
  process.exit(2)
}

/** Brings the node down (once); set by main when the node is up. */
let stopNode: () => void = () => {}

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))
async function until<T> (what: string, seconds: number, probe: () => T | undefined): Promise<T> {
  const end = Date.now() + seconds * 1000
  for (;;) {
    const v = probe()
    if (v !== undefined) return v
    if (Date.now() > end) throw new Error(`timed out after ${seconds} s: ${what}`)
    await sleep(1000)
  }
}

/** The part of a Pod these checks read. */
interface ContainerStatus { name: string, state?: { running?: { startedAt?: string } } }
interface Pod {
  metadata: { name: string, deletionTimestamp?: string }
  spec: { initContainers?: Array<{ name: string, restartPolicy?: string }>, containers: Array<{ name: string }> }
  status: { phase?: string, podIP?: string, initContainerStatuses?: ContainerStatus[], containerStatuses?: ContainerStatus[] }
}

function podJson (release: string): Pod | undefined {
  const r = kubectl('get', 'pods', '-l', `app.kubernetes.io/instance=${release}`, '-o', 'json')
  if (r.code !== 0) return undefined
  const items = (JSON.parse(r.stdout) as { items: Pod[] }).items
  return items.find(p => p.metadata.deletionTimestamp === undefined && p.status.phase === 'Running')
}

/** The app stand-in's log lines: "<time> request <n> GET <url> <status|error ...> ...". */
function appRequests (pod: string): Array<{ n: number, status: string }> {
  const r = kubectl('logs', pod, '-c', 'app')
  return r.stdout.split('\n').flatMap(l => {
    const m = / request (\d+) GET \S+ (\S+)/.exec(l)
    return m === null ? [] : [{ n: Number(m[1]), status: m[2] ?? '' }]
  })
}

async function main (): Promise<number> {
  if (process.getuid?.() !== 0) skipped('not root', 'run as root (network namespace, mounts, cgroups)')
  if (node(['built']).code !== 0) {
    skipped('the node\'s binaries or the pause image are not in the cache',
      `build them once (control plane ~10 min on 2 cores, then ~1.5 min for the node):\n  ${process.env.COS_KUBE_VERSION === undefined ? '' : `COS_KUBE_VERSION=${process.env.COS_KUBE_VERSION} `}bash scripts/kube-node.sh build`)
  }
  if (sh(HELM, ['version', '--short']).code !== 0) skipped(`no helm (${HELM})`, 'set HELM=/path/to/helm (HELM=$(bash ../shared/tools/get-helm.sh | tail -1))')
  if (!existsSync(CLI)) skipped(`no ${CLI}`, 'run npm run build first')
  if (sh('podman', ['image', 'exists', IMAGE]).code !== 0) {
    skipped(`no podman image ${IMAGE}`, `build it as the packaging step does (~3 min):\n  bash ../shared/tools/container-smoke.sh -t ${IMAGE} --build-only --keep Dockerfile .`)
  }

  const work = mkdtempSync(join(tmpdir(), 'cos-kubelet-'))
  const children: { mock?: ChildProcess } = {}
  let up = false
  let stopped = false
  const stop = (): Run | undefined => {
    if (stopped) return undefined
    stopped = true
    if (children.mock?.exitCode === null) children.mock.kill('SIGTERM')
    const r = up ? node(['down'], 300_000) : undefined
    if (r !== undefined) console.log(`${r.stdout}${r.stderr}`.trim())
    rmSync(work, { recursive: true, force: true })
    return r
  }
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.on(signal, () => {
      console.log(`kubelet: ${signal}: bringing the node down`)
      stop()
      console.log(`${summary().passed} passed, ${summary().failed + 1} failed`)
      process.exit(130)
    })
  }
  stopNode = () => { stop() }
  process.on('exit', () => { stop() })
  const limit = Number(process.env.COS_KUBELET_TIMEOUT_S ?? '900')
  setTimeout(() => {
    console.log(`kubelet: the whole run took over ${limit} s: stopping`)
    console.log(`${summary().passed} passed, ${summary().failed + 1} failed`)
    process.exit(1)
  }, limit * 1000).unref()

  // The app stand-in: the project's image (it has node) with an entrypoint that GETs
  // $COS_MANAGEMENT_URL/v1/clusters every 2 s and logs the status; the chart's app container
  // takes only an image, so the behaviour has to be in the image.
  const t0 = Date.now()
  const app = "const u = process.env.COS_MANAGEMENT_URL + '/v1/clusters'; let n = 0; const tick = async () => { n++; try { const r = await fetch(u); await r.text(); console.log(new Date().toISOString(), 'request', n, 'GET', u, r.status); } catch (e) { console.log(new Date().toISOString(), 'request', n, 'GET', u, 'error', e.cause ? e.cause.code : e.message); } setTimeout(tick, 2000); }; tick(); process.on('SIGTERM', () => { console.log('app: SIGTERM'); process.exit(0); });"
  writeFileSync(join(work, 'Containerfile'), `FROM ${IMAGE}\nENTRYPOINT ${JSON.stringify(['/nodejs/bin/node', '-e', app])}\nCMD []\n`)
  for (const [args, what] of [
    [['build', '-q', '-t', APP_IMAGE, work], 'podman build of the app stand-in'],
    [['save', '--format', 'docker-archive', '-o', join(work, 'image.tar'), IMAGE], `podman save ${IMAGE}`],
    [['save', '--format', 'docker-archive', '-o', join(work, 'app.tar'), APP_IMAGE], `podman save ${APP_IMAGE}`],
  ] as const) {
    const r = sh('podman', args)
    if (r.code !== 0) { console.log(`${what} failed: ${r.stderr.trim()}`); console.log('0 passed, 1 failed'); return 1 }
  }
  console.log(`# images saved in ${((Date.now() - t0) / 1000).toFixed(1)} s`)

  const t1 = Date.now()
  up = true
  const started = node(['up', '--image', join(work, 'image.tar'), '--image', join(work, 'app.tar')], 600_000)
  console.log(`${started.stdout}${started.stderr}`.trim())
  if (started.code !== 0) { up = false; console.log('0 passed, 1 failed'); return 1 }
  console.log(`# up in ${((Date.now() - t1) / 1000).toFixed(1)} s`)
  const runDir = /export COS_KUBE_NODE_RUN=(\S+)/.exec(started.stdout)?.[1] ?? ''

  // The upstream: the mock API inside the namespace, on the node's address (pods reach it
  // through the bridge), verifying every token against a throwaway pair.
  const key = `kubelet-${randomBytes(4).toString('hex')}`
  const secret = randomBytes(24).toString('base64')
  writeFileSync(join(work, 'access-key'), key)
  writeFileSync(join(work, 'access-key-secret'), secret)
  const mockLog: string[] = []
  const mock = children.mock = spawn('nsenter', [`--net=/run/netns/${NETNS}`, process.execPath, CLI, 'mock-api', '--port', String(MOCK_PORT)], {
    env: { ...process.env, COS_ACCESS_KEY: key, COS_ACCESS_KEY_SECRET: secret, COS_MOCK_HOST: NODE_IP, COS_LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  mock.stdout.on('data', (b: Buffer) => { mockLog.push(b.toString()) })
  mock.stderr.on('data', (b: Buffer) => { mockLog.push(b.toString()) })

  const helmEnv = { ...process.env, HELM_CONFIG_HOME: join(work, 'helm/config'), HELM_CACHE_HOME: join(work, 'helm/cache'), HELM_DATA_HOME: join(work, 'helm/data') }
  const helm = (args: readonly string[]): Run => sh('bash', [NODE_SCRIPT, 'exec', HELM, ...args], { env: helmEnv, timeoutMs: 300_000 })
  // A copy of the example beside a copy of the chart (file://../../helm/cos-auth-proxy), so
  // that `helm dependency build` writes nothing into the working tree.
  cpSync(join(ROOT, 'examples/sidecar-parent-chart'), join(work, 'examples/sidecar-parent-chart'), { recursive: true })
  cpSync(join(ROOT, 'helm/cos-auth-proxy'), join(work, 'helm/cos-auth-proxy'), { recursive: true })
  const chart = join(work, 'examples/sidecar-parent-chart')
  const dep = sh(HELM, ['dependency', 'build', chart], { env: helmEnv })
  if (dep.code !== 0) throw new Error(`helm dependency build: ${dep.stderr}`)
  const [repository, tag] = [IMAGE.slice(0, IMAGE.lastIndexOf(':')), IMAGE.slice(IMAGE.lastIndexOf(':') + 1)]
  writeFileSync(join(work, 'values.yaml'), [
    `image: ${APP_IMAGE}`,
    'replicaCount: 1',
    'cos-auth-proxy:',
    `  image: {repository: ${repository}, tag: ${tag}, pullPolicy: Never}`,
    `  upstream: {managementUrl: "http://${NODE_IP}:${MOCK_PORT}/management", optimizeUrl: "http://${NODE_IP}:${MOCK_PORT}/optimize"}`,
    '',
  ].join('\n'))

  await section('setup', async () => {
    ok(kubectl('create', 'secret', 'generic', 'cos-credentials', `--from-file=access-key=${join(work, 'access-key')}`,
      `--from-file=access-key-secret=${join(work, 'access-key-secret')}`).code === 0, 'Secret cos-credentials created')
    await until('the mock API answering inside the namespace', 30, () =>
      inNs(['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', `http://${NODE_IP}:${MOCK_PORT}/management/v1/clusters`]).stdout === '401' ? true : undefined)
    ok(true, `mock API on ${NODE_IP}:${MOCK_PORT} inside ${NETNS} refuses a request without a token (401)`)
  })

  for (const [release, native] of [['native', true], ['plain', false]] as const) {
    await section(`parent chart, sidecar.native=${native}`, async () => {
      const t = Date.now()
      const r = helm(['install', release, chart, '-f', join(work, 'values.yaml'), '--set', `cos-auth-proxy.sidecar.native=${native}`, '--wait', '--timeout', '180s'])
      if (!ok(r.code === 0, `helm install ${release} (${((Date.now() - t) / 1000).toFixed(1)} s)`, r.stderr.trim())) return
      const pod = await until(`a Running pod of ${release}`, 120, () => podJson(release))
      const name = pod.metadata.name
      const statuses = [...(pod.status.initContainerStatuses ?? []), ...(pod.status.containerStatuses ?? [])]
      const proxy = statuses.find(s => s.name === 'cos-auth-proxy')
      const appStatus = statuses.find(s => s.name === 'app')
      ok(native ? (pod.spec.initContainers ?? []).some(c => c.name === 'cos-auth-proxy' && c.restartPolicy === 'Always')
        : pod.spec.containers.some(c => c.name === 'cos-auth-proxy'),
      native ? 'the proxy is a native sidecar (initContainer, restartPolicy: Always)' : 'the proxy is a plain container beside the app')
      const requests = await until(`a 200 in the app's log of ${name}`, 90, () => {
        const rs = appRequests(name)
        return rs.some(q => q.status === '200') ? rs : undefined
      })
      const first = requests[0]
      if (native) {
        const [ps, as] = [proxy?.state?.running?.startedAt ?? '', appStatus?.state?.running?.startedAt ?? '']
        ok(ps !== '' && as !== '' && Date.parse(ps) <= Date.parse(as), `the proxy started before the app (${ps} <= ${as})`)
        ok(first?.status === '200', `the app's first request through 127.0.0.1:8080 got ${first?.status ?? 'nothing'} (want 200)`)
      } else {
        // Plain container: both start together; the app retries until the proxy listens.
        const firstOk = requests.findIndex(q => q.status === '200')
        ok(firstOk >= 0, `the app got 200 through 127.0.0.1:8080 at request ${firstOk + 1} (before it: ${requests.slice(0, firstOk).map(q => q.status).join(', ') || 'nothing'})`)
      }
      ok(requests.filter(q => q.status === '200').length >= 1 && requests.slice(requests.findIndex(q => q.status === '200')).every(q => q.status === '200'),
        `every request after the first 200 got 200 (${requests.length} requests)`)
      const kubeletLog = readFileSync(join(runDir, 'kubelet.log'), 'utf8')
      const podRef = `pod="default/${name}"`
      ok(kubeletLog.split('\n').some(l => l.includes('probe="startup"') && l.includes('status="started"') && l.includes(podRef)),
        'the kubelet\'s startup probe on the admin port passed (kubelet log: probe="startup" status="started")')
      ok(kubeletLog.split('\n').some(l => l.includes('probe="readiness"') && l.includes('status="ready"') && l.includes(podRef)),
        'the kubelet\'s readiness probe on the admin port passed (kubelet log: probe="readiness" status="ready")')
      const podIP = pod.status.podIP ?? '?'
      const seen = await until(`the mock API's log of a request from ${podIP}`, 15, () => mockLog.join('').includes(`"remoteAddress":"${podIP}"`) ? true : undefined).catch(() => false)
      ok(seen, `the mock API saw the requests come from the pod's address ${podIP}`)
      const del = helm(['uninstall', release, '--wait', '--timeout', '120s'])
      ok(del.code === 0, `helm uninstall ${release}`, del.stderr.trim())
    })
  }

  await section('down', async () => {
    const t = Date.now()
    const r = stop()
    ok(r?.code === 0, `down: everything stopped and the host as before up (${((Date.now() - t) / 1000).toFixed(1)} s)`, r?.stderr.trim())
    await Promise.resolve()
  })
  const s = summary()
  if (s.failures.length > 0) console.log(`failed:\n${s.failures.map(f => `  ${f}`).join('\n')}`)
  console.log(`${s.passed} passed, ${s.failed} failed`)
  return s.failed === 0 ? 0 : 1
}

main().then(code => { process.exitCode = code }, (err: unknown) => {
  console.log(err instanceof Error ? err.stack : String(err))
  stopNode() // before the closing line, so that it is the last one
  console.log(`${summary().passed} passed, ${summary().failed + 1} failed`)
  process.exitCode = 1
})
