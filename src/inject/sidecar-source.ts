// The sidecar definition the webhook serves, re-read when its file changes.
// The watching is the mounted-file watcher's (src/mounted/mounted-files.ts:
// a ConfigMap's `..data` swap seen by the directory watch, settled, a poll
// every 10 s as well, unchanged bytes not parsed again); this module says
// how the file is parsed and checked, and what a change is logged and counted
// as. A file that does not pass keeps the previous definition, with one
// warning and one count per bad content.
import type { FastifyBaseLogger } from 'fastify'
import { ConfigError } from '../config/config.js'
import { MountedFiles, type MountedOutcome, type Parsed } from '../mounted/mounted-files.js'
import { readSidecarSettings, type SidecarChoices } from './config.js'
import type { InjectMetrics } from './metrics.js'
import type { InjectSettings } from './patch.js'

export interface SidecarSourceOptions {
  readonly file: string
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
  private readonly files: MountedFiles<InjectSettings, void>

  constructor (initial: InjectSettings, private readonly opts: SidecarSourceOptions) {
    this.settings = initial
    this.version = initial.version
    this.files = new MountedFiles<InjectSettings, void>({
      files: [{ path: opts.file, variable: 'COS_INJECT_SIDECAR_FILE', maxBytes: SIDECAR_FILE_MAX_BYTES }],
      what: 'sidecar definition',
      parse: ([text]) => this.parse(text ?? ''),
      apply: next => { this.settings = next },
      report: o => { this.report(o) },
      closed: undefined,
      pollMs: opts.pollMs ?? 10_000,
      logger: opts.logger,
    })
  }

  readonly current = (): InjectSettings => this.settings

  start (): void {
    this.files.start().catch((err: unknown) => { this.opts.logger.error({ err }, 'sidecar definition: reading it again failed; still injecting the previous one') })
  }

  /** Reads the file again; applies it when it changed and passes the checks. */
  async reload (): Promise<void> {
    await this.files.reload()
  }

  close (): void {
    this.files.close()
  }

  private parse (text: string): Parsed<InjectSettings> {
    try {
      return { ok: true, value: readSidecarSettings(this.opts.file, this.opts.sidecar, this.opts.programVersion, text) }
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      return { ok: false, variable: err.variable, problem: err.message }
    }
  }

  private report (o: MountedOutcome<InjectSettings>): void {
    const { metrics, logger } = this.opts
    if (o.result === 'applied') {
      // Rewritten with the same content (or the first look after start): nothing to announce.
      const previous = this.version
      if (o.value.version === previous) return
      this.version = o.value.version
      metrics.sidecarReload('applied')
      metrics.sidecarVersion(o.value.version)
      logger.info({ version: o.value.version, previous, image: o.value.template.container.image }, 'sidecar definition reloaded: pods injected from now on get it; running pods keep theirs until restarted')
    } else if (o.result === 'rejected' && !o.repeated) {
      metrics.sidecarReload('rejected')
      logger.warn({ problem: o.problem, version: this.settings.version }, 'sidecar definition on disk is not usable: still injecting the previous one')
    } else if (o.result === 'unreadable' && !o.repeated) {
      // Mid-swap, or gone: the next event or poll reads it again.
      logger.debug({ problem: o.problem, version: this.settings.version }, 'sidecar definition file not readable: still injecting the previous one')
    }
  }
}
