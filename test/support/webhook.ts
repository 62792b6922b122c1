// The real webhook server (buildWebhookServer) listening on 127.0.0.1 for one
// test: the example sidecar, metrics of its own, a logger into a LogCapture
// unless one is given, its limits and budgets as the test sets them;
// stopped with the test (its connections cut first); and one POST to it.
import { request as httpsRequest, type Agent, type Server as HttpsServer } from 'node:https'
import type { FastifyBaseLogger } from 'fastify'
import type { Test } from 'tap'
import type { ByteBudget } from '../../src/client/bytes-in-flight.js'
import type { WebhookLimits } from '../../src/inject/limits.js'
import { InjectMetrics } from '../../src/inject/metrics.js'
import type { InjectSettings } from '../../src/inject/patch.js'
import { buildWebhookServer, type CertificateFiles } from '../../src/inject/server.js'
import { createLogger } from '../../src/observability/logger.js'
import { LogCapture } from './helpers.js'
import { EXAMPLE_SETTINGS } from '../inject/pods.js'

export interface TestWebhookOptions {
  readonly tls: CertificateFiles
  readonly limits?: Partial<WebhookLimits>
  readonly budgets?: { readonly bodies?: ByteBudget, readonly answers?: ByteBudget }
  /** A logger of the test's own; else one at info into `logs`. */
  readonly logger?: FastifyBaseLogger
  readonly certificateCheckMs?: number
  /** The definition it injects; the example's (EXAMPLE_SETTINGS) unless given. */
  readonly settings?: InjectSettings
}

export interface TestWebhook {
  readonly port: number
  readonly server: HttpsServer
  readonly metrics: InjectMetrics
  /** What the webhook logged (empty when the test gave its own logger). */
  readonly logs: LogCapture
  /** Connections the server holds now. */
  readonly connections: () => Promise<number>
}

export async function startTestWebhook (t: Test, opts: TestWebhookOptions): Promise<TestWebhook> {
  const metrics = new InjectMetrics({ defaultMetrics: false })
  const logs = new LogCapture()
  const app = await buildWebhookServer({
    settings: () => opts.settings ?? EXAMPLE_SETTINGS,
    tls: opts.tls,
    metrics,
    logger: opts.logger ?? createLogger('info', logs),
    ...(opts.limits === undefined ? {} : { limits: opts.limits }),
    ...(opts.budgets === undefined ? {} : { budgets: opts.budgets }),
    ...(opts.certificateCheckMs === undefined ? {} : { certificateCheckMs: opts.certificateCheckMs }),
  })
  await app.listen({ host: '127.0.0.1', port: 0 })
  t.teardown(async () => {
    app.server.closeAllConnections()
    await app.close()
  })
  const connections = (): Promise<number> => new Promise((resolve, reject) => { app.server.getConnections((err, n) => { if (err === null) resolve(n); else reject(err) }) })
  return { port: (app.server.address() as { port: number }).port, server: app.server, metrics, logs, connections }
}

export interface WebhookAnswer { status: number, body: string }

/** One POST to the webhook, trusting `ca` only, on a new connection unless `agent` keeps one: status and body, read whole. */
export function postToWebhook (port: number, ca: string, body: string, opts: { readonly path?: string, readonly timeoutMs: number, readonly agent?: Agent | false }): Promise<WebhookAnswer> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest({ host: '127.0.0.1', port, path: opts.path ?? '/mutate', method: 'POST', ca, agent: opts.agent ?? false, headers: { 'content-type': 'application/json' }, timeout: opts.timeoutMs }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (d: string) => { text += d })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, body: text }) })
    })
    req.on('error', reject)
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.end(body)
  })
}
