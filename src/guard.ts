// What the proxy refuses before anything is forwarded. The proxy turns
// unauthenticated traffic into requests with the key owner's full API rights,
// so whoever can reach it, or trick something into reaching it, acts with
// those rights: these checks decide who and what gets through.
import { BlockList, isIPv4 } from 'node:net'
import type { Route } from './config.js'

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
