// What the proxy refuses before anything is forwarded. The proxy turns
// unauthenticated traffic into requests with the key owner's full API rights,
// so whoever can reach it, or trick something into reaching it, acts with
// those rights: these checks decide who and what gets through.
import { BlockList, isIPv4, isIPv6 } from 'node:net'
import type { Config, Route } from './config.js'

/** COS_ALLOW_FROM as a BlockList (used as an allow-list). */
export function allowList (cidrs: readonly string[]): BlockList {
  const list = new BlockList()
  for (const cidr of cidrs) {
    const [address = '', bits = ''] = cidr.split('/')
    list.addSubnet(address, Number(bits), isIPv4(address) ? 'ipv4' : 'ipv6')
  }
  return list
}

/** The socket's peer address against the list; an IPv4-mapped IPv6 address counts as its IPv4 address. */
export function peerAllowed (list: BlockList, address: string | undefined): boolean {
  if (address === undefined) return false
  if (address.startsWith('::ffff:') && isIPv4(address.slice(7))) return list.check(address.slice(7), 'ipv4')
  return list.check(address, isIPv4(address) ? 'ipv4' : 'ipv6')
}

/** The configured route a path belongs to, by prefix on a segment boundary (as the router does). */
export function routeFor (routes: readonly Route[], path: string): Route | undefined {
  let fallback: Route | undefined
  for (const r of routes) {
    if (r.prefix === '') fallback = r
    else if (path === r.prefix || path.startsWith(r.prefix + '/')) return r
  }
  return fallback
}

const ENCODED_SLASH = /%2f/i
// What a second decoding by a lenient upstream would turn into a separator, a dot or NUL.
const DOUBLE_ENCODED = /%(?:2e|2f|5c|00)/i

/** Decodes %XX except %2F; undefined when an escape is malformed. */
function decodeKeepingSlashes (path: string): string | undefined {
  try {
    return path.split(/(%2[fF])/).map(part => ENCODED_SLASH.test(part) ? part : decodeURIComponent(part)).join('')
  } catch {
    return undefined
  }
}

/**
 * Why a request target must not be forwarded, or undefined when it may.
 * Only origin-form (`/path?query`) is accepted: an absolute-form target
 * (`http://other-host/x`) or `*` would let the request line pick a
 * destination. In the path: no dot-segments, raw or percent-encoded in any
 * case (`..`, `%2e%2e`, `.%2E`, `..%2f`), no backslash (raw or `%5C`), no NUL,
 * no double encoding of those, and no encoded `/` that would move the
 * request to another route if an upstream decoded it.
 */
export function targetProblem (url: string, routes: readonly Route[]): string | undefined {
  if (url.charCodeAt(0) !== 47 /* / */) return 'the request target must be a path (origin-form)'
  const q = url.indexOf('?')
  const path = q < 0 ? url : url.slice(0, q)
  if (!path.includes('%') && !path.includes('.') && !path.includes('\\') && !path.includes('#')) return undefined // the common case
  if (path.includes('\\')) return 'backslash in path'
  if (path.includes('#')) return 'fragment in request target'
  for (const segment of path.split('/')) {
    let decoded = segment
    if (segment.includes('%')) {
      try {
        decoded = decodeURIComponent(segment)
      } catch {
        return 'malformed percent-encoding in path'
      }
      if (DOUBLE_ENCODED.test(decoded)) return 'double-encoded character in path'
    }
    if (decoded === '.' || decoded === '..') return 'dot-segment in path'
    if (decoded.includes('\\')) return 'encoded backslash in path'
    if (decoded.includes('\0')) return 'NUL in path'
    if (decoded.includes('/')) {
      const parts = decoded.split('/')
      if (parts.includes('.') || parts.includes('..')) return 'dot-segment in path'
    }
  }
  if (ENCODED_SLASH.test(path)) {
    const asRouted = decodeKeepingSlashes(path)
    const decoded = asRouted?.replace(/%2f/gi, '/')
    if (asRouted === undefined || decoded === undefined) return 'malformed percent-encoding in path'
    if (routeFor(routes, asRouted) !== routeFor(routes, decoded)) return 'encoded "/" would change the route'
  }
  return undefined
}

/** Whether the request carries the header COS_REQUIRE_HEADER asks for. */
export function hasRequiredHeader (required: { readonly name: string, readonly value?: string }, value: string | string[] | undefined): boolean {
  if (typeof value !== 'string') return false // absent, or sent twice
  return required.value === undefined ? value !== '' : value === required.value
}

// A Host value as a browser sends it: a name or an IPv4 address, or an IPv6
// address in brackets, then an optional port. Userinfo, paths, spaces and
// percent-escapes are not, and are never read as loopback.
const HOST_VALUE = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::[0-9]{0,5})?$/

/**
 * The name in a Host header value, read as a browser reads the host of a URL
 * (the WHATWG URL parser): lower case, without port or trailing dot, IPv4 in
 * dotted decimal (`127.1` and `0x7f.1` are `127.0.0.1`), IPv6 compressed and
 * in brackets. Undefined when the value is not `host[:port]`.
 */
export function hostName (value: string): string | undefined {
  if (!HOST_VALUE.test(value)) return undefined
  let name: string
  try {
    name = new URL(`http://${value}/`).hostname
  } catch {
    return undefined
  }
  return name.endsWith('.') ? name.slice(0, -1) : name
}

const LOOPBACK_V6 = new BlockList()
LOOPBACK_V6.addAddress('::1', 'ipv6')
LOOPBACK_V6.addSubnet('::ffff:127.0.0.0', 104, 'ipv6')

/** Whether a name from hostName is this machine's loopback: localhost, 127.0.0.0/8, [::1] (or 127.0.0.0/8 mapped into IPv6). */
export function isLoopbackName (name: string): boolean {
  if (name === 'localhost') return true
  if (name.startsWith('[')) return LOOPBACK_V6.check(name.slice(1, -1), 'ipv6')
  return name.startsWith('127.') && isIPv4(name)
}

/** Whether a bind address (COS_LISTEN_HOST) is loopback only. */
export function isLoopbackAddress (address: string): boolean {
  const name = hostName(isIPv6(address) ? `[${address}]` : address)
  return name !== undefined && isLoopbackName(name)
}

/** Which web pages and which Host names may use the proxy. */
export interface BrowserPolicy {
  /** COS_ALLOWED_ORIGINS, lower case as browsers send them. */
  readonly origins: ReadonlySet<string>
  /** COS_ALLOWED_HOSTS, as hostName reads them. */
  readonly hosts: ReadonlySet<string>
  /** Host is checked when the listener is loopback only (a name there can only be a rebinding) or a list is given. */
  readonly checkHost: boolean
}

export function browserPolicy (config: Pick<Config, 'allowedOrigins' | 'allowedHosts' | 'listen'>): BrowserPolicy {
  return {
    origins: new Set(config.allowedOrigins),
    hosts: new Set(config.allowedHosts),
    checkHost: config.allowedHosts.length > 0 || isLoopbackAddress(config.listen.host),
  }
}

/**
 * Why a request sent by a web page must not be forwarded, or undefined when
 * it may. A page's request carries `Origin` (every POST, every CORS request)
 * or `Sec-Fetch-Site` (everything a current browser sends to a loopback or
 * https URL); a page can set neither. A page from a listed origin may use
 * the proxy, cross-site included. Otherwise only `Sec-Fetch-Site: none` (the
 * user typed the URL) and `same-origin` pass; `Origin: null` (sandboxed
 * frames, file: pages, redirects) can never be listed.
 */
export function originProblem (policy: BrowserPolicy, origin: string | undefined, fetchSite: string | string[] | undefined): string | undefined {
  if (origin !== undefined) {
    return policy.origins.has(origin.toLowerCase()) ? undefined : 'requests from web pages (with an Origin header) are refused unless the origin is listed in COS_ALLOWED_ORIGINS'
  }
  if (fetchSite === undefined || fetchSite === 'none' || fetchSite === 'same-origin') return undefined
  return 'requests made by another site\'s web page (Sec-Fetch-Site) are refused'
}

/**
 * Why a request's Host must not be forwarded, or undefined when it may.
 * Where the proxy listens on loopback only, a Host naming anything else can
 * only come from a page whose name was rebound to 127.0.0.1 (DNS rebinding:
 * the page would then read the answers as its own). No Host (HTTP/1.0) or an
 * empty one names nothing and passes.
 */
export function hostProblem (policy: BrowserPolicy, host: string | undefined): string | undefined {
  if (!policy.checkHost || host === undefined || host === '') return undefined
  const name = hostName(host)
  if (name !== undefined && (isLoopbackName(name) || policy.hosts.has(name))) return undefined
  return 'the Host header must name this machine (localhost, 127.0.0.0/8, [::1]) or be listed in COS_ALLOWED_HOSTS'
}

/** Whether a request to the admin listener was sent by a web page: any Origin, or Sec-Fetch-Site other than none. */
export function fromWebPage (origin: string | undefined, fetchSite: string | string[] | undefined): boolean {
  return origin !== undefined || (fetchSite !== undefined && fetchSite !== 'none')
}
