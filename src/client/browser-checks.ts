// Who is asking, as a web page would show it: the Host a browser sends (read
// as its URL parser reads it, never loopback by accident), the loopback
// names, and which pages may use the proxy (`Origin`, `Sec-Fetch-Site`).
// DNS rebinding and cross-site requests are refused here; guard.ts holds the
// checks of the target.
import { BlockList, isIPv4, isIPv6 } from 'node:net'
import { hostName } from '../config/names.js'

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

/** COS_ALLOWED_ORIGINS, COS_ALLOWED_HOSTS and COS_LISTEN_HOST, as Config has them. */
export interface BrowserSettings {
  readonly allowedOrigins: readonly string[]
  readonly allowedHosts: readonly string[]
  readonly listen: { readonly host: string }
}

export function browserPolicy (config: BrowserSettings): BrowserPolicy {
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
