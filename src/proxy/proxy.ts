// A routed request, in order: admitted on its route (route-admission.ts),
// its body limited as it streams, signed (upstream-headers.ts), forwarded
// over the route's undici Pool (upstream.ts) and retried only when safe
// (retry.ts), its answer forwarded or its failure answered
// (forward-response.ts). One @fastify/http-proxy registration per route.
import type { FastifyInstance } from 'fastify'
// Before @fastify/http-proxy, which loads reply-from: see the module.
import '../patches/reply-from-patch.js'
import httpProxy, { type FastifyHttpProxyOptions } from '@fastify/http-proxy'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import type { RefusalStatus } from './auth-refusals.js'
import { quietRequestLogs } from '../observability/quiet-request-logger.js'
import type { Route, RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import { answerFailedUpstreamBodies, answerUpstreamFailure, forwardUpstreamResponse } from './forward-response.js'
import { retryPolicy } from './retry.js'
import { admitToRoute, limitBodyTo } from './route-admission.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'
import { forwardedResponseHeaders, signedRequestHeaders } from './upstream-headers.js'
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
  /** The upstream answered (the status of its answer, before the proxy forwards it). */
  upstreamResponse?: (route: RouteName, status: number) => void
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
  readonly authRefused?: (route: RouteName, status: RefusalStatus) => void
}

type PreHandler = ReturnType<typeof limitBodyTo>

export async function proxyPlugin (fastify: FastifyInstance, opts: ProxyOptions): Promise<void> {
  const { upstreams } = opts
  const maxBodyBytes = opts.maxBodyBytes ?? 0
  // Bodies are streamed, never parsed or buffered: drop Fastify's JSON and
  // text parsers; @fastify/http-proxy adds its pass-through parser for '*'.
  fastify.removeAllContentTypeParsers()

  quietRequestLogs(fastify)
  fastify.addHook('onRequest', admitToRoute(opts.routes, opts.credentials))
  const limitBody = maxBodyBytes > 0 ? limitBodyTo(maxBodyBytes) : undefined
  const onError = answerUpstreamFailure({ upstreams, observer: opts.observer, maxBodyBytes })
  answerFailedUpstreamBodies(fastify, onError)
  const replyOptions: FastifyReplyFromHooks = {
    rewriteRequestHeaders: signedRequestHeaders(opts),
    rewriteHeaders: forwardedResponseHeaders(opts.clock),
    onError,
    onResponse: forwardUpstreamResponse(onError, opts.authRefused, opts.observer),
  }
  const retryDelayFor = retryPolicy(opts)
  for (const route of opts.routes) {
    await fastify.register(httpProxy, routeOptions(route, upstreams, limitBody, {
      ...replyOptions,
      // Replaces reply-from's default, which retries a GET that got 503
      // up to 10 times with the same token.
      retryDelay: retryDelayFor(route.name),
    }))
  }
}

/** One route's @fastify/http-proxy registration. */
function routeOptions (route: Route, upstreams: Upstreams, limitBody: PreHandler | undefined, replyOptions: FastifyReplyFromHooks): FastifyHttpProxyOptions & { websocket: false } {
  return {
    upstream: route.origin,
    // The catch-all is registered at '/', which http-proxy strips like any
    // prefix, so its rewrite keeps the '/' that separates base and path.
    prefix: route.prefix === '' ? '/' : route.prefix,
    rewritePrefix: route.prefix === '' ? route.basePath + '/' : route.basePath === '' ? '/' : route.basePath,
    undici: upstreams.dispatcherFor(route.origin),
    websocket: false,
    disableRequestLogging: true,
    // Responses pass through unchanged, Location included.
    internalRewriteLocationHeader: false,
    config: { routeName: route.name, allowedMethods: route.allowedMethods },
    ...(limitBody === undefined ? {} : { preHandler: limitBody }),
    // For a bare prefix with a query (`/management?q=1`) and no upstream base
    // path, http-proxy computes an empty destination, and reply-from reads
    // an empty one as "the original URL": the prefix would not be stripped.
    // Nothing is returned: the reply is a thenable, and Fastify would hang
    // a promise and end-of-stream listeners on every response to await it.
    handler: (_request, reply, dest, options) => { reply.from(dest === '' ? '/' : dest, options) },
    replyOptions,
  }
}
