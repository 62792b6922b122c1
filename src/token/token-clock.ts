// The timestamps and nonces tokens are minted with: a strictly increasing
// nanosecond clock (with the offset COS_CLOCK_SKEW_CORRECTION moves) and
// CSPRNG nonces. Pure as token.ts is: clocks are injected where a test pins them.
import { randomFillSync } from 'node:crypto'
import { performance } from 'node:perf_hooks'

/** Current wall-clock time in ns; millisecond resolution. For checks, not minting. */
export function wallClockNs (): bigint {
  return BigInt(Date.now()) * 1_000_000n
}

export interface TimestampSourceOptions {
  /** Integer ms since the epoch (default Date.now). */
  readonly wallMs?: () => number
  /** Monotonic ms with sub-ms fraction (default performance.now). */
  readonly monoMs?: () => number
  /** How often the monotonic clock is re-anchored to the wall clock, so NTP slews are followed. */
  readonly reanchorMs?: number
}

/**
 * The clock tokens are stamped with: the local clock, plus an offset that is
 * 0 unless COS_CLOCK_SKEW_CORRECTION moves it to the upstream's clock.
 */
export interface MintingClock {
  /**
   * Whole milliseconds added to the local clock in every timestamp (so
   * whole nanoseconds too). A change takes effect at the next timestamp;
   * one that goes back holds timestamps at 1 ns steps until the shifted time
   * catches up, as a wall clock stepped back does. Of the ways back that
   * never repeat a timestamp the quickest (a slew takes longer at any rate);
   * upstream-clock.ts keeps the offset within COS_CLOCK_SKEW_MAX_SECONDS, so
   * no hold leaves timestamps further ahead of the local clock than that.
   */
  offsetMs: number
  /**
   * Set while the offset tracks another clock (the upstream's): a step of the
   * local wall clock is then taken out of the offset, so timestamps stay on
   * that clock. Without this, NTP fixing a clock that was 5 min behind would
   * push timestamps 5 min ahead until the offset is measured again, and the
   * hold that follows would keep them there for 5 min.
   */
  followSteps: boolean
  /** The local time timestamps are built from, before the offset: ms since the epoch, fractional. */
  readonly localMs: () => number
  /** The next timestamp: ns since the epoch, decimal, strictly increasing for the life of the clock. */
  readonly next: () => string
}

// A wall clock that moved this far from where the monotonic clock says it
// should be was stepped (NTP slews by at most 0.5 ms per second).
const STEP_MS = 1000

/**
 * Nanoseconds since the Unix epoch, as a decimal string, strictly increasing
 * for the life of the clock. Wall time gives the milliseconds; the monotonic
 * clock gives the ns within them. Kept as two doubles (ms, ns-in-ms), since a
 * double cannot hold ~1.7e18 exactly and a BigInt per request costs more.
 * If the wall clock steps back (or the offset does), values keep increasing
 * by 1 ns until real time catches up: a replay window on the server never
 * sees a timestamp repeat.
 */
export function createMintingClock (opts: TimestampSourceOptions = {}): MintingClock {
  const wallMs = opts.wallMs ?? Date.now
  const monoMs = opts.monoMs ?? (() => performance.now())
  const reanchorMs = opts.reanchorMs ?? 1000
  let anchorWall = wallMs()
  let anchorMono = monoMs()
  let lastMs = 0
  let lastSub = -1

  /** The monotonic time now, re-anchored to the wall clock when due. */
  function monoNow (): number {
    const mono = monoMs()
    if (mono - anchorMono < reanchorMs && mono >= anchorMono) return mono
    const wall = wallMs()
    const now = monoMs()
    // Where the wall clock would be had it kept pace with the monotonic one
    // (meaningless if the monotonic clock went back).
    const step = mono < anchorMono ? 0 : Math.round(wall - (anchorWall + (now - anchorMono)))
    if (clock.followSteps && (step >= STEP_MS || step <= -STEP_MS)) clock.offsetMs -= step
    anchorWall = wall
    anchorMono = now
    return now
  }

  const clock: MintingClock = {
    offsetMs: 0,
    followSteps: false,
    localMs: () => {
      const mono = monoNow()
      return anchorWall + (mono - anchorMono)
    },
    next: () => {
      const elapsedNs = Math.floor((monoNow() - anchorMono) * 1e6)
      let ms = anchorWall + clock.offsetMs + Math.floor(elapsedNs / 1e6)
      let sub = elapsedNs % 1e6
      if (ms < lastMs || (ms === lastMs && sub <= lastSub)) {
        ms = lastMs
        sub = lastSub + 1
        if (sub === 1e6) { ms += 1; sub = 0 }
      }
      lastMs = ms
      lastSub = sub
      return ms.toString() + sub.toString().padStart(6, '0')
    },
  }
  return clock
}

/** A minting clock's timestamps alone (no offset). */
export function createTimestampSource (opts: TimestampSourceOptions = {}): () => string {
  return createMintingClock(opts).next
}

const NONCE_BYTES = 16

/**
 * 32 lowercase hex characters from the CSPRNG. Random bytes are drawn a pool
 * at a time (one syscall per 256 nonces) and turned into hex at once; each
 * slice is used once. (Hex per nonce cost ~70 ns more, measured on Node 24.)
 */
export function createNonceSource (poolNonces = 256): () => string {
  const pool = Buffer.allocUnsafeSlow(NONCE_BYTES * poolNonces)
  const width = NONCE_BYTES * 2
  let hex = ''
  let offset = 0
  return function nextNonce (): string {
    if (offset === hex.length) {
      randomFillSync(pool)
      hex = pool.toString('hex')
      offset = 0
    }
    const nonce = hex.slice(offset, offset + width)
    offset += width
    return nonce
  }
}
