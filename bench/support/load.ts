// Load: the workloads, one autocannon run with sub-millisecond latencies,
// and open-loop load at a steady rate.
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import autocannon from 'autocannon'
import { spawnNode, spawnProgram } from './children.js'
import { BENCH_DIR, nodePath } from './node.js'

export interface Load {
  readonly url: string
  readonly connections: number
  /** Seconds (unless `amount` is given). */
  readonly duration?: number
  readonly amount?: number
  readonly overallRate?: number
  readonly method?: 'GET' | 'POST'
  readonly body?: Buffer
  readonly headers?: Record<string, string>
  /**
   * Seconds of warm-up on the same connections before `duration` is
   * measured: the result then covers only the requests sent after it.
   * Without it every measured run would begin by opening all its
   * connections at once, and against a saturated Node server that is a
   * measurement of accepting them (libuv accepts one connection per
   * event-loop turn), not of serving requests: see docs/performance.md.
   */
  readonly warmupSeconds?: number
  /** Seconds a request may wait for its answer before the client gives up on it (default 30). */
  readonly timeoutSeconds?: number
}

export type Workload = 'small' | 'get-1mib' | 'post-1mib' | 'bodies'
export const WORKLOADS: readonly Workload[] = ['small', 'get-1mib', 'post-1mib', 'bodies']
/** The catch-all route (COS_API_URL): path kept, signed. */
export const SMALL_PATH = '/api/v1/clusters'
const UPLOAD = Buffer.alloc(1024 * 1024, 'b')

/** A --workload option's value, or an error naming the choices. */
export function parseWorkload (value: string | undefined): Workload {
  const workload = WORKLOADS.find(w => w === value)
  if (workload === undefined) throw new Error(`--workload must be one of ${WORKLOADS.join(', ')}`)
  return workload
}

/** The request each workload sends to a server at `url` (see upstream.mjs). */
export function workloadLoad (workload: Workload, url: string, connections: number, duration: number): Load {
  switch (workload) {
    case 'small': return { url: url + SMALL_PATH, connections, duration }
    case 'get-1mib': return { url: url + '/big', connections, duration }
    case 'post-1mib': return { url: url + '/upload', connections, duration, method: 'POST', body: UPLOAD, headers: { 'content-type': 'application/octet-stream' } }
    // 1 MiB each way in one exchange (bench:soak's, issue 47).
    case 'bodies': return { url: url + '/exchange', connections, duration, method: 'POST', body: UPLOAD, headers: { 'content-type': 'application/octet-stream' } }
  }
}

export interface Latency { readonly p50: number, readonly p90: number, readonly p99: number, readonly max: number, readonly mean: number }

/** What went wrong, by kind: each failed request counted once. */
export interface Failures {
  /** No answer within the load's timeout: the client gave up, and opened a new connection. */
  timeout: number
  /** The connection could not be opened (refused, timed out, no route). */
  connect: number
  /** Reset or broken pipe on an open connection. */
  reset: number
  /** The server closed the connection with a request on it unanswered. */
  closed: number
  /** Anything else, by error code. */
  other: Record<string, number>
  /** Answers outside 2xx, by status. */
  status: Record<string, number>
}

const CONNECT_ERRORS = new Set(['ECONNREFUSED', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'EADDRINUSE'])
const RESET_ERRORS = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED'])

export function noFailures (): Failures {
  return { timeout: 0, connect: 0, reset: 0, closed: 0, other: {}, status: {} }
}

/** Counts one failed request by its error (autocannon's `reqError`). */
export function countError (f: Failures, err: unknown): void {
  const code = (err as { code?: unknown }).code
  if (err instanceof Error && err.message === 'request timed out') f.timeout++
  else if (typeof code === 'string' && CONNECT_ERRORS.has(code)) f.connect++
  else if (typeof code === 'string' && RESET_ERRORS.has(code)) f.reset++
  else {
    const key = typeof code === 'string' ? code : err instanceof Error ? err.message : String(err)
    f.other[key] = (f.other[key] ?? 0) + 1
  }
}

const sum = (xs: Record<string, number>): number => Object.values(xs).reduce((a, b) => a + b, 0)

export function failureCount (f: Failures): number {
  return f.timeout + f.connect + f.reset + f.closed + sum(f.other) + sum(f.status)
}

/** `none`, or e.g. `timeout 143, status 503 ×5`. */
export function describeFailures (f: Failures): string {
  const parts = [
    ...(['timeout', 'connect', 'reset', 'closed'] as const).filter(k => f[k] > 0).map(k => `${k} ${f[k]}`),
    ...Object.entries(f.other).map(([k, n]) => `${k} ${n}`),
    ...Object.entries(f.status).map(([k, n]) => `status ${k} ×${n}`),
  ]
  return parts.length === 0 ? 'none' : parts.join(', ')
}

/** autocannon's client, as far as `closed` needs it: its connection and the requests sent on it, unanswered. */
interface AutocannonClient { conn: { on: (event: 'end', f: () => void) => void }, pipelinedRequests: { size: () => number }, _connect: () => void }

export interface LoadResult {
  /** Completed. */
  readonly requests: number
  /** Sent (includes those cut off in flight when the run stopped). */
  readonly sent: number
  readonly seconds: number
  readonly rps: number
  readonly bytes: number
  /** ms, from every 2xx response (autocannon's own histogram rounds to whole ms). */
  readonly latency: Latency
  readonly errors: number
  readonly non2xx: number
  /** The failed requests by kind (measured part only, as `errors` and `non2xx`). */
  readonly failures: Failures
  /** Each connection's first request (warm-up included): how long a new connection waited to be served. */
  readonly firstOnConnection: Latency
  /** Over the whole run, warm-up included (e.g. against a log's line count). */
  readonly total: { readonly requests: number, readonly sent: number }
}

/** Grows as needed; one Float64Array, no per-sample objects. */
class Samples {
  #data = new Float64Array(1 << 16)
  #n = 0
  add (v: number): void {
    if (this.#n === this.#data.length) {
      const next = new Float64Array(this.#data.length * 2)
      next.set(this.#data)
      this.#data = next
    }
    this.#data[this.#n++] = v
  }

  latency (): Latency {
    const sorted = this.#data.subarray(0, this.#n).sort()
    const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN
    let sum = 0
    for (const v of sorted) sum += v
    return { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: sorted[sorted.length - 1] ?? Number.NaN, mean: sum / sorted.length }
  }
}

/** `onMeasuring` runs when the warm-up ends (at once without one). */
export async function runLoad (load: Load, onMeasuring?: () => void): Promise<LoadResult> {
  const samples = new Samples()
  const firsts = new Samples()
  const warmupMs = (load.warmupSeconds ?? 0) * 1000
  let measuring = false
  const failures = noFailures()
  const instance = autocannon({
    url: load.url,
    connections: load.connections,
    pipelining: 1,
    // Keep-alive is autocannon's only mode: each connection is reused.
    ...(load.amount === undefined ? { duration: (load.warmupSeconds ?? 0) + (load.duration ?? 5) } : { amount: load.amount }),
    ...(load.overallRate === undefined ? {} : { overallRate: load.overallRate }),
    ...(load.method === undefined ? {} : { method: load.method }),
    ...(load.body === undefined ? {} : { body: load.body }),
    ...(load.headers === undefined ? {} : { headers: load.headers }),
    timeout: load.timeoutSeconds ?? 30,
    // A connection the server closes with a request on it: autocannon opens another and counts nothing.
    setupClient: (client: unknown) => {
      const c = client as AutocannonClient
      const connect = c._connect
      c._connect = function (this: AutocannonClient) {
        connect.call(this)
        this.conn.on('end', () => { if (measuring && this.pipelinedRequests.size() > 0) failures.closed++ })
      }
    },
  })
  const t0 = performance.now()
  let from = t0
  const startMeasuring = (): void => { from = performance.now(); measuring = true; onMeasuring?.() }
  const timer = warmupMs > 0 ? setTimeout(startMeasuring, warmupMs) : undefined
  if (timer === undefined) startMeasuring()
  const served = new Set<unknown>()
  // Counted here rather than from autocannon's totals, which include the warm-up.
  let requests = 0
  let bytes = 0
  let non2xx = 0
  let errors = 0
  instance.on('response', (client: unknown, status: number, resBytes: number, ms: number) => {
    const ok = status >= 200 && status < 300
    if (!served.has(client)) {
      served.add(client)
      if (ok) firsts.add(ms)
    }
    if (!measuring) return
    requests++
    bytes += resBytes
    if (!ok) {
      non2xx++
      failures.status[status] = (failures.status[status] ?? 0) + 1
    }
    // After a warm-up, only requests sent after it: those in flight at its end waited behind it.
    // Without one, every request, each connection's first included (the wait of a burst).
    else if (warmupMs === 0 || performance.now() - ms >= from) samples.add(ms)
  })
  instance.on('reqError', (err: unknown) => {
    if (!measuring) return
    errors++
    countError(failures, err)
  })
  const r = await instance
  clearTimeout(timer)
  const seconds = warmupMs > 0 ? (performance.now() - from) / 1000 : r.duration
  return {
    requests: warmupMs > 0 ? requests : r.requests.total,
    sent: warmupMs > 0 ? requests : r.requests.sent,
    seconds,
    rps: (warmupMs > 0 ? requests : r.requests.total) / seconds,
    bytes: warmupMs > 0 ? bytes : r.throughput.total,
    latency: samples.latency(),
    errors: warmupMs > 0 ? errors : r.errors, // autocannon's errors include its timeouts
    non2xx: warmupMs > 0 ? non2xx : r.non2xx,
    failures,
    firstOnConnection: firsts.latency(),
    total: { requests: r.requests.total, sent: r.requests.sent },
  }
}

/** How the paced generator itself fared in one run (bench/paced.mjs). */
export interface PacedGenerator {
  /** Its event loop's delay, ms: the p99 and the worst of its 1 ms samples. */
  readonly loopP99Ms: number
  readonly loopMaxMs: number
  /** How late its requests left after their due times, ms. */
  readonly sendLateP99Ms: number
  readonly sendLateMaxMs: number
  readonly cpuMs: number
  /** Its CPU since it started (warm-up included), ms. */
  readonly cpuTotalMs: number
  /** It ran under SCHED_FIFO (chrt), ahead of anything else on its core. */
  readonly realtime: boolean
}

let realtime: boolean | undefined
/** Whether this process may start one under SCHED_FIFO (`chrt -f`): root, or CAP_SYS_NICE. */
function mayRunRealtime (): boolean {
  if (realtime === undefined) {
    try {
      execFileSync('chrt', ['-f', '10', 'true'], { stdio: 'ignore' })
      realtime = true
    } catch {
      realtime = false
    }
  }
  return realtime
}

/**
 * Open-loop load at a steady rate: one GET every 1/rate s over `clients`
 * keep-alive connections, each sent on time whether or not earlier ones have
 * been answered (bench/paced.mjs, in a process of its own, pinned to `core`
 * and under SCHED_FIFO where it may be). autocannon's overallRate is not
 * that: each connection sends its per-second quota back to back at every 1 s
 * tick, so with N connections the "fixed rate" is a burst at concurrency N
 * and its latency is mostly queueing.
 */
export async function runPaced (url: string, rate: number, seconds: number, opts: { readonly clients?: number, readonly core?: number, readonly warmupSeconds?: number } = {}): Promise<LoadResult & { readonly generator: PacedGenerator }> {
  const args = [join(BENCH_DIR, 'paced.mjs'), url, String(rate), String(seconds), String(opts.clients ?? 10), String(opts.warmupSeconds ?? 1)]
  const rt = mayRunRealtime()
  const child = rt
    ? spawnProgram('paced generator', 'chrt', ['-f', '10', nodePath(), ...args], { core: opts.core })
    : spawnNode('paced generator', args[0] as string, args.slice(1), { core: opts.core })
  let out = ''
  child.proc.stdout?.setEncoding('utf8')
  child.proc.stdout?.on('data', (s: string) => { out += s })
  await child.exited
  if (child.exitCode !== 0) throw new Error(`the paced generator exited with ${String(child.exitCode)}`)
  const r = JSON.parse(out) as Omit<PacedGenerator, 'realtime'> & {
    sent: number, done: number, seconds: number, bytes: number, latencies: number[], errors: Record<string, number>, status: Record<string, number>
  }
  const samples = new Samples()
  for (const v of r.latencies) samples.add(v)
  const failures = noFailures()
  for (const [code, n] of Object.entries(r.errors)) for (let i = 0; i < n; i++) countError(failures, Object.assign(new Error(code), { code }))
  failures.status = r.status
  const errors = Object.values(r.errors).reduce((a, b) => a + b, 0)
  const non2xx = Object.values(r.status).reduce((a, b) => a + b, 0)
  const requests = r.done - errors
  return {
    requests, sent: r.sent, seconds: r.seconds, rps: requests / r.seconds, bytes: r.bytes, latency: samples.latency(), errors, non2xx, failures,
    // Connections are the agent's, opened as needed: no first-request figure.
    firstOnConnection: new Samples().latency(), total: { requests, sent: r.sent },
    generator: { loopP99Ms: r.loopP99Ms, loopMaxMs: r.loopMaxMs, sendLateP99Ms: r.sendLateP99Ms, sendLateMaxMs: r.sendLateMaxMs, cpuMs: r.cpuMs, cpuTotalMs: r.cpuTotalMs, realtime: rt },
  }
}
