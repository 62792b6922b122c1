// Throughput (small responses and 1 MiB bodies): a fresh server per
// measurement, warmed up on the connections then measured, targets
// interleaved and the whole round repeated; the tables give medians.
import { fixed, ratio, table, type Cell } from '../format.js'
import { workloadLoad, type Latency, type Workload } from '../support/load.js'
import { measure, median, type Measured } from '../support/measure.js'
import { LABEL, progress, type Context, type Settings, type Target } from './context.js'
import { start, type Stopped } from './servers.js'

export interface ThroughputRun {
  readonly workload: Workload
  readonly target: Target
  readonly connections: number
  readonly round: number
  readonly rps: number
  readonly latencyMs: Latency
  /** Each connection's first request, in the warm-up: the wait of a new connection to a busy server. */
  readonly firstOnConnectionMs: Latency
  readonly cpuMsPer1k: number
  readonly sutBusy: number
  readonly upstreamBusy: number | undefined
  readonly loadgenBusy: number
  /** Cores' worth of CPU used by anything else on the machine meanwhile. */
  readonly otherLoad: number
  readonly peakRssMB: number
  readonly requests: number
  readonly failures: number
  /**
   * Request lines in the proxy's log, against the requests it answered and
   * those sent (warm-up and readiness probe included). Requests cut off in
   * flight when a run stops may or may not have reached it, so a correct
   * count lies between the two.
   */
  readonly log?: { readonly lines: number, readonly completed: number, readonly sent: number }
  /** Measurements made to get this one (see MAX_NOISE). */
  readonly attempts?: number
}

async function throughput (ctx: Context, workload: Workload, target: Target, connections: number, round: number): Promise<ThroughputRun> {
  for (let attempt = 1; ; attempt++) {
    const t = performance.now()
    const run = await throughputOnce(ctx, workload, target, connections, round)
    if (!ctx.noise.again(run.otherLoad, performance.now() - t, attempt)) return { ...run, attempts: attempt }
  }
}

async function throughputOnce (ctx: Context, workload: Workload, target: Target, connections: number, round: number): Promise<ThroughputRun> {
  const small = workload === 'small'
  const s = await start(ctx, target)
  let m: Measured
  let stopped: Stopped
  try {
    await ctx.noise.settle()
    // The warm-up on the connections that are then measured (see Load.warmupSeconds).
    const load = workloadLoad(workload, s.server.url, connections, small ? ctx.settings.seconds : ctx.settings.bigSeconds)
    m = await measure({ ...load, warmupSeconds: small ? ctx.settings.warmupSeconds : ctx.settings.bigWarmupSeconds }, s.pid, s.upstreamPid, ctx.machine.clockTicks)
  } finally {
    stopped = await s.stop()
  }
  const run: ThroughputRun = {
    workload, target, connections, round,
    rps: m.load.rps,
    latencyMs: m.load.latency,
    firstOnConnectionMs: m.load.firstOnConnection,
    cpuMsPer1k: m.cost.cpuMsPer1k,
    sutBusy: m.cost.sutBusy,
    upstreamBusy: m.cost.upstreamBusy,
    loadgenBusy: m.cost.loadgenBusy,
    otherLoad: m.cost.otherLoad,
    peakRssMB: stopped.peakRssMB,
    requests: m.load.requests,
    failures: m.load.errors + m.load.non2xx,
    // +1: the readiness probe.
    ...(stopped.logLines === undefined ? {} : { log: { lines: stopped.logLines, completed: m.load.total.requests + 1, sent: m.load.total.sent + 1 } }),
  }
  progress(`  ${workload} ${String(connections).padStart(3)} conns round ${round}: ${LABEL[target].padEnd(12)} ${fixed(run.rps).padStart(7)} req/s  p99 ${fixed(run.latencyMs.p99)} ms  ${fixed(run.cpuMsPer1k)} CPU ms/1k  busy ${fixed(run.sutBusy, 2)}  others ${fixed(run.otherLoad, 2)}${run.failures > 0 ? `  FAILURES ${run.failures}` : ''}`)
  return run
}

export interface Summary {
  readonly workload: Workload
  readonly target: Target
  readonly connections: number
  readonly rps: number
  readonly p50: number
  readonly p99: number
  /** Median over the rounds of the first requests' p50 and maximum (see ThroughputRun.firstOnConnectionMs). */
  readonly firstP50: number
  readonly firstMax: number
  readonly cpuMsPer1k: number
  readonly sutBusy: number
  readonly peakRssMB: number
  readonly failures: number
  /** Median of log lines per request answered. */
  readonly logLinesPerRequest?: number
  /** Whether every run's line count lay between the requests answered and those sent. */
  readonly logLinesExact?: boolean
}

export function summarise (runs: readonly ThroughputRun[]): Summary[] {
  const keys = new Map<string, ThroughputRun[]>()
  for (const r of runs) {
    const k = `${r.workload}|${r.target}|${r.connections}`
    keys.set(k, [...(keys.get(k) ?? []), r])
  }
  return [...keys.values()].map(rs => {
    const first = rs[0] as ThroughputRun
    const logs = rs.map(r => r.log).filter(x => x !== undefined)
    return {
      workload: first.workload,
      target: first.target,
      connections: first.connections,
      rps: median(rs.map(r => r.rps)),
      p50: median(rs.map(r => r.latencyMs.p50)),
      p99: median(rs.map(r => r.latencyMs.p99)),
      firstP50: median(rs.map(r => r.firstOnConnectionMs.p50)),
      firstMax: median(rs.map(r => r.firstOnConnectionMs.max)),
      cpuMsPer1k: median(rs.map(r => r.cpuMsPer1k)),
      sutBusy: median(rs.map(r => r.sutBusy)),
      // Peak is a peak: the largest over the rounds, not the median.
      peakRssMB: Math.max(...rs.map(r => r.peakRssMB)),
      failures: rs.reduce((n, r) => n + r.failures, 0),
      ...(logs.length === 0
        ? {}
        : { logLinesPerRequest: median(logs.map(l => l.lines / l.completed)), logLinesExact: logs.every(l => l.lines >= l.completed && l.lines <= l.sent) }),
    }
  })
}

export function find (s: readonly Summary[], workload: Workload, target: Target, connections: number): Summary | undefined {
  return s.find(x => x.workload === workload && x.target === target && x.connections === connections)
}

export function rpsRatio (s: readonly Summary[], workload: Workload, a: Target, b: Target, connections: number): number {
  return (find(s, workload, a, connections)?.rps ?? Number.NaN) / (find(s, workload, b, connections)?.rps ?? Number.NaN)
}

/** Small responses: every server, at each number of connections, round after round. */
export async function smallResponses (ctx: Context, peers: readonly ('floor' | 'go')[]): Promise<ThroughputRun[]> {
  const runs: ThroughputRun[] = []
  for (let round = 1; round <= ctx.settings.rounds; round++) {
    for (const c of ctx.settings.connections) {
      for (const t of ['proxy', ...peers, 'floor-image', 'direct', 'proxy-all'] as const) runs.push(await throughput(ctx, 'small', t, c, round))
    }
  }
  return runs
}

/**
 * 1 MiB bodies, each way, through the proxy, its peers (the floor, the Go
 * signer when built), the floor with the image's Node flags (what the
 * image's heap limits cost a body, apart from what our code costs) and directly.
 */
export async function bigBodies (ctx: Context, peers: readonly ('floor' | 'go')[]): Promise<ThroughputRun[]> {
  const runs: ThroughputRun[] = []
  for (let round = 1; round <= ctx.settings.rounds; round++) {
    for (const w of ['get-1mib', 'post-1mib'] as const) {
      for (const t of ['proxy', ...peers, 'floor-image', 'direct'] as const) runs.push(await throughput(ctx, w, t, ctx.settings.bigConnections, round))
    }
  }
  return runs
}

export function smallTable (small: readonly Summary[], settings: Settings): string {
  const rows: Cell[][] = []
  for (const c of settings.connections) {
    for (const t of ['proxy', 'proxy-all', 'floor', 'floor-image', 'go', 'direct'] as const) {
      const x = find(small, 'small', t, c)
      if (x === undefined) continue
      rows.push([LABEL[t], c, Math.round(x.rps), x.p50, x.p99, `${fixed(x.firstP50)} / ${fixed(x.firstMax)}`, x.cpuMsPer1k, fixed(x.sutBusy * 100, 0) + ' %', fixed(x.peakRssMB, 1) + (t === 'direct' ? '*' : ''), x.failures])
    }
  }
  return table(['server', 'conns', 'req/s', 'p50 ms', 'p99 ms', 'new conn. 1st req p50 / max ms', 'CPU ms/1k req', 'core busy', 'peak RSS MB', 'failed'], rows)
}

export function ratioTable (small: readonly Summary[], settings: Settings): string {
  const row = (name: string, a: Target, b: Target): Cell[] => [name, ...settings.connections.map(c => ratio(rpsRatio(small, 'small', a, b, c)))]
  return table(['req/s ratio', ...settings.connections.map(c => `${c} conns`)], [
    row('proxy / floor', 'proxy', 'floor'),
    row('proxy / floor, both with the image\'s Node flags', 'proxy', 'floor-image'),
    row('proxy / Go signer', 'proxy', 'go'),
    row('proxy / direct', 'proxy', 'direct'),
    row('proxy all lines / defaults', 'proxy-all', 'proxy'),
    row('floor / direct', 'floor', 'direct'),
  ])
}

export function bigTable (big: readonly Summary[], settings: Settings): string {
  const rows: Cell[][] = []
  for (const w of ['get-1mib', 'post-1mib'] as const) {
    for (const t of ['proxy', 'floor', 'floor-image', 'go', 'direct'] as const) {
      const x = find(big, w, t, settings.bigConnections)
      if (x === undefined) continue
      rows.push([BODY[w], LABEL[t], x.rps, x.p50, x.p99, x.cpuMsPer1k / 1000, fixed(x.peakRssMB, 1) + (t === 'direct' ? '*' : ''), x.failures])
    }
  }
  return table(['body', 'server', 'MiB/s', 'p50 ms', 'p99 ms', 'CPU ms/MiB', 'peak RSS MB', 'failed'], rows)
}

const BODY = { 'get-1mib': 'GET 1 MiB', 'post-1mib': 'POST 1 MiB' } as const

/** CPU per 1,000 requests of `a` over `b`'s in the same run (NaN when either was not measured). */
export function cpuRatio (s: readonly Summary[], workload: Workload, a: Target, b: Target, connections: number): number {
  return (find(s, workload, a, connections)?.cpuMsPer1k ?? Number.NaN) / (find(s, workload, b, connections)?.cpuMsPer1k ?? Number.NaN)
}

/** 1 MiB bodies: the proxy against the floor and the Go signer, req/s and CPU per request, each way. */
export function bigRatioTable (big: readonly Summary[], settings: Settings): string {
  const c = settings.bigConnections
  const rows: Cell[][] = []
  for (const w of ['get-1mib', 'post-1mib'] as const) {
    for (const peer of ['floor', 'floor-image', 'go'] as const) {
      if (find(big, w, peer, c) === undefined) continue
      rows.push([BODY[w], `proxy / ${LABEL[peer]}`, ratio(rpsRatio(big, w, 'proxy', peer, c)), ratio(cpuRatio(big, w, 'proxy', peer, c))])
    }
  }
  return table(['body', 'ratio', 'req/s', 'CPU ms per 1,000'], rows)
}
