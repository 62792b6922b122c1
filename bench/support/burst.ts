// What `npm run bench:accept` watches while a set of connections opens at
// once: the listening socket's accept queue and backlog (`ss`), the kernel's
// counters of connections it dropped because that queue was full
// (/proc/net/netstat: ListenOverflows, ListenDrops; TCPSynRetrans, the
// handshakes retried after a drop, 1 s, then 3, 7, 15 s), a process's major
// page faults, and the CPU other processes used meanwhile. And wrk, the load
// generator the finding was made with, run with a Lua `done` that prints its
// summary as JSON.
import { execFileSync, spawn } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { noFailures, type Failures, type Latency } from './load.js'
import { cpuTicks, machineBusyTicks } from './machine.js'

/** The listening socket on `port`: connections waiting to be accepted (Recv-Q) and its backlog (Send-Q). */
export function listenQueue (port: number): { queued: number, backlog: number } {
  const line = execFileSync('ss', ['-ltnH', `( sport = :${port} )`], { encoding: 'utf8' }).trim().split('\n')[0] ?? ''
  const [, queued, backlog] = line.trim().split(/\s+/)
  return { queued: Number(queued), backlog: Number(backlog) }
}

/** Samples the accept queue every `everyMs`; stop() gives the largest and how long it was not empty. */
export function sampleAcceptQueue (port: number, everyMs = 50): () => { max: number, nonEmptyMs: number } {
  const samples: number[] = []
  const timer = setInterval(() => {
    try { samples.push(listenQueue(port).queued) } catch { /* ss missing or the server gone */ }
  }, everyMs)
  return () => {
    clearInterval(timer)
    return { max: samples.length === 0 ? Number.NaN : Math.max(...samples), nonEmptyMs: samples.filter(n => n > 0).length * everyMs }
  }
}

export interface KernelCounters { readonly listenOverflows: number, readonly listenDrops: number, readonly synRetrans: number }

/** TcpExt counters of this network namespace. */
export function kernelCounters (): KernelCounters {
  const lines = readFileSync('/proc/net/netstat', 'utf8').split('\n').filter(l => l.startsWith('TcpExt:'))
  const names = (lines[0] ?? '').split(/\s+/).slice(1)
  const values = (lines[1] ?? '').split(/\s+/).slice(1).map(Number)
  const get = (name: string): number => values[names.indexOf(name)] ?? Number.NaN
  return { listenOverflows: get('ListenOverflows'), listenDrops: get('ListenDrops'), synRetrans: get('TCPSynRetrans') }
}

export function counterDelta (a: KernelCounters, b: KernelCounters): KernelCounters {
  return { listenOverflows: b.listenOverflows - a.listenOverflows, listenDrops: b.listenDrops - a.listenDrops, synRetrans: b.synRetrans - a.synRetrans }
}

/** Major page faults of `pid` so far (pages read back from disk: the binary's, under memory pressure). */
export function majorFaults (pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[9])
  } catch {
    return Number.NaN
  }
}

/**
 * Cores' worth of CPU that processes other than `pids()` (and this one) used
 * until stop(): the machine's busy ticks less ours, our processes sampled
 * every half second so that one that exits (wrk) is still counted.
 */
export function othersCpu (pids: () => readonly number[], ticksPerSecond: number): () => number {
  const last = new Map<number, number>()
  let ours = 0
  const sample = (): void => {
    for (const pid of pids()) {
      try {
        const t = cpuTicks(pid)
        const before = last.get(pid)
        if (before !== undefined) ours += t - before
        last.set(pid, t)
      } catch { /* gone since */ }
    }
  }
  sample()
  const all0 = machineBusyTicks()
  const me0 = process.cpuUsage()
  const t0 = performance.now()
  const timer = setInterval(sample, 500)
  return () => {
    clearInterval(timer)
    sample()
    const me = process.cpuUsage(me0)
    const others = machineBusyTicks() - all0 - ours - (me.user + me.system) / 1e6 * ticksPerSecond
    return Math.max(0, others / ticksPerSecond / ((performance.now() - t0) / 1000))
  }
}

/** wrk on PATH, or undefined (Debian: apt-get install wrk). */
export function findWrk (): string | undefined {
  try {
    return execFileSync('sh', ['-c', 'command -v wrk'], { encoding: 'utf8' }).trim() || undefined
  } catch {
    return undefined
  }
}

const DONE_LUA = `done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_JSON {"requests":%d,"us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
`

export interface WrkResult {
  readonly requests: number
  readonly seconds: number
  /** ms, of the answers within the timeout (wrk keeps no figure for later ones: those are its `timeout`). */
  readonly latency: Latency
  /**
   * wrk's errors: `timeout` are answers that came after `--timeout` (wrk never
   * gives up on a request; one never answered by the end is not counted at
   * all); `reset` its read and write errors; `status` answers of 400 and more.
   */
  readonly failures: Failures
}

/** `wrk -t<threads> -c<connections> -d<seconds>s --timeout <timeout>s --latency <url>`, pinned to `core`. */
export async function runWrk (wrk: string, scratch: string, o: { url: string, connections: number, seconds: number, timeoutSeconds: number, threads: number, core?: number }, onStart?: (pid: number) => void): Promise<WrkResult> {
  const lua = join(scratch, 'wrk-done.lua')
  writeFileSync(lua, DONE_LUA)
  const argv = [`-t${Math.min(o.threads, o.connections)}`, `-c${o.connections}`, `-d${o.seconds}s`, '--timeout', `${o.timeoutSeconds}s`, '--latency', '-s', lua, o.url]
  const [cmd, args] = o.core === undefined ? [wrk, argv] : ['taskset', ['-c', String(o.core), wrk, ...argv]]
  const out = await new Promise<string>((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] })
    if (child.pid !== undefined) onStart?.(child.pid)
    let text = ''
    child.stdout.on('data', (d: Buffer) => { text += d.toString() })
    child.on('error', reject)
    child.on('close', code => { if (code === 0) resolve(text); else reject(new Error(`wrk exited ${String(code)}: ${text}`)) })
  })
  const line = out.split('\n').find(l => l.startsWith('WRK_JSON '))
  if (line === undefined) throw new Error(`wrk printed no summary: ${out}`)
  const j = JSON.parse(line.slice('WRK_JSON '.length)) as Record<string, number>
  const n = (k: string): number => j[k] ?? Number.NaN
  const failures = noFailures()
  failures.timeout = n('timeout')
  failures.connect = n('connect')
  failures.reset = n('read') + n('write')
  if (n('status') > 0) failures.status['≥400'] = n('status')
  return {
    requests: n('requests'),
    seconds: n('us') / 1e6,
    latency: { p50: n('p50') / 1000, p90: n('p90') / 1000, p99: n('p99') / 1000, max: n('max') / 1000, mean: n('mean') / 1000 },
    failures,
  }
}


/** What the server saw of one phase (bench/accept-recorder.mjs, `bench:accept --record`). */
export interface ServerView {
  readonly accepted: number
  /** ms from the phase's start to the last connection accepted in it, and to 90 % of them. */
  readonly lastAcceptMs: number
  readonly p90AcceptMs: number
  /** Event-loop turns longer than 5 ms: how many, their sum and the longest, ms. */
  readonly longTurns: number
  readonly longTurnsMs: number
  readonly longestTurnMs: number
  /** V8's collections: how many, and their sum, ms. */
  readonly collections: number
  readonly collectionsMs: number
}

/** The recorder's file, cut into the phases' wall-clock windows [start, end). */
export function serverViews (file: string, windows: readonly (readonly [number, number])[]): ServerView[] {
  const r = JSON.parse(readFileSync(file, 'utf8')) as { accepts: number[], stalls: [number, number][], gcs: [number, number][] }
  return windows.map(([start, end]) => {
    const inside = (t: number): boolean => t >= start && t < end
    const accepts = r.accepts.filter(inside).map(t => t - start).sort((a, b) => a - b)
    const stalls = r.stalls.filter(([t]) => inside(t)).map(([, ms]) => ms)
    const gcs = r.gcs.filter(([t]) => inside(t)).map(([, ms]) => ms)
    const total = (xs: number[]): number => xs.reduce((a, b) => a + b, 0)
    return {
      accepted: accepts.length,
      lastAcceptMs: accepts.at(-1) ?? Number.NaN,
      p90AcceptMs: accepts[Math.min(accepts.length - 1, Math.floor(0.9 * accepts.length))] ?? Number.NaN,
      longTurns: stalls.length,
      longTurnsMs: total(stalls),
      longestTurnMs: stalls.length === 0 ? 0 : Math.max(...stalls),
      collections: gcs.length,
      collectionsMs: total(gcs),
    }
  })
}
