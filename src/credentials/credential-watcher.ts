// Keeps the key pair in the CredentialStore in step with the mounted files, so
// a rotated Access Key is in force within ~2 s and no request is dropped.
// The watching is the mounted-file watcher's (src/mounted/mounted-files.ts:
// the `..data` swap, a pair written one file at a time, the poll every
// COS_CREDENTIALS_RELOAD_MS, bounded reads that time out after 1 s); this
// module says what a pair is, when it is the one in force, and what the
// outcomes are logged and counted as.
import type { FastifyBaseLogger } from 'fastify'
import type { Config } from '../config/config.js'
import { MountedFiles, type MountedOutcome } from '../mounted/mounted-files.js'
import { accessKeyHint, credentialFiles, pairFromTexts, type CredentialStore, type ReadRefusal } from './credentials.js'
import type { HeaderMinter, TokenEncoding } from '../token/token.js'

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
  /** How long one read of the files may take before it counts as failed (default 1 s). */
  readonly readTimeoutMs?: number
}

interface Pair { readonly accessKey: string, readonly minter: HeaderMinter }

const UNCHANGED: ReloadOutcome = { result: 'unchanged' }

/**
 * A new key with the secret in force (or the other way round) is half a
 * rotation, most likely: a key comes with its own secret. Vault Agent renders
 * each file as its own template and renames each into place on its own, so
 * the second can land well after the first. Such a pair waits this long for
 * the other file, the pair in force signing meanwhile; then it is taken as it is.
 */
export const PARTIAL_PAIR_HOLD_MS = 2000

export class CredentialWatcher {
  readonly #files: MountedFiles<Pair, ReloadOutcome>

  constructor (opts: CredentialWatcherOptions) {
    const { store, logger } = opts
    /** The key the last applied pair replaced, for its log line. */
    let replaced: string | undefined
    this.#files = new MountedFiles<Pair, ReloadOutcome>({
      files: credentialFiles(opts.credentials),
      what: 'credentials',
      parse: texts => {
        const r = pairFromTexts(opts.credentials, opts.encoding, texts)
        return r.ok ? { ok: true, value: r } : r
      },
      inForce: pair => store.current?.samePair(pair.minter) === true,
      apply: pair => {
        replaced = store.current?.accessKey
        store.swap(pair.minter)
      },
      report: o => {
        const outcome = report(o, store, logger, replaced)
        try {
          opts.onOutcome?.(outcome)
        } catch (err) {
          // A failing metrics callback must not stop rotation.
          logger.error({ err }, 'credentials: onOutcome failed')
        }
        return outcome
      },
      closed: UNCHANGED,
      pollMs: opts.reloadMs,
      holdPartialMs: PARTIAL_PAIR_HOLD_MS,
      logger,
      ...(opts.readTimeoutMs === undefined ? {} : { readTimeoutMs: opts.readTimeoutMs }),
    })
  }

  /** First read + start watching. Never throws for missing/invalid files (logs, store stays empty). */
  start (): Promise<ReloadOutcome> {
    return this.#files.start()
  }

  /** Re-read now; calls during a read share one follow-up read. */
  reload (): Promise<ReloadOutcome> {
    return this.#files.reload()
  }

  /**
   * A hint that the files may have changed though no event said so (the
   * upstream refused the pair in force): re-read in the background, sharing
   * any read under way. At most once per 250 ms; never blocks.
   */
  nudge (): void {
    this.#files.nudge()
  }

  /** Stop watchers and timers (idempotent). A read under way finishes without effect. */
  close (): void {
    this.#files.close()
  }
}

/** The outcome logged (a refusal at `error` once, then `debug` while it stays) and as the store's callers see it. */
function report (o: MountedOutcome<Pair>, store: CredentialStore, logger: FastifyBaseLogger, replaced: string | undefined): ReloadOutcome {
  if (o.result === 'applied') {
    // The store already holds the new pair; the secret is never logged, and of the key only what tells keys apart.
    logger.info({ accessKey: accessKeyHint(o.value.accessKey), previousAccessKey: replaced === undefined ? null : accessKeyHint(replaced) }, 'credentials: key pair in force')
    return { result: 'applied', accessKey: o.value.accessKey }
  }
  if (o.result === 'unchanged') {
    if (o.recovered) logger.info({ accessKey: store.current === undefined ? null : accessKeyHint(store.current.accessKey) }, 'credentials: files valid again; key pair unchanged')
    else logger.trace('credentials: unchanged')
    return UNCHANGED
  }
  const previous = store.current?.accessKey
  const fields = { variable: o.variable, problem: o.problem, accessKeyInForce: previous === undefined ? null : accessKeyHint(previous) }
  if (o.repeated) {
    logger.debug(fields, 'credentials: still invalid')
  } else {
    logger.error(fields, previous === undefined
      ? 'credentials: no valid key pair; requests get 503 credentials_unavailable until one appears'
      : 'credentials: new key pair refused; the pair in force stays')
  }
  return { result: 'rejected', variable: o.variable, problem: o.problem, ...(o.refusal === undefined ? {} : { refusal: o.refusal }) }
}
