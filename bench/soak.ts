// npm run bench:soak -- [--workload small|bodies] [--limit 192] [--minutes 10] [--connections 256] [--node <path>] [--node-args="<flags>"] [--env NAME=value …]
//                       [--burst-connections 1024] [--burst-minutes 1] [--attack-seconds 20] [--timeout 10]
//                       [--no-limit] [--warm-binary] [--level info] [--out <name>]
//
// The proxy under a real memory limit, as the kubelet sets one: a Linux
// memory cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) created
// for the run, the proxy's process put in it before it execs (so every byte
// it allocates is charged there and Node reads the limit from it, as in a
// container), run as the image runs it (the bundle with the Dockerfile's
// Node flags and environment, bench/image.ts), then driven with
// `--connections` keep-alive connections by autocannon for `--minutes`
// against the benchmark's upstream (both outside the cgroup, on the other
// core); then `--burst-connections` for `--burst-minutes`; then, for
// `--attack-seconds`, every attack on what one connection may cost at once
// (bench/support/attack-phase.ts) with /healthz probed once a second (0 skips
// a phase). Needs root (or a writable cgroup tree) and Linux.
//
// `--workload` is what each request is (bench/support/load.ts): `small` (the
// default, a GET answered ~200 bytes) or `bodies`, a POST of 1 MiB answered
// 1 MiB (issue 47; its defaults `--minutes 1 --connections 64`); also
// `get-1mib` and `post-1mib`, one way only. The burst sends the same request.
//
// Reports, and writes to bench/results/<time>-soak.json: the cgroup's peak
// usage (v1 memory.max_usage_in_bytes / v2 memory.peak), its failcnt (v1:
// how often the limit was hit and the kernel had to reclaim; v2: the
// `max` count of memory.events), OOM kills (v1 memory.oom_control's
// oom_kill, v2 memory.events' oom_kill), whether the proxy was still alive
// at the end, its own VmHWM, V8's heap limit as Node computed it inside the
// cgroup, the working set over time (usage less inactive file pages, the
// kubelet's figure), and per phase autocannon's requests, their p50 / p99 /
// max latency, each connection's first request, and every failed request by
// kind: timeout (no answer within `--timeout` seconds, 10 as `wrk --timeout
// 10s`), connect error, reset, closed by the proxy with the request
// unanswered, non-2xx status. It exits 1 on any failed request. The cgroup
// and every process are removed on exit, also on Ctrl-C or an error.
//
// The proxy starts from a fresh copy of the Node binary whose pages are not in the page cache
// (bench/support/fresh-binary.ts), so that the binary's pages it reads are charged to its
// cgroup, as for the first sidecar on a node; `--warm-binary` starts it from the binary as it
// is (its pages cached, and charged to whoever read them first).
//
// `--limit` defaults to the chart's resources.limits.memory
// (helm/cos-auth-proxy/values.yaml). `--no-limit` runs the same load
// without a cgroup (peak RSS as `npm run bench` measures it).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { chartLimitMiB, createCgroup } from './cgroup.js'
import { freshBinary } from './support/fresh-binary.js'
import { attackPhase } from './support/attack-phase.js'
import { isAbsolute, join } from 'node:path'
import { parseArgs } from 'node:util'
import { fixed, table } from './format.js'
import { installCleanup, scratchDir, stopAll, stopChild } from './support/children.js'
import { describeFailures, failureCount, parseWorkload, runLoad, workloadLoad } from './support/load.js'
import { choosePinning, cpuTicks, machine, pinProcess, vmMB } from './support/machine.js'
import { BENCH_DIR, gitCommit, nodeUnderTest, parseEnv, splitArgs, useNode } from './support/node.js'
import { startProxy, startUpstream, thisBuild } from './support/servers.js'
import { heapLimitMiB as probeHeapLimit, watchMemory, type Phase, type Sample } from './support/soak-watch.js'

const { values } = parseArgs({
  options: {
    limit: { type: 'string' },
    'no-limit': { type: 'boolean', default: false },
    'warm-binary': { type: 'boolean', default: false },
    workload: { type: 'string', default: 'small' },
    minutes: { type: 'string' },
    connections: { type: 'string' },
    'burst-connections': { type: 'string', default: '1024' },
    'burst-minutes': { type: 'string', default: '1' },
    'attack-seconds': { type: 'string', default: '20' },
    timeout: { type: 'string', default: '10' },
    level: { type: 'string', default: 'info' },
    node: { type: 'string' },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    out: { type: 'string' },
    help: { type: 'boolean', default: false },
  },
})
if (values.help) {
  process.stdout.write(readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter(l => l.startsWith('//')).map(l => l.slice(3)).join('\n') + '\n')
  process.exit(0)
}
useNode(values.node)
const workload = parseWorkload(values.workload)
const minutes = Number(values.minutes ?? (workload === 'small' ? 10 : 1))
const connections = Number(values.connections ?? (workload === 'small' ? 256 : 64))
const burst = { connections: Number(values['burst-connections']), minutes: Number(values['burst-minutes']) }
const attackSeconds = Number(values['attack-seconds'])
const timeoutSeconds = Number(values.timeout)
if (!(minutes > 0) || !(connections > 0)) throw new Error('--minutes and --connections must be positive numbers')
if (!(burst.minutes >= 0) || !(burst.connections > 0) || !(attackSeconds >= 0) || !(timeoutSeconds > 0)) throw new Error('--burst-minutes and --attack-seconds must be numbers >= 0, --burst-connections and --timeout > 0')
const progress = (s: string): void => { process.stderr.write(s + '\n') }
const MiB = 1024 * 1024
const read = (file: string): string => readFileSync(file, 'utf8')

async function main (): Promise<void> {
  installCleanup()
  const limitMiB = values['no-limit'] ? undefined : values.limit === undefined ? chartLimitMiB() : Number(values.limit)
  if (limitMiB !== undefined && !(limitMiB > 0)) throw new Error('--limit wants MiB, e.g. --limit 192')
  const m = machine()
  const pin = choosePinning(m.cores, true)
  pinProcess(process.pid, pin.loadgen)
  const build = thisBuild()
  const nodeArgs = splitArgs(values['node-args'])
  const env = parseEnv(values.env)
  const cgroup = limitMiB === undefined ? undefined : createCgroup(limitMiB * MiB)
  let removed = false
  const removeCgroup = (): void => { if (!removed && cgroup !== undefined) { removed = true; cgroup.remove() } }
  process.on('exit', removeCgroup)
  const scratch = scratchDir()
  const started = new Date()
  const load0 = read('/proc/loadavg').split(' ').slice(0, 3).join(' ')
  try {
    progress(`soak: ${workload} requests on ${connections} connections for ${minutes} min, ${limitMiB === undefined ? 'no memory limit' : `in ${cgroup?.dir} (limit ${limitMiB} MiB, cgroup v${cgroup?.version})`}\n  proxy: ${build.description}${nodeArgs.length > 0 ? ` + ${nodeArgs.join(' ')}` : ''}${Object.keys(env).length > 0 ? ` + ${Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''}\n  ${m.cpuModel}, ${m.cores} cores, Node ${m.node}; load average ${load0}`)
    const fresh = values['warm-binary'] ? undefined : freshBinary(nodeUnderTest().path, scratch.path)
    progress(fresh === undefined ? '  binary: as it is (warm page cache)' : `  binary: a fresh copy, ${fixed(fresh.cachedMB, 1)} MB of it in the page cache`)
    const upstream = await startUpstream(pin.upstream)
    const proxy = await startProxy({
      ...(fresh === undefined ? {} : { node: fresh.path }),
      upstreamUrl: upstream.url, logLevel: values.level, logFile: join(scratch.path, 'proxy.log'), cwd: scratch.path, core: pin.sut,
      nodeArgs, env, build, ...(cgroup === undefined ? {} : { cgroup: cgroup.dir }),
    })
    const pid = proxy.child.pid
    // What Node made of the limit: V8's heap limit, read by the proxy's own flags and environment in the same cgroup.
    const heapLimitMiB = probeHeapLimit(build, nodeArgs, env, cgroup?.dir)
    progress(`  proxy ready (pid ${pid}); V8 heap limit under these settings: ${fixed(heapLimitMiB, 0)} MiB`)
    const watch = watchMemory(pid, cgroup, progress)
    const { samples } = watch
    const cpu0 = cpuTicks(pid)
    let r, burstRun, attacks
    let cpuSoak = Number.NaN
    try {
      r = await runLoad({ ...workloadLoad(workload, proxy.url, connections, minutes * 60), timeoutSeconds })
      cpuSoak = existsSync(`/proc/${pid}`) ? cpuTicks(pid) : Number.NaN
      if (burst.minutes > 0) {
        watch.phase = 'burst'
        progress(`  burst: ${burst.connections} connections for ${burst.minutes} min`)
        burstRun = await runLoad({ ...workloadLoad(workload, proxy.url, burst.connections, burst.minutes * 60), timeoutSeconds })
      }
      if (attackSeconds > 0) {
        watch.phase = 'attacks'
        progress(`  attacks for ${attackSeconds} s, /healthz probed once a second`)
        attacks = await attackPhase(Number(new URL(proxy.url).port), proxy.adminPort ?? 0, attackSeconds)
      }
    } finally {
      watch.stop()
    }
    const alive = watch.alive && existsSync(`/proc/${pid}`) && proxy.child.exitCode === undefined
    const cpuMsPer1k = (cpuSoak - cpu0) * 1000 / m.clockTicks / r.requests * 1000
    const phaseMax = (p: Phase, f: (x: Sample) => number): number => {
      const xs = samples.filter(x => x.phase === p).map(f)
      return xs.length === 0 ? Number.NaN : Math.max(...xs) // NaN: a phase not run
    }
    const healthy = attacks === undefined ? undefined : attacks.probes.filter(x => x === 200).length
    const peakRssMB = alive ? vmMB(pid, 'VmHWM') : Number.NaN
    const result = {
      schema: 1,
      startedAt: started.toISOString(),
      finishedAt: new Date().toISOString(),
      command: ['npm run bench:soak --', ...process.argv.slice(2)].join(' ').replace(/ --$/, ''),
      commit: gitCommit(),
      machine: m,
      loadAverage: { start: load0, end: read('/proc/loadavg').split(' ').slice(0, 3).join(' ') },
      proxy: build.description,
      nodeArgs,
      env,
      workload,
      minutes,
      connections,
      limitMiB: limitMiB ?? null,
      binary: fresh === undefined ? 'warm' : 'fresh',
      cgroupVersion: cgroup?.version ?? null,
      heapLimitMiB,
      proxyAliveAtEnd: alive,
      proxyExitCode: proxy.child.exitCode ?? null,
      peakRssMB,
      cgroupPeakMB: cgroup === undefined ? null : cgroup.peak() / 1e6,
      maxWorkingSetMB: cgroup === undefined ? null : samples.length === 0 ? Number.NaN : Math.max(...samples.map(x => x.workingSetMB)),
      failcnt: cgroup?.failcnt() ?? null,
      oomKills: cgroup?.oomKills() ?? null,
      requests: r.requests,
      rps: r.rps,
      answerMiBps: r.bytes / r.seconds / MiB,
      cpuMsPer1k,
      non2xx: r.non2xx,
      timeoutSeconds,
      burst: burstRun === undefined ? null : { ...burst, requests: burstRun.requests, non2xx: burstRun.non2xx, errors: burstRun.errors, failures: burstRun.failures, latencyMs: burstRun.latency, firstOnConnectionMs: burstRun.firstOnConnection },
      attacks: attacks ?? null,
      maxWorkingSetMBByPhase: Object.fromEntries((['soak', 'burst', 'attacks'] as const).map(p => [p, phaseMax(p, x => x.workingSetMB)])),
      maxUsageMBByPhase: Object.fromEntries((['soak', 'burst', 'attacks'] as const).map(p => [p, phaseMax(p, x => x.usageMB)])),
      errors: r.errors,
      failures: r.failures,
      latencyMs: r.latency,
      firstOnConnectionMs: r.firstOnConnection,
      samples: samples.map(x => [Math.round(x.s), x.phase, +x.rssMB.toFixed(1), +x.usageMB.toFixed(1), +x.workingSetMB.toFixed(1)]),
    }
    /** The largest RSS sampled in each quarter of the run: a leak climbs from quarter to quarter, a saw-tooth does not. */
    const quarter = (q: number): number => {
      const T = minutes * 60
      const xs = samples.filter(x => x.phase === 'soak' && x.s >= q * T && x.s < (q + 0.25) * T).map(x => x.rssMB)
      return xs.length === 0 ? Number.NaN : Math.max(...xs)
    }
    await stopChild(proxy.child)
    await stopAll()
    removeCgroup()
    process.stdout.write([
      `# soak: ${workload} requests, ${connections} connections, ${minutes} min, ${limitMiB === undefined ? 'no memory limit' : `memory cgroup v${cgroup?.version} limit ${limitMiB} MiB`} (${started.toISOString()}${result.commit === undefined ? '' : `, commit ${result.commit}`})`,
      `machine: ${m.cpuModel}, ${m.cores} cores, Node ${m.node}; load average ${result.loadAverage.start} at the start, ${result.loadAverage.end} at the end`,
      `proxy: ${build.description}${nodeArgs.length > 0 ? `; added Node flags ${nodeArgs.join(' ')}` : ''}${Object.keys(env).length > 0 ? `; added environment ${Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''}`,
      `V8 heap limit: ${fixed(heapLimitMiB, 0)} MiB; binary: ${fresh === undefined ? 'as it is (page cache warm)' : 'a fresh copy (not in the page cache at the start)'}`,
      '',
      table(['figure', 'value'], [
        ['requests (req/s)', `${r.requests} (${fixed(r.rps, 0)})`],
        ...(workload === 'small' ? [] : [['answers received, MiB/s', fixed(result.answerMiBps, 1)]]),
        ['proxy CPU ms per 1,000 requests', fixed(cpuMsPer1k, 1)],
        [`failed requests (timeout ${timeoutSeconds} s)`, describeFailures(r.failures)],
        ['p50 / p99 / max latency, ms', `${fixed(r.latency.p50)} / ${fixed(r.latency.p99)} / ${fixed(r.latency.max, 0)}`],
        ['first request on a new connection, p50 / max ms', `${fixed(r.firstOnConnection.p50)} / ${fixed(r.firstOnConnection.max, 0)}`],
        ['proxy alive at the end', alive ? 'yes' : `NO (${proxy.child.exitCode === null ? `killed by ${String(proxy.child.proc.signalCode)}` : `exit ${String(proxy.child.exitCode)}`})`],
        ['proxy peak RSS (VmHWM), MB', fixed(peakRssMB, 1)],
        ...(cgroup === undefined
          ? []
          : [
              [`cgroup peak usage (${cgroup.version === 1 ? 'memory.max_usage_in_bytes' : 'memory.peak'}), MB`, fixed(result.cgroupPeakMB ?? Number.NaN, 1)],
              ['max working set (usage − inactive file), MB', fixed(result.maxWorkingSetMB ?? Number.NaN, 1)],
              [cgroup.version === 1 ? 'memory.failcnt' : 'memory.events max', String(result.failcnt)],
              ['OOM kills', String(result.oomKills)],
            ]),
        ['max RSS per quarter of the soak, MB', [0, 0.25, 0.5, 0.75].map(q => fixed(quarter(q), 1)).join(' / ')],
        ...(burstRun === undefined
          ? []
          : [
              [`burst, ${burst.connections} connections ${burst.minutes} min: requests`, String(burstRun.requests)],
              ['burst: failed requests', describeFailures(burstRun.failures)],
              ['burst: p50 / p99 / max latency, ms', `${fixed(burstRun.latency.p50)} / ${fixed(burstRun.latency.p99)} / ${fixed(burstRun.latency.max, 0)}`],
              ['burst: first request on a new connection, p50 / max ms', `${fixed(burstRun.firstOnConnection.p50)} / ${fixed(burstRun.firstOnConnection.max, 0)}`],
            ]),
        ...(attacks === undefined ? [] : [[`attacks, ${fixed(attacks.seconds, 0)} s: /healthz answered 200`, `${healthy ?? 0} of ${attacks.probes.length} (${attacks.trickled} trickling connections opened)`]]),
        ...(cgroup === undefined ? [] : [['max working set, MB: soak / burst / attacks', (['soak', 'burst', 'attacks'] as const).map(p => fixed(phaseMax(p, x => x.workingSetMB), 1)).join(' / ')]]),
      ]),
    ].join('\n') + '\n')
    const dir = join(BENCH_DIR, 'results')
    mkdirSync(dir, { recursive: true })
    const name = values.out ?? `${started.toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-')}-soak.json`
    const file = isAbsolute(name) ? name : join(dir, name)
    writeFileSync(file, JSON.stringify(result, null, 2) + '\n')
    progress(`results: ${isAbsolute(name) ? name : `bench/results/${name}`}`)
    const failed = failureCount(r.failures) + (burstRun === undefined ? 0 : failureCount(burstRun.failures))
    if (!alive || (result.oomKills ?? 0) > 0 || failed > 0 || (attacks !== undefined && healthy !== attacks.probes.length)) process.exitCode = 1
  } finally {
    await stopAll()
    removeCgroup()
    scratch.remove()
  }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`soak: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
