// Preloaded (node --import) into a server under bench/tail.ts: records V8's
// collections and the event loop's stalls, with wall-clock times, so slow
// requests can be matched with what the process was doing. A 2 ms timer
// chain: a tick that comes late by more than STALL_MS is a stall (a turn of
// the loop that ran that long: a collection, a long callback, the process
// descheduled). Written to $STALL_OUT on SIGTERM or exit.
import { writeFileSync } from 'node:fs'
import { PerformanceObserver, performance } from 'node:perf_hooks'

const out = process.env.STALL_OUT
const STALL_MS = 2
const PERIOD_MS = 2
const gcs = []
const stalls = []
const origin = performance.timeOrigin
new PerformanceObserver(list => {
  for (const e of list.getEntries()) gcs.push({ at: origin + e.startTime, ms: e.duration, kind: e.detail?.kind })
}).observe({ entryTypes: ['gc'] })
let due = performance.now() + PERIOD_MS
let cpu = process.cpuUsage()
const tick = () => {
  const now = performance.now()
  const late = now - due
  const used = process.cpuUsage(cpu)
  cpu = process.cpuUsage()
  // cpuMs: the CPU this process used since the last tick (all threads). Near
  // the stall's length: it was working; far below: it was not running.
  if (late > STALL_MS) stalls.push({ at: origin + due, ms: late, cpuMs: (used.user + used.system) / 1000 })
  due = now + PERIOD_MS
  setTimeout(tick, PERIOD_MS).unref()
}
// STALL_TIMER=off: collections only (the timer chain itself keeps the thread from sleeping).
if (process.env.STALL_TIMER !== 'off') setTimeout(tick, PERIOD_MS).unref()
let written = false
const write = () => {
  if (written || out === undefined) return
  written = true
  writeFileSync(out, JSON.stringify({ gcs, stalls }))
}
process.on('exit', write)
process.on('SIGTERM', () => {
  write()
  if (process.listenerCount('SIGTERM') === 1) process.exit(0)
})
