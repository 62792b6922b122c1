// What the proxy refuses before anything is forwarded. The proxy turns
// unauthenticated traffic into requests with the key owner's full API rights,
// so whoever can reach it, or trick something into reaching it, acts with
// those rights: these checks decide who and what gets through (which peers,
// which targets, which header); browser-checks.ts decides which web pages.
import { BlockList, isIPv4 } from 'node:net'
import { foldedPrefix, foldSegment, withoutParams } from '../config/names.js'
import type { Route } from '../config/route.js'

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
 * case (`..`, `%2e%2e`, `.%2E`, `..%2f`), also with `;params` (`..;`), no
 * backslash (raw or `%5C`), no NUL, no double encoding of those, and no
 * encoded `/` that would move the request to another route if an upstream
 * decoded it.
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
    if (isDotSegment(decoded)) return 'dot-segment in path'
    if (decoded.includes('\\')) return 'encoded backslash in path'
    if (decoded.includes('\0')) return 'NUL in path'
    if (decoded.includes('/') && decoded.split('/').some(isDotSegment)) return 'dot-segment in path'
  }
  if (ENCODED_SLASH.test(path)) {
    const asRouted = decodeKeepingSlashes(path)
    const decoded = asRouted?.replace(/%2f/gi, '/')
    if (asRouted === undefined || decoded === undefined) return 'malformed percent-encoding in path'
    if (routeFor(routes, asRouted) !== routeFor(routes, decoded)) return 'encoded "/" would change the route'
  }
  return undefined
}

/** `.` or `..`, also as a server that drops `;params` or trailing whitespace reads it (`..;x`, `.. `). */
function isDotSegment (segment: string): boolean {
  if (segment === '.' || segment === '..') return true
  if (segment.length < 2 || segment.charCodeAt(0) !== 46 /* . */) return false
  const bare = withoutParams(segment).trimEnd()
  return bare === '.' || bare === '..'
}

/** Percent-decoded (twice, as a lenient upstream might), then NFKC; the input when an escape is malformed. */
function leniently (path: string): string {
  let decoded = path
  for (let pass = 0; pass < 2 && decoded.includes('%'); pass++) {
    try {
      decoded = decodeURIComponent(decoded)
    } catch {
      break
    }
  }
  return decoded.normalize('NFKC')
}

/** The first `count` segments of `path` that are not empty once folded (`//x`, `/;a/x` and `/x` all start with `x`: slashes are merged by many servers). */
function foldedHead (path: string, count: number): string[] {
  const head: string[] = []
  for (const segment of leniently(path).split('/')) {
    const folded = foldSegment(segment)
    if (folded === '') continue
    head.push(folded)
    if (head.length === count) break
  }
  return head
}

const PERCENT = 0x25
const SLASH = 0x2f
const SEMICOLON = 0x3b
const DOT = 0x2e
const QUESTION = 0x3f
const LOWER_CASE = 0x20

/** Characters a lenient server may decode, drop or merge. */
function mayBeRewritten (c: number): boolean {
  return c === PERCENT || c === SEMICOLON || c === DOT || c === SLASH
}

function isLetter (c: number): boolean {
  return (c | LOWER_CASE) >= 0x61 && (c | LOWER_CASE) <= 0x7a
}

/**
 * Whether `url` may begin with a variant of `prefix`, for prefixLookalike
 * to decide; false when surely not. It stops at the first character that
 * settles it: for `/v1/x` against `/management`, the first one.
 */
function mayImitate (url: string, prefix: string): boolean {
  for (let i = 1; i < prefix.length; i++) {
    const c = url.charCodeAt(i)
    const p = prefix.charCodeAt(i)
    if (c === p) continue
    if (mayBeRewritten(c)) return true
    // Only the other case of the same letter is still alike.
    if (!isLetter(p) || (c | LOWER_CASE) !== (p | LOWER_CASE)) return false
  }
  const next = url.charCodeAt(prefix.length)
  return Number.isNaN(next) || next === QUESTION || mayBeRewritten(next)
}

/**
 * For a request the router sent to the catch-all route: the prefixed route
 * whose prefix its path imitates, or undefined. `/MANAGEMENT/x`,
 * `/management;x/x`, `/management./x`, `/management%20/x`,
 * `/%4Danagement/x`, `//management/x`, or for `/mgmt/v1` also `/mgmt/V1/x`
 * go to the catch-all, past the prefixed route's COS_*_ALLOWED_METHODS,
 * while an upstream that drops `;params`, folds case, trims dots and spaces
 * or merges slashes serves them as the prefixed path. (The router itself
 * decodes `/%6Danagement/x` to `/management/x`: that one is the management
 * route's, with its methods.)
 *
 * A path whose first characters could not become a prefix costs a few
 * character comparisons.
 */
export function prefixLookalike (url: string, routes: readonly Route[]): Route | undefined {
  let maybe = false
  for (let i = 0; i < routes.length && !maybe; i++) {
    const prefix = (routes[i] as Route).prefix
    maybe = prefix !== '' && mayImitate(url, prefix)
  }
  if (!maybe) return undefined
  const q = url.indexOf('?')
  const path = q < 0 ? url : url.slice(0, q)
  for (const r of routes) {
    if (r.prefix === '') continue
    const want = foldedPrefix(r.prefix)
    const head = foldedHead(path, want.length)
    if (head.length === want.length && head.every((s, i) => s === want[i])) return r
  }
  return undefined
}

/** Whether the request carries the header COS_REQUIRE_HEADER asks for. */
export function hasRequiredHeader (required: { readonly name: string, readonly value?: string }, value: string | string[] | undefined): boolean {
  if (typeof value !== 'string') return false // absent, or sent twice
  return required.value === undefined ? value !== '' : value === required.value
}
