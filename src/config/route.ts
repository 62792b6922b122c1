// What a route is: a path prefix on the proxy and the upstream it forwards to;
// and the one table of routes that everything per route is read from.
import type { VariableName } from './config-variables.js'

/**
 * Every route the proxy knows, in the order their prefixes are matched (the
 * catch-all last). Its settings, the metrics' route label, the injector's
 * pass-through and method lists, and the "at least one URL" checks are all
 * read from here; the chart keeps the same names in `upstream.*` (a test
 * holds the two together). Adding a route: docs/development.md.
 */
export const ROUTE_TABLE = [
  { name: 'management', url: 'COS_MANAGEMENT_API_URL', prefix: 'COS_MANAGEMENT_PATH_PREFIX', methods: 'COS_MANAGEMENT_ALLOWED_METHODS', chart: { url: 'managementUrl', prefix: 'managementPathPrefix' } },
  { name: 'optimize', url: 'COS_OPTIMIZE_API_URL', prefix: 'COS_OPTIMIZE_PATH_PREFIX', methods: 'COS_OPTIMIZE_ALLOWED_METHODS', chart: { url: 'optimizeUrl', prefix: 'optimizePathPrefix' } },
  // The catch-all: no prefix of its own, every path no other route claims.
  { name: 'api', url: 'COS_API_URL', prefix: undefined, methods: 'COS_API_ALLOWED_METHODS', chart: { url: 'apiUrl', prefix: undefined } },
] as const satisfies ReadonlyArray<{
  readonly name: string
  readonly url: VariableName
  readonly prefix: VariableName | undefined
  readonly methods: VariableName
  readonly chart: { readonly url: string, readonly prefix: string | undefined }
}>

export type RouteName = typeof ROUTE_TABLE[number]['name']
export type RouteEntry = typeof ROUTE_TABLE[number]

/** The route URL variables, the catch-all first: COS_API_URL, COS_MANAGEMENT_API_URL, COS_OPTIMIZE_API_URL. */
function routeUrls (): string[] {
  return [...ROUTE_TABLE.filter(r => r.prefix === undefined), ...ROUTE_TABLE.filter(r => r.prefix !== undefined)].map(r => r.url)
}

/** For "one of them is required" as a ConfigError: ['COS_API_URL', 'or COS_MANAGEMENT_API_URL or COS_OPTIMIZE_API_URL']. */
export function oneRouteUrl (): readonly [variable: string, rest: string] {
  const [first = '', ...rest] = routeUrls()
  return [first, rest.map(u => `or ${u}`).join(' ')]
}

/** The same in a sentence: "COS_API_URL, COS_MANAGEMENT_API_URL or COS_OPTIMIZE_API_URL". */
export function routeUrlList (): string {
  const urls = routeUrls()
  return urls.length < 2 ? urls.join('') : `${urls.slice(0, -1).join(', ')} or ${urls.at(-1) ?? ''}`
}

export interface Route {
  readonly name: RouteName
  /** Path prefix claimed on the proxy ('' for the catch-all api route). */
  readonly prefix: string
  /** Upstream origin, e.g. https://h:8443 */
  readonly origin: string
  /** Upstream path prepended to the forwarded path, '' or '/api/v1' (never a trailing '/'). */
  readonly basePath: string
  /** The URL as configured, for display. */
  readonly url: string
  /** Methods this route forwards; undefined = all the proxy supports. */
  readonly allowedMethods?: readonly string[]
}
