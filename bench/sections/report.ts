// The report of `npm run bench`: the targets checked, the tables on stdout,
// and the results file (bench/results/<timestamp>.json, and latest.json
// when the run may stand for this checkout).
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fixed, ratio, table } from '../format.js'
import { mintTable } from '../mint.js'
import { SMALL_PATH } from '../support/load.js'
import { median } from '../support/measure.js'
import { BENCH_DIR } from '../support/node.js'
import { progress, type Context, type Section, type Settings, type Target } from './context.js'
import { idleTable, summariseIdle, type IdleRun, type IdleSummary } from './idle.js'
import type { Minted } from './mint.js'
import { addedP99Ratio, generatorLine, rateTable, summariseRate, type Generator, type RateRun, type RateSummary } from './rate.js'
import { soakTable, type Soak } from './soak.js'
import { bigRatioTable, bigTable, cpuRatio, find, ratioTable, rpsRatio, smallTable, summarise, type Summary, type ThroughputRun } from './throughput.js'

/** What the sections measured (empty for a section not run). */
export interface Measurements {
  readonly idleRuns: readonly IdleRun[]
  readonly smallRuns: readonly ThroughputRun[]
  readonly bigRuns: readonly ThroughputRun[]
  readonly rateRuns: readonly RateRun[]
  readonly soaks: readonly Soak[]
  readonly minted: Minted | undefined
}

/** The run itself, as the report describes it. */
export interface Run {
  readonly started: Date
  readonly commit: string | undefined
  readonly mode: string
  /** Seconds per section. */
  readonly timings: Readonly<Record<string, number>>
  readonly runs: (x: Section) => boolean
  /** Every section, this checkout's proxy as its image runs it: the results may become latest.json. */
  readonly complete: boolean
}

export interface Check { readonly what: string, readonly goal: string, readonly measured: string, readonly met: boolean | undefined }

export function checks (small: readonly Summary[], big: readonly Summary[], rate: readonly RateSummary[], soaks: readonly Soak[], idle: readonly IdleSummary[], settings: Settings): Check[] {
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
  // A figure from a generator that stalled in every round measures the generator: not met, not missed.
  const trusted = (generator: Generator, t: Target): boolean => {
    const of = (x: Target): RateSummary | undefined => rate.find(r => r.generator === generator && r.target === x)
    return [t, 'direct' as const].every(x => { const r = of(x); return r !== undefined && r.stalledRounds < r.rounds })
  }
  const added = (generator: Generator, f: (r: RateSummary) => number): number => {
    const p = rate.find(r => r.generator === generator && r.target === 'proxy')
    return p !== undefined && trusted(generator, 'proxy') ? f(p) : Number.NaN
  }
  for (const generator of ['paced', 'autocannon-R'] as const) {
    atMost(`added latency p50 at ${settings.rate} req/s (${generator})`, added(generator, r => r.addedP50), 0.3, 'ms')
    atMost(`added latency p99 at ${settings.rate} req/s (${generator})`, added(generator, r => r.addedP99), 1.5, 'ms')
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
  // Issue 47: a light load's tail at the framework's, by both generators.
  for (const generator of ['paced', 'autocannon-R'] as const) {
    atMost(`added p99 at ${settings.rate} req/s (${generator}), proxy / floor`,
      trusted(generator, 'proxy') && trusted(generator, 'floor') ? addedP99Ratio(rate, generator, 'proxy', 'floor') : Number.NaN, 1.5, '×')
  }
  const s = soaks.find(x => x.target === 'proxy')
  atMost(`proxy RSS growth from request ${settings.soakCheckpoint.toLocaleString('en-US')} to ${settings.soakRequests.toLocaleString('en-US')}`, s?.growthMB ?? Number.NaN, 10, 'MB')
  // Issue 35: the price per request against the Go standard-library signer in the same run.
  const of = (t: Target, c: number, f: (x: Summary) => number): number => { const x = find(small, 'small', t, c); return x === undefined ? Number.NaN : f(x) }
  for (const c of settings.connections) atMost(`proxy / Go signer CPU ms per 1,000 requests, ${c} conns`, of('proxy', c, x => x.cpuMsPer1k) / of('go', c, x => x.cpuMsPer1k), 1, '×')
  atMost('proxy / Go signer p99 at 256 conns (issue 35)', p99('proxy', 256) / p99('go', 256), 1, '×')
  atMost('proxy / Go signer first request on a new connection at 256 conns, p50', of('proxy', 256, x => x.firstP50) / of('go', 256, x => x.firstP50), 2, '×')
  // Issue 47: a megabyte at the framework's price.
  for (const [w, name] of [['get-1mib', 'GET'], ['post-1mib', 'POST']] as const) {
    atLeast(`1 MiB ${name} proxy / floor req/s`, rpsRatio(big, w, 'proxy', 'floor', settings.bigConnections), 0.95)
    atMost(`1 MiB ${name} proxy / floor CPU ms per 1,000 requests`, cpuRatio(big, w, 'proxy', 'floor', settings.bigConnections), 1.1, '×')
  }
  return out
}

function checkTable (list: readonly Check[]): string {
  return table(['target', 'goal', 'measured', 'met'], list.map(c => [c.what, c.goal, c.measured, c.met === undefined ? '?' : c.met ? 'yes' : 'NO']))
}

/** Writes the tables to stdout and the results file. */
export function report (ctx: Context, run: Run, measured: Measurements): void {
  const { settings, machine: m, pin, noise, goSigner } = ctx
  const { build: proxyBuild, nodeArgs: proxyNodeArgs, extraEnv: proxyExtraEnv } = ctx.proxy
  const { started, commit, mode, timings, runs, complete } = run
  const { idleRuns, smallRuns, bigRuns, rateRuns, soaks, minted } = measured
  const small = summarise(smallRuns)
  const big = summarise(bigRuns)
  const rate = summariseRate(rateRuns)
  const idle = summariseIdle(idleRuns)
  const checked = checks(small, big, rate, soaks, idle, settings)
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
      `## Small responses (GET ${SMALL_PATH}, ${ctx.upstream.smallBytes}-byte JSON), keep-alive`,
      smallTable(small, settings),
      `p50/p99: requests sent after the warm-up, on the connections it opened; new conn. 1st req: each connection's first request, all opened at once at the start of the warm-up`,
      `core busy: share of its core the server under test used; CPU ms/1k req from /proc/<pid>/stat; peak RSS: VmHWM of a fresh process per run (* direct: the upstream's, over its whole life)`,
      '',
      ratioTable(small, settings),
      '',
    ]),
    ...(!runs('big') ? [] : [
      `## 1 MiB bodies, ${settings.bigConnections} connections`,
      bigTable(big, settings),
      '',
      bigRatioTable(big, settings),
      '',
    ]),
    ...(!runs('rate') ? [] : [
      `## Latency at a fixed ${settings.rate.toLocaleString('en-US')} req/s (${settings.rateSeconds} s per run), added = over direct`,
      rateTable(rate),
      'paced: one request every 1 ms, 10 keep-alive clients (open loop); autocannon-R: autocannon -R over 1 connection (each second\'s quota back to back)',
      `generator stalled: rounds where the generator's own event loop was over 1 ms late in more than 1 % of its samples, or the hypervisor stole over 0.05 cores; left out of the medians (unless every round stalled). ${generatorLine(rateRuns)}`,
      '',
    ]),
    ...(!runs('soak') ? [] : [
      `## RSS soak, ${settings.soakRequests.toLocaleString('en-US')} requests on a fresh process, ${settings.soakConnections} connections`,
      soakTable(soaks, settings),
      `VmRSS after request ${settings.soakCheckpoint.toLocaleString('en-US')} and at the end, sampled every 250 ms in between; trend: median over the last fifth less the median over the first fifth`,
      '',
    ]),
    ...(minted === undefined ? [] : [`## Token minting (one core; other processes used ${fixed(minted.otherLoad, 2)} cores meanwhile)`, mintTable(minted), '']),
    '## Targets (issues 6, 13, 21, 29, 35 and 47)',
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
    mode: ctx.quick ? 'quick' : 'full',
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
  const name = started.toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-') + (ctx.quick ? '-quick' : '') + '.json'
  const json = JSON.stringify(results, null, 2) + '\n'
  // A quick run is indicative only: it never replaces the latest full figures.
  const latest = ctx.quick ? 'latest-quick.json' : 'latest.json'
  writeFileSync(join(dir, name), json)
  // Nor does a run of some sections only, or with other flags for the proxy.
  if (complete) writeFileSync(join(dir, latest), json)
  progress(`results: bench/results/${name}${complete ? ` and bench/results/${latest}` : ''}`)
}
