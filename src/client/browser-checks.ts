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
  /**
   * Beyond loopback and without COS_ALLOWED_HOSTS, Host may also name what no
   * public DNS serves to a browser (privateName); otherwise only loopback and
   * the list pass.
   */
  readonly privateNames: boolean
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
    privateNames: config.allowedHosts.length === 0 && !isLoopbackAddress(config.listen.host),
  }
}

// Suffixes no public DNS serves: mDNS (RFC 6762), RFC 6761's localhost, ICANN's
// private-use .internal, RFC 8375's home network, Kubernetes Service names
// (name.ns.svc; name.ns.svc.cluster.local ends in .local). Not `.svc.<any
// domain>`: `x.svc.attacker.example` is the attacker's to rebind.
const PRIVATE_SUFFIX = /\.(?:local|internal|localhost|home\.arpa|svc)$/

/**
 * Whether a name from hostName is one a rebound page cannot have: an IP
 * literal (a page's Host is its DNS name), a single label (compose service
 * names, Kubernetes short Service names: resolved by search domains, never by
 * public DNS), or a name under PRIVATE_SUFFIX.
 */
export function isPrivateName (name: string): boolean {
  return !name.includes('.') || name.startsWith('[') || isIPv4(name) || PRIVATE_SUFFIX.test(name)
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
 * A page whose DNS name is rebound to the proxy's address reads the answers
 * as its own (DNS rebinding); its requests carry that name in Host. On a
 * loopback listener only loopback names pass; beyond loopback also names
 * public DNS cannot serve (isPrivateName); once COS_ALLOWED_HOSTS is set,
 * loopback and the list. No Host (HTTP/1.0) or an empty one names nothing
 * and passes.
 */
export function hostProblem (policy: BrowserPolicy, host: string | undefined): string | undefined {
  if (host === undefined || host === '') return undefined
  const name = hostName(host)
  if (name !== undefined && (isLoopbackName(name) || policy.hosts.has(name) || (policy.privateNames && isPrivateName(name)))) return undefined
  return policy.privateNames
    ? 'the Host header names a domain a web page could rebind to the proxy: list it in COS_ALLOWED_HOSTS (IP addresses, single-label names and names under .local, .internal, .localhost, .home.arpa or .svc pass without)'
    : 'the Host header must name this machine (localhost, 127.0.0.0/8, [::1]) or be listed in COS_ALLOWED_HOSTS'
}

/** Whether a request to the admin listener was sent by a web page: any Origin, or Sec-Fetch-Site other than none. */
export function fromWebPage (origin: string | undefined, fetchSite: string | string[] | undefined): boolean {
  return origin !== undefined || (fetchSite !== undefined && fetchSite !== 'none')
}
