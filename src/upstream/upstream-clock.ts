// How far the upstream's clock is from this node's, read from the Date header
// of the upstream's answers. The upstream checks a token's timestamp against
// its own clock, within a window (the spec does not give its size; the mock
// API allows ±5 min): on a node whose clock is off every token is refused,
// and the upstream's 401 does not say why.
//
// Sign: upstream time minus local time, in seconds. Positive: the upstream is
// ahead, this node's clock is behind.
//
// Date has whole-second resolution and is stamped when the upstream writes
// the head of its answer, just before the proxy receives it: the upstream's
// clock read somewhere in [Date, Date + 1 s) at about the moment of receipt.
// So the estimate is Date + 0.5 s − local time at receipt, good to ±0.5 s
// plus the network's one-way delay. (The midpoint between sending and
// receiving would add half the upstream's processing time: seconds for a slow
// call.) A cached answer is older than its Date by its Age, which is added.
//
// The correction (COS_CLOCK_SKEW_CORRECTION) filters the samples as NTP
// filters its servers: one beyond COS_CLOCK_SKEW_MAX_SECONDS is refused (a
// Date of 2100 or 1970 is a broken upstream, not a clock to follow; logged at
// most once per interval, never once per answer), and the offset moves only
// when the last two samples agree, within the noise, with at least 3 of the
// last 5 and more than half of them: one odd answer, or two upstream
// instances whose clocks disagree, move nothing. The offset is the median of
// those that agree. So |offset| never exceeds the bound, and neither does how
// far ahead of this node's clock a timestamp can be held when the offset goes
// back (token-clock.ts holds them at 1 ns steps until the shifted time catches
// up: of all the ways back that keep timestamps strictly increasing, the
// quickest; a slew at any rate takes longer).
import type { IncomingHttpHeaders } from 'node:http'
import { performance } from 'node:perf_hooks'
import type { FastifyBaseLogger } from 'fastify'
import type { Route } from '../config/config.js'
import { mintingClock, type MintingClock } from '../token/token.js'
import type { Upstreams } from './upstream.js'

export interface ClockThresholds {
  /** A skew beyond this many seconds either way is reported (default 60). */
  readonly warnAfterS?: number
  /**
   * Seconds of skew that are measurement noise (default 2): Date's 1 s
   * resolution plus the network. Also the hysteresis of the report and the
   * least change of the correction, so neither flaps on a noisy estimate.
   */
  readonly noiseS?: number
  /** At most one Date parsed per this many ms (default 1000: Date changes once a second). */
  readonly sampleEveryMs?: number
  /** At most one line about samples beyond the bound per this many ms (default 60 000). */
  readonly refusalLogEveryMs?: number
}

export interface UpstreamClockOptions extends ClockThresholds {
  readonly logger: FastifyBaseLogger
  /** COS_CLOCK_SKEW_CORRECTION: move the minting clock's offset to the measured skew. */
  readonly correct: boolean
  /** COS_CLOCK_SKEW_MAX_SECONDS: a skew beyond this either way is not followed (default 600). */
  readonly maxCorrectionS?: number
  /** Monotonic ms (default performance.now): paces the lines about refused samples. */
  readonly monoMs?: () => number
  /** The clock tokens are stamped with, and local time is read from (default the process-wide one). */
  readonly clock?: MintingClock
  /** Each measurement, in seconds (the gauge). */
  readonly onMeasured?: (skewSeconds: number) => void
}

/** For log lines: 0.1 s is all the precision there is. */
function roundSeconds (ms: number): number {
  return Math.round(ms / 100) / 10
}

/** In words, to the second: the estimate is no finer (the field next to it has 0.1 s). */
function describeSkew (ms: number): string {
  return `${Math.round(Math.abs(ms) / 1000)} s ${ms > 0 ? 'ahead of' : 'behind'}`
}

/** An Age header in ms (RFC 9111 §5.1: delta-seconds); 0 when absent or not a number. */
function ageMs (age: unknown): number {
  return typeof age === 'string' && /^[0-9]{1,9}$/.test(age) ? Number(age) * 1000 : 0
}

/** Samples held for agreement, and how many of them must agree. */
const SAMPLES_HELD = 5
const SAMPLES_AGREEING = 3

/**
 * The skew a run of samples (oldest first) agrees on: the last two agree
 * within `noiseMs`, and with them at least `needed` of the samples and more
 * than half; their median (the upper one of an even count). Undefined when
 * they do not agree. Pure.
 */
export function agreedSkewMs (samples: readonly number[], needed: number, noiseMs: number): number | undefined {
  const n = samples.length
  if (n < needed || n < 2) return undefined
  const latest = samples[n - 1] as number
  if (Math.abs(latest - (samples[n - 2] as number)) > noiseMs) return undefined
  const agreeing = samples.filter(s => Math.abs(s - latest) <= noiseMs).sort((a, b) => a - b)
  if (agreeing.length < needed || agreeing.length * 2 <= n) return undefined
  return agreeing[agreeing.length >> 1]
}

export class UpstreamClock {
  /** Whether minted timestamps follow the upstream's clock. */
  readonly correcting: boolean
  readonly #logger: FastifyBaseLogger
  readonly #clock: MintingClock
  readonly #onMeasured: ((skewSeconds: number) => void) | undefined
  readonly #warnAfterMs: number
  readonly #noiseMs: number
  readonly #sampleEveryMs: number
  readonly #maxMs: number
  readonly #monoMs: () => number
  readonly #refusalLogEveryMs: number
  /** The last samples within the bound, oldest first (correcting only). */
  readonly #samples: number[] = []
  #skewMs: number | undefined
  #skewed = false
  #nextSampleAt = -Infinity
  /** Samples beyond the bound since the last line about them, and when the next line may be written. */
  #refused = 0
  #nextRefusalLogAt = -Infinity

  constructor (opts: UpstreamClockOptions) {
    this.correcting = opts.correct
    this.#logger = opts.logger
    this.#clock = opts.clock ?? mintingClock
    this.#onMeasured = opts.onMeasured
    this.#warnAfterMs = (opts.warnAfterS ?? 60) * 1000
    this.#noiseMs = (opts.noiseS ?? 2) * 1000
    this.#sampleEveryMs = opts.sampleEveryMs ?? 1000
    this.#maxMs = (opts.maxCorrectionS ?? 600) * 1000
    this.#monoMs = opts.monoMs ?? (() => performance.now())
    this.#refusalLogEveryMs = opts.refusalLogEveryMs ?? 60_000
    if (this.correcting) this.#clock.followSteps = true
  }

  /** Agreeing samples the correction needs before it moves: the reads at start take as many. */
  get samplesNeeded (): number {
    return SAMPLES_AGREEING
  }

  /** COS_CLOCK_SKEW_MAX_SECONDS. */
  get maxCorrectionS (): number {
    return this.#maxMs / 1000
  }

  /** Upstream time minus local time from the last measurement, in seconds; undefined before the first. */
  get skewSeconds (): number | undefined {
    return this.#skewMs === undefined ? undefined : this.#skewMs / 1000
  }

  /** Whether the last measurement put the skew beyond the warning threshold (with hysteresis). */
  get skewed (): boolean {
    return this.#skewed
  }

  get warnAfterS (): number {
    return this.#warnAfterMs / 1000
  }

  /**
   * For every upstream answer, on the hot path: one comparison, and a Date
   * parse at most once per sampleEveryMs. `nowMono` is performance.now().
   */
  observe (headers: IncomingHttpHeaders, nowMono: number): void {
    if (nowMono < this.#nextSampleAt) return
    this.#nextSampleAt = nowMono + this.#sampleEveryMs
    this.measure(headers.date, headers.age)
  }

  /** Reads one answer's Date (and Age) now; false when there was no usable Date. */
  measure (date: unknown, age: unknown): boolean {
    if (typeof date !== 'string') return false
    const dateMs = Date.parse(date)
    if (!Number.isFinite(dateMs)) return false
    const skewMs = dateMs + 500 + ageMs(age) - this.#clock.localMs()
    this.#skewMs = skewMs
    this.#onMeasured?.(skewMs / 1000)
    this.#report(skewMs)
    if (this.correcting) this.#correct(skewMs)
    return true
  }

  /** Gives the minting clock back as it was: no offset, steps not followed. */
  close (): void {
    if (!this.correcting) return
    this.#clock.offsetMs = 0
    this.#clock.followSteps = false
  }

  /** One line per change of state, never one per answer. */
  #report (skewMs: number): void {
    const abs = Math.abs(skewMs)
    const fields = { upstreamClockSkewSeconds: roundSeconds(skewMs), clockSkewCorrection: this.correcting }
    if (!this.#skewed && abs > this.#warnAfterMs) {
      this.#skewed = true
      this.#logger.warn(fields, `clock: the upstream's clock is ${describeSkew(skewMs)} this node's (from its Date header): ` +
        'the upstream refuses token timestamps outside its window. Check NTP on the node (timedatectl status, chronyc tracking)' +
        (!this.correcting
          ? '; if the clock cannot be fixed, COS_CLOCK_SKEW_CORRECTION=true shifts minted timestamps to the upstream\'s clock'
          : abs <= this.#maxMs
            ? '; COS_CLOCK_SKEW_CORRECTION is on: minted timestamps follow the upstream\'s clock'
            : `; COS_CLOCK_SKEW_CORRECTION is on but does not follow a skew beyond COS_CLOCK_SKEW_MAX_SECONDS (${this.maxCorrectionS} s)`))
    } else if (this.#skewed && abs < this.#warnAfterMs - this.#noiseMs) {
      this.#skewed = false
      this.#logger.info(fields, `clock ok: the upstream's clock agrees with this node's again (within ${this.warnAfterS} s)`)
    }
  }

  /**
   * A sample beyond the bound is refused; within it, it is held, and the
   * offset moves to what the samples held agree on, only when that has left
   * it by more than the noise, so it does not wander.
   */
  #correct (skewMs: number): void {
    const clock = this.#clock
    if (Math.abs(skewMs) > this.#maxMs) { this.#refuse(skewMs); return }
    if (this.#samples.push(skewMs) > SAMPLES_HELD) this.#samples.shift()
    const agreed = agreedSkewMs(this.#samples, SAMPLES_AGREEING, this.#noiseMs)
    if (agreed === undefined || Math.abs(agreed - clock.offsetMs) < this.#noiseMs) return
    const before = clock.offsetMs
    clock.offsetMs = Math.abs(agreed) < this.#noiseMs ? 0 : Math.round(agreed)
    const back = before - clock.offsetMs
    const fields = { clockOffsetSeconds: clock.offsetMs / 1000, previousClockOffsetSeconds: before / 1000 }
    this.#logger.info(fields, (clock.offsetMs === 0
      ? 'clock: COS_CLOCK_SKEW_CORRECTION: minted timestamps are no longer shifted'
      : `clock: COS_CLOCK_SKEW_CORRECTION: minted timestamps are shifted by ${clock.offsetMs > 0 ? '+' : ''}${roundSeconds(clock.offsetMs)} s to the upstream's clock`) +
      (back > 0 ? `; timestamps go on from the last one minted, 1 ns apart, until the shifted clock catches up (at most ${roundSeconds(back)} s)` : ''))
  }

  /** A sample beyond the bound: nothing moves; one line per interval says so, with how many since the last. */
  #refuse (skewMs: number): void {
    this.#refused++
    const now = this.#monoMs()
    if (now < this.#nextRefusalLogAt) return
    this.#nextRefusalLogAt = now + this.#refusalLogEveryMs
    this.#logger.warn({
      upstreamClockSkewSeconds: roundSeconds(skewMs),
      clockSkewMaxSeconds: this.maxCorrectionS,
      refusedSamples: this.#refused,
      clockOffsetSeconds: this.#clock.offsetMs / 1000,
    }, `clock: COS_CLOCK_SKEW_CORRECTION: the upstream's Date puts its clock ${describeSkew(skewMs)} this node's, beyond COS_CLOCK_SKEW_MAX_SECONDS (${this.maxCorrectionS} s): not followed, minted timestamps keep the shift they had. ` +
      'A clock that far off is more likely the upstream\'s (or a cache\'s) than this node\'s; if the upstream is right, fix the node\'s clock or raise COS_CLOCK_SKEW_MAX_SECONDS')
    this.#refused = 0
  }
}

/**
 * With the correction on, HEADs without credentials to each upstream origin
 * before the proxy takes requests (one after another, as many as the
 * correction needs to agree), so the first token already carries the
 * upstream's time. Measured from the first answers instead, a node whose
 * clock is ahead would have minted timestamps ahead already, and timestamps
 * never go back: those would hold the correction off for as long as the
 * clock is ahead. Failures are logged; the answers to requests measure then.
 */
export async function readUpstreamClocks (clock: UpstreamClock, upstreams: Upstreams, routes: readonly Route[], timeoutMs: number, logger: FastifyBaseLogger): Promise<void> {
  const paths = new Map<string, string>()
  for (const r of routes) if (!paths.has(r.origin)) paths.set(r.origin, r.basePath === '' ? '/' : r.basePath)
  await Promise.all([...paths].map(async ([origin, path]) => {
    try {
      for (let i = 0; i < clock.samplesNeeded; i++) {
        const res = await upstreams.dispatcherFor(origin).request({ origin, path, method: 'HEAD', signal: AbortSignal.timeout(timeoutMs) })
        await res.body.dump()
        if (!clock.measure(res.headers.date, res.headers.age)) {
          logger.warn({ upstream: origin }, 'clock: the upstream sends no Date header: its clock cannot be compared, and COS_CLOCK_SKEW_CORRECTION does nothing')
          return
        }
      }
    } catch (err) {
      logger.warn({ upstream: origin, problem: (err as Error).message }, 'clock: could not read the upstream\'s clock at start; the answers to requests will (COS_CLOCK_SKEW_CORRECTION)')
    }
  }))
}
