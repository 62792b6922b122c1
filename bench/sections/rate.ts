// Fixed rate: the latency the proxy adds over going straight to the upstream,
// with an open-loop paced generator and with autocannon -R.
import { fixed, table } from '../format.js'
import { runLoad, runPaced, SMALL_PATH, type Latency, type LoadResult } from '../support/load.js'
import { noiseProbe } from '../support/machine.js'
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
}

export async function fixedRate (ctx: Context): Promise<RateRun[]> {
  // One proxy and one floor for the whole section (RSS is not measured here);
  // the upstream stays where it is, so "direct" differs only by the hop.
  const proxy = await start(ctx, 'proxy')
  const floor = await start(ctx, 'floor')
  const runs: RateRun[] = []
  try {
    for (const s of [proxy, floor]) await runLoad({ url: s.server.url + SMALL_PATH, connections: 32, duration: ctx.settings.warmupSeconds })
    const urls: Readonly<Record<'proxy' | 'floor' | 'direct', string>> = { proxy: proxy.server.url, floor: floor.server.url, direct: ctx.upstream.url }
    for (let round = 1; round <= ctx.settings.rounds; round++) {
      for (const generator of ['paced', 'autocannon-R'] as const) {
        for (const target of ['proxy', 'floor', 'direct'] as const) {
          const url = urls[target] + SMALL_PATH
          // autocannon -R with one connection: its rate limit sends each
          // second's quota back to back, so more connections would measure
          // queueing in the burst; one keeps a single request in flight.
          const once = (): Promise<LoadResult> => generator === 'paced'
            ? runPaced(url, ctx.settings.rate, ctx.settings.rateSeconds)
            : runLoad({ url, connections: 1, overallRate: ctx.settings.rate, duration: ctx.settings.rateSeconds })
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
          progress(`  ${ctx.settings.rate} req/s ${generator.padEnd(12)} round ${round}: ${LABEL[target].padEnd(12)} p50 ${fixed(r.latency.p50)} ms  p99 ${fixed(r.latency.p99)} ms`)
        }
      }
    }
  } finally {
    await proxy.stop()
    await floor.stop()
  }
  return runs
}

export interface RateSummary { readonly generator: Generator, readonly target: Target, readonly p50: number, readonly p90: number, readonly p99: number, readonly addedP50: number, readonly addedP99: number, readonly failures: number }

export function summariseRate (runs: readonly RateRun[]): RateSummary[] {
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

export function rateTable (rate: readonly RateSummary[]): string {
  return table(['generator', 'server', 'p50 ms', 'p90 ms', 'p99 ms', 'added p50 ms', 'added p99 ms', 'failed'],
    rate.map(r => [r.generator, LABEL[r.target], r.p50, r.p90, r.p99, r.target === 'direct' ? '' : fixed(r.addedP50, 3), r.target === 'direct' ? '' : fixed(r.addedP99, 3), r.failures]))
}
