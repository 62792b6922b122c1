// An upstream 401 or 403 passes through unchanged, and says nothing about
// why. The usual causes are on this side: a clock that is off, or a key pair
// rotated on one side only. One warning per interval (never one per request:
// an upstream that refuses everything would flood the log) says what the
// proxy knows: the access key in force and since when, the measured clock
// skew, and what a fresh read of the credential files found. Never the token,
// its signature or the secret: the line is built from identifiers and
// numbers only.
import { performance } from 'node:perf_hooks'
import type { FastifyBaseLogger } from 'fastify'
import { addTraceFields } from '../client/trace-context.js'
import type { RouteName } from '../config/config.js'
import type { ReloadOutcome } from '../credentials/credential-watcher.js'
import { accessKeyHint, type CredentialStore } from '../credentials/credentials.js'
import type { HeaderMinter } from '../token/token.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'

export type RefusalStatus = 401 | 403

export interface AuthRefusalOptions {
  readonly store: CredentialStore
  readonly clock: UpstreamClock
  readonly logger: FastifyBaseLogger
  /** Re-reads the credential files, sharing any read under way; unset when the pair comes from literal values. */
  readonly reread?: () => Promise<ReloadOutcome>
  /** At most one warning per this many ms (default 60 000). */
  readonly intervalMs?: number
}

/**
 * What a fresh read of the files found: `applied` when the pair in force is
 * no longer the one the refused request was signed with (whichever read
 * found it); `not_files` when the pair comes from literal values.
 */
type RereadResult = ReloadOutcome['result'] | 'not_files' | 'failed'

/** What the hint is built from. */
export interface RefusalFacts {
  readonly status: RefusalStatus
  readonly accessKey: string | undefined
  readonly skewSeconds: number | undefined
  readonly skewed: boolean
  readonly correcting: boolean
  /** COS_CLOCK_SKEW_MAX_SECONDS: the correction does not follow a skew beyond it. */
  readonly maxCorrectionS?: number
  readonly warnAfterS: number
  readonly reread: ReloadOutcome | undefined
  readonly fromFiles: boolean
  readonly encoding: string | undefined
}

function clockState (f: RefusalFacts): string {
  if (f.skewSeconds === undefined) return 'the clock skew is unknown (no Date header from the upstream yet)'
  if (f.skewed && f.correcting) return 'the clock is off but COS_CLOCK_SKEW_CORRECTION shifts timestamps to the upstream\'s'
  const s = Math.round(Math.abs(f.skewSeconds))
  // Date has 1 s resolution: 2 s is as close as agreement can be told.
  return s <= 2 ? 'the clocks agree' : `the clocks differ by ${s} s (under the ${f.warnAfterS} s this proxy warns at)`
}

/** The likeliest cause first, and what to do about it. */
export function refusalHint (f: RefusalFacts): string {
  const key = `access key ${f.accessKey === undefined ? '(none)' : accessKeyHint(f.accessKey)}`
  const beyond = f.correcting && f.maxCorrectionS !== undefined && f.skewSeconds !== undefined && Math.abs(f.skewSeconds) > f.maxCorrectionS
  if (f.skewed && (!f.correcting || beyond) && f.skewSeconds !== undefined) {
    const s = Math.round(f.skewSeconds)
    const clock = `the upstream's clock is ${Math.abs(s)} s ${s > 0 ? 'ahead of' : 'behind'} this node's`
    return beyond
      ? `${clock}, beyond the COS_CLOCK_SKEW_MAX_SECONDS (${f.maxCorrectionS ?? 0} s) the correction follows, so token timestamps fall outside its window: fix the node's clock (NTP), or raise COS_CLOCK_SKEW_MAX_SECONDS if the upstream's clock is the right one`
      : `${clock}, so token timestamps fall outside its window: fix the node's clock (NTP), or set COS_CLOCK_SKEW_CORRECTION=true`
  }
  const r = f.reread
  if (r?.result === 'applied') {
    return `a re-read of the credential files found a different key pair and put it in force (access key ${accessKeyHint(r.accessKey)}): the key was rotated and the proxy had not seen it yet; requests now use the new pair`
  }
  if (r?.result === 'rejected') {
    return `the credential files cannot be used (${r.variable} ${r.problem}), so the pair in force (${key}) stays: fix the mounted Secret`
  }
  const source = f.fromFiles ? 'the pair in force is the one in the credential files' : 'the pair comes from COS_ACCESS_KEY / COS_ACCESS_KEY_SECRET'
  const compare = f.fromFiles ? 'compare the mounted Secret with the key issued for this API' : 'compare COS_ACCESS_KEY and COS_ACCESS_KEY_SECRET with the pair issued for this API'
  const checks = `check that the upstream knows ${key} (rotated or revoked on one side only? ${compare}) and that COS_TOKEN_ENCODING=${f.encoding ?? 'url'} is the form it expects`
  if (f.status === 403) return `${source} and ${clockState(f)}: a 403 usually means ${key} lacks the permission for this operation (RBAC); if every call gets it, ${checks}`
  return `${source} and ${clockState(f)}: ${checks}`
}

export class AuthRefusals {
  readonly #opts: AuthRefusalOptions
  readonly #intervalMs: number
  #lastWarning = -Infinity
  #refusals = 0

  constructor (opts: AuthRefusalOptions) {
    this.#opts = opts
    this.#intervalMs = opts.intervalMs ?? 60_000
  }

  /** An upstream answered 401 or 403. Cheap until a warning is due; the warning is written once the re-read is done. */
  refused (route: RouteName, status: RefusalStatus, traceparent?: string | string[]): void {
    this.#refusals++
    const now = performance.now()
    if (now - this.#lastWarning < this.#intervalMs) return
    this.#lastWarning = now
    const refusals = this.#refusals
    this.#refusals = 0
    // Taken now, before any read ends: the 401 has already asked the watcher
    // for a read (retry.ts), and that one may be the read that finds the new pair.
    const before = this.#opts.store.current
    this.#warn(route, status, refusals, before, traceparent).catch((err: unknown) => {
      this.#opts.logger.error({ err }, 'auth: diagnosing an upstream refusal failed')
    })
  }

  /** Reads the files again and compares the pair in force with the one the refused request was signed with. */
  async #reread (before: HeaderMinter | undefined): Promise<{ readonly result: RereadResult, readonly outcome?: ReloadOutcome }> {
    const { reread, store } = this.#opts
    if (reread === undefined) return { result: 'not_files' }
    let outcome: ReloadOutcome
    try {
      outcome = await reread()
    } catch {
      return { result: 'failed' }
    }
    if (outcome.result === 'rejected') return { result: 'rejected', outcome }
    const after = store.current
    if (after !== undefined && (before === undefined || !before.samePair(after))) {
      return { result: 'applied', outcome: { result: 'applied', accessKey: after.accessKey } }
    }
    return { result: 'unchanged', outcome: { result: 'unchanged' } }
  }

  async #warn (route: RouteName, status: RefusalStatus, refusals: number, before: HeaderMinter | undefined, traceparent: string | string[] | undefined): Promise<void> {
    const { store, clock, logger } = this.#opts
    const { result, outcome } = await this.#reread(before)
    const minter = store.current
    const skew = clock.skewSeconds
    const hint = refusalHint({
      status,
      accessKey: minter?.accessKey,
      skewSeconds: skew,
      skewed: clock.skewed,
      correcting: clock.correcting,
      maxCorrectionS: clock.maxCorrectionS,
      warnAfterS: clock.warnAfterS,
      reread: outcome,
      fromFiles: this.#opts.reread !== undefined,
      encoding: minter?.encoding,
    })
    // The trace context of the refusal that made the warning due (the `refusals` before it were counted, not logged).
    logger.warn(addTraceFields({
      status,
      route,
      accessKey: minter === undefined ? null : accessKeyHint(minter.accessKey),
      keyLoadedAt: store.loadedAt?.toISOString() ?? null,
      upstreamClockSkewSeconds: skew === undefined ? null : Math.round(skew * 10) / 10,
      clockSkewCorrection: clock.correcting,
      reread: result,
      ...(result === 'applied' ? { previousAccessKey: before === undefined ? null : accessKeyHint(before.accessKey) } : {}),
      refusals,
    }, traceparent), `auth: the upstream answered ${status}${status === 401 ? ' (token refused)' : ' (forbidden)'}: ${hint}`)
  }
}
