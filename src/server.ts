// `serve`: start (credentials, upstreams, metrics, the proxy and admin
// listeners), what readiness waits for, the drain on SIGTERM / SIGINT / POST
// /quitquitquit, and exit, through the lifecycle `inject` shares
// (admin/lifecycle.ts). What the proxy server is made of: proxy-server.ts.
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import type { Logger } from 'pino'
import { exitAfterFlush, startListeners } from './admin/lifecycle.js'
import type { BoundListeners } from './admin/listeners.js'
import { acceptBurstsFirst } from './client/accept-bursts.js'
import { isLoopbackAddress } from './client/browser-checks.js'
import type { Config } from './config/config.js'
import { CredentialWatcher } from './credentials/credential-watcher.js'
import { accessKeyHint, CredentialStore } from './credentials/credentials.js'
import { drain } from './admin/drain.js'
import { ProxyMetrics } from './observability/metrics.js'
import { buildProxyServer, metricsObserver, upstreamsFor } from './proxy/proxy-server.js'
import { RequestLog } from './observability/request-log.js'
import type { Upstreams } from './upstream/upstream.js'

/** How long the drain may still take once the shutdown timeout has cut everything (it needs milliseconds). */
const EXIT_GRACE_MS = 500

function usesFiles (config: Config): boolean {
  return config.credentials.accessKey.file !== undefined || config.credentials.secret.file !== undefined
}

/** For the start line: the egress proxy a route goes through, password redacted. */
function egressOf (upstreams: Upstreams, origin: string): { egressProxy?: string } {
  const proxy = upstreams.egressProxyFor(origin)
  return proxy === undefined ? {} : { egressProxy: proxy.url }
}

export interface ServeOptions {
  readonly config: Config
  readonly logger: Logger
  readonly onListening?: (address: AddressInfo) => void
  /** Log lines the logger's destination has dropped so far (exported as a metric). */
  readonly logLinesDropped?: () => number
  /** Runs after the proxy has drained, before the process exits. */
  readonly onClose?: () => Promise<void>
}

async function watchCredentials (config: Config, logger: Logger, metrics: ProxyMetrics): Promise<{ store: CredentialStore, watcher: CredentialWatcher }> {
  const store = new CredentialStore()
  const watcher = new CredentialWatcher({
    credentials: config.credentials,
    encoding: config.tokenEncoding,
    store,
    reloadMs: config.credentialsReloadMs,
    logger,
    onOutcome: o => metrics.credentialReload(o.result, o.result === 'rejected' ? o.refusal : undefined),
  })
  await watcher.start()
  return { store, watcher }
}

/**
 * Runs the sidecar until SIGTERM, SIGINT or POST /quitquitquit, then drains:
 * readiness turns 503 at once; after COS_SHUTDOWN_DELAY_MS the listener stops
 * accepting and idle keep-alive connections are closed; requests in flight
 * (streams included) get up to COS_SHUTDOWN_TIMEOUT_MS, then the rest are cut
 * on both sides, the client's connection and the upstream request; exit 0, at
 * most EXIT_GRACE_MS after the timeout. A second signal exits at once.
 */
export async function serve (opts: ServeOptions): Promise<void> {
  const { config, logger } = opts
  // First, as it reads the TLS files: a config error must come before anything starts.
  const upstreams = upstreamsFor(config, logger)
  const metrics = new ProxyMetrics(opts.logLinesDropped === undefined ? {} : { logLinesDropped: opts.logLinesDropped })
  const { store, watcher } = await watchCredentials(config, logger, metrics)
  upstreams.watch()
  metrics.observeCertificates(() => upstreams.certificateExpiry)
  const observer = metricsObserver(metrics)
  const requestLog = new RequestLog(observer, config.accessLog)
  const app = await buildProxyServer({
    config,
    credentials: store,
    logger,
    upstreams,
    observer,
    requestLog,
    resyncCredentials: () => { watcher.nudge() },
    ...(usesFiles(config) ? { rereadCredentials: () => watcher.reload() } : {}),
  })

  const drainProxy = (cause: string, admin: FastifyInstance): Promise<void> => drain(app, config, logger, {
    cause,
    onTimeout: () => { cutWhatIsLeft(app, admin, upstreams, logger) },
    afterClose: async () => {
      // Responses emit 'close' (which writes their log line) a few ticks after
      // their socket is gone; let them, so the last lines are not lost at exit.
      const settled = Date.now() + 200
      while (requestLog.open > 0 && Date.now() < settled) await new Promise(resolve => setImmediate(resolve))
      watcher.close()
      await admin.close()
      await opts.onClose?.()
    },
  })
  // A burst of new connections (an app restarting its pool) is accepted before the
  // established ones are read again, and waits in the kernel's queue rather than
  // having its SYNs dropped and retried 1, 3, 7 s later: room for every connection
  // the cap admits (docs/performance.md, "A burst of new connections").
  acceptBurstsFirst(app.server)
  const { bound, exitOnSignals } = await startListeners({
    app,
    listener: 'proxy listener',
    notReady: () => store.current === undefined ? 'credentials not loaded' : undefined,
    drain: drainProxy,
    admin: { metrics, logger, limits: { maxConnections: config.admin.maxConnections }, quitquitquit: config.admin.quitquitquit },
    listen: { ...config.listen, backlog: Math.max(511, config.client.maxConnections) },
    adminListen: config.admin,
    variables: { listen: 'COS_LISTEN_PORT', admin: 'COS_ADMIN_PORT' },
    logger,
  })
  exitOnSignals()
  logStart(config, logger, bound.fields, store, upstreams)
  opts.onListening?.(bound.address)
}

/**
 * The shutdown timeout: cut the clients' connections (which aborts their
 * upstream requests), destroy the upstream pools (so nothing waits for an
 * upstream that does not answer), and the admin listener's connections.
 * What is left of the drain then takes milliseconds; should something
 * still hang, the process exits EXIT_GRACE_MS later all the same.
 */
function cutWhatIsLeft (app: FastifyInstance, admin: FastifyInstance, upstreams: Upstreams, logger: Logger): void {
  logger.warn('shutdown timeout reached: cutting the requests still in flight')
  app.server.closeAllConnections()
  admin.server.closeAllConnections()
  upstreams.destroy().catch((err: unknown) => logger.warn({ err }, 'destroying the upstream pools failed'))
  setTimeout(() => {
    logger.warn('shutdown: exiting with the drain unfinished')
    exitAfterFlush(logger, 0)
  }, EXIT_GRACE_MS).unref()
}

function logStart (config: Config, logger: Logger, fields: BoundListeners['fields'], store: CredentialStore, upstreams: Upstreams): void {
  if (config.allowFromIsDefault && !isLoopbackAddress(config.listen.host)) {
    logger.warn({ host: config.listen.host, allowFrom: config.allowFrom },
      'listening beyond loopback with the default COS_ALLOW_FROM: only 127.0.0.0/8 and ::1 may use the proxy; set COS_ALLOW_FROM to the CIDRs of your clients (and restrict them with a NetworkPolicy)')
  }
  logger.info({
    ...fields,
    accessKey: store.current === undefined ? null : accessKeyHint(store.current.accessKey),
    routes: config.routes.map(r => ({ name: r.name, prefix: r.prefix === '' ? '/' : r.prefix, upstream: r.url, ...egressOf(upstreams, r.origin) })),
  }, 'cos-auth-proxy listening')
}
