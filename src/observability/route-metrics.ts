// What the proxy counts per route: the cells the hot path bumps (allocated
// once per route label) and the scrape-time metrics that read them.
import { Counter, type Registry } from 'prom-client'
import { ROUTE_TABLE, type RouteName } from '../config/config.js'
import { HistogramCell, registerHistogram } from './metric-exposition.js'
import type { UpstreamErrorKind } from '../upstream/upstream-error-kinds.js'

export type RetryReason = 'connect' | 'unauthorized'

export const PREFIX = 'cos_auth_proxy_'

// Every label value is from one of these fixed lists, so the number of series
// is bounded whatever clients send.
// The route names of the route table, and `none` for a request no route took.
export const ROUTES: readonly RouteLabel[] = [...ROUTE_TABLE.map(r => r.name), 'none']
type RouteLabel = RouteName | 'none'
const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH'] as const
// `throttled`: 429, and 503 with Retry-After: the upstream's rate limit, counted apart from other 4xx/5xx.
const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx', 'throttled'] as const
const THROTTLED = 5
const ERROR_KINDS: readonly UpstreamErrorKind[] = ['refused', 'reset', 'timeout', 'tls', 'dns', 'other']
const RETRY_REASONS: readonly RetryReason[] = ['connect', 'unauthorized']

/**
 * 1xx..5xx → 0..4, and `throttled` (5) for a 429 or a 503 with Retry-After
 * (`retryAfter`). Node lets a status up to 999 through; anything past 5xx
 * counts as 5xx so the label set stays closed. Integer compares only.
 */
export function statusClassIndex (status: number, retryAfter = false): number {
  if (status === 429 || (status === 503 && retryAfter)) return THROTTLED
  const i = Math.trunc(status / 100) - 1
  return i >= 0 && i < 4 ? i : 4
}

/** Everything counted per route, allocated once. */
export class RouteCells {
  /** method → request count per status class; a method not listed counts under `other`. */
  readonly requests = new Map<string, Float64Array>(METHODS.map(m => [m, new Float64Array(STATUS_CLASSES.length)]))
  readonly other = new Float64Array(STATUS_CLASSES.length)
  readonly total = new HistogramCell()
  readonly upstream = new HistogramCell()
  /** Of the requests the upstream answered: total minus upstream time, the proxy's own share. */
  readonly added = new HistogramCell()
  /** The upstream's answers by status class (what it said, before the proxy forwarded it). */
  readonly answers = new Float64Array(STATUS_CLASSES.length)
  readonly errors: Record<UpstreamErrorKind, number> = { refused: 0, reset: 0, timeout: 0, tls: 0, dns: 0, other: 0 }
  readonly retries: Record<RetryReason, number> = { connect: 0, unauthorized: 0 }
  responseFailures = 0
  aborted = 0
  constructor (readonly route: RouteLabel) {}

  /**
   * Whether this route has sent anything upstream: from then on its upstream
   * answers and errors are all exported, zeros included, so that an alert
   * adding the two (or a panel) finds both series for every such route.
   */
  get reachedUpstream (): boolean {
    return this.answers.some(n => n > 0) || ERROR_KINDS.some(kind => this.errors[kind] > 0)
  }
}

/** What is counted per route: requests, their durations, upstream answers, failures and retries. */
export function registerRouteExporters (registry: Registry, cells: readonly RouteCells[]): void {
  const registers = [registry]
  new Counter({
    name: `${PREFIX}requests_total`,
    help: 'Requests answered, by route name, method and status class (whoever answered: the upstream, or the proxy itself); status_class="throttled": 429, or 503 with Retry-After, counted apart from 4xx and 5xx.',
    labelNames: ['route', 'method', 'status_class'] as const,
    registers,
    collect () {
      this.reset()
      for (const c of cells) {
        for (const [method, byClass] of [...c.requests, ['OTHER', c.other] as const]) {
          byClass.forEach((count, i) => {
            if (count > 0) this.inc({ route: c.route, method, status_class: STATUS_CLASSES[i] }, count)
          })
        }
      }
    },
  })
  registerRouteCounter(registry, `${PREFIX}requests_aborted_total`,
    'Requests whose connection closed before the response finished (the client went away, or the proxy cut a failed stream or, at the shutdown timeout, everything), by route name. Also counted in requests_total, with status 499 when no response had started.',
    cells, c => c.aborted)
  registerHistogram(registry, `${PREFIX}request_duration_seconds`, 'Time from request received to response finished, by route name.', cells, c => c.total)
  registerHistogram(registry, `${PREFIX}upstream_duration_seconds`, 'Time from sending the request upstream to the upstream\'s response headers, by route name.', cells, c => c.upstream)
  registerHistogram(registry, `${PREFIX}added_duration_seconds`,
    'Of each request the upstream answered: its time in the proxy minus the upstream\'s time to response headers (signing, forwarding, streaming the body), by route name.', cells, c => c.added)
  new Counter({
    name: `${PREFIX}upstream_responses_total`,
    help: 'Answers the upstream gave, by route name and the status class of its answer (status_class="throttled": 429, or 503 with Retry-After, apart from 4xx and 5xx). Answers the proxy made itself (503 without credentials, 502/504 when the upstream failed) are not counted here.',
    labelNames: ['route', 'status_class'] as const,
    registers,
    collect () {
      this.reset()
      for (const c of cells) {
        if (c.reachedUpstream) STATUS_CLASSES.forEach((status_class, i) => { this.inc({ route: c.route, status_class }, c.answers[i] as number) })
      }
    },
  })
  new Counter({
    name: `${PREFIX}upstream_errors_total`,
    help: 'Upstream requests that failed without a response, by route name and kind.',
    labelNames: ['route', 'kind'] as const,
    registers,
    collect () {
      this.reset()
      for (const c of cells) if (c.reachedUpstream) for (const kind of ERROR_KINDS) this.inc({ route: c.route, kind }, c.errors[kind])
    },
  })
  new Counter({
    name: `${PREFIX}upstream_retries_total`,
    help: 'Upstream requests sent again, by route name and reason.',
    labelNames: ['route', 'reason'] as const,
    registers,
    collect () {
      this.reset()
      for (const c of cells) for (const reason of RETRY_REASONS) if (c.retries[reason] > 0) this.inc({ route: c.route, reason }, c.retries[reason])
    },
  })
  registerRouteCounter(registry, `${PREFIX}response_failures_total`,
    'Responses that could not be written (Node refused their head): their connection was closed instead, by route name.',
    cells, c => c.responseFailures)
}

/** A counter with one series per route that has counted anything. */
function registerRouteCounter (registry: Registry, name: string, help: string, cells: readonly RouteCells[], read: (c: RouteCells) => number): void {
  new Counter({
    name,
    help,
    labelNames: ['route'] as const,
    registers: [registry],
    collect () {
      this.reset()
      for (const c of cells) {
        const n = read(c)
        if (n > 0) this.inc({ route: c.route }, n)
      }
    },
  })
}
