// One measurement: a load run plus what it cost the processes involved, and
// the statistics the figures are reduced with.
import { existsSync, readFileSync } from 'node:fs'
import { runLoad, type Load, type LoadResult } from './load.js'
import { cpuTicks, noiseProbe } from './machine.js'

export interface Cost {
  /** CPU ms per 1,000 requests of the server under test. */
  readonly cpuMsPer1k: number
  /** Share of its core the server under test used while loaded (1 = saturated). */
  readonly sutBusy: number
  readonly upstreamBusy?: number
  readonly loadgenBusy: number
  /** Cores' worth of CPU that other processes (or the hypervisor: steal) used meanwhile. */
  readonly otherLoad: number
}

export interface Measured { readonly load: LoadResult, readonly cost: Cost }

/** A load run and its cost; with `load.warmupSeconds`, both from the end of the warm-up. */
export async function measure (load: Load, sutPid: number, upstreamPid: number | undefined, ticksPerSecond: number): Promise<Measured> {
  const ms = (ticks: number): number => ticks * 1000 / ticksPerSecond
  let sut0 = 0
  let up0 = 0
  let me0 = process.cpuUsage()
  let others = (): number => Number.NaN
  let t0 = 0
  const result = await runLoad(load, () => {
    sut0 = cpuTicks(sutPid)
    up0 = upstreamPid === undefined ? 0 : cpuTicks(upstreamPid)
    me0 = process.cpuUsage()
    others = noiseProbe(upstreamPid === undefined ? [sutPid] : [sutPid, upstreamPid], ticksPerSecond)
    t0 = performance.now()
  })
  const wallMs = performance.now() - t0
  const otherLoad = others()
  const me = process.cpuUsage(me0)
  const sutMs = ms(cpuTicks(sutPid) - sut0)
  return {
    load: result,
    cost: {
      cpuMsPer1k: sutMs / result.requests * 1000,
      sutBusy: sutMs / wallMs,
      ...(upstreamPid === undefined ? {} : { upstreamBusy: ms(cpuTicks(upstreamPid) - up0) / wallMs }),
      loadgenBusy: (me.user + me.system) / 1000 / wallMs,
      otherLoad,
    },
  }
}

/** How many per-request lines ("msg":"request") a pino log file holds. */
export function countRequestLines (path: string): number {
  if (!existsSync(path)) return 0
  const buf = readFileSync(path)
  const needle = Buffer.from('"msg":"request"')
  let n = 0
  for (let i = buf.indexOf(needle); i !== -1; i = buf.indexOf(needle, i + needle.length)) n++
  return n
}

export function median (values: readonly number[]): number {
  const v = values.filter(x => !Number.isNaN(x)).sort((a, b) => a - b)
  if (v.length === 0) return Number.NaN
  const mid = v.length >> 1
  return v.length % 2 === 1 ? v[mid] ?? Number.NaN : ((v[mid - 1] ?? 0) + (v[mid] ?? 0)) / 2
}
