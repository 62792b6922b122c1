// Preloaded (node --import) into the proxy or the floor under `bench:accept
// --record`: when the server accepted each connection (diagnostics_channel
// 'net.server.socket', published as the connection is handed over), how long
// its event loop's turns ran (a 2 ms timer chain: a tick late by more than
// 5 ms was a turn that long, as bench/stall-recorder.mjs), and V8's
// collections, with wall-clock times, written to $ACCEPT_RECORD at exit.
// With $ACCEPT_BACKLOG every listen() gets that backlog: what a larger
// backlog alone buys, on a build that does not set one.
import dc from 'node:diagnostics_channel'
import { writeFileSync } from 'node:fs'
import net from 'node:net'
import { PerformanceObserver, performance } from 'node:perf_hooks'

const origin = performance.timeOrigin
const accepts = []
const stalls = []
const gcs = []
dc.subscribe('net.server.socket', () => { accepts.push(Math.round(origin + performance.now())) })
new PerformanceObserver(list => {
  for (const e of list.getEntries()) gcs.push([Math.round(origin + e.startTime), +e.duration.toFixed(2)])
}).observe({ entryTypes: ['gc'] })
const PERIOD_MS = 2
const STALL_MS = 5
let due = performance.now() + PERIOD_MS
const tick = () => {
  const now = performance.now()
  if (now - due > STALL_MS) stalls.push([Math.round(origin + due), +(now - due).toFixed(1)])
  due = now + PERIOD_MS
  setTimeout(tick, PERIOD_MS).unref()
}
setTimeout(tick, PERIOD_MS).unref()

const backlog = Number(process.env.ACCEPT_BACKLOG)
if (backlog > 0) {
  const listen = net.Server.prototype.listen
  net.Server.prototype.listen = function (...args) {
    if (typeof args[0] === 'object' && args[0] !== null) args[0] = { ...args[0], backlog }
    return listen.apply(this, args)
  }
}

let written = false
const write = () => {
  if (written || process.env.ACCEPT_RECORD === undefined) return
  written = true
  writeFileSync(process.env.ACCEPT_RECORD, JSON.stringify({ accepts, stalls, gcs }))
}
process.on('exit', write)
process.on('SIGTERM', () => {
  write()
  if (process.listenerCount('SIGTERM') === 1) process.exit(0)
})
