// Routes + header rewriting: the one place where a client request becomes a
// signed upstream request. One @fastify/http-proxy registration per route,
// each over its own keep-alive undici Pool (shared by routes with one origin).
import type { IncomingHttpHeaders } from 'node:http'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import httpProxy from '@fastify/http-proxy'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import { Pool } from 'undici'
import type { Route, RouteName } from './config.js'
import type { CredentialStore } from './credentials.js'
import { sendError } from './errors.js'

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Bounded label for logs and metrics: never the raw path. */
    routeName?: RouteName
  }
}

export interface ProxyOptions {
  readonly routes: readonly Route[]
  readonly credentials: CredentialStore
  readonly connectTimeoutMs: number
  /** Time to response headers. */
  readonly upstreamTimeoutMs: number
  /** Longest silence allowed while a body streams, either way. */
  readonly bodyIdleTimeoutMs: number
}

// Hop-by-hop (RFC 9110 §7.6.1) plus the client's own credentials. `expect`
// is answered by Node's server itself (100-continue) and undici refuses it.
// Set to undefined rather than deleted: undici skips undefined values and the
// object keeps its shape.
const DROP_REQUEST = ['authorization', 'proxy-authorization', 'proxy-connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'expect'] as const
const DROP_RESPONSE = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade'] as const

function connectionTokens (value: string | string[] | undefined): string[] {
  if (value === undefined) return []
  return (Array.isArray(value) ? value.join(',') : value).split(',').map(s => s.trim().toLowerCase()).filter(s => s !== '')
}

const TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'FST_REPLY_FROM_GATEWAY_TIMEOUT', 'FST_REPLY_FROM_TIMEOUT'])

/** Maps a reply-from/undici failure to the proxy's contract: 504 for timeouts, 502 for the rest. */
export function upstreamErrorStatus (error: Error): 502 | 504 {
  const code = (error as { code?: string }).code
  const causeCode = (error.cause as { code?: string } | undefined)?.code
  return TIMEOUT_CODES.has(code ?? '') || TIMEOUT_CODES.has(causeCode ?? '') ? 504 : 502
}

export async function proxyPlugin (fastify: FastifyInstance, opts: ProxyOptions): Promise<void> {
  const { credentials } = opts
  const pools = new Map<string, Pool>()
  const poolFor = (origin: string): Pool => {
    let pool = pools.get(origin)
    if (pool === undefined) {
      pool = new Pool(origin, {
        connect: { timeout: opts.connectTimeoutMs },
        headersTimeout: opts.upstreamTimeoutMs,
        bodyTimeout: opts.bodyIdleTimeoutMs,
      })
      pools.set(origin, pool)
    }
    return pool
  }
  fastify.addHook('onClose', async () => {
    await Promise.all([...pools.values()].map(p => p.close()))
  })

  // Bodies are streamed, never parsed or buffered: drop Fastify's JSON and
  // text parsers; @fastify/http-proxy adds its pass-through parser for '*'.
  fastify.removeAllContentTypeParsers()

  const rewriteRequestHeaders: NonNullable<FastifyReplyFromHooks['rewriteRequestHeaders']> = (request, headers) => {
    const h = headers as IncomingHttpHeaders // HTTP/1 only: the proxy listens on plain HTTP/1.1
    for (const name of connectionTokens(request.headers.connection)) h[name] = undefined
    for (const name of DROP_REQUEST) h[name] = undefined
    // preHandler guaranteed a pair; read it again so a swap in between is honoured.
    h.authorization = credentials.current?.next()
    h['x-request-id'] = request.id
    return h
  }

  const rewriteHeaders: NonNullable<FastifyReplyFromHooks['rewriteHeaders']> = (headers) => {
    const h = headers as IncomingHttpHeaders
    // Deleted, not set to undefined: reply-from copies every key it finds.
    // eslint-disable-next-line @typescript-eslint/no-dynamic-delete
    for (const name of connectionTokens(h.connection)) delete h[name]
    // eslint-disable-next-line @typescript-eslint/no-dynamic-delete
    for (const name of DROP_RESPONSE) delete h[name]
    return h
  }

  const onError: NonNullable<FastifyReplyFromHooks['onError']> = (reply, { error }) => {
    const status = upstreamErrorStatus(error)
    if (status === 504) sendError(reply, 504, 'upstream_timeout', 'the upstream did not answer in time')
    else sendError(reply, 502, 'upstream_unavailable', 'the upstream could not be reached')
  }

  // Callback style: replying without calling done() ends the request here.
  function requireCredentials (_request: FastifyRequest, reply: FastifyReply, done: () => void): void {
    if (credentials.current === undefined) {
      sendError(reply, 503, 'credentials_unavailable', 'no valid access key pair is loaded yet')
      return
    }
    done()
  }

  for (const route of opts.routes) {
    await fastify.register(httpProxy, {
      upstream: route.origin,
      // The catch-all is registered at '/', which http-proxy strips like any
      // prefix, so its rewrite keeps the '/' that separates base and path.
      prefix: route.prefix === '' ? '/' : route.prefix,
      rewritePrefix: route.prefix === '' ? route.basePath + '/' : route.basePath === '' ? '/' : route.basePath,
      undici: poolFor(route.origin),
      websocket: false,
      disableRequestLogging: true,
      // Responses pass through unchanged, Location included.
      internalRewriteLocationHeader: false,
      config: { routeName: route.name },
      preHandler: requireCredentials,
      replyOptions: {
        rewriteRequestHeaders,
        rewriteHeaders,
        onError,
        // reply-from retries a GET that got 503 up to 10 times by default;
        // the proxy returns the upstream's answer as it is.
        retryDelay: () => null,
      },
    })
  }
}
