// The node of scripts/kube-node.sh, as the kubelet suite and the release's pod use it: commands
// inside its network namespace (kubectl, helm, curl, by way of scripts/kube-node.sh exec) and
// the parts of Pods the checks read.
import { spawn } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { ROOT, sh, type Run } from '../harness/processes.js'

export const NODE_SCRIPT = join(ROOT, 'scripts/kube-node.sh')
export const NETNS = process.env.COS_KUBE_NETNS ?? 'cos-kube-node'
/** The node's address on its bridge, inside the namespace: where the upstreams listen. */
export const NODE_IP = '10.88.0.1'

export const node = (args: readonly string[], timeoutMs?: number): Run => sh('bash', [NODE_SCRIPT, ...args], { timeoutMs })
/** A command inside the namespace, KUBECONFIG set by kube-node.sh exec. */
export const inNs = (args: readonly string[], opts: { timeoutMs?: number, input?: string, env?: NodeJS.ProcessEnv } = {}): Run =>
  sh('bash', [NODE_SCRIPT, 'exec', ...args], opts)
export const kubectl = (...args: string[]): Run => inNs(['kubectl', ...args])
/** kubectl apply of a manifest given as objects. */
export const apply = (ns: string, ...objects: unknown[]): Run =>
  inNs(['kubectl', '-n', ns, 'apply', '-f', '-'], { input: objects.map(o => JSON.stringify(o)).join('\n') })
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

export function pods (ns: string, selector: string): Pod[] {
  const r = kubectl('-n', ns, 'get', 'pods', '-l', selector, '-o', 'json')
  return r.code === 0 ? (JSON.parse(r.stdout) as { items: Pod[] }).items : []
}
/** The first pod of the selector that runs and is not being deleted. */
export const runningPod = (ns: string, selector: string): Pod | undefined =>
  pods(ns, selector).find(p => p.metadata.deletionTimestamp === undefined && p.status.phase === 'Running')
export const statusesOf = (pod: Pod): ContainerStatus[] => [...(pod.status.initContainerStatuses ?? []), ...(pod.status.containerStatuses ?? [])]
export const containersOf = (pod: Pod): Container[] => [...(pod.spec.initContainers ?? []), ...pod.spec.containers]

/** The app's log lines "<time> request <n> GET <url> <status|error CODE>" (test/e2e/kubelet/app.mjs). */
export const appRequests = (ns: string, pod: string): Array<{ n: number, status: string }> => requestLines(kubectl('-n', ns, 'logs', pod, '-c', 'app').stdout)
export function requestLines (log: string): Array<{ n: number, status: string }> {
  return log.split('\n').flatMap(l => {
    const m = / request (\d+) GET \S+ (\S+)/.exec(l)
    return m === null ? [] : [{ n: Number(m[1]), status: m[2] ?? '' }]
  })
}

/** The JSON lines of a container's log (the proxy's), parsed; other lines skipped. */
export const jsonLog = (ns: string, pod: string, container: string): Array<Record<string, unknown>> => jsonLines(kubectl('-n', ns, 'logs', pod, '-c', container).stdout)
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
export function probesPassed (ns: string, pod: string, container: string): Record<'Startup' | 'Readiness' | 'Liveness', number> {
  const text = kubectl('get', '--raw', `/api/v1/nodes/${NETNS}/proxy/metrics/probes`).stdout
  const count = (type: string): number => metric(text, 'prober_probe_total', { namespace: ns, pod, container, probe_type: type, result: 'successful' })
  return { Startup: count('Startup'), Readiness: count('Readiness'), Liveness: count('Liveness') }
}

/** A key pair of the test, in files for `kubectl create secret --from-file`. */
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

/**
 * `kubectl logs -f` of one container, kept as it comes: the kubelet removes a deleted pod's
 * containers, and their logs with them, soon after they stop.
 */
export function followLog (ns: string, pod: string, container: string): { text: () => string, ended: Promise<void> } {
  const child = spawn('bash', [NODE_SCRIPT, 'exec', 'kubectl', '-n', ns, 'logs', '-f', pod, '-c', container], { stdio: ['ignore', 'pipe', 'ignore'] })
  const out: string[] = []
  child.stdout.on('data', (b: Buffer) => { out.push(b.toString()) })
  const ended = new Promise<void>(resolve => { child.on('close', () => { resolve() }) })
  return { text: () => out.join(''), ended }
}
