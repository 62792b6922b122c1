// `cos-auth-proxy inject`: the webhook and its admin listener, until SIGTERM
// or SIGINT, then the proxy's drain: readiness 503 at once, keep answering
// for COS_SHUTDOWN_DELAY_MS (the API server still has this pod as an
// endpoint), stop accepting, give reviews in flight COS_SHUTDOWN_TIMEOUT_MS.
// While serving, the sidecar definition is re-read when its file changes
// (SidecarSource, below).
import { createHash } from 'node:crypto'
import { watch, type FSWatcher } from 'node:fs'
import { readFile } from 'node:fs/promises'
import type { AddressInfo } from 'node:net'
import { dirname } from 'node:path'
import type { FastifyBaseLogger } from 'fastify'
import type { Logger } from 'pino'
import { buildAdminServer, type Readiness } from '../admin/admin.js'
import { listenWithAdmin } from '../admin/listeners.js'
import { drain } from '../admin/drain.js'
import { ConfigError } from '../config/config.js'
import { createLogger, inLogFormat, stdoutDestination } from '../observability/logger.js'
import { loadInjectConfig, readSidecarSettings, type InjectConfig } from './config.js'
import { InjectMetrics } from './metrics.js'
import type { InjectSettings } from './patch.js'
import { buildWebhookServer } from './server.js'

export interface RunningWebhook {
  readonly address: AddressInfo
  readonly adminAddress: AddressInfo
  /** Drains and closes both listeners (what SIGTERM does, without exiting). */
  readonly stop: (cause: string) => Promise<void>
}

/** Starts both listeners. The caller decides what a signal does (runInject: drain, then exit). */
export async function startWebhook (config: InjectConfig, logger: Logger, programVersion: string, env: NodeJS.ProcessEnv = process.env): Promise<RunningWebhook> {
  const metrics = new InjectMetrics()
  metrics.sidecarVersion(config.settings.version)
  const source = config.sidecarFile === undefined ? undefined : new SidecarSource(config.settings, { file: config.sidecarFile, env, programVersion, metrics, logger })
  const settings = source?.current ?? ((): InjectConfig['settings'] => config.settings)
  if (config.tls === undefined) throw new Error('startWebhook needs the serving certificate (loadInjectConfig with serving)')
  const app = await buildWebhookServer({ settings, tls: config.tls, metrics, logger })
  source?.start()
  app.addHook('onClose', (_instance, done) => { source?.close(); done() })
  let listening = false
  let draining = false
  const readiness = (): Readiness => {
    if (draining) return { ready: false, reason: 'draining' }
    if (!listening) return { ready: false, reason: 'webhook listener not started' }
    return { ready: true }
  }
  let stopping: Promise<void> | undefined
  const drainWebhook = (cause: string): Promise<void> => {
    draining = true
    return drain(app, config, logger, {
      cause,
      onTimeout: () => {
        logger.warn('shutdown timeout reached: cutting the reviews still in flight')
        app.server.closeAllConnections()
      },
      afterClose: async () => { await admin.close() },
    })
  }
  const stop = (cause: string): Promise<void> => {
    stopping ??= drainWebhook(cause)
    return stopping
  }
  const admin = buildAdminServer({ metrics, readiness, onQuit: () => { void stop('quitquitquit') }, logger, limits: { maxConnections: config.admin.maxConnections } })
  const { address, adminAddress, fields } = await listenWithAdmin(app, config.listen, admin, config.admin, { listen: 'COS_INJECT_PORT', admin: 'COS_ADMIN_PORT' })
  listening = true
  const current = settings()
  logger.info({
    ...fields,
    image: current.template.container.image,
    version: current.version,
    sidecarFile: config.sidecarFile ?? null,
    nativeSidecar: current.nativeSidecar,
    defaultSecret: current.defaultSecret ?? null,
  }, 'cos-auth-proxy injection webhook listening')
  return { address, adminAddress, stop }
}

/** The `inject` command: ConfigError propagates (exit 78 in cli.ts). */
export async function runInject (programVersion: string): Promise<void> {
  const config = loadInjectConfig(process.env, { programVersion })
  const logger = createLogger(config.logLevel, await inLogFormat(config.logFormat, stdoutDestination()))
  const webhook = await startWebhook(config, logger, programVersion)
  let signalled = false
  const onSignal = (signal: string): void => {
    if (signalled) {
      logger.warn({ signal }, 'second signal: exiting without finishing the drain')
      process.exit(1)
    }
    signalled = true
    webhook.stop(signal).then(() => process.exit(0), (err: unknown) => {
      logger.error({ err }, 'shutdown failed')
      process.exit(1)
    })
  }
  process.on('SIGTERM', () => { onSignal('SIGTERM') })
  process.on('SIGINT', () => { onSignal('SIGINT') })
}

// ---------------------------------------------------------------------------
// The sidecar definition the webhook serves, re-read when its file changes:
// a ConfigMap volume swaps its files through the ..data symlink, so the
// directory is watched, and a changed file is parsed and checked before it
// replaces the definition in one assignment. A file that does not pass keeps
// the previous definition, with a warning and a metric.

export interface SidecarSourceOptions {
  readonly file: string
  readonly env: NodeJS.ProcessEnv
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
      next = readSidecarSettings(this.opts.file, this.opts.env, this.opts.programVersion, text)
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
