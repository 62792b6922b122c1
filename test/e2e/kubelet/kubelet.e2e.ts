// Pods a kubelet runs (issue 34): the chart and the injector on a real one-node cluster
// (scripts/kube-node.sh: containerd, the control plane, kubelet, kube-scheduler and
// kube-proxy, all inside the network namespace the script makes), the project's image as the
// sidecar, token-verifying upstreams inside that namespace. The node's API server is relayed to
// the host's loopback (node.ts's hostAccess): the checks read and write it with the harness's
// cluster client and run helm on the host, both given that kubeconfig. In order:
//   parent-chart.ts  the parent-chart example, native sidecar and plain container (proofs 1-2)
//   injection.ts     the injector by helm behind its Service; an injected Deployment, a Job,
//                    256 connections inside the memory limit, a delete with a request in flight
//                    (proofs 3, 5, 6, 7, 8)
//   standalone.ts    the standalone Deployment through its Service (proof 8)
//   injection.ts     the Secret rotated under the running proxy, then a refused pair (proof 4)
// and `down`, which must leave the host as it was.
//
// A tap file, not part of `npm test` (that runs test/**/*.test.ts). Run as root:
//   npm run test:kubelet
// Without root, the node's binaries, helm or the image it is one skipped test that says how to
// get them (CI counts a skip as a failure).
// env: HELM (default helm on PATH), COS_KUBELET_IMAGE (podman image of this repository's
// Dockerfile, default localhost/cos-auth-proxy:kubelet), COS_KUBE_VERSION and the other
// COS_KUBE_* that scripts/kube-node.sh reads, COS_KUBELET_TIMEOUT_S (default 1500).
import { spawn, type ChildProcess } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { createInterface } from 'node:readline'
import { ok, section, suite } from '../harness/checks.js'
import { ROOT, type Run, seconds, sh, until } from '../harness/processes.js'
import { type Context, curlStatus, failure, type HostAccess, hostAccess, NETNS, node, NODE_IP, type Pair, secretOf, type Upstream } from './node.js'
import { injectorAndLooper, jobCompletes, memoryLimit, rotation, termination } from './injection.js'
import { parentChart } from './parent-chart.js'
import { standalone } from './standalone.js'

const CLI = join(ROOT, 'dist/cos-auth-proxy.mjs')
const MOCK_PORT = 18081
const UPSTREAM_PORT = 18082
const IMAGE = process.env.COS_KUBELET_IMAGE ?? 'localhost/cos-auth-proxy:kubelet'
const APP_IMAGE = 'localhost/cos-kube-app:1'
const HELM = process.env.HELM ?? 'helm'

function newPair (work: string, name: string): Pair {
  const dir = join(work, `pair-${name}`)
  mkdirSync(dir)
  const pair = { name, key: `kubelet-${name}-${randomBytes(4).toString('hex')}`, secret: `SeCrEt-${name}-${randomBytes(18).toString('base64')}`, dir }
  writeFileSync(join(dir, 'access-key'), pair.key)
  writeFileSync(join(dir, 'access-key-secret'), pair.secret)
  return pair
}

/** A child inside the namespace (nsenter --net, as the node's daemons), its output kept. */
function inNamespace (args: readonly string[], env: NodeJS.ProcessEnv): { child: ChildProcess, out: string[] } {
  const child = spawn('nsenter', [`--net=/run/netns/${NETNS}`, process.execPath, ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
  const out: string[] = []
  child.stdout.on('data', (b: Buffer) => { out.push(b.toString()) })
  child.stderr.on('data', (b: Buffer) => { out.push(b.toString()) })
  return { child, out }
}

function startUpstream (): { child: ChildProcess, upstream: Upstream } {
  const child = spawn('nsenter', [`--net=/run/netns/${NETNS}`, process.execPath, '--import', 'tsx', 'test/e2e/kubelet/upstream.ts', NODE_IP, String(UPSTREAM_PORT)],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] })
  const lines: Array<ReturnType<Upstream['requests']>[number]> = []
  createInterface({ input: child.stdout }).on('line', l => {
    try {
      const o = JSON.parse(l) as ReturnType<Upstream['requests']>[number]
      if (o.status !== undefined) lines.push(o)
    } catch { console.log(`upstream: ${l}`) }
  })
  const say = (line: string): void => { child.stdin.write(`${line}\n`) }
  return {
    child,
    upstream: {
      url: `http://${NODE_IP}:${UPSTREAM_PORT}`,
      accept: p => { say(`accept ${p.key} ${p.secret}`) },
      revoke: p => { say(`revoke ${p.key}`) },
      requests: () => lines,
    },
  }
}

let work = ''
const children: ChildProcess[] = []
let up = false
let access: HostAccess | undefined
let stopped = false
/** Everything down (once): the upstreams, the API server's relay, the node, the work directory, the app image. */
function stop (): Run | undefined {
  if (stopped) return undefined
  stopped = true
  for (const c of children) if (c.exitCode === null) c.kill('SIGTERM')
  access?.relay.stop()
  const r = up ? node(['down'], 300_000) : undefined
  if (r !== undefined) console.log(`${r.stdout}${r.stderr}`.trim())
  if (work !== '') rmSync(work, { recursive: true, force: true })
  sh('podman', ['rmi', '--ignore', APP_IMAGE]) // built here from IMAGE; IMAGE is the caller's
  return r
}

suite('kubelet', {
  prerequisites: [
    () => process.getuid?.() !== 0 ? { why: 'not root', how: 'run as root (network namespace, mounts, cgroups)' } : undefined,
    () => node(['built']).code === 0
      ? undefined
      : {
          why: 'the node\'s binaries or the pause image are not in the cache',
          how: `build them once (control plane ~10 min on 2 cores, then ~1.5 min for the node):\n  ${process.env.COS_KUBE_VERSION === undefined ? '' : `COS_KUBE_VERSION=${process.env.COS_KUBE_VERSION} `}bash scripts/kube-node.sh build`,
        },
    () => sh(HELM, ['version', '--short']).code === 0 ? undefined : { why: `no helm (${HELM})`, how: 'set HELM=/path/to/helm (HELM=$(bash scripts/tools/get-helm.sh))' },
    () => existsSync(CLI) ? undefined : { why: `no ${CLI}`, how: 'run npm run build first' },
    () => sh('podman', ['image', 'exists', IMAGE]).code === 0
      ? undefined
      : { why: `no podman image ${IMAGE}`, how: `build it as the packaging step does (~3 min):\n  bash scripts/tools/container-smoke.sh -t ${IMAGE} --build-only --keep Dockerfile .` },
  ],
  timeoutS: Number(process.env.COS_KUBELET_TIMEOUT_S ?? '1500'),
  stop: () => { stop() },
  setUp,
}, async x => {
  await parentChart(x, x.helmEnv, HELM)
  await injectorAndLooper(x)
  await jobCompletes(x)
  await memoryLimit(x)
  await termination(x)
  await standalone(x)
  await rotation(x)

  await section('down', async () => {
    const t = Date.now()
    const r = stop()
    ok(r?.code === 0, `down: everything stopped and the host as before up (${seconds(t)})`, r?.stderr.trim())
    await Promise.resolve()
  })
})

/** The app image built and saved, the node up, the upstreams inside its namespace, pair a's Secret. */
async function setUp (): Promise<Context & { helmEnv: NodeJS.ProcessEnv }> {
  work = mkdtempSync(join(tmpdir(), 'cos-kubelet-'))
  // The app (test/e2e/kubelet/app.mjs) in an image FROM the project's (it has node).
  const t0 = Date.now()
  cpSync(join(ROOT, 'test/e2e/kubelet/app.mjs'), join(work, 'app.mjs'))
  writeFileSync(join(work, 'Containerfile'), `FROM ${IMAGE}\nCOPY app.mjs /app/app.mjs\nENTRYPOINT ["/nodejs/bin/node", "/app/app.mjs"]\nCMD []\n`)
  for (const [args, what] of [
    [['build', '-q', '-t', APP_IMAGE, work], 'podman build of the app image'],
    [['save', '--format', 'docker-archive', '-o', join(work, 'image.tar'), IMAGE], `podman save ${IMAGE}`],
    [['save', '--format', 'docker-archive', '-o', join(work, 'app.tar'), APP_IMAGE], `podman save ${APP_IMAGE}`],
  ] as const) {
    const r = sh('podman', args)
    if (r.code !== 0) throw new Error(`${what} failed: ${r.stderr.trim()}`)
  }
  console.log(`images saved in ${seconds(t0)}`)

  const t1 = Date.now()
  up = true
  const started = node(['up', '--image', join(work, 'image.tar'), '--image', join(work, 'app.tar')], 600_000)
  console.log(`${started.stdout}${started.stderr}`.trim())
  if (started.code !== 0) { up = false; throw new Error(`scripts/kube-node.sh up: exit ${started.code} (its output above)`) }
  console.log(`up in ${seconds(t1)}`)
  const runDir = /export COS_KUBE_NODE_RUN=(\S+)/.exec(started.stdout)?.[1] ?? ''
  access = await hostAccess(runDir, work)
  const { cluster, kubeconfig } = access
  console.log(`the node's API server on the host: ${cluster.url} (${kubeconfig})`)
  // The upstreams, inside the namespace on the node's address (pods reach it through the
  // bridge): the product's mock API, verifying pair a, and test/e2e/kubelet/upstream.ts, which
  // accepts the pairs it is told to (a first).
  const pairs = { a: newPair(work, 'a'), b: newPair(work, 'b'), c: newPair(work, 'c') }
  const mock = inNamespace([CLI, 'mock-api', '--port', String(MOCK_PORT)],
    { COS_ACCESS_KEY: pairs.a.key, COS_ACCESS_KEY_SECRET: pairs.a.secret, COS_MOCK_HOST: NODE_IP, COS_LOG_LEVEL: 'info' })
  const { child: upstreamChild, upstream } = startUpstream()
  children.push(mock.child, upstreamChild)
  upstream.accept(pairs.a)

  const helmEnv = { ...process.env, KUBECONFIG: kubeconfig, HELM_CONFIG_HOME: join(work, 'helm/config'), HELM_CACHE_HOME: join(work, 'helm/cache'), HELM_DATA_HOME: join(work, 'helm/data') }
  const chart = join(work, 'helm/cos-auth-proxy')
  cpSync(join(ROOT, 'helm/cos-auth-proxy'), chart, { recursive: true })
  const [repository, tag] = [IMAGE.slice(0, IMAGE.lastIndexOf(':')), IMAGE.slice(IMAGE.lastIndexOf(':') + 1)]
  const x: Context = {
    work,
    runDir,
    cluster,
    helm: args => sh(HELM, args, { env: helmEnv, timeoutMs: 300_000 }),
    chart,
    image: { repository, tag },
    appImage: APP_IMAGE,
    mockUrl: `http://${NODE_IP}:${MOCK_PORT}`,
    mockLog: () => mock.out.join(''),
    upstream,
    pairs,
  }

  const secret = await failure(cluster.create('/api/v1/namespaces/default/secrets',
    secretOf('cos-credentials', { 'access-key': join(pairs.a.dir, 'access-key'), 'access-key-secret': join(pairs.a.dir, 'access-key-secret') })))
  ok(secret === '', 'Secret cos-credentials created (pair a)', secret)
  await until('the upstreams answering inside the namespace', 30_000, () =>
    curlStatus(`${x.mockUrl}/management/v1/clusters`) === '401' && curlStatus(`${upstream.url}/management/v1/clusters`) === '401' ? true : undefined, 1000)
  ok(true, `mock API (${x.mockUrl}) and the rotation upstream (${upstream.url}) inside ${NETNS} refuse a request without a token (401)`)
  return { ...x, helmEnv }
}
