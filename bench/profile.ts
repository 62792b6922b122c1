// CPU profile of the proxy (or the floor) under load, summarised: where the
// time goes, in our code (dist/) and in the framework's (node_modules/).
//
//   npm run bench:profile -- [--target proxy|floor] [--level info|warn] [--seconds 6] [--connections 32] [--workload small|get-1mib|post-1mib]
//                            [--rate <req/s>] [--gc] [--alloc] [--node <path>] [--node-args="<flags>"] [--env NAME=value]
//
// --rate: a steady open-loop rate (10 keep-alive clients) instead of
// saturation. --gc: the proxy also runs with --trace-gc, and the scavenges,
// mark-compacts and their pauses are summarised. --alloc: also the bytes
// allocated per request while loaded, by function (bench/alloc.ts).
//
// The server runs with `node --cpu-prof`; the profile is written when it
// exits, kept in bench/results/profiles/ (open it in Chrome DevTools or
// VS Code) and summarised on stdout. Times are self time (the function's own
// code) unless marked inclusive; percentages are of the non-idle samples,
// start-up included (well under 5 % of a 6 s run).
import { readdirSync, readFileSync, mkdirSync, copyFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { allocNodeArgs, allocReport, startSampling, stopSampling } from './alloc.js'
import { fixed, table } from './format.js'
import { installCleanup, scratchDir, stopAll, stopChild } from './support/children.js'
import { parseWorkload, runLoad, runPaced, SMALL_PATH, workloadLoad } from './support/load.js'
import { awaitQuiet, choosePinning, cpuTicks, machine, noiseProbe, pinProcess } from './support/machine.js'
import { measure, median, type Measured } from './support/measure.js'
import { BENCH_DIR, CLI, parseEnv, ROOT, splitArgs, useNode } from './support/node.js'
import { startFloor, startProxy, startUpstream, thisBuild } from './support/servers.js'

interface CallFrame { readonly functionName: string, readonly url: string, readonly lineNumber: number }
interface ProfileNode { readonly id: number, readonly callFrame: CallFrame, readonly children?: readonly number[] }
interface CpuProfile { readonly nodes: readonly ProfileNode[], readonly samples: readonly number[], readonly timeDeltas: readonly number[] }

/** Which code a frame belongs to: ours, an npm package, Node's own JS, or native/V8. */
function category (frame: CallFrame): string {
  const { url, functionName } = frame
  if (url === '') return functionName.startsWith('(') ? functionName : 'native'
  if (url.startsWith('wasm://')) return 'wasm (undici\'s llhttp)'
  if (url.startsWith('node:')) return 'node core'
  const nm = url.lastIndexOf('/node_modules/')
  if (nm >= 0) {
    const parts = url.slice(nm + '/node_modules/'.length).split('/')
    return (parts[0]?.startsWith('@') === true ? `${parts[0]}/${parts[1] ?? ''}` : parts[0]) ?? 'npm'
  }
  if (url.includes('/dist/')) return 'ours'
  if (url.includes('/bench/')) return 'bench'
  return 'other'
}

function place (frame: CallFrame): string {
  const file = frame.url.replace(/^file:\/\//, '').replace(ROOT + '/', '').replace(/^.*\/node_modules\//, '')
  return file === '' ? '' : `${file}:${frame.lineNumber + 1}`
}

interface Row { readonly name: string, readonly where: string, readonly category: string, self: number, inclusive: number }

interface Summary {
  readonly totalMs: number
  readonly idleMs: number
  readonly byCategory: readonly { readonly category: string, readonly ms: number, readonly share: number }[]
  readonly functions: readonly Row[]
}

function summarise (profile: CpuProfile): Summary {
  const byId = new Map(profile.nodes.map(n => [n.id, n]))
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const rows = new Map<string, Row>()
  const rowOf = (f: CallFrame): Row => {
    const key = `${f.functionName}@${f.url}:${f.lineNumber}`
    let r = rows.get(key)
    if (r === undefined) {
      r = { name: f.functionName === '' ? '(anonymous)' : f.functionName, where: place(f), category: category(f), self: 0, inclusive: 0 }
      rows.set(key, r)
    }
    return r
  }
  let total = 0
  let idle = 0
  const { samples, timeDeltas } = profile
  for (let i = 0; i < samples.length; i++) {
    // A sample's duration is the gap to the next one.
    const us = timeDeltas[i + 1] ?? 0
    const node = byId.get(samples[i] ?? -1)
    if (node === undefined) continue
    total += us
    if (node.callFrame.functionName === '(idle)') { idle += us; continue }
    rowOf(node.callFrame).self += us
    // Inclusive: once per distinct function on the stack (recursion counted once).
    const seen = new Set<Row>()
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const n = byId.get(id)
      if (n === undefined || n.callFrame.functionName === '(root)') continue
      const r = rowOf(n.callFrame)
      if (!seen.has(r)) { seen.add(r); r.inclusive += us }
    }
  }
  const busy = total - idle
  const cats = new Map<string, number>()
  for (const r of rows.values()) cats.set(r.category, (cats.get(r.category) ?? 0) + r.self)
  return {
    totalMs: total / 1000,
    idleMs: idle / 1000,
    byCategory: [...cats].map(([c, us]) => ({ category: c, ms: us / 1000, share: us / busy })).sort((a, b) => b.ms - a.ms),
    functions: [...rows.values()].map(r => ({ ...r, self: r.self / 1000, inclusive: r.inclusive / 1000 })).sort((a, b) => b.self - a.self),
  }
}

/** The categories above 0.5 %, then the rest in one line. */
function categoryRows (s: Summary): string[][] {
  const big = s.byCategory.filter(c => c.share >= 0.005)
  const rest = s.byCategory.filter(c => c.share < 0.005)
  const rows = big.map(c => [c.category, fixed(c.ms, 0), fixed(c.share * 100, 1) + ' %'])
  if (rest.length > 0) {
    const ms = rest.reduce((n, c) => n + c.ms, 0)
    rows.push([`${rest.length} more packages`, fixed(ms, 0), fixed(rest.reduce((n, c) => n + c.share, 0) * 100, 1) + ' %'])
  }
  return rows
}

function report (s: Summary, top = 25): string {
  const busy = s.totalMs - s.idleMs
  const pct = (ms: number): string => fixed(ms / busy * 100, 1) + ' %'
  const fnRow = (r: Row): (string | number)[] => [r.name, r.where, r.category, fixed(r.self, 0), pct(r.self), fixed(r.inclusive, 0), pct(r.inclusive)]
  const head = ['function', 'where', 'code', 'self ms', 'self', 'inclusive ms', 'inclusive']
  const framework = (r: Row): boolean => !['ours', 'node core', 'native', 'bench', 'other'].includes(r.category) && !r.category.startsWith('(')
  return [
    `profiled ${fixed(s.totalMs / 1000, 1)} s, busy ${fixed(busy / 1000, 1)} s (idle ${fixed(s.idleMs / 1000, 1)} s)`,
    '',
    '### Self time by code',
    table(['code', 'self ms', 'share of busy'], categoryRows(s)),
    '',
    `### Top ${top} functions by self time`,
    table(head, s.functions.slice(0, top).map(fnRow)),
    '',
    '### Top 10 in our code (dist/)',
    table(head, s.functions.filter(r => r.category === 'ours').slice(0, 10).map(fnRow)),
    '',
    '### Top 10 in our code by inclusive time (what each of our functions costs with everything it calls)',
    table(head, [...s.functions].filter(r => r.category === 'ours').sort((a, b) => b.inclusive - a.inclusive).slice(0, 10).map(fnRow)),
    '',
    '### Top 10 in framework code (node_modules/)',
    table(head, s.functions.filter(framework).slice(0, 10).map(fnRow)),
  ].join('\n')
}

/** The --trace-gc lines in a server's stdout (which for the proxy is also its JSON log). */
function gcLines (file: string): string[] {
  return readFileSync(file, 'utf8').split('\n').filter(l => /: (Scavenge|Mark-Compact|Minor Mark-Sweep|Mark-Sweep)/.test(l))
}

/** Counts per second and pause p50/max for each kind of collection. */
function gcSummary (lines: readonly string[], seconds: number): string {
  const kinds = new Map<string, number[]>()
  for (const l of lines) {
    // e.g. "[123:0x…]   4567 ms: Scavenge 10.2 (12.0) -> 9.1 (12.0) MB, pooled: 0 MB, 0.61 / 0.00 ms  (average mu = …"
    const m = /: (Scavenge|Mark-Compact|Minor Mark-Sweep|Mark-Sweep)\b.*?MB, (?:pooled: [\d.]+ MB, )?([\d.]+) \/ [\d.]+ ms/.exec(l)
    if (m === null) continue
    const [, kind = '', pause = ''] = m
    kinds.set(kind, [...(kinds.get(kind) ?? []), Number(pause)])
  }
  if (kinds.size === 0) return '(no collections seen)'
  return table(['collection', 'count', 'per second', 'pause p50 ms', 'pause max ms', 'pause total ms'],
    [...kinds].map(([kind, p]) => [kind, p.length, fixed(p.length / seconds, 1), fixed(median(p), 2), fixed(Math.max(...p), 2), fixed(p.reduce((a, b) => a + b, 0), 0)]))
}

/** runPaced with the server's CPU accounted, as measure() does for autocannon. */
async function measurePaced (url: string, rate: number, seconds: number, pid: number, ticksPerSecond: number): Promise<Measured> {
  const cpu0 = cpuTicks(pid)
  const others = noiseProbe([pid], ticksPerSecond)
  const t0 = performance.now()
  const load = await runPaced(url, rate, seconds)
  const wallMs = performance.now() - t0
  const ms = (cpuTicks(pid) - cpu0) * 1000 / ticksPerSecond
  return { load, cost: { cpuMsPer1k: ms / load.requests * 1000, sutBusy: ms / wallMs, loadgenBusy: Number.NaN, otherLoad: others() } }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      target: { type: 'string', default: 'proxy' },
      level: { type: 'string', default: 'info' },
      seconds: { type: 'string', default: '6' },
      connections: { type: 'string', default: '32' },
      workload: { type: 'string', default: 'small' },
      rate: { type: 'string' },
      gc: { type: 'boolean', default: false },
      alloc: { type: 'boolean', default: false },
      node: { type: 'string' },
      'node-args': { type: 'string' },
      env: { type: 'string', multiple: true },
    },
  })
  useNode(values.node)
  if (values.target !== 'proxy' && values.target !== 'floor') throw new Error('--target must be proxy or floor')
  const workload = parseWorkload(values.workload)
  installCleanup()
  const m = machine()
  const pin = choosePinning(m.cores, true)
  pinProcess(process.pid, pin.loadgen)
  const scratch = scratchDir()
  try {
    const upstream = await startUpstream(pin.upstream)
    const nodeArgs = ['--cpu-prof', `--cpu-prof-dir=${scratch.path}`, ...(values.gc ? ['--trace-gc'] : []), ...(values.alloc ? allocNodeArgs() : []), ...splitArgs(values['node-args'])]
    const allocFile = join(scratch.path, 'alloc.json')
    const env = { ...parseEnv(values.env), ...(values.alloc ? { BENCH_ALLOC_OUT: allocFile } : {}) }
    const logFile = join(scratch.path, 'server.log')
    const server = values.target === 'floor'
      ? await startFloor(upstream.url, pin.sut, nodeArgs, env)
      // The unbundled build with the image's flags and environment: its frames
      // name the files and packages the time goes to (the bundle's are all one file).
      : await startProxy({ upstreamUrl: upstream.url, logLevel: values.level, logFile, cwd: scratch.path, core: pin.sut, nodeArgs, env, build: { ...thisBuild(), script: CLI } })
    const connections = Number(values.connections)
    const rate = values.rate === undefined ? undefined : Number(values.rate)
    await runLoad(workloadLoad(workload, server.url, connections, 1))
    await awaitQuiet(0.1, 30_000, m.clockTicks) // a shared machine: wait for a quiet moment
    const gcFrom = values.gc && values.target === 'proxy' ? gcLines(logFile).length : 0
    if (values.alloc) startSampling(server.child.pid)
    const t0 = performance.now()
    const r = rate === undefined
      ? await measure(workloadLoad(workload, server.url, connections, Number(values.seconds)), server.child.pid, upstream.child.pid, m.clockTicks)
      : await measurePaced(server.url + SMALL_PATH, rate, Number(values.seconds), server.child.pid, m.clockTicks)
    const loadedSeconds = (performance.now() - t0) / 1000
    const gc = values.gc && values.target === 'proxy' ? gcSummary(gcLines(logFile).slice(gcFrom), loadedSeconds) : undefined
    const alloc = values.alloc ? allocReport(await stopSampling(server.child.pid, allocFile), r.load.requests) : undefined
    await stopChild(server.child, 10_000) // the profile is written as it exits
    await stopAll()
    const file = readdirSync(scratch.path).find(f => f.endsWith('.cpuprofile'))
    if (file === undefined) throw new Error('no .cpuprofile was written')
    const outDir = join(BENCH_DIR, 'results', 'profiles')
    mkdirSync(outDir, { recursive: true })
    const kept = join(outDir, `${new Date().toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-')}-${values.target}${values.target === 'proxy' ? '-' + values.level : ''}.cpuprofile`)
    copyFileSync(join(scratch.path, file), kept)
    const summary = summarise(JSON.parse(readFileSync(kept, 'utf8')) as CpuProfile)
    process.stdout.write([
      `# CPU profile: ${values.target}${values.target === 'proxy' ? ` at ${values.level}` : ''}, ${values.workload}, ${rate === undefined ? `${connections} connections (saturation)` : `${rate} req/s paced (10 keep-alive clients)`}, ${values.seconds} s`,
      `machine: ${m.cpuModel}, ${m.cores} cores, Node ${m.node}; ${pin.description}; Node flags ${nodeArgs.slice(2).join(' ') || 'none'}`,
      `load: ${fixed(r.load.rps)} req/s, p50 ${fixed(r.load.latency.p50, 2)} ms, p99 ${fixed(r.load.latency.p99, 2)} ms, ${fixed(r.cost.cpuMsPer1k)} CPU ms per 1,000 requests (profiling slows it), other processes ${fixed(r.cost.otherLoad, 2)} cores`,
      ...(gc === undefined ? [] : ['', '### Garbage collection while loaded (--trace-gc)', gc]),
      ...(alloc === undefined ? [] : ['', alloc]),
      `profile: ${kept.replace(ROOT + '/', '')}`,
      '',
      report(summary),
    ].join('\n') + '\n')
  } finally {
    await stopAll()
    scratch.remove()
  }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`profile: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
