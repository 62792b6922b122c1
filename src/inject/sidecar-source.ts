// The sidecar definition the webhook serves, re-read when its file changes:
// a ConfigMap volume swaps its files through the ..data symlink, so the
// directory is watched, and a changed file is parsed and checked before it
// replaces the definition in one assignment. A file that does not pass keeps
// the previous definition, with a warning and a metric.
import { createHash } from 'node:crypto'
import { watch, type FSWatcher } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { dirname } from 'node:path'
import type { FastifyBaseLogger } from 'fastify'
import { ConfigError } from '../config/config.js'
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
  /** Events come in bursts (several files, a symlink swap): read once they settle. */
  readonly settleMs?: number
  /** Read again this often too, in case an event is missed (some volume types send none). */
  readonly pollMs?: number
}

function digest (text: string): string {
  return createHash('sha256').update(text).digest('hex')
}

export class SidecarSource {
  private settings: InjectSettings
  private served = ''
  private rejected = ''
  private watcher: FSWatcher | undefined
  private timer: NodeJS.Timeout | undefined
  private poll: NodeJS.Timeout | undefined
  private reading: Promise<void> = Promise.resolve()

  constructor (initial: InjectSettings, private readonly opts: SidecarSourceOptions) {
    this.settings = initial
  }

  readonly current = (): InjectSettings => this.settings

  start (): void {
    const unwatched = (err: Error): void => { this.opts.logger.warn({ problem: err.message }, 'sidecar definition: watching the directory failed; changes are seen by polling only') }
    try {
      this.watcher = watch(dirname(this.opts.file), { persistent: false }, () => { this.schedule(this.opts.settleMs ?? 200) })
      this.watcher.on('error', unwatched)
    } catch (err) {
      unwatched(err as Error) // e.g. no inotify watches left on the node
    }
    this.poll = setInterval(() => { this.schedule(0) }, this.opts.pollMs ?? 10_000)
    this.poll.unref()
  }

  private schedule (delayMs: number): void {
    clearTimeout(this.timer)
    this.timer = setTimeout(() => {
      this.reading = this.reading.then(() => this.reload()).catch((err: unknown) => {
        this.opts.logger.error({ err }, 'sidecar definition: reading it again failed; still injecting the previous one')
      })
    }, delayMs)
    this.timer.unref()
  }

  /** Reads the file again; applies it when it changed and passes the checks. */
  async reload (): Promise<void> {
    let text: string
    try {
      text = await readFile(this.opts.file, 'utf8')
    } catch {
      return // mid-swap: the next event reads it again
    }
    const d = digest(text)
    if (d === this.served || d === this.rejected) return
    let next: InjectSettings
    try {
      next = readSidecarSettings(this.opts.file, this.opts.sidecar, this.opts.programVersion, text)
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      this.rejected = d
      this.opts.metrics.sidecarReload('rejected')
      this.opts.logger.warn({ problem: err.message, version: this.settings.version }, 'sidecar definition on disk is not usable: still injecting the previous one')
      return
    }
    const previous = this.settings.version
    this.settings = next
    this.served = d
    // Rewritten with the same content (or a first event after start): nothing to announce.
    if (next.version === previous) return
    this.opts.metrics.sidecarReload('applied')
    this.opts.metrics.sidecarVersion(next.version)
    this.opts.logger.info({ version: next.version, previous, image: next.template.container.image }, 'sidecar definition reloaded: pods injected from now on get it; running pods keep theirs until restarted')
  }

  close (): void {
    clearTimeout(this.timer)
    clearInterval(this.poll)
    this.watcher?.close()
  }
}
