// The machine and where each process runs: the CPU, pinning to cores with
// taskset, /proc accounting (Linux) and the noise other processes make.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { availableParallelism, cpus } from 'node:os'
import { monitorEventLoopDelay } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import { nodeUnderTest } from './node.js'

export interface Machine {
  readonly cpuModel: string
  readonly cores: number
  readonly node: string
  readonly platform: string
  readonly clockTicks: number
}

function clockTicks (): number {
  try {
    const n = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim())
    return Number.isInteger(n) && n > 0 ? n : 100
  } catch {
    return 100 // USER_HZ on every Linux in practice
  }
}

const CLOCK_TICKS = clockTicks()

export function machine (): Machine {
  let cpuModel = cpus()[0]?.model ?? 'unknown'
  try {
    const line = readFileSync('/proc/cpuinfo', 'utf8').split('\n').find(l => l.startsWith('model name'))
    if (line !== undefined) cpuModel = line.slice(line.indexOf(':') + 1).trim()
  } catch { /* not Linux: os.cpus() is as good */ }
  return { cpuModel, cores: availableParallelism(), node: nodeUnderTest().version, platform: `${process.platform} ${process.arch}`, clockTicks: CLOCK_TICKS }
}

/**
 * The server under test (proxy, floor, or the upstream when measured
 * directly) gets core 1 to itself; the load generator (this process) gets core
 * 0, and the upstream core 2 when there is one, else core 0 as well.
 */
export interface Pinning {
  readonly enabled: boolean
  readonly loadgen?: number
  readonly upstream?: number
  readonly sut?: number
  readonly description: string
}

function hasTaskset (): boolean {
  try {
    execFileSync('taskset', ['-V'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

export function choosePinning (cores: number, wanted: boolean): Pinning {
  if (!wanted) return { enabled: false, description: 'not pinned (--no-pin)' }
  if (process.platform !== 'linux' || !hasTaskset()) return { enabled: false, description: 'not pinned (no taskset)' }
  if (cores < 2) return { enabled: false, description: 'not pinned (1 core)' }
  const upstream = cores >= 3 ? 2 : 0
  return {
    enabled: true,
    loadgen: 0,
    upstream,
    sut: 1,
    description: `server under test on core 1 alone; load generator on core 0; upstream on core ${upstream}` +
      ' (moved to core 1 while it is measured directly)',
  }
}

/** Sets the CPU affinity of every thread of a running process. */
export function pinProcess (pid: number, core: number | undefined): void {
  if (core === undefined) return
  execFileSync('taskset', ['-a', '-p', '-c', String(core), String(pid)], { stdio: 'ignore' })
}

// ---------------------------------------------------------------------------
// /proc accounting (Linux).

/** utime + stime of a process, in clock ticks. */
export function cpuTicks (pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  // The command name (field 2) is in parentheses and may contain spaces.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return Number(fields[11]) + Number(fields[12]) // fields 14 and 15 of proc(5)
}

export function cpuMs (pid: number): number {
  return cpuTicks(pid) * 1000 / CLOCK_TICKS
}

/**
 * A `Vm*` line of /proc/<pid>/status in MB (10^6 bytes, the unit; the
 * kernel's "kB" is KiB). VmHWM is the peak RSS over the process's whole life.
 */
export function vmMB (pid: number, field: 'VmRSS' | 'VmHWM' | 'RssAnon' | 'RssFile'): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)
  return match?.[1] === undefined ? Number.NaN : Number(match[1]) * 1024 / 1e6
}

/**
 * Busy ticks of the whole machine (user, nice, system, irq, softirq, steal:
 * everything but idle and iowait), from /proc/stat. Less what our own
 * processes used, it says how much else ran during a measurement: on a
 * shared machine, that is the noise in the figures.
 */
export function machineBusyTicks (): number {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] ?? ''
  const [, user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = line.trim().split(/\s+/).map(Number)
  return user + nice + system + irq + softirq + steal
}

/** Ticks the hypervisor took from this machine's cores (steal, /proc/stat); 0 where there is none. */
function stealTicks (): number {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] ?? ''
  return Number(line.trim().split(/\s+/)[8] ?? 0)
}

/** How the load generator and the machine fared during one run. */
export interface GeneratorHealth {
  /** The generator's event-loop delay, ms: the p99 and the worst over its 1 ms timer samples. */
  readonly loopP99Ms: number
  readonly loopMaxMs: number
  /** How late its requests left after their due times, ms (the paced generator only). */
  readonly sendLateP99Ms?: number
  /** Cores' worth of time the hypervisor stole from the machine meanwhile. */
  readonly steal: number
  /** The generator was late by more than 1 ms in over 1 % of its samples or of its requests, or the hypervisor stole over 0.05 cores. */
  readonly stalled: boolean
}

/**
 * Starts watching the generator and the machine's steal time; the function
 * it returns stops and says how they fared. The generator is this process's
 * event loop (1 ms samples), unless the caller hands over what a generator
 * in its own process measured of itself (bench/paced.mjs). A generator that
 * stalls delays the answers it reads as much as the server would: a round
 * where it did is reported as such, not charged to the server.
 */
export function generatorProbe (ticksPerSecond: number): (own?: { readonly loopP99Ms: number, readonly loopMaxMs: number, readonly sendLateP99Ms: number }) => GeneratorHealth {
  const loop = monitorEventLoopDelay({ resolution: 1 })
  loop.enable()
  const steal0 = stealTicks()
  const t0 = performance.now()
  return own => {
    loop.disable()
    // Node records each sample as the whole interval between two timer turns: less the 1 ms asked for, the delay.
    const late = (ns: number): number => Math.max(0, ns / 1e6 - 1)
    const steal = (stealTicks() - steal0) / ticksPerSecond / ((performance.now() - t0) / 1000)
    const g = own ?? { loopP99Ms: late(loop.percentile(99)), loopMaxMs: late(loop.max) }
    const sendLate = own?.sendLateP99Ms ?? 0
    return { ...g, steal, stalled: g.loopP99Ms > 1 || sendLate > 1 || steal > 0.05 }
  }
}

/**
 * Starts counting; the function it returns gives the cores' worth of CPU that
 * processes other than `pids` and this one used since (machine busy ticks
 * less ours). Near 0 on a quiet machine.
 */
export function noiseProbe (pids: readonly number[], ticksPerSecond: number): () => number {
  const ours = (): number => pids.reduce((n, pid) => n + cpuTicks(pid), 0)
  const all0 = machineBusyTicks()
  const ours0 = ours()
  const me0 = process.cpuUsage()
  const t0 = performance.now()
  return () => {
    const me = process.cpuUsage(me0)
    const meTicks = (me.user + me.system) / 1e6 * ticksPerSecond
    const otherTicks = machineBusyTicks() - all0 - (ours() - ours0) - meTicks
    // Tick granularity makes small negative values possible.
    return Math.max(0, otherTicks / ticksPerSecond / ((performance.now() - t0) / 1000))
  }
}

/**
 * Waits (at most `maxMs`) for half a second in which other processes used
 * less than `maxCores`; returns how long it waited. Idle time is cheaper
 * than a measurement thrown away.
 */
export async function awaitQuiet (maxCores: number, maxMs: number, ticksPerSecond: number): Promise<number> {
  const t0 = performance.now()
  while (performance.now() - t0 < maxMs) {
    const others = noiseProbe([], ticksPerSecond)
    await sleep(500)
    if (others() < maxCores) break
  }
  return performance.now() - t0
}
