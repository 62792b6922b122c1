// A shortcut in front of @fastify/http-proxy 11.6.3's per-request
// resolveDestination, which parses three URLs (upstream, destination and
// rewrite prefix) to learn that the destination stays on the upstream and
// under the prefix: about 4 % of the proxy's CPU per small request.
//
// destinationWithinPrefix answers only when the answer is plain from the
// string itself: a path starting with one `/` (so the upstream's origin), with
// none of the characters the URL parser or http-proxy's own check would read
// differently (`%` escapes, `\`, tab, CR, LF, NUL, `#`), no `.` or `..`
// segment, under a prefix made of plain path characters. For such a path the
// parsed pathname is the string itself, so the prefix test on the string is
// the test http-proxy makes. Anything else returns false and http-proxy's
// own resolveDestination runs, unchanged: the shortcut can skip work, never
// a refusal. Put into http-proxy at build time in the bundle
// (scripts/bundle.mjs); dist/ and tsx run http-proxy as published.
// test/patches/http-proxy-destination.test.ts checks it against http-proxy's logic.

/** The @fastify/http-proxy version whose handler this shortcut is put into (checked by the bundle build). */
export const PATCHED_HTTP_PROXY = '11.6.3'

// No `.`, `%` or `\` at all: nothing the URL parser reads differently.
const PLAIN_PREFIX = /^\/[A-Za-z0-9_~/-]*$/
const NOT_PLAIN = /[%\\\t\r\n\0#]|(?:^|\/)\.{1,2}(?:\/|$)/

/** Prefix → its boundary (`/v1` → `/v1/`), or '' when the prefix is not plain. */
const boundaries = new Map<string, string>()

function boundaryOf (prefix: string): string {
  let boundary = boundaries.get(prefix)
  if (boundary === undefined) {
    // '' is what http-proxy makes of a '/' rewrite under the '/' prefix (the
    // catch-all route): resolved against the upstream, the root.
    boundary = prefix === '' ? '/' : PLAIN_PREFIX.test(prefix) ? (prefix.endsWith('/') ? prefix : prefix + '/') : ''
    // Bounded: the prefixes are the routes' rewrite prefixes, fixed at start.
    if (boundaries.size < 64) boundaries.set(prefix, boundary)
  }
  return boundary
}

/** True when `dest` (a path, no query) certainly stays on the upstream under `rewritePrefix`; false: ask http-proxy. */
export function destinationWithinPrefix (dest: string, rewritePrefix: string): boolean {
  if (dest.charCodeAt(0) !== 0x2f || dest.charCodeAt(1) === 0x2f || NOT_PLAIN.test(dest)) return false
  const boundary = boundaryOf(rewritePrefix)
  return boundary !== '' && (dest === rewritePrefix || dest.startsWith(boundary))
}
