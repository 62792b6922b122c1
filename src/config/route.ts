// What a route is: a path prefix on the proxy and the upstream it forwards to.

export type RouteName = 'management' | 'optimize' | 'api'

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
