// A routed request, in order: admitted on its route (route-admission.ts),
// its body limited as it streams, its headers rewritten
// (upstream-headers.ts), then signed, forwarded over the route's undici
// dispatcher (upstream.ts), retried only when safe (retry.ts) and its answer
// forwarded (upstream-exchange.ts) or its failure answered
// (forward-response.ts). One @fastify/http-proxy registration per route:
// http-proxy routes, rewrites the prefix and checks the destination, then
// hands it to the exchange (its `handler` option) instead of reply-from.
import type { IncomingHttpHeaders } from 'node:http'
import { Readable } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import httpProxy, { type FastifyHttpProxyOptions } from '@fastify/http-proxy'
import type { RefusalStatus } from './auth-refusals.js'
import { quietRequestLogs } from '../observability/quiet-request-logger.js'
import type { Route, RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { answerFailedUpstreamBodies, answerUpstreamFailure } from './forward-response.js'
import { admitToRoute, limitBodyTo } from './route-admission.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'
import type { ExchangeRoute } from './exchange-route.js'
import { UpstreamExchange } from './upstream-exchange.js'
import { RetryWaits } from './retry.js'
import { upstreamRequestHeaders } from './upstream-headers.js'
import { upstreamPath } from '../upstream/upstream-path.js'
import type { Upstreams } from '../upstream/upstream.js'

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Bounded label for logs and metrics: never the raw path. */
    routeName?: RouteName
    /** COS_*_ALLOWED_METHODS; undefined = all. */
    allowedMethods?: readonly string[] | undefined
  }
  interface FastifyRequest {
    /** performance.now() when the request left for the upstream (decorated in proxy-server.ts). */
    upstreamStart: number
    /** ms from leaving to the upstream's response headers; -1 = never reached. */
    upstreamMs: number
  }
}

/** What the proxy reports; the metrics registry implements it (tests may pass nothing). */
export interface ProxyObserver {
  upstreamError: (route: RouteName, err: Error) => void
  retried: (route: RouteName, reason: 'connect' | 'unauthorized') => void
  tokenMinted: () => void
  /** The upstream answered (the status of its answer, before the proxy forwards it; `retryAfter`: a 503 carrying Retry-After). */
  upstreamResponse?: (route: RouteName, status: number, retryAfter: boolean) => void
  /** A measurement of the upstream's clock, in seconds (upstream minus local). */
  upstreamClockSkew?: (seconds: number) => void
}

export interface ProxyOptions {
  readonly routes: readonly Route[]
  readonly credentials: CredentialStore
  readonly upstreams: Upstreams
  /** Asks for the credential files to be re-read in the background (an upstream 401); rate-limited, never blocks. */
  readonly resyncCredentials?: () => void
  readonly observer?: ProxyObserver
  /** A header only for the proxy (COS_REQUIRE_HEADER): never forwarded. */
  readonly dropHeader?: string
  /** 0 = unlimited. Streamed bodies are counted as they pass. */
  readonly maxBodyBytes?: number
  /** Reads the upstream's clock off its answers (sampled). */
  readonly clock?: UpstreamClock
  /** An upstream answered 401 or 403 (rate-limited diagnosis; never on the request's time). */
  readonly authRefused?: (route: RouteName, status: RefusalStatus, traceparent: string | string[] | undefined) => void
  /** COS_UPSTREAM_TIMEOUT_MS, which interim (1xx) answers do not extend (undici's own timer restarts on each). */
  readonly upstreamTimeoutMs?: number
}

type PreHandler = ReturnType<typeof limitBodyTo>

export async function proxyPlugin (fastify: FastifyInstance, opts: ProxyOptions): Promise<void> {
  const { upstreams } = opts
  const maxBodyBytes = opts.maxBodyBytes ?? 0
  // Bodies are streamed, never parsed or buffered: drop Fastify's JSON and
  // text parsers; @fastify/http-proxy adds its pass-through parser for '*'.
  fastify.removeAllContentTypeParsers()

  quietRequestLogs(fastify)
  const limitBody = maxBodyBytes > 0 ? limitBodyTo(maxBodyBytes) : undefined
  const fail = answerUpstreamFailure({ upstreams, observer: opts.observer, maxBodyBytes })
  answerFailedUpstreamBodies(fastify, fail)
  // Retries waiting on a Retry-After stop when the proxy closes (the drain): their 401 is the answer.
  const waits = new RetryWaits()
  fastify.addHook('preClose', done => { waits.close(); done() })
  for (const route of opts.routes) {
    const exchange: ExchangeRoute = {
      name: route.name,
      origin: route.origin,
      dispatcher: upstreams.dispatcherFor(route.origin),
      credentials: opts.credentials,
      observer: opts.observer,
      resyncCredentials: opts.resyncCredentials,
      clock: opts.clock,
      authRefused: opts.authRefused,
      fail,
      headersTimeoutMs: opts.upstreamTimeoutMs,
      waits,
    }
    // Each route in a scope of its own, with its own admission hook.
    await fastify.register(async scope => {
      scope.addHook('onRequest', admitToRoute(route, opts.routes, opts.credentials))
      await scope.register(httpProxy, routeOptions(route, limitBody, forwardTo(exchange, opts.dropHeader)))
    })
  }
}

type Forward = (request: FastifyRequest, reply: FastifyReply, dest: string) => void

/** http-proxy's handler for one route: the checked destination goes upstream through an exchange. */
function forwardTo (route: ExchangeRoute, dropHeader: string | undefined): Forward {
  const host = new URL(route.origin).host
  return (request, reply, dest) => {
    const headers: IncomingHttpHeaders = upstreamRequestHeaders(request.headers, host, request.id, dropHeader)
    // http-proxy's pass-through parser: the client's stream (or BodyLimit's), never a parsed value.
    const body = request.body instanceof Readable ? request.body : null
    // For a bare prefix with a query (`/management?q=1`) and no upstream base
    // path, http-proxy computes an empty destination.
    const path = upstreamPath(dest === '' ? '/' : dest, route.origin, request.raw.url ?? '/')
    new UpstreamExchange(route, request, reply, { origin: route.origin, path, method: request.method, headers, body }).start()
  }
}

/** One route's @fastify/http-proxy registration. */
function routeOptions (route: Route, limitBody: PreHandler | undefined, handler: Forward): FastifyHttpProxyOptions & { websocket: false } {
  return {
    upstream: route.origin,
    // The catch-all is registered at '/', which http-proxy strips like any
    // prefix, so its rewrite keeps the '/' that separates base and path.
    prefix: route.prefix === '' ? '/' : route.prefix,
    rewritePrefix: route.prefix === '' ? route.basePath + '/' : route.basePath === '' ? '/' : route.basePath,
    websocket: false,
    config: { routeName: route.name, allowedMethods: route.allowedMethods },
    ...(limitBody === undefined ? {} : { preHandler: limitBody }),
    // Nothing is returned: Fastify would otherwise wait on whatever comes back.
    handler: (request, reply, dest) => { handler(request, reply, dest) },
  }
}
