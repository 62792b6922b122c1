// What a look of the mounted-file watcher (mounted-files.ts) ends in, and the
// two things every consumer does alike with it: `parsed`, a parser's
// ConfigError (or a refusal the consumer blames on its files) as the
// watcher's `Parsed` refusal; `reportOnce`, a consumer's `report` told each
// new value, and each failure the first time only (the watcher says which are
// `repeated`), so a bad file is logged and counted once.
import { ConfigError } from '../config/config.js'
import type { FileRefusal } from './bounded-file.js'

export type ReadRefusal = FileRefusal | 'read_timeout'

export type Parsed<T> = { readonly ok: true, readonly value: T } | { readonly ok: false, readonly variable: string, readonly problem: string }

export interface MountedFailure {
  readonly result: 'rejected' | 'unreadable'
  readonly variable: string
  readonly problem: string
  /** The file was refused unread (what is at the path), or its read did not end in time. */
  readonly refusal?: ReadRefusal
  /** The same bytes, or the same read failure, as the last outcome: already reported. */
  readonly repeated: boolean
}

export type MountedOutcome<T> =
  | { readonly result: 'applied', readonly value: T }
  /** `recovered`: the files are back to the value in force after failures were reported. */
  | { readonly result: 'unchanged', readonly recovered: boolean }
  | MountedFailure

/**
 * `parse()`'s value, or what it threw as a refusal: a ConfigError names its
 * setting and its message is the reason (the setting first, as at start);
 * any other error is `blame`'s (e.g. OpenSSL refusing a pair) when given, and
 * thrown on otherwise (a bug, not a bad file).
 */
export function parsed<T> (parse: () => T, blame?: string): Parsed<T> {
  try {
    return { ok: true, value: parse() }
  } catch (err) {
    if (err instanceof ConfigError) return { ok: false, variable: err.variable, problem: err.message }
    if (blame === undefined) throw err
    return { ok: false, variable: blame, problem: (err as Error).message }
  }
}

export interface Reports<T> {
  /** A new value was put in force. */
  readonly applied: (value: T) => void
  /** A content the consumer's checks refused; the previous value stays. */
  readonly rejected: (failure: MountedFailure) => void
  /** Files that could not be read (mid-swap, gone, refused unread, too slow); the previous value stays. */
  readonly unreadable: (failure: MountedFailure) => void
}

/**
 * A consumer's `report`: a value applied, and a failure the first time it
 * happens (not again while the same bytes or the same read failure stay),
 * each told to its handler; `unchanged` to none. Returns the outcome, what
 * the watcher's `reload()` resolves with.
 */
export function reportOnce<T> (reports: Reports<T>): (o: MountedOutcome<T>) => MountedOutcome<T> {
  return o => {
    if (o.result === 'applied') reports.applied(o.value)
    else if (o.result !== 'unchanged' && !o.repeated) reports[o.result](o)
    return o
  }
}
