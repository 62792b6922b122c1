// npm run bench [-- --quick] [-- --no-pin]
//
// The benchmark of issue 6: the real proxy (as a child process, run as the
// image runs it: the bundle with the Dockerfile's Node flags, environment
// and warm compile cache, see bench/image.ts) against the framework floor (a bare @fastify/http-proxy, bench/floor.mjs)
// and against the upstream itself, all on 127.0.0.1, driven by autocannon.
// Tables go to stdout, progress to stderr, everything to
// bench/results/<timestamp>.json and bench/results/latest.json (a --quick
// run: <timestamp>-quick.json and latest-quick.json).
//
// Each throughput figure is a fresh server process (so VmHWM is that
// scenario's peak RSS), warmed up, then measured; targets are interleaved
// (proxy, floor, direct, proxy with every request line) and the whole round repeated; the
// tables give medians over the rounds. On a shared machine, the CPU other
// processes use during each measurement is recorded; a full run waits for a
// quiet moment before each measurement and repeats one that was disturbed.
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseArgs } from 'node:util'
import { fixed, ratio, table, type Cell } from './format.js'
import {
  BENCH_DIR, bare, parseEnv, thisBuild, splitArgs, useNode, awaitQuiet, choosePinning, countRequestLines, installCleanup, machine, measure, median, pinProcess,
  noiseProbe, runLoad, runPaced, scratchDir, spawnNode, startFloor, startProxy, startUpstream, stopAll, stopChild, vmMB,
  SMALL_PATH, workloadLoad, type Workload, type Latency, type LoadResult, type Machine, type Measured, type Pinning, type Server, type Upstream,
  gitCommit, imageEnvForThisNode,
} from './harness.js'
import { buildGoSigner, checkGoSigner, startGoSigner, type GoSigner } from './go-signer.js'
import { imageBuild, type Build } from './image.js'
import { mintTable, type MintResult } from './mint.js'

const SECTIONS = ['idle', 'small', 'big', 'rate', 'soak', 'mint'] as const
type Section = typeof SECTIONS[number]

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    'no-pin': { type: 'boolean', default: false },
    node: { type: 'string' },
    cli: { type: 'string' },
    checkout: { type: 'string' },
    bare: { type: 'boolean', default: false },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    sections: { type: 'string', default: SECTIONS.join(',') },
    help: { type: 'boolean', default: false },
  },
})
if (flags.help) {
  process.stdout.write([
    'usage: npm run bench [-- --quick] [-- --no-pin] [-- --node <path>] [-- --node-args "<flags>"] [-- --env NAME=value …] [-- --sections idle,small,…]',
    '  --quick       1 round, short runs: a few minutes',
    '  --no-pin      do not pin processes to cores with taskset',
    '  --node        the Node binary every server runs on (default: BENCH_NODE, else the one running the bench)',
    '  --checkout    another built checkout to measure as the proxy, run as its own image runs it (e.g. a worktree of the commit before a change)',
    '  --cli         this file as the proxy instead of the bundle, with the image\'s flags and environment (e.g. dist/cli.js)',
    '  --bare        without the image\'s Node flags and environment',
    '  --node-args   Node flags for the proxy only, after the image\'s, with "=": --node-args="--max-semi-space-size=8"',
    '  --env         added to the proxy\'s environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)',
    `  --sections    which parts to run (default all: ${SECTIONS.join(',')})`,
    '',
  ].join('\n'))
  process.exit(0)
}
useNode(flags.node)
const proxyNodeArgs = splitArgs(flags['node-args'])
const proxyExtraEnv = parseEnv(flags.env)
const proxyBuild = ((): Build => {
  const image = flags.checkout === undefined ? thisBuild() : imageBuild(resolve(flags.checkout))
  const chosen = flags.cli === undefined ? image : { ...image, script: resolve(flags.cli), description: `${resolve(flags.cli)} with the flags and environment of ${image.description}` }
  return flags.bare ? bare(chosen) : chosen
})()
const sections = new Set(flags.sections.split(',').map(x => x.trim()).filter(x => x !== ''))
for (const x of sections) if (!SECTIONS.includes(x as Section)) throw new Error(`--sections: unknown ${JSON.stringify(x)} (choices: ${SECTIONS.join(', ')})`)
const runs = (x: Section): boolean => sections.has(x)

interface Settings {
  readonly rounds: number
  /** Seconds per throughput measurement, and of the warm-up before it. */
  readonly seconds: number
  readonly warmupSeconds: number
  readonly connections: readonly number[]
  readonly bigSeconds: number
  readonly bigWarmupSeconds: number
  readonly bigConnections: number
  readonly rate: number
  readonly rateSeconds: number
  readonly soakRequests: number
  /** RSS is read after this many soak requests, and again at the end. */
  readonly soakCheckpoint: number
  readonly soakConnections: number
  /** Idle: requests after start, then seconds of quiet, before RSS is read. */
  readonly idleRequests: number
  readonly idleSettleSeconds: number
  /** Extra time the run may spend waiting for, or repeating after, other processes' load (see Noise). */
  readonly noiseBudgetSeconds: number
}

const FULL: Settings = {
  rounds: 3, seconds: 6, warmupSeconds: 1.5, connections: [32, 256],
  bigSeconds: 4, bigWarmupSeconds: 0.5, bigConnections: 32,
  rate: 1000, rateSeconds: 4,
  soakRequests: 20_000, soakCheckpoint: 2_000, soakConnections: 32,
  idleRequests: 50, idleSettleSeconds: 5,
  noiseBudgetSeconds: 60,
}
const QUICK: Settings = {
  ...FULL,
  rounds: 1, seconds: 1, warmupSeconds: 0.5,
  bigSeconds: 1, bigWarmupSeconds: 0.3,
  rateSeconds: 1,
  
  noiseBudgetSeconds: 0,
}
const settings = flags.quick ? QUICK : FULL

const progress = (s: string): void => { process.stderr.write(s + '\n') }

/** Cores' worth of CPU other processes may use during a measurement before it counts as disturbed. */
const MAX_NOISE = 0.1

/**
 * For a shared machine (a CI runner, a laptop with a build going): before
 * each measurement wait for a quiet half second (at most 15 s), and measure
 * once more when other processes used over MAX_NOISE cores meanwhile; all
 * of it within one time budget, so a machine that never quietens costs at
 * most that much extra. Whatever was measured last is kept, with its noise.
 */
class Noise {
  #budgetMs: number
  waitedMs = 0
  repeats = 0
  readonly #ticks: number
  constructor (budgetMs: number, clockTicks: number) {
    this.#budgetMs = budgetMs
    this.#ticks = clockTicks
  }

  async settle (): Promise<void> {
    if (this.#budgetMs <= 0) return
    const waited = await awaitQuiet(MAX_NOISE, Math.min(15_000, this.#budgetMs), this.#ticks)
    this.#budgetMs -= waited
    this.waitedMs += waited
  }

  /** Whether to measure again after attempt `attempt`, which took `ms` while others used `otherLoad` cores. */
  again (otherLoad: number, ms: number, attempt: number): boolean {
    if (otherLoad <= MAX_NOISE || attempt >= 2 || this.#budgetMs <= 0) return false
    this.#budgetMs -= ms
    this.repeats++
    progress(`    other processes used ${fixed(otherLoad, 2)} cores meanwhile: measuring again`)
    return true
  }
}

const PATH = SMALL_PATH

type Target = 'proxy' | 'floor' | 'go' | 'direct' | 'proxy-all' | 'floor-image'
const LABEL: Readonly<Record<Target, string>> = { proxy: 'proxy (defaults)', floor: 'floor', go: 'Go signer', direct: 'direct', 'proxy-all': 'proxy (COS_ACCESS_LOG=all)', 'floor-image': 'floor (image\'s Node flags)' }
/** Servers that start fresh for a measurement (the upstream, measured directly, does not). */
type Fresh = 'proxy' | 'floor' | 'go'

interface Context {
  readonly machine: Machine
  readonly pin: Pinning
  readonly upstream: Upstream
  readonly scratch: string
  readonly noise: Noise
  readonly goSigner: GoSigner
}

// ---------------------------------------------------------------------------
// Servers

interface Started {
  readonly server: Server
  /** The process whose CPU and memory are measured. */
  readonly pid: number
  /** The upstream, when it is a separate process. */
  readonly upstreamPid: number | undefined
  readonly stop: () => Promise<Stopped>
}

interface Stopped {
  /** VmHWM just before stopping. */
  readonly peakRssMB: number
  /** Request lines in its log (the proxy only). */
  readonly logLines?: number
}

let logSeq = 0

/**
 * A fresh server for one measurement, pinned to the measured core. `direct`
 * is the upstream itself, moved to that core for the measurement; its VmHWM
 * is over its whole life, not this scenario's.
 */
async function start (ctx: Context, target: Target): Promise<Started> {
  const { pin, upstream } = ctx
  if (target === 'direct') {
    pinProcess(upstream.child.pid, pin.sut)
    return {
      server: { child: upstream.child, url: upstream.url, readyMs: Number.NaN },
      pid: upstream.child.pid,
      upstreamPid: undefined,
      stop: async () => {
        const peakRssMB = vmMB(upstream.child.pid, 'VmHWM')
        pinProcess(upstream.child.pid, pin.upstream)
        return { peakRssMB }
      },
    }
  }
  const go = ctx.goSigner
  const server = target === 'floor'
    ? await startFloor(upstream.url, pin.sut)
    : target === 'floor-image'
      // The floor as it would run in the proxy's container: the image's Node
      // flags and environment (its heap limits). In a pod the heap limit is
      // small whatever the flags (Node sizes it from the memory limit), and a
      // small heap limit alone costs Node 24 10-15 % of its CPU per request
      // here (docs/performance.md): this floor pays it as the proxy does.
      ? await startFloor(upstream.url, pin.sut, proxyBuild.nodeArgs, imageEnvForThisNode(proxyBuild.env))
    : target === 'go'
      ? await startGoSigner({ binary: 'binary' in go ? go.binary : 'go-signer', upstreamUrl: upstream.url, core: pin.sut })
      : await startProxy({
      upstreamUrl: upstream.url,
      // The image's defaults (info, COS_ACCESS_LOG=errors: no line for a success), or a line for every request.
      logLevel: 'info',
      logFile: join(ctx.scratch, `proxy-${++logSeq}.log`),
      cwd: ctx.scratch,
      core: pin.sut,
      nodeArgs: proxyNodeArgs,
      env: target === 'proxy-all' ? { ...proxyExtraEnv, COS_ACCESS_LOG: 'all' } : proxyExtraEnv,
      build: proxyBuild,
    })
  const { pid } = server.child
  return {
    server,
    pid,
    upstreamPid: upstream.child.pid,
    stop: async () => {
      const peakRssMB = vmMB(pid, 'VmHWM')
      await stopChild(server.child)
      await server.logReader?.exited
      if (server.logFile === undefined) return { peakRssMB }
      const logLines = countRequestLines(server.logFile)
      rmSync(server.logFile, { force: true })
      return { peakRssMB, logLines }
    },
  }
}

// ---------------------------------------------------------------------------
// Throughput (small responses and 1 MiB bodies)


interface ThroughputRun {
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
    const load = workloadLoad(workload, s.server.url, connections, small ? settings.seconds : settings.bigSeconds)
    m = await measure({ ...load, warmupSeconds: small ? settings.warmupSeconds : settings.bigWarmupSeconds }, s.pid, s.upstreamPid, ctx.machine.clockTicks)
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

interface Summary {
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

function summarise (runs: readonly ThroughputRun[]): Summary[] {
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

function find (s: readonly Summary[], workload: Workload, target: Target, connections: number): Summary | undefined {
  return s.find(x => x.workload === workload && x.target === target && x.connections === connections)
}

function rpsRatio (s: readonly Summary[], workload: Workload, a: Target, b: Target, connections: number): number {
  return (find(s, workload, a, connections)?.rps ?? Number.NaN) / (find(s, workload, b, connections)?.rps ?? Number.NaN)
}

// ---------------------------------------------------------------------------
// Fixed rate: the latency the proxy adds over going straight to the upstream.

type Generator = 'paced' | 'autocannon-R'

interface RateRun {
  readonly generator: Generator
  readonly target: Target
  readonly round: number
  readonly rps: number
  readonly latencyMs: Latency
  readonly failures: number
  readonly otherLoad: number
}

async function fixedRate (ctx: Context): Promise<RateRun[]> {
  // One proxy and one floor for the whole section (RSS is not measured here);
  // the upstream stays where it is, so "direct" differs only by the hop.
  const proxy = await start(ctx, 'proxy')
  const floor = await start(ctx, 'floor')
  const runs: RateRun[] = []
  try {
    for (const s of [proxy, floor]) await runLoad({ url: s.server.url + PATH, connections: 32, duration: settings.warmupSeconds })
    const urls: Readonly<Record<'proxy' | 'floor' | 'direct', string>> = { proxy: proxy.server.url, floor: floor.server.url, direct: ctx.upstream.url }
    for (let round = 1; round <= settings.rounds; round++) {
      for (const generator of ['paced', 'autocannon-R'] as const) {
        for (const target of ['proxy', 'floor', 'direct'] as const) {
          const url = urls[target] + PATH
          // autocannon -R with one connection: its rate limit sends each
          // second's quota back to back, so more connections would measure
          // queueing in the burst; one keeps a single request in flight.
          const once = (): Promise<LoadResult> => generator === 'paced'
            ? runPaced(url, settings.rate, settings.rateSeconds)
            : runLoad({ url, connections: 1, overallRate: settings.rate, duration: settings.rateSeconds })
          let r: LoadResult
          let otherLoad: number
          // Repeated while the machine is noisy, as in throughput().
          for (let attempt = 1; ; attempt++) {
            await ctx.noise.settle()
            const t = performance.now()
            const others = noiseProbe([proxy.pid, floor.pid, ctx.upstream.child.pid], ctx.machine.clockTicks)
            r = await once()
            otherLoad = others()
            if (!ctx.noise.again(otherLoad, performance.now() - t, attempt)) break
          }
          runs.push({ generator, target, round, rps: r.rps, latencyMs: r.latency, failures: r.errors + r.non2xx, otherLoad })
          progress(`  ${settings.rate} req/s ${generator.padEnd(12)} round ${round}: ${LABEL[target].padEnd(12)} p50 ${fixed(r.latency.p50)} ms  p99 ${fixed(r.latency.p99)} ms`)
        }
      }
    }
  } finally {
    await proxy.stop()
    await floor.stop()
  }
  return runs
}

interface RateSummary { readonly generator: Generator, readonly target: Target, readonly p50: number, readonly p90: number, readonly p99: number, readonly addedP50: number, readonly addedP99: number, readonly failures: number }

function summariseRate (runs: readonly RateRun[]): RateSummary[] {
  const out: RateSummary[] = []
  for (const generator of ['paced', 'autocannon-R'] as const) {
    const pick = (t: Target): RateRun[] => runs.filter(r => r.generator === generator && r.target === t)
    const direct = pick('direct')
    for (const target of ['proxy', 'floor', 'direct'] as const) {
      const rs = pick(target)
      const p50 = median(rs.map(r => r.latencyMs.p50))
      const p99 = median(rs.map(r => r.latencyMs.p99))
      out.push({
        generator, target, p50, p90: median(rs.map(r => r.latencyMs.p90)), p99,
        // Difference of the medians over the rounds.
        addedP50: p50 - median(direct.map(r => r.latencyMs.p50)),
        addedP99: p99 - median(direct.map(r => r.latencyMs.p99)),
        failures: rs.reduce((n, r) => n + r.failures, 0),
      })
    }
  }
  return out
}

// ---------------------------------------------------------------------------
// Idle footprint and start-up: what every pod pays before any load.

interface IdleRun {
  readonly target: Fresh
  readonly round: number
  /** Spawn to ready (the proxy: /readyz 200; the floor: listening). */
  readonly readyMs: number
  /** CPU the server used until then (all threads): robust to a busy machine. */
  readonly readyCpuMs: number
  /** RssAnon: the per-pod part (the binary's file-backed pages are shared between pods of a node). */
  readonly anonMB: number
  readonly rssMB: number
  readonly otherLoad: number
}

async function idleOnce (ctx: Context, target: Fresh, round: number): Promise<IdleRun> {
  await ctx.noise.settle()
  const others = noiseProbe([], ctx.machine.clockTicks)
  const s = await start(ctx, target)
  try {
    await runLoad({ url: s.server.url + PATH, connections: 1, amount: settings.idleRequests })
    await sleep(settings.idleSettleSeconds * 1000)
    const run = { target, round, readyMs: s.server.readyMs, readyCpuMs: s.server.readyCpuMs ?? Number.NaN, anonMB: vmMB(s.pid, 'RssAnon'), rssMB: vmMB(s.pid, 'VmRSS'), otherLoad: others() }
    progress(`  idle round ${round}: ${LABEL[target].padEnd(12)} ready ${fixed(run.readyMs, 0)} ms (${fixed(run.readyCpuMs, 0)} CPU ms)  RssAnon ${fixed(run.anonMB, 1)} MB  RSS ${fixed(run.rssMB, 1)} MB`)
    return run
  } finally {
    await s.stop()
  }
}

interface IdleSummary { readonly target: Fresh, readonly readyMs: number, readonly readyCpuMs: number, readonly anonMB: number, readonly rssMB: number }

function summariseIdle (runs: readonly IdleRun[]): IdleSummary[] {
  return (['proxy', 'floor', 'go'] as const).flatMap(target => {
    const rs = runs.filter(r => r.target === target)
    if (rs.length === 0) return []
    return { target, readyMs: median(rs.map(r => r.readyMs)), readyCpuMs: median(rs.map(r => r.readyCpuMs)), anonMB: median(rs.map(r => r.anonMB)), rssMB: median(rs.map(r => r.rssMB)) }
  })
}

// ---------------------------------------------------------------------------
// RSS soak: a fresh server, RSS after the first requests and at the end.

interface Soak {
  readonly target: 'proxy' | 'floor'
  readonly requests: number
  readonly connections: number
  readonly rps: number
  readonly failures: number
  /** VmRSS after settings.soakCheckpoint requests. */
  readonly rssAtCheckpointMB: number
  readonly rssAfterMB: number
  readonly peakRssMB: number
  /** After less at the checkpoint. */
  readonly growthMB: number
  /**
   * Median VmRSS over the last fifth of the soak less that over the first
   * fifth after the checkpoint: the trend, which a garbage collection just
   * before or after a single sample cannot fake (RSS saw-tooths as the heap
   * grows and is collected).
   */
  readonly trendMB: number
  readonly otherLoad: number
  /** [seconds since the checkpoint, VmRSS MB] every 250 ms. */
  readonly samples: readonly (readonly [number, number])[]
}

async function soak (ctx: Context, target: 'proxy' | 'floor'): Promise<Soak> {
  await ctx.noise.settle()
  const s = await start(ctx, target)
  try {
    const { url } = s.server
    const others = noiseProbe([s.pid, ctx.upstream.child.pid], ctx.machine.clockTicks)
    const first = await runLoad({ url: url + PATH, connections: settings.soakConnections, amount: settings.soakCheckpoint })
    const atCheckpoint = vmMB(s.pid, 'VmRSS')
    const samples: [number, number][] = []
    const t0 = performance.now()
    const timer = setInterval(() => { samples.push([(performance.now() - t0) / 1000, vmMB(s.pid, 'VmRSS')]) }, 250)
    let r
    try {
      r = await runLoad({ url: url + PATH, connections: settings.soakConnections, amount: settings.soakRequests - settings.soakCheckpoint })
    } finally {
      clearInterval(timer)
    }
    const after = vmMB(s.pid, 'VmRSS')
    const fifth = Math.max(1, Math.floor(samples.length / 5))
    const rss = samples.map(([, mb]) => mb)
    const peak = vmMB(s.pid, 'VmHWM')
    const soaked: Soak = {
      target,
      requests: first.requests + r.requests,
      connections: settings.soakConnections,
      rps: r.rps,
      failures: first.errors + first.non2xx + r.errors + r.non2xx,
      rssAtCheckpointMB: atCheckpoint,
      rssAfterMB: after,
      peakRssMB: peak,
      growthMB: after - atCheckpoint,
      trendMB: rss.length === 0 ? Number.NaN : median(rss.slice(-fifth)) - median(rss.slice(0, fifth)),
      otherLoad: others(),
      samples,
    }
    progress(`  soak ${LABEL[target].padEnd(12)} RSS at ${settings.soakCheckpoint}: ${fixed(atCheckpoint, 1)} MB, at ${soaked.requests}: ${fixed(after, 1)} MB`)
    return soaked
  } finally {
    await s.stop()
  }
}

// ---------------------------------------------------------------------------
// Token minting, in its own process on the measured core.

async function mint (ctx: Context): Promise<MintResult & { readonly otherLoad: number }> {
  await ctx.noise.settle()
  const child = spawnNode('mint', join(BENCH_DIR, 'mint.ts'), flags.quick ? ['--json', '--quick'] : ['--json'], {
    nodeArgs: ['--import', 'tsx'],
    ...(ctx.pin.sut === undefined ? {} : { core: ctx.pin.sut }),
  })
  const others = noiseProbe([child.pid], ctx.machine.clockTicks)
  let out = ''
  child.proc.stdout?.setEncoding('utf8')
  child.proc.stdout?.on('data', (s: string) => { out += s })
  // Read before it exits: /proc/<pid> goes with the process.
  let otherLoad = 0
  const timer = setInterval(() => { try { otherLoad = others() } catch { /* exited */ } }, 100)
  await child.exited
  clearInterval(timer)
  if (child.exitCode !== 0) throw new Error('the minting micro-benchmark failed')
  return { ...(JSON.parse(out) as MintResult), otherLoad }
}

// ---------------------------------------------------------------------------
// Report

interface Check { readonly what: string, readonly goal: string, readonly measured: string, readonly met: boolean | undefined }

function checks (small: readonly Summary[], big: readonly Summary[], rate: readonly RateSummary[], soaks: readonly Soak[], idle: readonly IdleSummary[]): Check[] {
  const out: Check[] = []
  const atLeast = (what: string, value: number, goal: number, show = ratio): void => {
    out.push({ what, goal: `≥ ${goal}`, measured: show(value), met: Number.isNaN(value) ? undefined : value >= goal })
  }
  const atMost = (what: string, value: number, goal: number, unit: string): void => {
    out.push({ what, goal: `≤ ${goal} ${unit}`, measured: `${fixed(value, 2)} ${unit}`, met: Number.isNaN(value) ? undefined : value <= goal })
  }
  for (const c of settings.connections) atLeast(`proxy / floor req/s, ${c} conns`, rpsRatio(small, 'small', 'proxy', 'floor', c), 0.95)
  // Issue 21's fourth target, at the image's defaults (issue 29).
  atLeast('proxy / floor req/s, 32 conns (defaults)', rpsRatio(small, 'small', 'proxy', 'floor', 32), 1.15)
  // The same with the floor under the image's Node flags and environment, as in one pod.
  atLeast('proxy / floor req/s, 32 conns, both with the image\'s Node flags', rpsRatio(small, 'small', 'proxy', 'floor-image', 32), 1.15)
  for (const c of settings.connections) atLeast(`proxy all lines / defaults req/s, ${c} conns`, rpsRatio(small, 'small', 'proxy-all', 'proxy', c), 0.85)
  // Counted in each proxy's log file (see ThroughputRun.log).
  const all = small.filter(x => x.target === 'proxy-all')
  const allLines = median(all.map(x => x.logLinesPerRequest ?? Number.NaN))
  out.push({ what: 'request log lines per request, COS_ACCESS_LOG=all', goal: '1', measured: fixed(allLines, 3), met: all.length === 0 ? undefined : all.every(x => x.logLinesExact === true) })
  const defaultLines = median(small.filter(x => x.target === 'proxy').map(x => x.logLinesPerRequest ?? Number.NaN))
  // Every answer is a 200: the only lines are the requests autocannon cuts when a run stops (client gone, 499), a few per run.
  out.push({ what: 'request log lines per request at the defaults (all 200)', goal: '≤ 0.01 (only the requests cut when a run stops)', measured: fixed(defaultLines, 3), met: Number.isNaN(defaultLines) ? undefined : defaultLines <= 0.01 })
  for (const generator of ['paced', 'autocannon-R'] as const) {
    const p = rate.find(r => r.generator === generator && r.target === 'proxy')
    atMost(`added latency p50 at ${settings.rate} req/s (${generator})`, p?.addedP50 ?? Number.NaN, 0.3, 'ms')
    atMost(`added latency p99 at ${settings.rate} req/s (${generator})`, p?.addedP99 ?? Number.NaN, 1.5, 'ms')
  }
  // Issue 13's targets (a sidecar's footprint).
  const proxyIdle = idle.find(x => x.target === 'proxy')
  atMost('proxy idle RssAnon (start + 50 requests + 5 s)', proxyIdle?.anonMB ?? Number.NaN, 35, 'MB')
  atMost('proxy idle RSS', proxyIdle?.rssMB ?? Number.NaN, 90, 'MB')
  atMost('proxy start to /readyz 200', proxyIdle?.readyMs ?? Number.NaN, 200, 'ms')
  // Issue 13's goals; issue 29's at 256 connections: ≤ 110 MB.
  const peakGoal: Readonly<Record<number, number>> = { 32: 120, 256: 110 }
  for (const c of settings.connections) atMost(`proxy peak RSS, ${c} conns`, find(small, 'small', 'proxy', c)?.peakRssMB ?? Number.NaN, peakGoal[c] ?? 130, 'MB')
  const p99 = (t: Target, c = 32): number => find(small, 'small', t, c)?.p99 ?? Number.NaN
  atMost('proxy / floor p99 at 32 conns (saturation)', p99('proxy') / p99('floor'), 1.3, '×')
  // Issue 21: the tail at 256 connections against the standard-library Go signer's in the same run.
  atMost('proxy / Go signer p99 at 256 conns (saturation)', p99('proxy', 256) / p99('go', 256), 2, '×')
  const pacedAdded = (t: Target): number => rate.find(r => r.generator === 'paced' && r.target === t)?.addedP99 ?? Number.NaN
  atMost(`added p99 at ${settings.rate} req/s (paced), proxy ≤ floor`, pacedAdded('proxy') - pacedAdded('floor'), 0, 'ms over the floor')
  const s = soaks.find(x => x.target === 'proxy')
  atMost(`proxy RSS growth from request ${settings.soakCheckpoint.toLocaleString('en-US')} to ${settings.soakRequests.toLocaleString('en-US')}`, s?.growthMB ?? Number.NaN, 10, 'MB')
  atLeast('1 MiB GET proxy / floor', rpsRatio(big, 'get-1mib', 'proxy', 'floor', settings.bigConnections), 0.95)
  atLeast('1 MiB POST proxy / floor', rpsRatio(big, 'post-1mib', 'proxy', 'floor', settings.bigConnections), 0.95)
  return out
}

function smallTable (small: readonly Summary[]): string {
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

function ratioTable (small: readonly Summary[]): string {
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

function bigTable (big: readonly Summary[]): string {
  const rows: Cell[][] = []
  for (const w of ['get-1mib', 'post-1mib'] as const) {
    for (const t of ['proxy', 'floor', 'direct'] as const) {
      const x = find(big, w, t, settings.bigConnections)
      if (x === undefined) continue
      rows.push([w === 'get-1mib' ? 'GET 1 MiB' : 'POST 1 MiB', LABEL[t], x.rps, x.p50, x.p99, x.cpuMsPer1k / 1000, fixed(x.peakRssMB, 1) + (t === 'direct' ? '*' : ''), x.failures])
    }
    rows.push([w === 'get-1mib' ? 'GET 1 MiB' : 'POST 1 MiB', 'proxy / floor', ratio(rpsRatio(big, w, 'proxy', 'floor', settings.bigConnections)), '', '', '', '', ''])
  }
  return table(['body', 'server', 'MiB/s', 'p50 ms', 'p99 ms', 'CPU ms/MiB', 'peak RSS MB', 'failed'], rows)
}

function rateTable (rate: readonly RateSummary[]): string {
  return table(['generator', 'server', 'p50 ms', 'p90 ms', 'p99 ms', 'added p50 ms', 'added p99 ms', 'failed'],
    rate.map(r => [r.generator, LABEL[r.target], r.p50, r.p90, r.p99, r.target === 'direct' ? '' : fixed(r.addedP50, 3), r.target === 'direct' ? '' : fixed(r.addedP99, 3), r.failures]))
}

function soakTable (soaks: readonly Soak[]): string {
  return table(['server', 'requests', 'conns', 'req/s', `RSS at ${settings.soakCheckpoint} MB`, 'RSS at end MB', 'peak MB', 'end − checkpoint MB', 'trend MB', 'failed'],
    soaks.map(s => [LABEL[s.target], s.requests, s.connections, Math.round(s.rps), s.rssAtCheckpointMB, s.rssAfterMB, s.peakRssMB, fixed(s.growthMB, 1), fixed(s.trendMB, 1), s.failures]))
}

function idleTable (idle: readonly IdleSummary[]): string {
  return table(['server', 'start to ready ms', 'CPU ms to ready', 'RssAnon MB', 'RSS MB'], idle.map(x => [LABEL[x.target], fixed(x.readyMs, 0), fixed(x.readyCpuMs, 0), x.anonMB, x.rssMB]))
}

function checkTable (list: readonly Check[]): string {
  return table(['target', 'goal', 'measured', 'met'], list.map(c => [c.what, c.goal, c.measured, c.met === undefined ? '?' : c.met ? 'yes' : 'NO']))
}

// ---------------------------------------------------------------------------

async function main (): Promise<void> {
  installCleanup()
  if (!existsSync(proxyBuild.script)) throw new Error(`${proxyBuild.script} is missing: run \`npm run build\` first (npm run bench does)`)
  const started = new Date()
  const m = machine()
  const pin = choosePinning(m.cores, !flags['no-pin'])
  pinProcess(process.pid, pin.loadgen)
  const commit = gitCommit()
  const mode = flags.quick ? `quick: ${settings.rounds} round, ${settings.seconds} s runs (indicative only)` : `full: ${settings.rounds} rounds, ${settings.seconds} s runs after ${settings.warmupSeconds} s warm-up`
  progress(`cos-auth-proxy benchmark (${mode})\n  ${m.cpuModel}, ${m.cores} cores, Node ${m.node}\n  ${pin.description}`)

  const scratch = scratchDir()
  const timings: Record<string, number> = {}
  const timed = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
    const t = performance.now()
    progress(`${name}…`)
    try { return await fn() } finally { timings[name] = (performance.now() - t) / 1000 }
  }
  try {
    const goSigner = !runs('idle') && !runs('small') ? { skipped: 'not in these sections' } : await timed('Go signer: build and check', () => goYardstick(scratch.path))
    const upstream = await startUpstream(pin.upstream)
    const noise = new Noise(settings.noiseBudgetSeconds * 1000, m.clockTicks)
    const ctx: Context = { machine: m, pin, upstream, scratch: scratch.path, noise, goSigner }
    // The peers measured beside the proxy: the floor, and the Go signer when it could be built.
    const peers = 'binary' in goSigner ? ['floor', 'go'] as const : ['floor'] as const

    const idleRuns = !runs('idle') ? [] : await timed('idle footprint and start-up', async () => {
      const out: IdleRun[] = []
      for (let round = 1; round <= settings.rounds; round++) {
        for (const t of ['proxy', ...peers] as const) out.push(await idleOnce(ctx, t, round))
      }
      return out
    })
    const smallRuns = !runs('small') ? [] : await timed('small responses', async () => {
      const runs: ThroughputRun[] = []
      for (let round = 1; round <= settings.rounds; round++) {
        for (const c of settings.connections) {
          for (const t of ['proxy', ...peers, 'floor-image', 'direct', 'proxy-all'] as const) runs.push(await throughput(ctx, 'small', t, c, round))
        }
      }
      return runs
    })
    const bigRuns = !runs('big') ? [] : await timed('1 MiB bodies', async () => {
      const runs: ThroughputRun[] = []
      for (let round = 1; round <= settings.rounds; round++) {
        for (const w of ['get-1mib', 'post-1mib'] as const) {
          for (const t of ['proxy', 'floor', 'direct'] as const) runs.push(await throughput(ctx, w, t, settings.bigConnections, round))
        }
      }
      return runs
    })
    const rateRuns = !runs('rate') ? [] : await timed('fixed rate', () => fixedRate(ctx))
    const soaks = !runs('soak') ? [] : await timed('RSS soak', async () => [await soak(ctx, 'proxy'), await soak(ctx, 'floor')])
    const minted = !runs('mint') ? undefined : await timed('token minting', () => mint(ctx))
    await stopAll()

    const small = summarise(smallRuns)
    const big = summarise(bigRuns)
    const rate = summariseRate(rateRuns)
    const idle = summariseIdle(idleRuns)
    const checked = checks(small, big, rate, soaks, idle)
    const others = [...idleRuns, ...smallRuns, ...bigRuns, ...rateRuns, ...soaks].map(r => r.otherLoad)
    const noiseLine = `machine noise: other processes used ${fixed(median(others), 2)} cores (median; max ${fixed(Math.max(...others), 2)}) during the measurements` +
      (noise.repeats + noise.waitedMs > 0 ? `; ${fixed(noise.waitedMs / 1000, 0)} s spent waiting for quiet, ${noise.repeats} measurement(s) repeated` : '') +
      (median(others) > 0.05 ? ' — NOT QUIET: these figures are not reliable' : '')
    const finished = new Date()
    const command = ['npm run bench --', ...process.argv.slice(2)].join(' ').replace(/ --$/, '')
    const seconds = (finished.getTime() - started.getTime()) / 1000

    const out = [
      `# cos-auth-proxy benchmark, ${started.toISOString()}${commit === undefined ? '' : ` (commit ${commit})`}`,
      `machine: ${m.cpuModel}, ${m.cores} cores, ${m.platform}, Node ${m.node}`,
      `pinning: ${pin.description}`,
      `mode:    ${mode}; figures are medians over the rounds (peak RSS: the maximum)`,
      `command: ${command}   (took ${fixed(seconds, 0)} s)`,
      `proxy: ${proxyBuild.description}`,
      `proxy: added Node flags ${proxyNodeArgs.length === 0 ? 'none' : proxyNodeArgs.join(' ')}; added environment ${Object.keys(proxyExtraEnv).length === 0 ? 'none' : Object.entries(proxyExtraEnv).map(([k, v]) => `${k}=${v}`).join(' ')} (the floor runs with neither)`,
      noiseLine,
      `Go signer: ${'binary' in goSigner ? `bench/go-signer/main.go built with ${goSigner.go}, GOMAXPROCS=1; ${goSigner.checked}` : `skipped: ${goSigner.skipped}`}`,
      '',
      ...(!runs('idle') ? [] : [
        `## Idle (fresh process, ${settings.idleRequests} requests, then ${settings.idleSettleSeconds} s) and start-up`,
        idleTable(idle),
        'RssAnon: anonymous resident memory, what each pod adds (the binary\'s file-backed pages are shared by the pods of a node)',
        '',
      ]),
      ...(!runs('small') ? [] : [
        `## Small responses (GET ${PATH}, ${upstream.smallBytes}-byte JSON), keep-alive`,
        smallTable(small),
        `p50/p99: requests sent after the warm-up, on the connections it opened; new conn. 1st req: each connection's first request, all opened at once at the start of the warm-up`,
        `core busy: share of its core the server under test used; CPU ms/1k req from /proc/<pid>/stat; peak RSS: VmHWM of a fresh process per run (* direct: the upstream's, over its whole life)`,
        '',
        ratioTable(small),
        '',
      ]),
      ...(!runs('big') ? [] : [
        `## 1 MiB bodies, ${settings.bigConnections} connections`,
        bigTable(big),
        '',
      ]),
      ...(!runs('rate') ? [] : [
        `## Latency at a fixed ${settings.rate.toLocaleString('en-US')} req/s (${settings.rateSeconds} s per run), added = over direct`,
        rateTable(rate),
        'paced: one request every 1 ms, 10 keep-alive clients (open loop); autocannon-R: autocannon -R over 1 connection (each second\'s quota back to back)',
        '',
      ]),
      ...(!runs('soak') ? [] : [
        `## RSS soak, ${settings.soakRequests.toLocaleString('en-US')} requests on a fresh process, ${settings.soakConnections} connections`,
        soakTable(soaks),
        `VmRSS after request ${settings.soakCheckpoint.toLocaleString('en-US')} and at the end, sampled every 250 ms in between; trend: median over the last fifth less the median over the first fifth`,
        '',
      ]),
      ...(minted === undefined ? [] : [`## Token minting (one core; other processes used ${fixed(minted.otherLoad, 2)} cores meanwhile)`, mintTable(minted), '']),
      '## Targets (issues 6, 13, 21 and 29)',
      checkTable(checked),
      '',
      `section times: ${Object.entries(timings).map(([k, v]) => `${k} ${fixed(v, 0)} s`).join(', ')}`,
    ]
    process.stdout.write(out.join('\n') + '\n')

    const results = {
      schema: 1,
      startedAt: started.toISOString(),
      finishedAt: finished.toISOString(),
      seconds,
      commit,
      command,
      proxy: proxyBuild,
      proxyNodeArgs,
      proxyExtraEnv,
      mode: flags.quick ? 'quick' : 'full',
      machine: m,
      pinning: pin,
      settings,
      sectionSeconds: timings,
      goSigner,
      otherLoad: { median: median(others), max: Math.max(...others), waitedSeconds: noise.waitedMs / 1000, repeats: noise.repeats },
      small: { summary: small, runs: smallRuns },
      large: { summary: big, runs: bigRuns },
      fixedRate: { summary: rate, runs: rateRuns },
      idle: { summary: idle, runs: idleRuns },
      soak: soaks,
      mint: minted,
      targets: checked,
    }
    const dir = join(BENCH_DIR, 'results')
    mkdirSync(dir, { recursive: true })
    const name = started.toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-') + (flags.quick ? '-quick' : '') + '.json'
    const json = JSON.stringify(results, null, 2) + '\n'
    // A quick run is indicative only: it never replaces the latest full figures.
    const latest = flags.quick ? 'latest-quick.json' : 'latest.json'
    writeFileSync(join(dir, name), json)
    // Nor does a run of some sections only, or with other flags for the proxy.
    const complete = sections.size === SECTIONS.length && flags.cli === undefined && flags.checkout === undefined && !flags.bare && proxyNodeArgs.length === 0 && Object.keys(proxyExtraEnv).length === 0
    if (complete) writeFileSync(join(dir, latest), json)
    progress(`results: bench/results/${name}${complete ? ` and bench/results/${latest}` : ''}`)
  } finally {
    await stopAll()
    scratch.remove()
  }
}

/** Builds the Go signer and proves its tokens are accepted (the run fails if not), or says why it is skipped. */
async function goYardstick (scratch: string): Promise<GoSigner & { readonly checked?: string }> {
  const built = buildGoSigner(scratch)
  if (!('binary' in built)) {
    progress(`  Go signer skipped: ${built.skipped}`)
    return built
  }
  const checked = await checkGoSigner(built.binary)
  progress(`  ${built.go}: ${checked}`)
  return { ...built, checked }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
