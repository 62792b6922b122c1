// How much slower than a quiet machine this one may be right now. A time
// bound in a test waits for something to happen or says "promptly, not at
// the next timeout"; it is never a performance figure. On a busy laptop or a
// shared CI runner everything takes longer, so such bounds are multiplied by
// this factor: COS_TEST_TIME_SCALE when set, else 1 + the load average per
// core when the suite starts (capped at 5), so an idle machine keeps the
// tight bounds and a loaded one gets room instead of a red run.
import { availableParallelism, loadavg } from 'node:os'

function fromLoad (): number {
  const perCore = (loadavg()[0] ?? 0) / Math.max(1, availableParallelism())
  return Math.min(5, 1 + perCore)
}

function fromEnv (): number | undefined {
  const v = Number(process.env.COS_TEST_TIME_SCALE)
  return Number.isFinite(v) && v >= 1 ? v : undefined
}

export const TIME_SCALE: number = fromEnv() ?? fromLoad()

/** A time bound of `ms` on a quiet machine, scaled to this one. */
export function scaled (ms: number): number {
  return Math.round(ms * TIME_SCALE)
}
