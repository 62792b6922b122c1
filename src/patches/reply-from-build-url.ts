// A fix to @fastify/reply-from 12.6.5: its buildURL with `..` refused as a
// whole segment only.
//
// reply-from's buildURL refuses every path whose decoded form contains "/.."
// or "../" anywhere, so names that merely contain dots (`/optimize/..x`,
// `/x../y`, `/...`) got 400 "source/request contain invalid characters". Real
// dot-segments never reach it: the guard (targetProblem) refuses them in every
// encoding before routing, and @fastify/http-proxy checks the rewritten path
// segment by segment again. Here buildURL gets that segment-wise check; the
// rest of the function is reply-from's own, unchanged.
//
// How it replaces reply-from's: in the bundle that ships (scripts/bundle.mjs),
// at build time, in reply-from's lib/utils.js itself; when run from dist/ or
// through tsx, at load time by src/patches/reply-from-patch.ts. Either way it travels
// with the code that needs it, so no way of installing (`npm ci
// --ignore-scripts`, a bundle without node_modules) can lose it.
// test/patches/dotted-names.test.ts pins the reply-from version and buildURL's
// source, so a dependency update that changes either fails the suite.

type BuildURL = (source: string, reqBase: string | string[] | undefined) => URL

/** The reply-from version and buildURL this replaces (checked by the tests and by the bundle build). */
export const PATCHED_REPLY_FROM = '12.6.5'

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
