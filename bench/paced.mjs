// The paced load generator, in a process of its own (issue 47): open-loop
// GETs at a steady rate over a few keep-alive clients, each sent on time
// whether or not earlier ones have been answered.
//
//   node bench/paced.mjs <url> <rate req/s> <seconds> [clients=10] [warm-up seconds=1]
//
// It first sends at the same rate for the warm-up (its own code compiled, its
// connections open), then measures. It prints one JSON line when done: every
// 2xx latency of the measured requests (ms, from the moment
// the request was written), the failures, and how the generator itself fared:
//   loopP99Ms / loopMaxMs   its event loop's delay (1 ms samples, less the 1 ms)
//   sendLateP99Ms / ...Max  how late each request left after its due time
//   cpuMs / cpuTotalMs      its own CPU while measuring / since it started
// A generator that is late delays the answers it reads as much as the server
// would; bench/sections/rate.ts reports such a round as stalled.
//
// Why its own process: in the benchmark's process it shared an event loop
// with the runner and a core with the upstream, and was 1–5 ms late in over
// 1 % of its samples in every round on a 2-core machine. The benchmark runs
// it under SCHED_FIFO where it may (`chrt`), so the upstream beside it on the
// same core never delays it; it sleeps between requests, so it takes no more
// of the core than it needs. (Its main thread alone under FIFO, V8's helper
// threads left to the ordinary scheduler, was tried: with the upstream on the
// same core starved whenever the generator fell behind, it was worse.)
import { Agent, get } from 'node:http'
import { monitorEventLoopDelay, performance } from 'node:perf_hooks'
import process from 'node:process'

const [url, rateArg, secondsArg, clientsArg = '10', warmupArg = '1'] = process.argv.slice(2)
const rate = Number(rateArg)
const seconds = Number(secondsArg)
const clients = Number(clientsArg)
const warmup = Number(warmupArg)
if (url === undefined || !(rate > 0) || !(seconds > 0) || !(clients > 0) || !(warmup >= 0)) {
  console.error('usage: node bench/paced.mjs <url> <rate req/s> <seconds> [clients] [warm-up seconds]')
  process.exit(2)
}

// Requests beyond `clients` in flight wait for a socket: that queueing is part of their latency.
const agent = new Agent({ keepAlive: true, maxSockets: clients })
const first = Math.round(rate * warmup)
const measured = Math.round(rate * seconds)
const total = first + measured
const intervalMs = 1000 / rate
const latencies = new Float64Array(measured)
const sendLate = new Float64Array(measured)
let ok = 0
let measuredDone = 0
let sent = 0
let done = 0
let bytes = 0
const errors = {}
const status = {}

const percentile = (xs, q) => {
  const sorted = Float64Array.from(xs).sort()
  return sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
}

const loop = monitorEventLoopDelay({ resolution: 1 })
let cpu0 = process.cpuUsage()
let tMeasured = 0
const t0 = performance.now()

await new Promise(resolve => {
  const finished = () => { if (++done === total) resolve() }
  const fire = (i, dueAt) => {
    const start = performance.now()
    const counted = i >= first
    if (i === first) {
      loop.enable()
      cpu0 = process.cpuUsage()
      tMeasured = start
    }
    if (counted) sendLate[i - first] = start - dueAt
    const req = get(url, { agent }, res => {
      if (counted) res.on('data', chunk => { bytes += chunk.length })
      else res.resume()
      res.on('end', () => {
        const code = res.statusCode ?? 0
        if (counted) {
          measuredDone++
          if (code >= 200 && code < 300) latencies[ok++] = performance.now() - start
          else status[code] = (status[code] ?? 0) + 1
        }
        finished()
      })
    })
    req.on('error', err => {
      if (counted) {
        measuredDone++
        const key = typeof err.code === 'string' ? err.code : err.message
        errors[key] = (errors[key] ?? 0) + 1
      }
      finished()
    })
  }
  // Timers fire late by up to a millisecond or so: send whatever is due.
  const tick = () => {
    const due = Math.min(total, Math.floor((performance.now() - t0) / intervalMs) + 1)
    while (sent < due) { fire(sent, t0 + sent * intervalMs); sent++ }
    if (sent < total) setTimeout(tick, Math.max(0, t0 + sent * intervalMs - performance.now()))
  }
  tick()
})

const secondsRun = (performance.now() - tMeasured) / 1000
loop.disable()
const cpu = process.cpuUsage(cpu0)
agent.destroy()
// Node records each sample as the whole interval between two timer turns: less the 1 ms asked for, the delay.
const late = ns => Math.max(0, ns / 1e6 - 1)
process.stdout.write(JSON.stringify({
  sent: measured,
  done: measuredDone,
  seconds: secondsRun,
  bytes,
  latencies: Array.from(latencies.subarray(0, ok), v => Math.round(v * 1000) / 1000),
  errors,
  status,
  loopP99Ms: late(loop.percentile(99)),
  loopMaxMs: late(loop.max),
  sendLateP99Ms: percentile(sendLate, 0.99),
  sendLateMaxMs: percentile(sendLate, 1),
  cpuMs: (cpu.user + cpu.system) / 1000,
  // Since it started, warm-up included: the benchmark takes it out of "other processes".
  cpuTotalMs: (process.cpuUsage().user + process.cpuUsage().system) / 1000,
}) + '\n')
