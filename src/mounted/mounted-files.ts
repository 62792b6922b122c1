// One watcher for files an operator mounts (a Kubernetes Secret or ConfigMap
// volume, cert-manager's output, a bind mount), used by every consumer: the
// credential files, the sidecar definition, the webhook's serving certificate
// and the upstream TLS files. The consumer says only how to parse and check
// what the files hold and what to do with a new value; this module owns:
//  - watching: the files' directories (directory-watch.ts: the `..data`
//    symlink swap, a directory replaced), one look per burst of events
//    (DEBOUNCE_MS, 20 ms);
//  - the poll: every `pollMs` as well (some volume types send no events,
//    inotify watches can run out, a directory may not exist yet);
//  - the bounded read (bounded-file.ts: no FIFO, device or huge file is
//    waited on or read whole), failed as `read_timeout` past READ_TIMEOUT_MS
//    (1 s) and never piled up behind a read that does not end;
//  - settling: a changed content is used only once two reads SETTLE_MS
//    (50 ms) apart agree, so a pair written one file at a time, or a file
//    truncated then written, is not seen half done (at most MAX_READS reads);
//  - partial changes held (a consumer's `holdPartialMs`): a settled read in
//    which some of the files changed and others did not waits up to that long
//    for the rest (files renamed into place one at a time, far apart, as
//    Vault Agent's templates are), re-read every SETTLE_MS; then it is taken;
//  - dedupe: the same bytes as the value in force (those a consumer read at
//    start, `readAtStart`, too) are `unchanged`, with no parse; bytes already
//    rejected, or the same read failure, are reported `repeated`, so a
//    consumer logs and counts a bad file once (outcomes.ts: `reportOnce`);
//  - "keep the previous value": nothing is applied unless it parsed, passed
//    the checks and `apply` took it.
// Every look ends in one outcome: applied | unchanged | rejected (read, but
// refused by the consumer's checks) | unreadable (missing, refused unread,
// too slow, or still changing), with the setting to blame and the reason
// (outcomes.ts: the outcome types, and `parsed` for a consumer's parser).
// Reasons name paths, never contents: a key file is a secret.
import { createHash } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'
import { readBoundedFile } from './bounded-file.js'
import { DirectoryWatch } from './directory-watch.js'
import type { MountedFailure, MountedOutcome, Parsed } from './outcomes.js'

export type { MountedFailure, MountedOutcome, Parsed, ReadRefusal } from './outcomes.js'

export interface MountedFile {
  readonly path: string
  /** The setting naming the file: a failure names it. */
  readonly variable: string
  /** Larger is refused unread. */
  readonly maxBytes: number
}

export interface MountedFilesOptions<T, R> {
  /** The files, read together as one value (e.g. a certificate and its key). May be empty: then nothing is watched. */
  readonly files: readonly MountedFile[]
  /** Names the files in debug lines ("credentials"). */
  readonly what: string
  /** The files' texts (in `files` order) to a value, or the problem. Never quotes the texts. */
  readonly parse: (texts: readonly string[]) => Parsed<T>
  /** The files' texts (in `files` order) the value in force was read from, when the consumer read and parsed them at start: the first look finds them `unchanged`, not parsed again. */
  readonly readAtStart?: readonly string[]
  /** Whether a parsed value is the one in force already (e.g. the same pair, reformatted). Default: no. */
  readonly inForce?: (value: T) => boolean
  /** Puts a value in force. Throwing refuses it (`rejected`, the message as the reason; the previous value stays). */
  readonly apply: (value: T) => void
  /** Told every outcome; what it returns is what `reload()` resolves with. */
  readonly report: (outcome: MountedOutcome<T>) => R
  /** What `reload()` resolves with once closed (nothing is reported then). */
  readonly closed: R
  /** The poll: a look this often, events or not. */
  readonly pollMs: number
  readonly logger: FastifyBaseLogger
  /** Default READ_TIMEOUT_MS. */
  readonly readTimeoutMs?: number
  /** Some files changed and the others not: wait this long for the rest before taking it. Default: taken at once. */
  readonly holdPartialMs?: number
}

export const SETTLE_MS = 50
export const MAX_READS = 5
// A read of a few small files takes well under a millisecond. One that takes
// this long is stuck (a hung network file system, a thread pool held by
// something else): report it and carry on rather than wait for ever.
export const READ_TIMEOUT_MS = 1000
export const NUDGE_INTERVAL_MS = 250

type Failure = Omit<MountedFailure, 'repeated'>
/** `parts`: each file's digest, to tell a partial change. */
type Raw = { readonly ok: true, readonly texts: readonly string[], readonly digest: string, readonly parts: readonly string[] } | { readonly ok: false, readonly failure: Failure }

export class MountedFiles<T, R> {
  readonly #opts: MountedFilesOptions<T, R>
  /** Names every file at once, for a failure no single file explains. */
  readonly #allVariables: string
  readonly #dirs: DirectoryWatch | undefined
  #poll: NodeJS.Timeout | undefined
  #running: Promise<R> | undefined
  #queued: Promise<R> | undefined
  /** The digest of the bytes in force, and of each file. */
  #inForce: string | undefined
  #inForceParts: readonly string[] = []
  /** What the last failure was (a digest of the bytes, or the read problem); undefined after a success. */
  #failed: string | undefined
  #lastFailure: MountedFailure | undefined
  /** True while a read that outlived the timeout has not ended: none other starts. */
  #overdue = false
  #lastNudge = -Infinity
  #closed = false

  constructor (opts: MountedFilesOptions<T, R>) {
    this.#opts = opts
    this.#allVariables = [...new Set(opts.files.map(f => f.variable))].join(' and ')
    this.#dirs = opts.files.length > 0 ? new DirectoryWatch(opts.files.map(f => f.path), opts.what, opts.logger, () => { this.#tick() }) : undefined
    if (opts.readAtStart !== undefined) ({ digest: this.#inForce, parts: this.#inForceParts } = digests(opts.readAtStart))
  }

  /** The first look, and watching from then on (a change made during the first read is not missed). */
  start (): Promise<R> {
    if (this.#opts.files.length > 0 && !this.#closed && this.#poll === undefined) {
      this.#dirs?.refresh()
      this.#poll = setInterval(() => { this.#tick() }, this.#opts.pollMs).unref()
    }
    return this.reload()
  }

  /**
   * Look now. Coalesced: while a look is under way, every further call
   * shares one follow-up look, which starts when the current one ends (it may
   * have read the files before the change that prompted the call).
   */
  reload (): Promise<R> {
    if (this.#closed) return Promise.resolve(this.#opts.closed)
    if (this.#queued !== undefined) return this.#queued
    if (this.#running === undefined) return this.#begin()
    const next = (): Promise<R> => { this.#queued = undefined; return this.#begin() }
    this.#queued = this.#running.then(next, next)
    return this.#queued
  }

  /** A hint that the files may have changed though no event said so: a look in the background, at most once per NUDGE_INTERVAL_MS. */
  nudge (): void {
    const now = performance.now()
    if (this.#closed || now - this.#lastNudge < NUDGE_INTERVAL_MS) return
    this.#lastNudge = now
    this.#inBackground()
  }

  /** Stops watching and polling (idempotent). A look under way ends without effect. */
  close (): void {
    this.#closed = true
    clearInterval(this.#poll)
    this.#dirs?.close()
  }

  #tick (): void {
    this.#dirs?.refresh()
    this.#inBackground()
  }

  #inBackground (): void {
    this.reload().catch((err: unknown) => { this.#opts.logger.error({ err }, `${this.#opts.what}: reload failed`) })
  }

  #begin (): Promise<R> {
    const run = this.#look().finally(() => {
      if (this.#running === run) this.#running = undefined
    })
    this.#running = run
    return run
  }

  async #look (): Promise<R> {
    let read = await this.#settled()
    const until = performance.now() + (this.#opts.holdPartialMs ?? 0)
    while (read !== undefined && this.#partial(read) && performance.now() < until) {
      await sleep(SETTLE_MS)
      read = this.#closed ? undefined : await this.#settled()
    }
    return read === undefined ? this.#opts.closed : this.#finish(read)
  }

  /** A read two reads SETTLE_MS apart agree on (undefined: closed meanwhile). */
  async #settled (): Promise<Raw | undefined> {
    let last = await this.#readWithin()
    if (!this.#needsSettling(last)) return last
    for (let reads = 1; ; reads++) {
      if (reads === MAX_READS) {
        return { ok: false, failure: { result: 'unreadable', variable: this.#allVariables, problem: `kept changing for ${SETTLE_MS * (MAX_READS - 1)} ms while being read` } }
      }
      // Not unref'd: start() may be all the process is waiting for.
      await sleep(SETTLE_MS)
      if (this.#closed) return undefined
      const next = await this.#readWithin()
      if (agree(last, next)) return next
      last = next
    }
  }

  /** Some files hold what is in force and others do not: perhaps half written. */
  #partial (r: Raw): boolean {
    if (!r.ok || r.digest === this.#inForce) return false
    const same = r.parts.filter((p, i) => p === this.#inForceParts[i]).length
    return same > 0 && same < r.parts.length
  }

  /** Bytes in force, bytes or a failure already reported, or no files at all: nothing can be half written. */
  #needsSettling (r: Raw): boolean {
    if (this.#opts.files.length === 0) return false
    return r.ok ? r.digest !== this.#inForce && r.digest !== this.#failed : failureKey(r.failure) !== this.#failed
  }

  /** One read of every file, failed as `read_timeout` if it does not end in time (it is left to end on its own). */
  async #readWithin (): Promise<Raw> {
    const ms = this.#opts.readTimeoutMs ?? READ_TIMEOUT_MS
    const timedOut: Raw = { ok: false, failure: { result: 'unreadable', variable: this.#allVariables, problem: `could not be read within ${ms} ms`, refusal: 'read_timeout' } }
    if (this.#overdue) return timedOut
    const reading = this.#readAll()
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

  async #readAll (): Promise<Raw> {
    const { files } = this.#opts
    const reads = await Promise.all(files.map(f => readBoundedFile(f.path, f.maxBytes)))
    const texts: string[] = []
    for (const [i, read] of reads.entries()) {
      const file = files[i] as MountedFile
      if (!read.ok) return { ok: false, failure: { result: 'unreadable', variable: file.variable, problem: read.problem, ...(read.refusal === undefined ? {} : { refusal: read.refusal }) } }
      texts.push(read.text)
    }
    return { ok: true, texts, ...digests(texts) }
  }

  /** Parses, checks and applies a settled read, and reports it. */
  #finish (r: Raw): R {
    if (this.#closed) return this.#opts.closed
    return this.#opts.report(this.#outcome(r))
  }

  #outcome (r: Raw): MountedOutcome<T> {
    if (!r.ok) return this.#failure(r.failure, failureKey(r.failure))
    if (r.digest === this.#inForce) return this.#unchanged(r)
    if (r.digest === this.#failed) return { ...this.#lastFailure as MountedFailure, repeated: true } // bytes already rejected: not parsed again
    const parsed = this.#opts.parse(r.texts)
    if (!parsed.ok) return this.#failure({ result: 'rejected', variable: parsed.variable, problem: parsed.problem }, r.digest)
    if (this.#opts.inForce?.(parsed.value) === true) return this.#unchanged(r)
    try {
      this.#opts.apply(parsed.value)
    } catch (err) {
      return this.#failure({ result: 'rejected', variable: this.#allVariables, problem: (err as Error).message }, r.digest)
    }
    this.#inForce = r.digest
    this.#inForceParts = r.parts
    this.#failed = undefined
    return { result: 'applied', value: parsed.value }
  }

  #failure (f: Failure, key: string): MountedFailure {
    const failure = { ...f, repeated: key === this.#failed }
    this.#failed = key
    this.#lastFailure = failure
    return failure
  }

  #unchanged (r: Raw & { ok: true }): MountedOutcome<T> {
    const recovered = this.#failed !== undefined
    this.#inForce = r.digest
    this.#inForceParts = r.parts
    this.#failed = undefined
    return { result: 'unchanged', recovered }
  }
}

/** Each file's digest, and the digest of them all: what tells bytes in force, and a partial change. */
function digests (texts: readonly string[]): { readonly digest: string, readonly parts: readonly string[] } {
  const parts = texts.map(text => createHash('sha256').update(text).digest('hex'))
  return { digest: createHash('sha256').update(parts.join(':')).digest('hex'), parts }
}

function failureKey (f: Failure): string {
  return `${f.result} ${f.variable} ${f.problem}`
}

/** Two reads agree when they hold the same bytes, or fail the same way. */
function agree (a: Raw, b: Raw): boolean {
  if (a.ok && b.ok) return a.digest === b.digest
  if (!a.ok && !b.ok) return failureKey(a.failure) === failureKey(b.failure)
  return false
}
