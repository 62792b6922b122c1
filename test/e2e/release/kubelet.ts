// The release on a real node (issue 44): the chart installed FROM its oci:// reference on
// test:kubelet's one-node cluster (scripts/kube-node.sh), whose containerd PULLS the image by
// the index's digest from the registry the release test started: nothing of the proxy is
// `ctr import`ed (`up` is given no --image; the pause image is the node's own). The registry
// listens on the host's 127.0.0.1:PORT; a relay (test/e2e/harness/relay.ts) makes the same
// address answer on the namespace's own loopback, so helm (run inside the namespace: its pull
// of the chart goes through the relay, which a check reads) and containerd use the very
// references the release printed. The checks read the API server with the harness's cluster
// client, through the other relay of kubelet/node.ts's hostAccess (the API server on the
// host's loopback). containerd 1.6's CRI speaks
// plain HTTP to a localhost or loopback registry by itself (its default scheme for such a
// host), so the node's config is unchanged.
// In order: node up → relay up → the upstream (test/e2e/kubelet/upstream.ts) and the credentials
// Secret → helm install oci://… --plain-http (mode=deployment, image.repository/image.digest)
// → the pod Ready, its image and imageID the digest, containerd's image list and the kubelet's
// events naming the registry, the relay having carried the manifest and blobs → 200 through
// the Service → down, with no process (of either relay), namespace, socket or directory left.
//
// As a program (root; the node's binaries built; a registry holding the image and the chart):
//   node --import tsx test/e2e/release/kubelet.ts --registry 127.0.0.1:PORT --digest sha256:… [--chart-version X.Y.Z]
// env: HELM (default scripts/tools/get-helm.sh's), COS_KUBE_VERSION and the other COS_KUBE_*.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { ok, section, suite } from '../harness/checks.js'
import { str } from '../harness/cluster.js'
import { ROOT, seconds, sh, until } from '../harness/processes.js'
import { startRelay, type Relay } from '../harness/relay.js'
import { curlStatus, failure, type HostAccess, hostAccess, inNs, NETNS, node, NODE_IP, type Pod, secretOf } from '../kubelet/node.js'

const NS = 'cos-release'
const RELEASE = 'cos-auth-proxy'
const UPSTREAM_PORT = 18090

export interface FromRegistry {
  /** 127.0.0.1:PORT */
  registry: string
  /** oci://127.0.0.1:PORT/charts/cos-auth-proxy */
  chart: string
  chartVersion: string
  /** 127.0.0.1:PORT/cos-auth-proxy */
  image: string
  /** sha256:… of the image index */
  digest: string
}

const helmPath = (): string => process.env.HELM ?? sh('bash', [join(ROOT, 'scripts/tools/get-helm.sh')], { timeoutMs: 600_000 }).stdout.trim()
/**
 * True once `probe` is: the children's lines (relay, upstream) are read only when this
 * process's event loop turns, which the harness's spawnSync calls hold up.
 */
const eventually = async (probe: () => boolean, secondsMax = 10): Promise<boolean> => until('', secondsMax * 1000, () => probe() ? true : undefined, 1000).catch(() => false)
const alive = (pid: number): boolean => {
  try { return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8')) } catch { return false }
}

/** The image names in the node's containerd (ctr images ls): ref, media type, digest. */
function containerdImages (runDir: string): Array<{ ref: string, type: string, digest: string }> {
  const r = sh('ctr', ['--address', join(runDir, 'containerd/containerd.sock'), '-n', 'k8s.io', 'images', 'ls'])
  return r.stdout.trim().split('\n').slice(1).map(l => l.split(/\s+/)).map(([ref = '', type = '', digest = '']) => ({ ref, type, digest }))
}

/** test/e2e/kubelet/upstream.ts inside the namespace on the node's address; its request lines. */
function startUpstream (): { child: ChildProcess, say: (line: string) => void, lines: Array<{ remote?: string, key?: string, path?: string, status?: number }> } {
  const child = spawn('nsenter', [`--net=/run/netns/${NETNS}`, process.execPath, '--import', 'tsx', 'test/e2e/kubelet/upstream.ts', NODE_IP, String(UPSTREAM_PORT)],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] })
  const lines: Array<{ remote?: string, key?: string, path?: string, status?: number }> = []
  createInterface({ input: child.stdout }).on('line', l => {
    try {
      const o = JSON.parse(l) as { status?: number }
      if (o.status !== undefined) lines.push(o)
    } catch { /* not a request line */ }
  })
  return { child, say: line => { child.stdin.write(`${line}\n`) }, lines }
}

let interrupted: () => void = () => {}
/**
 * For a runner's stop on an interruption (the suite's stop), before its closing
 * line: brings down what a podFromRegistry under way started (idempotent; the process's exit
 * does it otherwise).
 */
export function stopPodFromRegistry (): void { interrupted() }

export async function podFromRegistry (opts: FromRegistry): Promise<void> {
  const t0 = Date.now()
  const work = mkdtempSync(join(tmpdir(), 'cos-release-kubelet-'))
  const ref = `${opts.image}@${opts.digest}`
  let up = false
  let relay: Relay | undefined
  let access: HostAccess | undefined
  let upstream: ReturnType<typeof startUpstream> | undefined
  let down: ReturnType<typeof node> | undefined
  let runDir = ''
  const ownRunDir = process.env.COS_KUBE_NODE_RUN === undefined // else the caller's, left alone
  const stop = (): void => {
    if (upstream?.child.exitCode === null) upstream.child.kill('SIGKILL')
    relay?.stop()
    access?.relay.stop()
    if (up) {
      up = false
      down = node(['down'], 300_000)
      // kube-node.sh keeps the run directory it made (configs, logs): read when down fails, else removed
      if (down.code === 0 && ownRunDir) rmSync(runDir, { recursive: true, force: true })
    }
    rmSync(work, { recursive: true, force: true })
  }
  // interrupted (the suite's stop exits the process): still down, and said so
  const onExit = (): void => {
    const wasUp = up
    stop()
    if (wasUp && down !== undefined) console.log(`# down after the interruption: exit ${down.code}\n${down.stderr.trim().split('\n').slice(-3).join('\n')}`)
  }
  interrupted = onExit
  process.once('exit', onExit)
  try {
    if (!ok(node(['built']).code === 0, 'the node\'s binaries are built', 'run COS_KUBE_VERSION=… bash scripts/kube-node.sh build')) return
    const helm = helmPath()
    if (!ok(sh(helm, ['version', '--short']).code === 0, `helm: ${helm}`)) return

    // 1. the node, with no image of the proxy imported
    let t = Date.now()
    up = true
    const started = node(['up'], 600_000)
    if (!ok(started.code === 0, `node up, only its pause image imported (${seconds(t)})`, `${started.stdout}${started.stderr}`.trim().split('\n').slice(-15).join('\n'))) return
    runDir = /export COS_KUBE_NODE_RUN=(\S+)/.exec(started.stdout)?.[1] ?? ''
    access = await hostAccess(runDir, work)
    const k = access.cluster
    const before = containerdImages(runDir).map(i => i.ref)
    ok(before.length > 0 && !before.some(r => r.includes('cos-auth-proxy')), `containerd holds no image of the proxy before the install: ${before.join(', ')}`)

    // 2. the registry at the same address inside the namespace
    t = Date.now()
    relay = await startRelay({ target: opts.registry, targetOn: 'host', listen: opts.registry, netnsPath: `/run/netns/${NETNS}`, requests: true })
    const v2 = curlStatus(`http://${opts.registry}/v2/`)
    ok(v2 === '200', `the registry answers at http://${opts.registry}/v2/ inside ${NETNS} too, through the relay (${v2}, ${seconds(t)})`)

    // 3. the upstream and the credentials
    upstream = startUpstream()
    const pair = { key: `release-${randomBytes(4).toString('hex')}`, secret: `SeCrEt-${randomBytes(18).toString('base64')}` }
    writeFileSync(join(work, 'access-key'), pair.key, { mode: 0o600 })
    writeFileSync(join(work, 'access-key-secret'), pair.secret, { mode: 0o600 })
    upstream.say(`accept ${pair.key} ${pair.secret}`)
    await k.create('/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } }).catch(() => {})
    const secret = await failure(k.create(`/api/v1/namespaces/${NS}/secrets`,
      secretOf('cos-credentials', { 'access-key': join(work, 'access-key'), 'access-key-secret': join(work, 'access-key-secret') })))
    ok(secret === '', 'Secret cos-credentials created', secret)

    // 4. helm install from the OCI reference
    t = Date.now()
    const helmEnv = { ...process.env, HELM_CONFIG_HOME: join(work, 'helm/config'), HELM_CACHE_HOME: join(work, 'helm/cache'), HELM_DATA_HOME: join(work, 'helm/data') }
    const upstreamUrl = `http://${NODE_IP}:${UPSTREAM_PORT}`
    const installed = inNs([helm, 'install', RELEASE, opts.chart, '--version', opts.chartVersion, '--plain-http', '--namespace', NS,
      '--set', `image.repository=${opts.image}`, '--set', `image.digest=${opts.digest}`, '--set', 'mode=deployment',
      '--set', `upstream.managementUrl=${upstreamUrl}/management`, '--set', `upstream.optimizeUrl=${upstreamUrl}/optimize`,
      '--set', 'credentials.existingSecret=cos-credentials', '--set', 'proxy.allowFrom={10.88.0.0/16}', '--wait', '--timeout', '300s'],
    { env: helmEnv, timeoutMs: 400_000 })
    const events = async (selector = ''): Promise<string[]> =>
      (await k.items(`/api/v1/namespaces/${NS}/events${selector === '' ? '' : `?fieldSelector=${encodeURIComponent(selector)}`}`).catch(() => [])).map(e => str(e, 'message') ?? '')
    if (!ok(installed.code === 0, `helm install ${RELEASE} ${opts.chart} --version ${opts.chartVersion} --plain-http --set image.digest=${opts.digest} --wait (${seconds(t)})`,
      `${installed.stderr.trim()}\n${installed.code === 0 ? '' : (await events()).join('\n')}`)) return
    const chartOf = inNs([helm, 'list', '-n', NS, '-o', 'json'], { env: helmEnv }).stdout
    ok(chartOf.includes(`"chart":"cos-auth-proxy-${opts.chartVersion}"`), `helm list: the release's chart is cos-auth-proxy-${opts.chartVersion}`, chartOf)
    const r = relay
    const chartFetched = await eventually(() => r.requests().some(q => q.startsWith('GET /v2/charts/cos-auth-proxy/manifests/')) &&
      r.requests().some(q => q.startsWith('GET /v2/charts/cos-auth-proxy/blobs/sha256:')))
    ok(chartFetched, 'helm fetched the chart\'s manifest and blobs from the registry (through the relay)', relay.requests())

    // 5. the pod: Ready, running the digest, pulled from the registry
    type ReleasePod = Pod & { spec: { containers: Array<{ image?: string }> }, status: { conditions?: Array<{ type: string, status: string }>, containerStatuses?: Array<{ image?: string, imageID?: string }> } }
    const all = (await k.pods(NS, `app.kubernetes.io/instance=${RELEASE}`).catch(() => [])) as unknown as ReleasePod[]
    if (!ok(all.length >= 1, `the Deployment's pods: ${all.map(p => `${p.metadata.name} (${p.status.podIP ?? '?'})`).join(', ')}`)) return
    ok(all.every(p => p.status.conditions?.some(c => c.type === 'Ready' && c.status === 'True') === true), `every pod Ready (${all.length})`)
    ok(all.every(p => p.spec.containers[0]?.image === ref), `their container's image is the digest reference: ${ref}`, all.map(p => p.spec.containers[0]?.image))
    ok(all.every(p => p.status.containerStatuses?.[0]?.imageID === ref), 'the kubelet reports the image each runs (status.imageID) as that digest', all.map(p => p.status.containerStatuses?.[0]?.imageID))
    const images = containerdImages(runDir)
    const pulled = images.find(i => i.ref === ref)
    ok(pulled?.digest === opts.digest && pulled.type.includes('index'), `containerd's image list: ${pulled?.ref ?? '(missing)'} ${pulled?.type ?? ''}`, images)
    ok(!images.some(i => i.ref.startsWith('localhost/cos-auth-proxy') || (i.ref.includes('cos-auth-proxy') && !i.ref.startsWith(`${opts.registry}/`))),
      'no other image of the proxy in containerd (none imported)', images)
    const pulled_ = (await events('reason=Pulled')).join(' ')
    const pulls = pulled_.split(`Successfully pulled image "${ref}"`).length - 1
    ok(pulls >= 1, `the kubelet's events: ${pulls} × Successfully pulled image "${ref}"${/ in [^"]*$/.exec(pulled_)?.[0] ?? ''}`, pulled_)
    const blobs = (): number => r.requests().filter(q => q.startsWith('GET /v2/cos-auth-proxy/blobs/sha256:')).length
    const imageFetched = await eventually(() => r.requests().includes(`GET /v2/cos-auth-proxy/manifests/${opts.digest}`) && blobs() >= 2)
    ok(imageFetched, `containerd fetched the index by its digest, then ${blobs()} blobs (config and layers) from the registry, through the relay`, r.requests())

    // 6. a request through the proxy
    const ip = str(await k.find(`/api/v1/namespaces/${NS}/services/${RELEASE}`).catch(() => undefined), 'spec', 'clusterIP') ?? ''
    const url = `http://${ip}:8080/management/v1/clusters`
    const first = await until(`kube-proxy's rules for ${ip}`, 60_000, () => { const s = curlStatus(url); return s === '000' ? undefined : s }, 1000).catch(() => '000')
    ok(first === '200', `GET ${url} through the proxy: ${first}`)
    const u = upstream
    const ips = all.map(p => p.status.podIP)
    const seen = (): typeof u.lines => u.lines.filter(l => l.key === pair.key && l.status === 200 && ips.includes(l.remote))
    await eventually(() => seen().length >= 1)
    ok(seen().length >= 1, `the upstream verified the proxy's token for the Secret's key, from a pod of the release (${seen().length} request(s))`, upstream.lines)
  } finally {
    // 7. down: nothing of the node, the relay or this directory left
    const t = Date.now()
    const pids = [...relay?.pids ?? [], ...access?.relay.pids ?? []]
    const relayDirs = [relay?.dir, access?.relay.dir].filter(d => d !== undefined)
    stop()
    process.removeListener('exit', onExit)
    interrupted = () => {}
    if (down !== undefined) ok(down.code === 0, `down: the node stopped, the host as before up (${seconds(t)})`, `${down.stdout}${down.stderr}`.trim().split('\n').slice(-15).join('\n'))
    await new Promise(resolve => setTimeout(resolve, 200)) // the relay's halves, killed, reaped
    ok(!pids.some(alive) && !relayDirs.some(d => existsSync(d)) && !existsSync(work) && (runDir === '' || !ownRunDir || !existsSync(runDir)) &&
      !sh('ip', ['netns', 'list']).stdout.split('\n').some(l => l.split(' ')[0] === NETNS),
    `no relay process (${pids.join(', ') || 'none started'}), socket directory, namespace ${NETNS}, node run directory or temporary directory left (all in ${seconds(t0)})`)
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const arg = (name: string): string | undefined => { const i = process.argv.indexOf(name); return i < 0 ? undefined : process.argv[i + 1] }
  const registry = arg('--registry')
  const digest = arg('--digest')
  if (registry === undefined || digest === undefined) {
    console.log('usage: node --import tsx test/e2e/release/kubelet.ts --registry 127.0.0.1:PORT --digest sha256:… [--chart-version X.Y.Z]')
    process.exit(2)
  }
  const chartVersion = arg('--chart-version') ?? (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version
  suite('release kubelet', { prerequisites: [], timeoutS: 1200, stop: stopPodFromRegistry, setUp: () => Promise.resolve() }, async () => {
    await section('the chart from oci:// on a real node, the image pulled by digest', async () => {
      await podFromRegistry({ registry, chart: `oci://${registry}/charts/cos-auth-proxy`, chartVersion, image: `${registry}/cos-auth-proxy`, digest })
    })
  })
}
