// What new connections wait for, and what a burst of them costs (issues 21, 43).
//
//   npm run bench:accept -- [--targets proxy,floor,go] [--sequence 32,256,1024] [--seconds 15] [--limit <MiB>]
//                           [--runs 1] [--load wrk|autocannon] [--timeout 10] [--wrk-threads 2]
//                           [--node <path>] [--node-args="<flags>"] [--env NAME=value …] [--checkout <dir>] [--out <name>]
//                           [--record] [--backlog <n>]
//
// Each server, fresh and pinned as in `npm run bench`, is loaded with each
// number of keep-alive connections of --sequence in turn for --seconds, each
// set opened at once as the one before closes: issue 43's finding was `wrk
// --timeout 10s --latency` at 32, 256, then 1,024 connections, 15 s each.
// The proxy runs as its image runs it, the floor (bench/floor.mjs) under the
// image's Node flags, the Go signer (bench/go-signer) on GOMAXPROCS=1. With
// --limit each runs in a memory cgroup of that many MiB from a fresh copy of
// its binary, not in the page cache (bench/support/fresh-binary.ts), as the
// first sidecar on a node.
//
// Per phase: requests; p50 / p99 / max latency (max: the worst wait, of the
// answers within --timeout); every failed request by kind (wrk: timeout = an
// answer later than --timeout, reset = its read/write errors, connect,
// status ≥ 400; autocannon: also closed, and each connection's first request);
// the accept queue's largest length and how long it was not empty (ss, every
// 50 ms) and the backlog; the kernel's ListenOverflows / ListenDrops /
// TCPSynRetrans over the phase (SYNs dropped on a full queue, retried 1, 3,
// 7 s later); the server's major faults and its cgroup's failcnt; the CPU
// other processes used. --runs repeats it all, targets interleaved, and
// gives the last phase as ranges. Written to bench/results/<time>-accept.json.
// --checkout runs another built checkout's proxy (a commit before a change,
// from `git worktree add`) as its own Dockerfile runs it. --record preloads
// bench/accept-recorder.mjs into the proxy and the floor: when each
// connection was accepted, the event loop's long turns and V8's collections,
// per phase; --backlog <n> gives their listen() that backlog (with --record).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { isAbsolute, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { createCgroup, type Cgroup } from './cgroup.js'
import { fixed, table } from './format.js'
import { imageBuild } from './image.js'
import { buildGoSigner, startGoSigner } from './go-signer.js'
import { counterDelta, findWrk, kernelCounters, majorFaults, othersCpu, runWrk, sampleAcceptQueue, serverViews, listenQueue, type KernelCounters, type ServerView } from './support/burst.js'
import { installCleanup, scratchDir, stopAll, stopChild } from './support/children.js'
import { freshBinary } from './support/fresh-binary.js'
import { describeFailures, failureCount, runLoad, SMALL_PATH, type Failures, type Latency } from './support/load.js'
import { choosePinning, machine, pinProcess } from './support/machine.js'
import { BENCH_DIR, gitCommit, nodeUnderTest, parseEnv, splitArgs, useNode } from './support/node.js'
import { imageEnvForThisNode, startFloor, startProxy, startUpstream, thisBuild, type Server } from './support/servers.js'

const { values } = parseArgs({
  options: {
    node: { type: 'string' },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    targets: { type: 'string', default: 'proxy,floor,go' },
    sequence: { type: 'string', default: '32,256,1024' },
    seconds: { type: 'string', default: '15' },
    limit: { type: 'string' },
    runs: { type: 'string', default: '1' },
    load: { type: 'string' },
    timeout: { type: 'string', default: '10' },
    'wrk-threads': { type: 'string', default: '2' },
    out: { type: 'string' },
    checkout: { type: 'string' },
    record: { type: 'boolean', default: false },
    backlog: { type: 'string' },
    help: { type: 'boolean', default: false },
  },
})
if (values.help) {
  process.stdout.write(readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter(l => l.startsWith('//')).map(l => l.slice(3)).join('\n') + '\n')
  process.exit(0)
}
useNode(values.node)
const sequence = values.sequence.split(',').map(Number)
const seconds = Number(values.seconds)
const runs = Number(values.runs)
const timeoutSeconds = Number(values.timeout)
const limitMiB = values.limit === undefined ? undefined : Number(values.limit)
const wrk = values.load === 'autocannon' ? undefined : findWrk()
if (values.load === 'wrk' && wrk === undefined) throw new Error('--load wrk: no wrk on PATH (Debian: apt-get install wrk)')
if (sequence.some(c => !(c > 0)) || !(seconds > 0) || !(runs >= 1) || !(timeoutSeconds > 0) || (limitMiB !== undefined && !(limitMiB > 0))) {
  throw new Error('--sequence wants connection counts (32,256,1024), --seconds, --runs, --timeout and --limit positive numbers')
}
const MiB = 1024 * 1024
const progress = (s: string): void => { process.stderr.write(s + '\n') }
const loadAverage = (): string => loadavg().map(x => x.toFixed(2)).join(' ')

interface Phase {
  readonly connections: number
  readonly requests: number
  readonly latencyMs: Latency
  readonly failures: Failures
  readonly firstOnConnectionMs: Latency | null
  readonly acceptQueue: { readonly max: number, readonly nonEmptyMs: number }
  readonly backlog: number
  readonly kernel: KernelCounters
  readonly majorFaults: number
  readonly failcnt: number | null
  /** Cores' worth of CPU other processes used during the phase. */
  readonly otherCores: number
  /** With --record (the proxy and the floor): what the server saw. */
  server?: ServerView
}
interface TargetRun { readonly target: string, readonly run: number, readonly phases: Phase[], cgroupPeakMB: number | null, oomKills: number | null, alive: boolean }

async function main (): Promise<void> {
  installCleanup()
  const m = machine()
  const pin = choosePinning(m.cores, true)
  pinProcess(process.pid, pin.loadgen)
  const scratch = scratchDir()
  const build = values.checkout === undefined ? thisBuild() : imageBuild(resolve(values.checkout))
  const nodeArgs = splitArgs(values['node-args'])
  const env = parseEnv(values.env)
  const started = new Date()
  const load0 = loadAverage()
  const results: TargetRun[] = []
  const cgroups = new Set<Cgroup>()
  process.on('exit', () => { for (const c of cgroups) c.remove() })
  try {
    const targets = values.targets.split(',')
    const go = targets.includes('go') ? buildGoSigner(scratch.path) : undefined
    if (go !== undefined && 'skipped' in go) progress(`Go signer skipped: ${go.skipped}`)
    const upstream = await startUpstream(pin.upstream)
    progress(`bench:accept: ${targets.join(', ')}; ${sequence.join(' → ')} connections, ${seconds} s each, ${runs} run(s); load ${wrk === undefined ? 'autocannon' : `wrk (${values['wrk-threads']} threads)`}, timeout ${timeoutSeconds} s; ${limitMiB === undefined ? 'no memory limit, binaries as they are' : `${limitMiB} MiB memory cgroup, fresh binaries`}; load average ${load0}`)
    for (let run = 1; run <= runs; run++) {
      for (const target of targets) {
        if (target === 'go' && (go === undefined || !('binary' in go))) continue
        const cgroup = limitMiB === undefined ? undefined : createCgroup(limitMiB * MiB, 'accept')
        if (cgroup !== undefined) cgroups.add(cgroup)
        const where = cgroup === undefined ? {} : { cgroup: cgroup.dir }
        const recordFile = join(scratch.path, `record-${target}-${run}.json`)
        const recorder = values.record && target !== 'go' ? { args: ['--import', join(BENCH_DIR, 'accept-recorder.mjs')], env: { ACCEPT_RECORD: recordFile, ...(values.backlog === undefined ? {} : { ACCEPT_BACKLOG: values.backlog }) } } : { args: [], env: {} }
        const fresh = (program: string, name: string): string => limitMiB === undefined ? program : freshBinary(program, scratch.path, name).path
        const server: Server = target === 'floor'
          ? await startFloor(upstream.url, pin.sut, [...build.nodeArgs, ...recorder.args], { ...imageEnvForThisNode(build.env), ...recorder.env }, { ...where, node: fresh(nodeUnderTest().path, 'node-floor') })
          : target === 'go' && go !== undefined && 'binary' in go
            ? await startGoSigner({ binary: fresh(go.binary, 'go-signer-fresh'), upstreamUrl: upstream.url, core: pin.sut, ...where })
            : await startProxy({ upstreamUrl: upstream.url, logLevel: 'info', logFile: join(scratch.path, 'proxy.log'), cwd: scratch.path, core: pin.sut, nodeArgs: [...nodeArgs, ...recorder.args], env: { ...env, ...recorder.env }, build, ...where, ...(limitMiB === undefined ? {} : { node: fresh(nodeUnderTest().path, 'node-proxy') }) })
        const pid = server.child.pid
        const port = Number(new URL(server.url).port)
        const record: TargetRun = { target, run, phases: [], cgroupPeakMB: null, oomKills: null, alive: true }
        results.push(record)
        const windows: [number, number][] = []
        for (const connections of sequence) {
          const startedAt = Date.now()
          const before = { kernel: kernelCounters(), faults: majorFaults(pid), failcnt: cgroup?.failcnt() ?? Number.NaN }
          const pids = [pid, upstream.child.pid, ...(server.logReader === undefined ? [] : [server.logReader.pid])]
          const others = othersCpu(() => pids, m.clockTicks)
          const queue = sampleAcceptQueue(port)
          const backlog = listenQueue(port).backlog
          let phase: Omit<Phase, 'connections' | 'acceptQueue' | 'backlog' | 'kernel' | 'majorFaults' | 'failcnt' | 'otherCores'>
          if (wrk !== undefined) {
            const w = await runWrk(wrk, scratch.path, { url: server.url + SMALL_PATH, connections, seconds, timeoutSeconds, threads: Number(values['wrk-threads']), ...(pin.loadgen === undefined ? {} : { core: pin.loadgen }) }, p => { pids.push(p) })
            phase = { requests: w.requests, latencyMs: w.latency, failures: w.failures, firstOnConnectionMs: null }
          } else {
            const r = await runLoad({ url: server.url + SMALL_PATH, connections, duration: seconds, timeoutSeconds })
            phase = { requests: r.requests, latencyMs: r.latency, failures: r.failures, firstOnConnectionMs: r.firstOnConnection }
          }
          record.phases.push({
            connections, ...phase, acceptQueue: queue(), backlog,
            kernel: counterDelta(before.kernel, kernelCounters()),
            majorFaults: majorFaults(pid) - before.faults,
            failcnt: cgroup === undefined ? null : cgroup.failcnt() - before.failcnt,
            otherCores: others(),
          })
          windows.push([startedAt, Date.now()])
          const last = record.phases.at(-1)
          progress(`  ${target} run ${run}, ${connections} connections: p99 ${fixed(last?.latencyMs.p99 ?? Number.NaN)} ms, max ${fixed(last?.latencyMs.max ?? Number.NaN)} ms, failed: ${last === undefined ? '' : describeFailures(last.failures)}`)
          await new Promise(resolve => setTimeout(resolve, 500)) // the connections closed; the next set opens at once
        }
        record.alive = server.child.exitCode === undefined
        record.cgroupPeakMB = cgroup === undefined ? null : cgroup.peak() / 1e6
        record.oomKills = cgroup === undefined ? null : cgroup.oomKills()
        await stopChild(server.child)
        if (server.logReader !== undefined) await stopChild(server.logReader)
        if (existsSync(recordFile)) serverViews(recordFile, windows).forEach((view, i) => { const p = record.phases[i]; if (p !== undefined) p.server = view })
        if (cgroup !== undefined) { cgroup.remove(); cgroups.delete(cgroup) }
      }
    }
  } finally {
    await stopAll()
    for (const c of cgroups) c.remove()
    scratch.remove()
  }
  report(results, { m, started, load0, commit: gitCommit(), build: build.description })
  if (results.some(r => !r.alive || (r.oomKills ?? 0) > 0)) process.exitCode = 1
}

function report (results: readonly TargetRun[], ctx: { m: ReturnType<typeof machine>, started: Date, load0: string, commit: string | undefined, build: string }): void {
  const loadEnd = loadAverage()
  const kernel = (k: KernelCounters): string => `${k.listenOverflows} / ${k.listenDrops} / ${k.synRetrans}`
  const rows = results.flatMap(r => r.phases.map(p => [
    r.target, r.run, p.connections, p.requests, fixed(p.latencyMs.p50), fixed(p.latencyMs.p99), fixed(p.latencyMs.max, 0), describeFailures(p.failures),
    p.firstOnConnectionMs === null ? '–' : `${fixed(p.firstOnConnectionMs.p50)} / ${fixed(p.firstOnConnectionMs.max, 0)}`,
    `${fixed(p.acceptQueue.max, 0)} / ${p.backlog} (${p.acceptQueue.nonEmptyMs} ms)`, kernel(p.kernel), fixed(p.majorFaults, 0), p.failcnt === null ? '–' : String(p.failcnt), fixed(p.otherCores, 2),
  ]))
  const range = (xs: number[], digits?: number): string => xs.length === 0 ? '–' : Math.min(...xs) === Math.max(...xs) ? fixed(xs[0] ?? Number.NaN, digits) : `${fixed(Math.min(...xs), digits)}–${fixed(Math.max(...xs), digits)}`
  const lastPhase = sequence.at(-1) ?? 0
  const views = results.flatMap(r => r.phases.flatMap(p => p.server === undefined
    ? []
    : [[r.target, r.run, p.connections, p.server.accepted, fixed(p.server.lastAcceptMs, 0), fixed(p.server.p90AcceptMs, 0), `${p.server.longTurns} / ${fixed(p.server.longTurnsMs, 0)} / ${fixed(p.server.longestTurnMs, 0)}`, `${p.server.collections} / ${fixed(p.server.collectionsMs, 0)}`]]))
  const targets = [...new Set(results.map(r => r.target))]
  const summary = targets.map(target => {
    const ps = results.filter(r => r.target === target).map(r => r.phases.at(-1)).filter((p): p is Phase => p !== undefined)
    const rs = results.filter(r => r.target === target)
    return [target, ps.length, range(ps.map(p => p.latencyMs.max), 0), range(ps.map(p => p.latencyMs.p99), 0), range(ps.map(p => failureCount(p.failures))),
      range(ps.map(p => p.acceptQueue.max), 0), range(ps.map(p => p.kernel.listenOverflows)), range(ps.map(p => p.majorFaults)), range(ps.map(p => p.failcnt ?? Number.NaN)),
      rs.every(r => r.cgroupPeakMB === null) ? '–' : range(rs.map(r => r.cgroupPeakMB ?? Number.NaN), 1), range(ps.map(p => p.otherCores), 2)]
  })
  process.stdout.write([
    `# bench:accept: ${sequence.join(' → ')} keep-alive connections, each set opened at once, ${seconds} s each (${ctx.started.toISOString()}${ctx.commit === undefined ? '' : `, commit ${ctx.commit}`})`,
    `machine: ${ctx.m.cpuModel}, ${ctx.m.cores} cores, Node ${ctx.m.node}; load average ${ctx.load0} at the start, ${loadEnd} at the end`,
    `proxy: ${ctx.build}; floor: bench/floor.mjs under the image's Node flags; Go signer: GOMAXPROCS=1`,
    `load: ${wrk === undefined ? 'autocannon' : `wrk -t${values['wrk-threads']} --latency`}, timeout ${timeoutSeconds} s; ${limitMiB === undefined ? 'no memory limit' : `each server in a ${limitMiB} MiB memory cgroup from a fresh copy of its binary`}`,
    '',
    table(['server', 'run', 'connections', 'requests', 'p50 ms', 'p99 ms', 'max ms', 'failed requests', 'first request p50 / max ms', 'accept queue max / backlog (not empty)', 'ListenOverflows / Drops / SynRetrans', 'major faults', 'failcnt', 'other processes, cores'], rows),
    '',
    `## ${lastPhase} connections at once: ranges over ${runs} run(s)`,
    '',
    table(['server', 'runs', 'worst wait (max) ms', 'p99 ms', 'failed requests', 'accept queue max', 'ListenOverflows', 'major faults', 'failcnt', 'cgroup peak MB', 'other processes, cores'], summary),
    ...(views.length === 0 ? [] : ['', `## What the server saw (--record${values.backlog === undefined ? '' : `, listen backlog ${values.backlog}`})`, '', table(['server', 'run', 'connections', 'accepted', 'last accepted after ms', '90 % accepted after ms', 'turns > 5 ms: count / total / longest ms', 'collections: count / ms'], views)]),
  ].join('\n') + '\n')
  const dir = join(BENCH_DIR, 'results')
  mkdirSync(dir, { recursive: true })
  const name = values.out ?? `${ctx.started.toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-')}-accept.json`
  const file = isAbsolute(name) ? name : join(dir, name)
  writeFileSync(file, JSON.stringify({
    schema: 1, startedAt: ctx.started.toISOString(), finishedAt: new Date().toISOString(), commit: ctx.commit,
    command: ['npm run bench:accept --', ...process.argv.slice(2)].join(' ').replace(/ --$/, ''), machine: ctx.m, loadAverage: { start: ctx.load0, end: loadEnd },
    proxy: ctx.build, load: wrk === undefined ? 'autocannon' : `wrk -t${values['wrk-threads']}`, timeoutSeconds, limitMiB: limitMiB ?? null, sequence, seconds, results,
  }, null, 2) + '\n')
  progress(`results: ${isAbsolute(name) ? name : `bench/results/${name}`}`)
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench:accept: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
