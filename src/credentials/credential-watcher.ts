// Keeps the key pair in the CredentialStore in step with the mounted files, so
// a rotated Access Key is in force within ~2 s and no request is dropped.
//
// Kubernetes updates a mounted Secret by writing a new timestamped directory
// and renaming a `..data` symlink over the old one; the visible files are
// symlinks through `..data`. So the directories holding the files are
// watched (the files themselves are replaced, not written), and a periodic
// re-read covers what watching misses: a directory that does not exist yet,
// a symlink into an unwatched directory, a platform that drops events.
// Events only say "look again": any number of them, in any order, is fine.
import { statSync, watch, type FSWatcher } from 'node:fs'
import { basename, dirname } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'
import type { Config } from '../config/config.js'
import { accessKeyHint, readPair, type CredentialStore, type PairFailure, type PairResult, type ReadRefusal } from './credentials.js'
import type { TokenEncoding } from '../token/token.js'

export type ReloadOutcome =
  | { readonly result: 'applied', readonly accessKey: string }
  | { readonly result: 'unchanged' }
  | { readonly result: 'rejected', readonly variable: string, readonly problem: string, readonly refusal?: ReadRefusal }

export interface CredentialWatcherOptions {
  readonly credentials: Config['credentials']
  readonly encoding: TokenEncoding
  readonly store: CredentialStore
  readonly reloadMs: number
  readonly logger: FastifyBaseLogger
  /** Called for every reload attempt that finishes (including `unchanged` periodic re-reads). */
  readonly onOutcome?: (o: ReloadOutcome) => void
  /** How long one read of the files may take before it counts as failed (default READ_TIMEOUT_MS). */
  readonly readTimeoutMs?: number
}

// A changed pair is applied only once two reads this far apart agree: an
// in-place rewrite of two files (or a truncate-then-write of one) is seen
// half done by the first read, and a second read a moment later tells.
const SETTLE_MS = 50
// Reads per reload before giving up on files that keep changing (the next
// event or periodic re-read tries again): at most ~200 ms of settling.
const MAX_READS = 5
// One reload for a burst of events: a `..data` swap alone makes several.
const DEBOUNCE_MS = 20
// A read of two small files takes well under a millisecond. One that takes
// this long is stuck (a hung network file system, a thread pool held by
// something else): report it and carry on rather than wait for ever.
const READ_TIMEOUT_MS = 1000
// An upstream that rejects every request must not cause a read per request.
const NUDGE_INTERVAL_MS = 250

const UNCHANGED: ReloadOutcome = { result: 'unchanged' }

interface WatchedDir {
  readonly watcher: FSWatcher
  /** dev:ino when the watch began: a directory deleted and created again needs a new watch. */
  readonly identity: string
}

export class CredentialWatcher {
  readonly #opts: CredentialWatcherOptions
  readonly #dirs: readonly string[]
  readonly #names: ReadonlySet<string>
  /** Names the file variables, for a refusal that no single file explains. */
  readonly #fileVariables: string
  readonly #watched = new Map<string, WatchedDir>()
  #interval: NodeJS.Timeout | undefined
  #debounce: NodeJS.Timeout | undefined
  #running: Promise<ReloadOutcome> | undefined
  #queued: Promise<ReloadOutcome> | undefined
  /** True while a read that outlived READ_TIMEOUT_MS has not ended: none other starts, so stuck reads cannot pile up. */
  #overdue = false
  #lastNudge = -Infinity
  /** The refusal last logged at `error`, so a file that stays broken is not logged every period. */
  #lastProblem: string | undefined
  #closed = false

  constructor (opts: CredentialWatcherOptions) {
    this.#opts = opts
    const { accessKey, secret } = opts.credentials
    const files: [string, string][] = []
    if (accessKey.file !== undefined) files.push(['COS_ACCESS_KEY_FILE', accessKey.file])
    if (secret.file !== undefined) files.push(['COS_ACCESS_KEY_SECRET_FILE', secret.file])
    this.#dirs = [...new Set(files.map(([, f]) => dirname(f)))]
    this.#names = new Set(files.map(([, f]) => basename(f)))
    this.#fileVariables = files.map(([v]) => v).join(' and ')
  }

  /** First read + start watching. Never throws for missing/invalid files (logs, store stays empty). */
  async start (): Promise<ReloadOutcome> {
    if (this.#dirs.length > 0 && !this.#closed && this.#interval === undefined) {
      // Watch before the first read, so a change made during it is not missed.
      this.#watchDirs()
      this.#interval = setInterval(() => { this.#tick() }, this.#opts.reloadMs).unref()
    }
    return this.reload()
  }

  /**
   * Re-read now. Coalesced: while a read is under way, every further call
   * shares one follow-up read, which starts when the current one ends (the
   * current one may have looked at the files before the change that prompted
   * the call).
   */
  reload (): Promise<ReloadOutcome> {
    if (this.#closed) return Promise.resolve(UNCHANGED)
    if (this.#queued !== undefined) return this.#queued
    if (this.#running === undefined) return this.#begin()
    const next = (): Promise<ReloadOutcome> => { this.#queued = undefined; return this.#begin() }
    this.#queued = this.#running.then(next, next)
    return this.#queued
  }

  /**
   * A hint that the files may have changed though no event said so (the
   * upstream refused the pair in force): re-read in the background, sharing
   * any read under way. At most once per NUDGE_INTERVAL_MS; never blocks.
   */
  nudge (): void {
    const now = performance.now()
    if (this.#closed || now - this.#lastNudge < NUDGE_INTERVAL_MS) return
    this.#lastNudge = now
    this.#reloadInBackground()
  }

  /** Stop watchers and timers (idempotent). A read under way finishes without effect. */
  close (): void {
    this.#closed = true
    clearInterval(this.#interval)
    clearTimeout(this.#debounce)
    for (const { watcher } of this.#watched.values()) watcher.close()
    this.#watched.clear()
  }

  #begin (): Promise<ReloadOutcome> {
    const run = this.#readUntilSettled().finally(() => {
      if (this.#running === run) this.#running = undefined
    })
    this.#running = run
    return run
  }

  async #readUntilSettled (): Promise<ReloadOutcome> {
    const read = (): Promise<PairResult> => this.#readWithin()
    let last = await read()
    // The pair in force read back whole (the usual periodic re-read), or
    // literals only: nothing can be half written, nothing to confirm.
    if (this.#isCurrent(last) || this.#dirs.length === 0) return this.#finish(last)
    for (let reads = 1; reads < MAX_READS; reads++) {
      // Not unref'd: start() may be all the process is waiting for.
      await sleep(SETTLE_MS)
      if (this.#closed) return UNCHANGED
      const next = await read()
      if (agree(last, next)) return this.#finish(next)
      last = next
    }
    return this.#finish({ ok: false, variable: this.#fileVariables, problem: `kept changing for ${SETTLE_MS * (MAX_READS - 1)} ms while being read` })
  }

  /** One read of the pair, failed as `read_timeout` if it does not end in time (it is left to end on its own). */
  async #readWithin (): Promise<PairResult> {
    const ms = this.#opts.readTimeoutMs ?? READ_TIMEOUT_MS
    const timedOut: PairFailure = { ok: false, variable: this.#fileVariables, problem: `could not be read within ${ms} ms`, refusal: 'read_timeout' }
    if (this.#overdue) return timedOut
    const reading = readPair(this.#opts.credentials, this.#opts.encoding)
    let timer: NodeJS.Timeout | undefined
    const deadline = new Promise<undefined>(resolve => { timer = setTimeout(() => { resolve(undefined) }, ms) })
    const result = await Promise.race([reading, deadline])
    clearTimeout(timer)
    if (result !== undefined) return result
    this.#overdue = true
    const ended = (): void => { this.#overdue = false }
    reading.then(ended, ended)
    return timedOut
  }

  #isCurrent (r: PairResult): boolean {
    const current = this.#opts.store.current
    return r.ok && current !== undefined && current.samePair(r.minter)
  }

  /** Applies a settled read and reports it. */
  #finish (r: PairResult): ReloadOutcome {
    if (this.#closed) return UNCHANGED
    const { store, logger } = this.#opts
    const previous = store.current?.accessKey
    let outcome: ReloadOutcome
    if (!r.ok) {
      outcome = { result: 'rejected', variable: r.variable, problem: r.problem, ...(r.refusal === undefined ? {} : { refusal: r.refusal }) }
      const problem = `${r.variable} ${r.problem}`
      const fields = { variable: r.variable, problem: r.problem, accessKeyInForce: previous === undefined ? null : accessKeyHint(previous) }
      if (problem === this.#lastProblem) {
        logger.debug(fields, 'credentials: still invalid')
      } else {
        this.#lastProblem = problem
        logger.error(fields, previous === undefined
          ? 'credentials: no valid key pair; requests get 503 credentials_unavailable until one appears'
          : 'credentials: new key pair refused; the pair in force stays')
      }
    } else if (this.#isCurrent(r)) {
      outcome = UNCHANGED
      if (this.#lastProblem !== undefined) logger.info({ accessKey: accessKeyHint(r.accessKey) }, 'credentials: files valid again; key pair unchanged')
      else logger.trace('credentials: unchanged')
      this.#lastProblem = undefined
    } else {
      store.swap(r.minter)
      outcome = { result: 'applied', accessKey: r.accessKey }
      this.#lastProblem = undefined
      // The secret is never logged, and of the key only what tells keys apart.
      logger.info({ accessKey: accessKeyHint(r.accessKey), previousAccessKey: previous === undefined ? null : accessKeyHint(previous) }, 'credentials: key pair in force')
    }
    try {
      this.#opts.onOutcome?.(outcome)
    } catch (err) {
      // A failing metrics callback must not stop rotation.
      logger.error({ err }, 'credentials: onOutcome failed')
    }
    return outcome
  }

  #tick (): void {
    this.#watchDirs()
    this.#reloadInBackground()
  }

  #reloadInBackground (): void {
    this.reload().catch((err: unknown) => { this.#opts.logger.error({ err }, 'credentials: reload failed') })
  }

  #onEvent (filename: string | null): void {
    // Only our files and Kubernetes' `..data`/`..<timestamp>` entries matter:
    // the directory may be a busy one such as /tmp.
    if (filename !== null && !this.#names.has(filename) && !filename.startsWith('..')) return
    if (this.#closed || this.#debounce !== undefined) return
    this.#debounce = setTimeout(() => {
      this.#debounce = undefined
      this.#tick()
    }, DEBOUNCE_MS).unref()
  }

  /** Watches each directory that exists and is not watched yet (or was replaced). */
  #watchDirs (): void {
    for (const dir of this.#dirs) {
      const identity = dirIdentity(dir)
      const held = this.#watched.get(dir)
      if (held?.identity === identity) continue
      held?.watcher.close()
      this.#watched.delete(dir)
      // Not there yet: the periodic re-read covers it, and watches it once it appears.
      if (identity === undefined) continue
      try {
        const watcher = watch(dir, { persistent: false }, (_event, filename) => { this.#onEvent(filename) })
        watcher.on('error', (err: unknown) => {
          this.#opts.logger.debug({ err, dir }, 'credentials: directory watch failed; re-reading periodically')
          watcher.close()
          if (this.#watched.get(dir)?.watcher === watcher) this.#watched.delete(dir)
        })
        this.#watched.set(dir, { watcher, identity })
      } catch (err) {
        this.#opts.logger.debug({ err, dir }, 'credentials: cannot watch directory; re-reading periodically')
      }
    }
  }
}

function dirIdentity (dir: string): string | undefined {
  try {
    const s = statSync(dir)
    return s.isDirectory() ? `${s.dev}:${s.ino}` : undefined
  } catch {
    return undefined
  }
}

/** Two reads agree when they give the same pair, or fail the same way. */
function agree (a: PairResult, b: PairResult): boolean {
  if (a.ok && b.ok) return a.minter.samePair(b.minter)
  if (!a.ok && !b.ok) return a.variable === b.variable && a.problem === b.problem
  return false
}
