// The sidecar definition the webhook serves, re-read when its file changes.
// The watching is the mounted-file watcher's (src/mounted/mounted-files.ts:
// a ConfigMap's `..data` swap seen by the directory watch, settled, a poll
// every 10 s as well, unchanged bytes not parsed again); this module says
// how the file is parsed and checked, and what a change is logged and counted
// as. A file that does not pass keeps the previous definition, with one
// warning and one count per bad content.
import type { FastifyBaseLogger } from 'fastify'
import { MountedFiles } from '../mounted/mounted-files.js'
import { parsed, reportOnce, type MountedOutcome } from '../mounted/outcomes.js'
import { readSidecarSettings, type SidecarChoices } from './config.js'
import type { InjectMetrics } from './metrics.js'
import type { InjectSettings } from './patch.js'

export interface SidecarSourceOptions {
  readonly file: string
  /** The file's text the initial settings were read from at start: the value in force, not parsed again by the first look. */
  readonly readAtStart: string
  /** The webhook's settings, parsed once at start: a reload reads only the file. */
  readonly sidecar: SidecarChoices
  readonly programVersion: string
  readonly metrics: InjectMetrics
  readonly logger: FastifyBaseLogger
  /** Read again this often too, in case an event is missed (some volume types send none). Default 10 s. */
  readonly pollMs?: number
}

/** A ConfigMap holds at most 1 MiB; the definition is a few KiB. */
const SIDECAR_FILE_MAX_BYTES = 1024 * 1024

export class SidecarSource {
  private settings: InjectSettings
  /** The version last announced (logged, in the metrics). */
  private version: string
  private readonly files: MountedFiles<InjectSettings, MountedOutcome<InjectSettings> | undefined>

  constructor (initial: InjectSettings, private readonly opts: SidecarSourceOptions) {
    this.settings = initial
    this.version = initial.version
    const { metrics, logger } = opts
    this.files = new MountedFiles({
      files: [{ path: opts.file, variable: 'COS_INJECT_SIDECAR_FILE', maxBytes: SIDECAR_FILE_MAX_BYTES }],
      what: 'sidecar definition',
      parse: ([text = '']) => parsed(() => readSidecarSettings(opts.file, opts.sidecar, opts.programVersion, text)),
      readAtStart: [opts.readAtStart],
      apply: next => { this.settings = next },
      report: reportOnce({
        applied: next => { this.announce(next) },
        rejected: o => {
          metrics.sidecarReload('rejected')
          logger.warn({ problem: o.problem, version: this.settings.version }, 'sidecar definition on disk is not usable: still injecting the previous one')
        },
        // Mid-swap, or gone: the next event or poll reads it again.
        unreadable: o => { logger.debug({ problem: o.problem, version: this.settings.version }, 'sidecar definition file not readable: still injecting the previous one') },
      }),
      closed: undefined,
      pollMs: opts.pollMs ?? 10_000,
      logger: opts.logger,
    })
  }

  readonly current = (): InjectSettings => this.settings

  start (): void {
    this.files.start().catch((err: unknown) => { this.opts.logger.error({ err }, 'sidecar definition: reading it again failed; still injecting the previous one') })
  }

  /** Reads the file again; applies it when it changed and passes the checks. Resolves with what the look ended in (undefined: closed). */
  reload (): Promise<MountedOutcome<InjectSettings> | undefined> {
    return this.files.reload()
  }

  close (): void {
    this.files.close()
  }

  private announce (next: InjectSettings): void {
    // Rewritten with the same version: nothing to announce.
    const previous = this.version
    if (next.version === previous) return
    this.version = next.version
    this.opts.metrics.sidecarReload('applied')
    this.opts.metrics.sidecarVersion(next.version)
    this.opts.logger.info({ version: next.version, previous, image: next.template.container.image }, 'sidecar definition reloaded: pods injected from now on get it; running pods keep theirs until restarted')
  }
}
