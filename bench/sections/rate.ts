// Fixed rate: the latency the proxy adds over going straight to the upstream,
// beside the floor's and the Go signer's, with an open-loop paced generator
// and with autocannon -R; each round with how the generator itself fared (its
// event-loop delay, how late the paced one sent, the machine's steal time), so
// that a round where the generator stalled is reported as such and not
// charged to the server. The paced generator runs in its own process
// (bench/paced.mjs) on the load generator's core, under SCHED_FIFO where it may.
import { fixed, ratio, table } from '../format.js'
import { runLoad, runPaced, SMALL_PATH, type Latency, type LoadResult, type PacedGenerator } from '../support/load.js'
import { generatorProbe, noiseProbe, type GeneratorHealth } from '../support/machine.js'
import { median } from '../support/measure.js'
import { LABEL, progress, type Context, type Target } from './context.js'
import { start } from './servers.js'

export type Generator = 'paced' | 'autocannon-R'

export interface RateRun {
  readonly generator: Generator
  readonly target: Target
  readonly round: number
  readonly rps: number
  readonly latencyMs: Latency
  readonly failures: number
  readonly otherLoad: number
  readonly generatorHealth: GeneratorHealth
}

type RateTarget = 'proxy' | 'floor' | 'go' | 'direct'

export async function fixedRate (ctx: Context, peers: readonly ('floor' | 'go')[]): Promise<RateRun[]> {
  // One server of each for the whole section (RSS is not measured here);
  // the upstream stays where it is, so "direct" differs only by the hop.
  const servers: (readonly [RateTarget, Awaited<ReturnType<typeof start>>])[] = []
  const runs: RateRun[] = []
  try {
    for (const t of ['proxy', ...peers] as const) servers.push([t, await start(ctx, t)])
    for (const [, s] of servers) await runLoad({ url: s.server.url + SMALL_PATH, connections: 32, duration: ctx.settings.warmupSeconds })
    const targets: (readonly [RateTarget, string])[] = [...servers.map(([t, s]) => [t, s.server.url] as const), ['direct', ctx.upstream.url]]
    const pids = [...servers.map(([, s]) => s.pid), ctx.upstream.child.pid]
    for (let round = 1; round <= ctx.settings.rounds; round++) {
      for (const generator of ['paced', 'autocannon-R'] as const) {
        for (const [target, base] of targets) {
          const url = base + SMALL_PATH
          // autocannon -R with one connection: its rate limit sends each
          // second's quota back to back, so more connections would measure
          // queueing in the burst; one keeps a single request in flight.
          const once = (): Promise<LoadResult & { readonly generator?: PacedGenerator }> => generator === 'paced'
            ? runPaced(url, ctx.settings.rate, ctx.settings.rateSeconds, { core: ctx.pin.loadgen })
            : runLoad({ url, connections: 1, overallRate: ctx.settings.rate, duration: ctx.settings.rateSeconds })
          let r: LoadResult & { readonly generator?: PacedGenerator }
          let otherLoad: number
          let generatorHealth: GeneratorHealth
          // Repeated while the machine is noisy, as in throughput().
          for (let attempt = 1; ; attempt++) {
            await ctx.noise.settle()
            const t = performance.now()
            const others = noiseProbe(pids, ctx.machine.clockTicks)
            const health = generatorProbe(ctx.machine.clockTicks)
            r = await once()
            generatorHealth = health(r.generator)
            // The paced generator is a process of its own: its CPU is not another process's.
            otherLoad = Math.max(0, others() - (r.generator === undefined ? 0 : r.generator.cpuTotalMs / (performance.now() - t)))
            if (!ctx.noise.again(otherLoad, performance.now() - t, attempt)) break
          }
          runs.push({ generator, target, round, rps: r.rps, latencyMs: r.latency, failures: r.errors + r.non2xx, otherLoad, generatorHealth })
          const g = generatorHealth
          progress(`  ${ctx.settings.rate} req/s ${generator.padEnd(12)} round ${round}: ${LABEL[target].padEnd(12)} p50 ${fixed(r.latency.p50)} ms  p99 ${fixed(r.latency.p99)} ms  generator late p99 ${fixed(g.loopP99Ms)} / max ${fixed(g.loopMaxMs)} ms${g.sendLateP99Ms === undefined ? '' : `, sends late p99 ${fixed(g.sendLateP99Ms)} ms`}, steal ${fixed(g.steal, 2)}${g.stalled ? '  GENERATOR STALLED' : ''}`)
        }
      }
    }
  } finally {
    for (const [, s] of servers) await s.stop()
  }
  return runs
}

export interface RateSummary {
  readonly generator: Generator
  readonly target: Target
  readonly p50: number
  readonly p90: number
  readonly p99: number
  readonly addedP50: number
  readonly addedP99: number
  readonly failures: number
  /** Rounds left out of the medians because the generator stalled (see GeneratorHealth), of all rounds. */
  readonly stalledRounds: number
  readonly rounds: number
}

/** The rounds the medians are taken over: those where the generator did not stall, or all of them when it stalled in every one. */
function clean (rs: readonly RateRun[]): readonly RateRun[] {
  const ok = rs.filter(r => !r.generatorHealth.stalled)
  return ok.length > 0 ? ok : rs
}

export function summariseRate (runs: readonly RateRun[]): RateSummary[] {
  const out: RateSummary[] = []
  for (const generator of ['paced', 'autocannon-R'] as const) {
    const pick = (t: Target): RateRun[] => runs.filter(r => r.generator === generator && r.target === t)
    const direct = clean(pick('direct'))
    for (const target of ['proxy', 'floor', 'go', 'direct'] as const) {
      const all = pick(target)
      if (all.length === 0) continue
      const rs = clean(all)
      const p50 = median(rs.map(r => r.latencyMs.p50))
      const p99 = median(rs.map(r => r.latencyMs.p99))
      out.push({
        generator, target, p50, p90: median(rs.map(r => r.latencyMs.p90)), p99,
        // Difference of the medians over the rounds.
        addedP50: p50 - median(direct.map(r => r.latencyMs.p50)),
        addedP99: p99 - median(direct.map(r => r.latencyMs.p99)),
        failures: all.reduce((n, r) => n + r.failures, 0),
        stalledRounds: all.filter(r => r.generatorHealth.stalled).length,
        rounds: all.length,
      })
    }
  }
  return out
}

/** The added p99 of `a` over `b`'s, for one generator. */
export function addedP99Ratio (rate: readonly RateSummary[], generator: Generator, a: Target, b: Target): number {
  const of = (t: Target): number => rate.find(r => r.generator === generator && r.target === t)?.addedP99 ?? Number.NaN
  // Nothing added by `b` (its p99 at or under direct's, within the noise): no ratio to speak of.
  const base = of(b)
  return base > 0 ? of(a) / base : Number.NaN
}

export function rateTable (rate: readonly RateSummary[]): string {
  const rows = rate.map(r => [r.generator, LABEL[r.target], r.p50, r.p90, r.p99, r.target === 'direct' ? '' : fixed(r.addedP50, 3), r.target === 'direct' ? '' : fixed(r.addedP99, 3),
    r.target === 'proxy' ? ratio(addedP99Ratio(rate, r.generator, 'proxy', 'floor')) : '', r.target === 'proxy' ? ratio(addedP99Ratio(rate, r.generator, 'proxy', 'go')) : '',
    `${r.stalledRounds} / ${r.rounds}`, r.failures])
  return table(['generator', 'server', 'p50 ms', 'p90 ms', 'p99 ms', 'added p50 ms', 'added p99 ms', 'added p99 / floor', 'added p99 / Go', 'generator stalled', 'failed'], rows)
}

/** Each round's generator health, for the report: the worst over the rounds of each generator. */
export function generatorLine (runs: readonly RateRun[]): string {
  return (['paced', 'autocannon-R'] as const).map(g => {
    const rs = runs.filter(r => r.generator === g)
    if (rs.length === 0) return ''
    const worst = (f: (h: GeneratorHealth) => number): number => Math.max(...rs.map(r => f(r.generatorHealth)))
    return `${g}: generator late p99 ≤ ${fixed(worst(h => h.loopP99Ms))} ms, max ${fixed(worst(h => h.loopMaxMs))} ms, steal ≤ ${fixed(worst(h => h.steal), 2)} cores, ${rs.filter(r => r.generatorHealth.stalled).length} of ${rs.length} runs stalled`
  }).filter(x => x !== '').join('; ')
}
