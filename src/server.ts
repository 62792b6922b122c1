// Wiring and lifecycle: config + credentials + logger → one Fastify server.
import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify'
import type { Logger } from 'pino'
import type { Config } from './config.js'
import { CredentialStore } from './credentials.js'
import { sendError } from './errors.js'
import { proxyPlugin } from './proxy.js'
import { RequestLog } from './request-log.js'
import type { HeaderMinter } from './token.js'

// A client-chosen id is kept when it is a sane token; anything else (too
// long, spaces, control bytes) is replaced, so logs cannot be forged with it.
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/

export function requestId (req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID()
}

const STATUS_CODES: Readonly<Record<number, string>> = {
  400: 'bad_request',
  404: 'route_not_found',
  405: 'method_not_allowed',
  408: 'request_timeout',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  431: 'request_header_fields_too_large',
}

export interface ProxyServerOptions {
  readonly config: Config
  readonly credentials: CredentialStore
  readonly logger: FastifyBaseLogger
  /** Defaults to 60 s; issue-level setting COS_BODY_IDLE_TIMEOUT_MS comes later. */
  readonly bodyIdleTimeoutMs?: number
}

export async function buildProxyServer (opts: ProxyServerOptions): Promise<FastifyInstance> {
  const { config } = opts
  const app = Fastify({
    loggerInstance: opts.logger,
    logController: new RequestLog(),
    requestIdHeader: false,
    genReqId: requestId,
    return503OnClosing: true,
  })

  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
    done()
  })

  app.setNotFoundHandler((request, reply) => {
    sendError(reply, 404, 'route_not_found', `no route for ${request.method} on this path`)
  })

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const status = error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 600 ? error.statusCode : 500
    if (status >= 500) {
      request.log.error({ err: error }, 'request failed')
      sendError(reply, status, 'internal_error', 'the proxy failed to handle the request')
      return
    }
    request.log.debug({ err: error }, 'request refused')
    sendError(reply, status, STATUS_CODES[status] ?? 'bad_request', error.message)
  })

  await app.register(proxyPlugin, {
    routes: config.routes,
    credentials: opts.credentials,
    connectTimeoutMs: config.connectTimeoutMs,
    upstreamTimeoutMs: config.upstreamTimeoutMs,
    bodyIdleTimeoutMs: opts.bodyIdleTimeoutMs ?? 60_000,
  })
  return app
}

export interface ServeOptions {
  readonly config: Config
  readonly minter: HeaderMinter
  readonly logger: Logger
  readonly onListening?: (address: AddressInfo) => void
  /** Runs after the proxy has closed, before the process exits. */
  readonly onClose?: () => Promise<void>
}

/**
 * Runs the proxy until SIGTERM or SIGINT: then stops accepting, lets
 * in-flight requests finish, closes idle keep-alive connections and exits 0.
 * A second signal exits at once.
 */
export async function serve (opts: ServeOptions): Promise<FastifyInstance> {
  const { config, logger } = opts
  const credentials = new CredentialStore(opts.minter)
  const app = await buildProxyServer({ config, credentials, logger })
  await app.listen({ host: config.listen.host, port: config.listen.port })
  const address = app.server.address() as AddressInfo
  logger.info({
    address: address.address,
    port: address.port,
    accessKey: opts.minter.accessKey,
    routes: config.routes.map(r => ({ name: r.name, prefix: r.prefix === '' ? '/' : r.prefix, upstream: r.url })),
  }, 'cos-auth-proxy listening')
  opts.onListening?.(address)

  let stopping = false
  const stop = (signal: NodeJS.Signals): void => {
    if (stopping) {
      logger.warn({ signal }, 'second signal: exiting now')
      process.exit(0)
    }
    stopping = true
    logger.info({ signal }, 'draining')
    app.close()
      .then(async () => { await opts.onClose?.() })
      .then(() => { logger.info('stopped'); logger.flush(); process.exit(0) },
        (err: unknown) => { logger.error({ err }, 'shutdown failed'); logger.flush(); process.exit(1) })
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  return app
}
