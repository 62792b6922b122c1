// RSS soak: a fresh server, RSS after the first requests and at the end
// (`npm run bench`'s; bench/soak.ts is the long one inside a memory cgroup).
import { fixed, table } from '../format.js'
import { runLoad, SMALL_PATH } from '../support/load.js'
import { noiseProbe, vmMB } from '../support/machine.js'
import { median } from '../support/measure.js'
import { LABEL, progress, type Context, type Settings } from './context.js'
import { start } from './servers.js'

export interface Soak {
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
    const first = await runLoad({ url: url + SMALL_PATH, connections: ctx.settings.soakConnections, amount: ctx.settings.soakCheckpoint })
    const atCheckpoint = vmMB(s.pid, 'VmRSS')
    const samples: [number, number][] = []
    const t0 = performance.now()
    const timer = setInterval(() => { samples.push([(performance.now() - t0) / 1000, vmMB(s.pid, 'VmRSS')]) }, 250)
    let r
    try {
      r = await runLoad({ url: url + SMALL_PATH, connections: ctx.settings.soakConnections, amount: ctx.settings.soakRequests - ctx.settings.soakCheckpoint })
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
      connections: ctx.settings.soakConnections,
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
    progress(`  soak ${LABEL[target].padEnd(12)} RSS at ${ctx.settings.soakCheckpoint}: ${fixed(atCheckpoint, 1)} MB, at ${soaked.requests}: ${fixed(after, 1)} MB`)
    return soaked
  } finally {
    await s.stop()
  }
}

/** The proxy, then the floor. */
export async function rssSoak (ctx: Context): Promise<Soak[]> {
  return [await soak(ctx, 'proxy'), await soak(ctx, 'floor')]
}

export function soakTable (soaks: readonly Soak[], settings: Settings): string {
  return table(['server', 'requests', 'conns', 'req/s', `RSS at ${settings.soakCheckpoint} MB`, 'RSS at end MB', 'peak MB', 'end − checkpoint MB', 'trend MB', 'failed'],
    soaks.map(s => [LABEL[s.target], s.requests, s.connections, Math.round(s.rps), s.rssAtCheckpointMB, s.rssAfterMB, s.peakRssMB, fixed(s.growthMB, 1), fixed(s.trendMB, 1), s.failures]))
}
