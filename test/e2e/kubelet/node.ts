// The node of scripts/kube-node.sh, as the kubelet suite and the release's pod use it: its API
// server brought to the host's loopback (a relay, and a kubeconfig for it: the harness's one
// cluster client and helm talk to it as to any cluster), commands inside its network namespace
// (curl to pod and Service addresses, by way of scripts/kube-node.sh exec) and the parts of
// Pods the checks read.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parse, stringify } from 'yaml'
import { Cluster, get, isObject, list, str } from '../harness/cluster.js'
import { freePort, ROOT, sh, type Run } from '../harness/processes.js'
import { type Relay, startRelay } from '../harness/relay.js'

export const NODE_SCRIPT = join(ROOT, 'scripts/kube-node.sh')
export const NETNS = process.env.COS_KUBE_NETNS ?? 'cos-kube-node'
/** The node's address on its bridge, inside the namespace: where the upstreams listen. */
export const NODE_IP = '10.88.0.1'

export const node = (args: readonly string[], timeoutMs?: number): Run => sh('bash', [NODE_SCRIPT, ...args], { timeoutMs })
/** A command inside the namespace, KUBECONFIG set by kube-node.sh exec. */
export const inNs = (args: readonly string[], opts: { timeoutMs?: number, input?: string, env?: NodeJS.ProcessEnv } = {}): Run =>
  sh('bash', [NODE_SCRIPT, 'exec', ...args], opts)

/** The node's API server on the host: the relay, a kubeconfig naming it and its client. */
export interface HostAccess { readonly relay: Relay, readonly kubeconfig: string, readonly cluster: Cluster }

/**
 * The node's API server (127.0.0.1:PORT inside its namespace only, its certificate naming
 * 127.0.0.1) relayed to a free port of the host's loopback, and `<dir>/node.kubeconfig`: the
 * node's admin kubeconfig (kube-node.sh's <run>/cp/admin.kubeconfig: its CA, its client
 * certificate) with that address as its server. The caller stops the relay.
 */
export async function hostAccess (runDir: string, dir: string): Promise<HostAccess> {
  const admin = join(runDir, 'cp/admin.kubeconfig')
  const config = new Cluster(admin)
  const target = new URL(config.url)
  const port = await freePort()
  const relay = await startRelay({ target: `${target.hostname}:${target.port}`, targetOn: 'namespace', listen: `127.0.0.1:${port}`, netnsPath: `/run/netns/${NETNS}` })
  try {
    const parsed = parse(readFileSync(admin, 'utf8')) as unknown
    for (const c of list(parsed, 'clusters')) {
      const cluster = get(c, 'cluster')
      if (isObject(cluster) && cluster.server === config.url) cluster.server = `https://127.0.0.1:${port}`
    }
    const kubeconfig = join(dir, 'node.kubeconfig')
    writeFileSync(kubeconfig, stringify(parsed), { mode: 0o600 })
    return { relay, kubeconfig, cluster: new Cluster(kubeconfig) }
  } catch (err) {
    relay.stop()
    throw err
  }
}

/** An object's own path in the API ({apiVersion, kind, metadata.name} in namespace `ns`). */
export function objectPath (ns: string, o: unknown): string {
  const version = str(o, 'apiVersion') ?? 'v1'
  return `${version.includes('/') ? `/apis/${version}` : `/api/${version}`}/namespaces/${ns}/${(str(o, 'kind') ?? '?').toLowerCase()}s/${str(o, 'metadata', 'name') ?? '?'}`
}

/** Server-side apply of objects into `ns`: '' when all were applied, else why not. */
export async function apply (k: Cluster, ns: string, ...objects: unknown[]): Promise<string> {
  try {
    for (const o of objects) await k.apply(objectPath(ns, o), o)
    return ''
  } catch (err) { return err instanceof Error ? err.message : String(err) }
}

/** '' when `p` succeeded, else its error's message (for a check's diagnostics). */
export const failure = (p: Promise<unknown>): Promise<string> => p.then(() => '', (err: unknown) => err instanceof Error ? err.message : String(err))

/** A Secret like `kubectl create secret generic NAME --from-file=KEY=FILE…`. */
export function secretOf (name: string, files: Record<string, string>): unknown {
  return { apiVersion: 'v1', kind: 'Secret', metadata: { name }, type: 'Opaque', data: Object.fromEntries(Object.entries(files).map(([k, f]) => [k, readFileSync(f).toString('base64')])) }
}
/** GET from inside the namespace: the status code, or 000 when nothing answered. */
export const curlStatus = (url: string): string => inNs(['curl', '-s', '-o', '/dev/null', '-m', '10', '-w', '%{http_code}', url]).stdout
export const curlBody = (url: string): string => inNs(['curl', '-s', '-m', '10', url]).stdout

/** The part of a Pod these checks read. */
export interface ContainerStatus {
  name: string
  containerID?: string
  restartCount?: number
  state?: { running?: { startedAt?: string }, terminated?: { exitCode: number, reason?: string, startedAt?: string, finishedAt?: string } }
}
export interface Container { name: string, restartPolicy?: string, env?: Array<{ name: string, value?: string }>, resources?: { limits?: Record<string, string>, requests?: Record<string, string> }, volumeMounts?: Array<{ name: string, mountPath: string }> }
export interface Pod {
  metadata: { name: string, uid: string, deletionTimestamp?: string, annotations?: Record<string, string> }
  spec: { initContainers?: Container[], containers: Container[], terminationGracePeriodSeconds?: number }
  status: { phase?: string, podIP?: string, initContainerStatuses?: ContainerStatus[], containerStatuses?: ContainerStatus[] }
}

/** The pods of a label selector ([] when the API server did not answer). */
export async function pods (k: Cluster, ns: string, selector: string): Promise<Pod[]> {
  return (await k.pods(ns, selector).catch(() => [])) as unknown as Pod[]
}
/** The first pod of the selector that runs and is not being deleted. */
export const runningPod = async (k: Cluster, ns: string, selector: string): Promise<Pod | undefined> =>
  (await pods(k, ns, selector)).find(p => p.metadata.deletionTimestamp === undefined && p.status.phase === 'Running')
/** A container's log, '' when there is none (yet). */
export const logOf = (k: Cluster, ns: string, pod: string, container: string): Promise<string> => k.log(ns, pod, container).catch(() => '')
export const statusesOf = (pod: Pod): ContainerStatus[] => [...(pod.status.initContainerStatuses ?? []), ...(pod.status.containerStatuses ?? [])]
export const containersOf = (pod: Pod): Container[] => [...(pod.spec.initContainers ?? []), ...pod.spec.containers]

/** The app's log lines "<time> request <n> GET <url> <status|error CODE>" (test/e2e/kubelet/app.mjs). */
export const appRequests = async (k: Cluster, ns: string, pod: string): Promise<Array<{ n: number, status: string }>> => requestLines(await logOf(k, ns, pod, 'app'))
export function requestLines (log: string): Array<{ n: number, status: string }> {
  return log.split('\n').flatMap(l => {
    const m = / request (\d+) GET \S+ (\S+)/.exec(l)
    return m === null ? [] : [{ n: Number(m[1]), status: m[2] ?? '' }]
  })
}

/** The JSON lines of a container's log (the proxy's), parsed; other lines skipped. */
export const jsonLog = async (k: Cluster, ns: string, pod: string, container: string): Promise<Array<Record<string, unknown>>> => jsonLines(await logOf(k, ns, pod, container))
export function jsonLines (log: string): Array<Record<string, unknown>> {
  return log.split('\n').flatMap(l => {
    try { return l.startsWith('{') ? [JSON.parse(l) as Record<string, unknown>] : [] } catch { return [] }
  })
}

/** One sample of a Prometheus text exposition: the sum of the series of `name` whose labels include every `labels` pair. */
export function metric (text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}

/**
 * The memory cgroup (v1) of a container the kubelet runs with the cgroupfs driver:
 * <root>/kubepods[/<qos>]/pod<uid>/<container id>; v2 has no memory.max_usage_in_bytes, so
 * the checks that read it are for this machine's kind (cgroup v1).
 */
export function containerCgroup (pod: Pod, container: string): { pod: string, container: string } | undefined {
  const id = statusesOf(pod).find(s => s.name === container)?.containerID?.replace(/^\w+:\/\//, '')
  if (id === undefined) return undefined
  const root = '/sys/fs/cgroup/memory/kubepods'
  for (const qos of ['', 'burstable', 'besteffort']) {
    const podDir = join(root, qos, `pod${pod.metadata.uid}`)
    try {
      if (readdirSync(podDir).includes(id)) return { pod: podDir, container: join(podDir, id) }
    } catch { /* not this QoS class */ }
  }
  return undefined
}

/** The cgroup's figures as the kubelet reads them: working set = usage - total_inactive_file. */
export function cgroupMemory (dir: string): { limit: number, usage: number, maxUsage: number, workingSet: number, oomKills: number } {
  const num = (f: string): number => Number(readFileSync(join(dir, f), 'utf8').trim())
  const stat = Object.fromEntries(readFileSync(join(dir, 'memory.stat'), 'utf8').trim().split('\n').map(l => {
    const [k = '', v = '0'] = l.split(' ')
    return [k, Number(v)] as const
  }))
  const oom = /oom_kill (\d+)/.exec(readFileSync(join(dir, 'memory.oom_control'), 'utf8'))
  const usage = num('memory.usage_in_bytes')
  return {
    limit: num('memory.limit_in_bytes'),
    usage,
    maxUsage: num('memory.max_usage_in_bytes'),
    workingSet: Math.max(0, usage - (stat.total_inactive_file ?? 0)),
    oomKills: Number(oom?.[1] ?? '0'),
  }
}
export const mib = (bytes: number): string => `${(bytes / (1 << 20)).toFixed(1)} MiB`

/**
 * The kubelet's own count of the probes it ran on a container, by type, that succeeded
 * (prober_probe_total, from its /metrics/probes through the API server's node proxy).
 */
export async function probesPassed (k: Cluster, ns: string, pod: string, container: string): Promise<Record<'Startup' | 'Readiness' | 'Liveness', number>> {
  const text = await k.text(`/api/v1/nodes/${NETNS}/proxy/metrics/probes`).catch(() => '')
  const count = (type: string): number => metric(text, 'prober_probe_total', { namespace: ns, pod, container, probe_type: type, result: 'successful' })
  return { Startup: count('Startup'), Readiness: count('Readiness'), Liveness: count('Liveness') }
}

/** A key pair of the test, in files (as for `kubectl create secret --from-file`). */
export interface Pair { readonly name: string, readonly key: string, readonly secret: string, readonly dir: string }

/** The token-verifying upstream that accepts a changing set of pairs (test/e2e/kubelet/upstream.ts). */
export interface Upstream {
  readonly url: string
  accept: (p: Pair) => void
  revoke: (p: Pair) => void
  /** Its request lines so far: {t, remote, key, path, status}. */
  requests: () => Array<{ t: string, remote?: string, key?: string, path?: string, status?: number }>
}

/** What the checks after `up` are given. */
export interface Context {
  readonly work: string
  /** kube-node.sh's run directory (kubelet.log and the other logs). */
  readonly runDir: string
  /** The node's API server, from the host (hostAccess). */
  readonly cluster: Cluster
  readonly helm: (args: readonly string[]) => Run
  /** A copy of helm/cos-auth-proxy. */
  readonly chart: string
  /** The project's image, as the chart's image.repository and image.tag. */
  readonly image: { readonly repository: string, readonly tag: string }
  /** The app (test/e2e/kubelet/app.mjs) image. */
  readonly appImage: string
  /** `cos-auth-proxy mock-api` inside the namespace, verifying pair a. */
  readonly mockUrl: string
  /** Mock API log lines so far. */
  readonly mockLog: () => string
  readonly upstream: Upstream
  /** a: what mock-api and the first Secrets hold; b: the rotated pair; c: one no upstream accepts. */
  readonly pairs: { readonly a: Pair, readonly b: Pair, readonly c: Pair }
}

/** --set arguments that give the chart the project's image (pullPolicy Never: no registry). */
export const imageValues = (x: Context): string[] =>
  ['--set', `image.repository=${x.image.repository}`, '--set', `image.tag=${x.image.tag}`, '--set', 'image.pullPolicy=Never']
