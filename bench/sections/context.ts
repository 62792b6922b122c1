// What every section of `npm run bench` shares: the settings of a full and a
// quick run, the servers measured and their labels, the noise budget, and
// the context the sections run in.
import { fixed } from '../format.js'
import type { GoSigner } from '../go-signer.js'
import type { Build } from '../image.js'
import { awaitQuiet, type Machine, type Pinning } from '../support/machine.js'
import type { Upstream } from '../support/servers.js'

export const SECTIONS = ['idle', 'small', 'big', 'rate', 'soak', 'mint'] as const
export type Section = typeof SECTIONS[number]

export interface Settings {
  readonly rounds: number
  /** Seconds per throughput measurement, and of the warm-up before it. */
  readonly seconds: number
  readonly warmupSeconds: number
  readonly connections: readonly number[]
  readonly bigSeconds: number
  readonly bigWarmupSeconds: number
  readonly bigConnections: number
  readonly rate: number
  readonly rateSeconds: number
  readonly soakRequests: number
  /** RSS is read after this many soak requests, and again at the end. */
  readonly soakCheckpoint: number
  readonly soakConnections: number
  /** Idle: requests after start, then seconds of quiet, before RSS is read. */
  readonly idleRequests: number
  readonly idleSettleSeconds: number
  /** Extra time the run may spend waiting for, or repeating after, other processes' load (see Noise). */
  readonly noiseBudgetSeconds: number
}

export const FULL: Settings = {
  rounds: 3, seconds: 6, warmupSeconds: 1.5, connections: [32, 256],
  bigSeconds: 4, bigWarmupSeconds: 0.5, bigConnections: 32,
  rate: 1000, rateSeconds: 4,
  soakRequests: 20_000, soakCheckpoint: 2_000, soakConnections: 32,
  idleRequests: 50, idleSettleSeconds: 5,
  noiseBudgetSeconds: 60,
}
export const QUICK: Settings = {
  ...FULL,
  rounds: 1, seconds: 1, warmupSeconds: 0.5,
  bigSeconds: 1, bigWarmupSeconds: 0.3,
  rateSeconds: 1,
  noiseBudgetSeconds: 0,
}

export const progress = (s: string): void => { process.stderr.write(s + '\n') }

/** Cores' worth of CPU other processes may use during a measurement before it counts as disturbed. */
const MAX_NOISE = 0.1

/**
 * For a shared machine (a CI runner, a laptop with a build going): before
 * each measurement wait for a quiet half second (at most 15 s), and measure
 * once more when other processes used over MAX_NOISE cores meanwhile; all
 * of it within one time budget, so a machine that never quietens costs at
 * most that much extra. Whatever was measured last is kept, with its noise.
 */
export class Noise {
  #budgetMs: number
  waitedMs = 0
  repeats = 0
  readonly #ticks: number
  constructor (budgetMs: number, clockTicks: number) {
    this.#budgetMs = budgetMs
    this.#ticks = clockTicks
  }

  async settle (): Promise<void> {
    if (this.#budgetMs <= 0) return
    const waited = await awaitQuiet(MAX_NOISE, Math.min(15_000, this.#budgetMs), this.#ticks)
    this.#budgetMs -= waited
    this.waitedMs += waited
  }

  /** Whether to measure again after attempt `attempt`, which took `ms` while others used `otherLoad` cores. */
  again (otherLoad: number, ms: number, attempt: number): boolean {
    if (otherLoad <= MAX_NOISE || attempt >= 2 || this.#budgetMs <= 0) return false
    this.#budgetMs -= ms
    this.repeats++
    progress(`    other processes used ${fixed(otherLoad, 2)} cores meanwhile: measuring again`)
    return true
  }
}

export type Target = 'proxy' | 'floor' | 'go' | 'direct' | 'proxy-all' | 'floor-image'
export const LABEL: Readonly<Record<Target, string>> = { proxy: 'proxy (defaults)', floor: 'floor', go: 'Go signer', direct: 'direct', 'proxy-all': 'proxy (COS_ACCESS_LOG=all)', 'floor-image': 'floor (image\'s Node flags)' }
/** Servers that start fresh for a measurement (the upstream, measured directly, does not). */
export type Fresh = 'proxy' | 'floor' | 'go'

/** The proxy measured: which build, and what the command line adds to its Node flags and environment. */
export interface ProxyUnderTest {
  readonly build: Build
  readonly nodeArgs: readonly string[]
  readonly extraEnv: Readonly<Record<string, string>>
}

export interface Context {
  readonly machine: Machine
  readonly pin: Pinning
  readonly upstream: Upstream
  readonly scratch: string
  readonly noise: Noise
  /** Built and checked (see goYardstick), or why it is skipped. */
  readonly goSigner: GoSigner & { readonly checked?: string }
  readonly settings: Settings
  readonly quick: boolean
  readonly proxy: ProxyUnderTest
}
