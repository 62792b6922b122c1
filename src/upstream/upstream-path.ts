// The path a request takes upstream: the destination @fastify/http-proxy
// computed (the route's prefix rewritten to the upstream's base path) as
// the WHATWG URL parser reads it, and the client's query string as it sent it.

// Characters the URL parser keeps as they are in a path, no `%` (an escaped
// dot is a dot segment to it), no `.` or `..` segment, not `//` first (a
// scheme-relative reference).
const PLAIN_PATH = /^\/(?!\/)[A-Za-z0-9\-._~!$&'()*+,;=:@/]*$/
const DOT_SEGMENT = /(?:^|\/)\.{1,2}(?:\/|$)/

/**
 * `dest` (a path, no query) as the upstream gets it, followed by the query
 * of `rawUrl`. A plain path is its own parsed form; anything else is parsed
 * (and may be refused with a 400: buildURL below).
 */
export function upstreamPath (dest: string, origin: string, rawUrl: string): string {
  const path = PLAIN_PATH.test(dest) && !DOT_SEGMENT.test(dest) ? dest : buildURL(dest, origin).pathname
  const query = rawUrl.indexOf('?')
  return query > 0 ? path + rawUrl.slice(query) : path
}

// How a destination that is not a plain path is read:
// @fastify/reply-from 12.6.5's buildURL (MIT), which the proxy forwarded
// through before it had its own exchange, kept so that such paths go
// upstream exactly as they did, with one fix: reply-from refused every path
// whose decoded form contains "/.." or "../" anywhere, so names that merely
// contain dots (`/optimize/..x`, `/x../y`, `/...`) got 400 "source/request
// contain invalid characters"; here `..` is refused as a whole segment only.
// Real dot-segments never reach it: the guard (targetProblem) refuses them
// in every encoding before routing, and @fastify/http-proxy checks the
// rewritten path segment by segment again.

type BuildURL = (source: string, reqBase: string | string[] | undefined) => URL

function invalidCharacters (): Error {
  return Object.assign(new Error('source/request contain invalid characters'), { statusCode: 400 })
}

/** reply-from's buildURL with `..` refused as a whole segment only (`\` counts as `/`, as the URL parser reads it). */
export const buildURL: BuildURL = (source, reqBase) => {
  const decoded = decodeURIComponent(source)
  if (decoded.includes('..') && decoded.split(/[/\\]/).includes('..')) throw invalidCharacters()

  // From here on, reply-from 12.6.5 lib/utils.js buildURL (MIT), unchanged.
  if (Array.isArray(reqBase)) reqBase = reqBase[0]
  let baseOrigin = reqBase ? new URL(reqBase).href : undefined

  // To make sure we don't accidentally override the base path
  if (baseOrigin && source.length > 1 && source[0] === '/' && source[1] === '/') {
    source = '.' + source
  }

  const dest = new URL(source, reqBase)

  // if base is specified, source url should not override it
  if (baseOrigin) {
    if (!baseOrigin.endsWith('/') && dest.href.length > baseOrigin.length) {
      baseOrigin = baseOrigin + '/'
    }
    if (!dest.href.startsWith(baseOrigin)) {
      throw new Error('source must be a relative path string')
    }
  }
  return dest
}
