// `cos-auth-proxy inject`: the webhook and its admin listener, until SIGTERM
// or SIGINT, then the proxy's drain: readiness 503 at once, keep answering
// for COS_SHUTDOWN_DELAY_MS (the API server still has this pod as an
// endpoint), stop accepting, give reviews in flight COS_SHUTDOWN_TIMEOUT_MS.
// While serving, the sidecar definition is re-read when its file changes
// (SidecarSource, sidecar-source.ts).
import type { AddressInfo } from 'node:net'
import type { Logger } from 'pino'
import { buildAdminServer, type Readiness } from '../admin/admin.js'
import { listenWithAdmin } from '../admin/listeners.js'
import { drain } from '../admin/drain.js'
import { createLogger, inLogFormat, stdoutDestination } from '../observability/logger.js'
import type { InjectConfig } from './config.js'
import { InjectMetrics } from './metrics.js'
import { buildWebhookServer } from './server.js'
import { SidecarSource } from './sidecar-source.js'

export interface RunningWebhook {
  readonly address: AddressInfo
  readonly adminAddress: AddressInfo
  /** Drains and closes both listeners (what SIGTERM does, without exiting). */
  readonly stop: (cause: string) => Promise<void>
}

/** Starts both listeners. The caller decides what a signal does (runInject: drain, then exit). */
export async function startWebhook (config: InjectConfig, logger: Logger, programVersion: string): Promise<RunningWebhook> {
  const metrics = new InjectMetrics()
  metrics.sidecarVersion(config.settings.version)
  const source = new SidecarSource(config.settings, { file: config.sidecarFile, sidecar: config.sidecar, programVersion, metrics, logger })
  const settings = source.current
  if (config.tls === undefined) throw new Error('startWebhook needs the serving certificate (loadInjectConfig with serving)')
  const app = await buildWebhookServer({ settings, tls: config.tls, metrics, logger })
  source.start()
  app.addHook('onClose', (_instance, done) => { source.close(); done() })
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
    sidecarFile: config.sidecarFile,
    nativeSidecar: current.nativeSidecar,
    defaultSecret: current.defaultSecret ?? null,
  }, 'cos-auth-proxy injection webhook listening')
  return { address, adminAddress, stop }
}

/** The `inject` command, with the settings cli.ts loaded (a ConfigError there is exit 78). */
export async function runInject (config: InjectConfig, programVersion: string): Promise<void> {
  const logger = createLogger(config.logLevel, await inLogFormat(config.logFormat, stdoutDestination(), config.logColour))
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
