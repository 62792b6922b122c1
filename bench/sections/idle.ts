// Idle footprint and start-up: what every pod pays before any load.
import { setTimeout as sleep } from 'node:timers/promises'
import { fixed, table } from '../format.js'
import { runLoad, SMALL_PATH } from '../support/load.js'
import { noiseProbe, vmMB } from '../support/machine.js'
import { median } from '../support/measure.js'
import { LABEL, progress, type Context, type Fresh } from './context.js'
import { start } from './servers.js'

export interface IdleRun {
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
    await runLoad({ url: s.server.url + SMALL_PATH, connections: 1, amount: ctx.settings.idleRequests })
    await sleep(ctx.settings.idleSettleSeconds * 1000)
    const run = { target, round, readyMs: s.server.readyMs, readyCpuMs: s.server.readyCpuMs ?? Number.NaN, anonMB: vmMB(s.pid, 'RssAnon'), rssMB: vmMB(s.pid, 'VmRSS'), otherLoad: others() }
    progress(`  idle round ${round}: ${LABEL[target].padEnd(12)} ready ${fixed(run.readyMs, 0)} ms (${fixed(run.readyCpuMs, 0)} CPU ms)  RssAnon ${fixed(run.anonMB, 1)} MB  RSS ${fixed(run.rssMB, 1)} MB`)
    return run
  } finally {
    await s.stop()
  }
}

export interface IdleSummary { readonly target: Fresh, readonly readyMs: number, readonly readyCpuMs: number, readonly anonMB: number, readonly rssMB: number }

export function summariseIdle (runs: readonly IdleRun[]): IdleSummary[] {
  return (['proxy', 'floor', 'go'] as const).flatMap(target => {
    const rs = runs.filter(r => r.target === target)
    if (rs.length === 0) return []
    return { target, readyMs: median(rs.map(r => r.readyMs)), readyCpuMs: median(rs.map(r => r.readyCpuMs)), anonMB: median(rs.map(r => r.anonMB)), rssMB: median(rs.map(r => r.rssMB)) }
  })
}

/** A fresh proxy and each peer, round after round. */
export async function idleFootprint (ctx: Context, peers: readonly ('floor' | 'go')[]): Promise<IdleRun[]> {
  const out: IdleRun[] = []
  for (let round = 1; round <= ctx.settings.rounds; round++) {
    for (const t of ['proxy', ...peers] as const) out.push(await idleOnce(ctx, t, round))
  }
  return out
}

export function idleTable (idle: readonly IdleSummary[]): string {
  return table(['server', 'start to ready ms', 'CPU ms to ready', 'RssAnon MB', 'RSS MB'], idle.map(x => [LABEL[x.target], fixed(x.readyMs, 0), fixed(x.readyCpuMs, 0), x.anonMB, x.rssMB]))
}
