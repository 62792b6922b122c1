// What an upstream exchange (upstream-exchange.ts) is given for its route,
// built once per route by proxy.ts: where its requests go, how they are
// signed, what is reported, how a failure is answered.
import type { FastifyReply } from 'fastify'
import type { Dispatcher } from 'undici'
import type { RefusalStatus } from './auth-refusals.js'
import type { RouteName } from '../config/config.js'
import type { CredentialStore } from '../credentials/credentials.js'
import type { RetryWaits } from './retry.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'

/** What the exchange reports; the metrics registry implements it. */
export interface ExchangeObserver {
  readonly retried: (route: RouteName, reason: 'connect' | 'unauthorized') => void
  readonly tokenMinted: () => void
  /** The upstream answered (the status of its answer, before the proxy forwards it; `retryAfter`: a 503 carrying Retry-After). */
  readonly upstreamResponse?: ((route: RouteName, status: number, retryAfter: boolean) => void) | undefined
}

/** Fixed per route: where and how its requests go. */
export interface ExchangeRoute {
  readonly name: RouteName
  readonly origin: string
  readonly dispatcher: Dispatcher
  readonly credentials: CredentialStore
  readonly observer?: ExchangeObserver | undefined
  readonly resyncCredentials?: (() => void) | undefined
  readonly clock?: UpstreamClock | undefined
  readonly authRefused?: ((route: RouteName, status: RefusalStatus, traceparent: string | string[] | undefined) => void) | undefined
  /** Answers a failed exchange (forward-response.ts: 502/504/413, or nothing for a client gone). */
  readonly fail: (reply: FastifyReply, error: Error) => void
  /** COS_UPSTREAM_TIMEOUT_MS: interim answers (1xx) do not put off the final one past it. */
  readonly headersTimeoutMs?: number | undefined
  /** The proxy's retries waiting on a Retry-After, stopped when it closes; none without it. */
  readonly waits?: RetryWaits | undefined
}
