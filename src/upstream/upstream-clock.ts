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
import type { IncomingHttpHeaders } from 'node:http'
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
}

export interface UpstreamClockOptions extends ClockThresholds {
  readonly logger: FastifyBaseLogger
  /** COS_CLOCK_SKEW_CORRECTION: move the minting clock's offset to the measured skew. */
  readonly correct: boolean
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

export class UpstreamClock {
  /** Whether minted timestamps follow the upstream's clock. */
  readonly correcting: boolean
  readonly #logger: FastifyBaseLogger
  readonly #clock: MintingClock
  readonly #onMeasured: ((skewSeconds: number) => void) | undefined
  readonly #warnAfterMs: number
  readonly #noiseMs: number
  readonly #sampleEveryMs: number
  #skewMs: number | undefined
  #skewed = false
  #nextSampleAt = -Infinity

  constructor (opts: UpstreamClockOptions) {
    this.correcting = opts.correct
    this.#logger = opts.logger
    this.#clock = opts.clock ?? mintingClock
    this.#onMeasured = opts.onMeasured
    this.#warnAfterMs = (opts.warnAfterS ?? 60) * 1000
    this.#noiseMs = (opts.noiseS ?? 2) * 1000
    this.#sampleEveryMs = opts.sampleEveryMs ?? 1000
    if (this.correcting) this.#clock.followSteps = true
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
        (this.correcting
          ? '; COS_CLOCK_SKEW_CORRECTION is on: minted timestamps follow the upstream\'s clock'
          : '; if the clock cannot be fixed, COS_CLOCK_SKEW_CORRECTION=true shifts minted timestamps to the upstream\'s clock'))
    } else if (this.#skewed && abs < this.#warnAfterMs - this.#noiseMs) {
      this.#skewed = false
      this.#logger.info(fields, `clock ok: the upstream's clock agrees with this node's again (within ${this.warnAfterS} s)`)
    }
  }

  /** Moves the offset only when the estimate has left it by more than the noise, so it does not wander. */
  #correct (skewMs: number): void {
    const clock = this.#clock
    if (Math.abs(skewMs - clock.offsetMs) < this.#noiseMs) return
    clock.offsetMs = Math.abs(skewMs) < this.#noiseMs ? 0 : Math.round(skewMs)
    this.#logger.info({ clockOffsetSeconds: clock.offsetMs / 1000 }, clock.offsetMs === 0
      ? 'clock: COS_CLOCK_SKEW_CORRECTION: minted timestamps are no longer shifted'
      : `clock: COS_CLOCK_SKEW_CORRECTION: minted timestamps are shifted by ${clock.offsetMs > 0 ? '+' : ''}${roundSeconds(clock.offsetMs)} s to the upstream's clock`)
  }
}

/**
 * With the correction on, one HEAD without credentials to each upstream
 * origin before the proxy takes requests, so the first token already carries
 * the upstream's time. Measured from the first answers instead, a node whose
 * clock is ahead would have minted timestamps ahead already, and timestamps
 * never go back: those would hold the correction off for as long as the
 * clock is ahead. Failures are logged; the answers to requests measure then.
 */
export async function readUpstreamClocks (clock: UpstreamClock, upstreams: Upstreams, routes: readonly Route[], timeoutMs: number, logger: FastifyBaseLogger): Promise<void> {
  const paths = new Map<string, string>()
  for (const r of routes) if (!paths.has(r.origin)) paths.set(r.origin, r.basePath === '' ? '/' : r.basePath)
  await Promise.all([...paths].map(async ([origin, path]) => {
    try {
      const res = await upstreams.dispatcherFor(origin).request({ origin, path, method: 'HEAD', signal: AbortSignal.timeout(timeoutMs) })
      await res.body.dump()
      if (!clock.measure(res.headers.date, res.headers.age)) logger.warn({ upstream: origin }, 'clock: the upstream sends no Date header: its clock cannot be compared, and COS_CLOCK_SKEW_CORRECTION does nothing')
    } catch (err) {
      logger.warn({ upstream: origin, problem: (err as Error).message }, 'clock: could not read the upstream\'s clock at start; the answers to requests will (COS_CLOCK_SKEW_CORRECTION)')
    }
  }))
}
