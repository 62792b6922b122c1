// Where a steady rate's slow requests come from.
//
//   npm run bench:tail -- [--node <path>] [--node-args="<flags>"] [--rate 1000] [--seconds 8] [--rounds 2] [--targets proxy,proxy-all,floor] [--env NAME=value]
//
// Each server (the proxy at the image's defaults or with COS_ACCESS_LOG=all, the floor) runs with
// bench/stall-recorder.mjs preloaded: its collections (PerformanceObserver
// 'gc') and event-loop stalls (a 2 ms timer chain coming late), with wall
// clock times. The paced load (as in bench/run.ts) records each request's
// start and end; the load generator records its own collections and stalls
// the same way. Every request slower than --slow ms is matched with what
// overlapped it: a collection or a stall in the server, in the load
// generator, or nothing either saw (the upstream, the kernel, another
// process on the core). Targets are interleaved round by round.
import { Agent, get as httpGet } from 'node:http'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { fixed, table } from './format.js'
import { installCleanup, scratchDir, stopAll, stopChild } from './support/children.js'
import { runLoad, SMALL_PATH } from './support/load.js'
import { awaitQuiet, choosePinning, machine, pinProcess } from './support/machine.js'
import { median } from './support/measure.js'
import { BENCH_DIR, parseEnv, splitArgs, useNode } from './support/node.js'
import { startFloor, startProxy, startUpstream, type Server } from './support/servers.js'

interface Event { readonly at: number, readonly ms: number, readonly kind?: number, readonly cpuMs?: number }
interface Recorded { readonly gcs: Event[], readonly stalls: Event[] }
interface Sample { readonly start: number, readonly ms: number }

const { values } = parseArgs({
  options: {
    node: { type: 'string' },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    rate: { type: 'string', default: '1000' },
    seconds: { type: 'string', default: '8' },
    rounds: { type: 'string', default: '2' },
    slow: { type: 'string', default: '5' },
    targets: { type: 'string', default: 'proxy,proxy-all,floor' },
  },
})
useNode(values.node)
const rate = Number(values.rate)
const seconds = Number(values.seconds)
const slowMs = Number(values.slow)
const targets = values.targets.split(',')
const RECORDER = join(BENCH_DIR, 'stall-recorder.mjs')

// The load generator's own collections and stalls.
const here: Recorded = { gcs: [], stalls: [] }
{
  const { PerformanceObserver } = await import('node:perf_hooks')
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) here.gcs.push({ at: performance.timeOrigin + e.startTime, ms: e.duration })
  }).observe({ entryTypes: ['gc'] })
}

async function paced (url: string): Promise<Sample[]> {
  const agent = new Agent({ keepAlive: true, maxSockets: 10 })
  const total = Math.round(rate * seconds)
  const intervalMs = 1000 / rate
  const samples: Sample[] = []
  let sent = 0
  let done = 0
  const t0 = performance.now()
  let due = t0
  await new Promise<void>(resolve => {
    const finished = (): void => { if (++done === total) resolve() }
    const fire = (): void => {
      const start = performance.now()
      httpGet(url, { agent }, res => {
        res.resume()
        res.on('end', () => { samples.push({ start: performance.timeOrigin + start, ms: performance.now() - start }); finished() })
      }).on('error', finished)
    }
    const tick = (): void => {
      const now = performance.now()
      if (now - due > 2) here.stalls.push({ at: performance.timeOrigin + due, ms: now - due })
      const n = Math.min(total, Math.floor((now - t0) / intervalMs) + 1)
      while (sent < n) { sent++; fire() }
      due = t0 + sent * intervalMs
      if (sent < total) setTimeout(tick, Math.max(0, due - performance.now()))
    }
    tick()
  })
  agent.destroy()
  return samples
}

const overlaps = (s: Sample, events: readonly Event[]): Event | undefined =>
  events.find(e => e.at < s.start + s.ms && e.at + e.ms > s.start)

function pct (xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(s.length * p))] ?? Number.NaN
}

interface Row { target: string, round: number, p50: number, p99: number, max: number, slow: number, serverGc: number, serverStall: number, loadgen: number, none: number, gcPerS: number, gcP50: number, gcMax: number, stalls: number, stallMax: number, running: number }

async function main (): Promise<void> {
  installCleanup()
  const m = machine()
  const pin = choosePinning(m.cores, true)
  pinProcess(process.pid, pin.loadgen)
  const scratch = scratchDir()
  const rows: Row[] = []
  try {
    const upstream = await startUpstream(pin.upstream)
    const nodeArgs = ['--import', pathToFileURL(RECORDER).href, ...splitArgs(values['node-args'])]
    for (let round = 1; round <= Number(values.rounds); round++) {
      for (const target of targets) {
        const out = join(scratch.path, `${target}-${round}.json`)
        const env = { ...parseEnv(values.env), STALL_OUT: out }
        const server: Server = target === 'floor'
          ? await startFloor(upstream.url, pin.sut, nodeArgs, env)
          : await startProxy({ upstreamUrl: upstream.url, logLevel: 'info', logFile: join(scratch.path, `${target}.log`), cwd: scratch.path, core: pin.sut, nodeArgs, env: target === 'proxy-all' ? { ...env, COS_ACCESS_LOG: 'all' } : env })
        await runLoad({ url: server.url + SMALL_PATH, connections: 32, duration: 1.5 })
        await paced(server.url + SMALL_PATH) // warm at the rate itself
        await awaitQuiet(0.1, 15_000, m.clockTicks)
        const from = performance.timeOrigin + performance.now()
        here.gcs.length = 0
        here.stalls.length = 0
        const samples = await paced(server.url + SMALL_PATH)
        const to = performance.timeOrigin + performance.now()
        await stopChild(server.child, 10_000)
        const rec = JSON.parse(readFileSync(out, 'utf8')) as Recorded
        const gcs = rec.gcs.filter(e => e.at >= from && e.at <= to)
        const stalls = rec.stalls.filter(e => e.at >= from && e.at <= to)
        const ms = samples.map(s => s.ms)
        const slow = samples.filter(s => s.ms > slowMs)
        let serverGc = 0; let serverStall = 0; let loadgen = 0; let none = 0
        for (const s of slow) {
          if (overlaps(s, gcs) !== undefined) serverGc++
          else if (overlaps(s, stalls) !== undefined) serverStall++
          else if (overlaps(s, here.gcs) !== undefined || overlaps(s, here.stalls) !== undefined) loadgen++
          else none++
        }
        const pauses = gcs.map(g => g.ms)
        rows.push({
          target, round, p50: pct(ms, 0.5), p99: pct(ms, 0.99), max: Math.max(...ms), slow: slow.length, serverGc, serverStall, loadgen, none,
          gcPerS: gcs.length / ((to - from) / 1000), gcP50: median(pauses), gcMax: Math.max(0, ...pauses),
          stalls: stalls.length, stallMax: Math.max(0, ...stalls.map(s => s.ms)),
          // A stall in which the process used CPU for at least half its length was its own work (a long callback, a collection).
          running: stalls.filter(s => (s.cpuMs ?? 0) >= 0.5 * (s.ms + 2)).length,
        })
        const r = rows[rows.length - 1] as Row
        process.stderr.write(`${target} round ${round}: p50 ${fixed(r.p50, 2)} p99 ${fixed(r.p99, 2)} max ${fixed(r.max, 1)} ms; ${r.slow} > ${slowMs} ms (server GC ${serverGc}, server stall ${serverStall}, loadgen ${loadgen}, neither ${none}); GC ${fixed(r.gcPerS, 1)}/s p50 ${fixed(r.gcP50, 2)} max ${fixed(r.gcMax, 2)} ms; stalls >2 ms ${stalls.length}, max ${fixed(r.stallMax, 1)} ms (working ${r.running}); top stalls (ms/CPU ms) ${stalls.sort((a, b) => b.ms - a.ms).slice(0, 5).map(s => `${fixed(s.ms, 1)}/${fixed(s.cpuMs ?? 0, 1)}`).join(' ')}\n`)
      }
    }
    process.stdout.write(`# Slow requests at ${rate} req/s paced, 10 clients, ${seconds} s per run (slow = over ${slowMs} ms)\n` +
      `Node flags: ${nodeArgs.slice(2).join(' ') || 'none'}\n\n` +
      table(['target', 'round', 'p50', 'p99', 'max', 'slow', 'in server GC', 'in server stall', 'in loadgen GC/stall', 'neither', 'GC/s', 'GC p50 ms', 'GC max ms', 'stalls > 2 ms', 'of them working', 'stall max ms'],
        rows.map(r => [r.target, r.round, fixed(r.p50, 2), fixed(r.p99, 2), fixed(r.max, 1), r.slow, r.serverGc, r.serverStall, r.loadgen, r.none, fixed(r.gcPerS, 1), fixed(r.gcP50, 2), fixed(r.gcMax, 2), r.stalls, r.running, fixed(r.stallMax, 1)])) + '\n')
  } finally {
    await stopAll()
    scratch.remove()
  }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`tail: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
