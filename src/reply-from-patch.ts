// A fix to @fastify/reply-from 12.6.5, applied when this module is loaded.
//
// Its buildURL refuses every path whose decoded form contains "/.." or "../"
// anywhere, so names that merely contain dots (`/optimize/..x`, `/x../y`,
// `/...`) got 400 "source/request contain invalid characters". Real
// dot-segments never reach it: the guard (targetProblem) refuses them in every
// encoding before routing, and @fastify/http-proxy checks the rewritten path
// segment by segment again. Here buildURL gets that segment-wise check; the
// rest of the function is reply-from's own, unchanged.
//
// Done at run time rather than by patching node_modules at install time, so
// it cannot be lost to `npm ci --ignore-scripts` (as the Dockerfile runs it)
// or to any other way of installing: it ships in dist/ with the code that
// needs it. reply-from's index.js takes buildURL out of lib/utils.js once,
// when it is first loaded, so this module must run before that: proxy.ts
// imports it ahead of @fastify/http-proxy, and it throws if it comes too late.
// test/dotted-names.test.ts pins the reply-from version and buildURL's
// source, so a dependency update that changes either fails the suite.
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'

type BuildURL = (source: string, reqBase: string | string[] | undefined) => URL

interface ReplyFromUtils { buildURL: BuildURL }

/** The reply-from version and buildURL this replaces (checked by the tests). */
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

/** Where reply-from lives, as @fastify/http-proxy (its only user here) resolves it. */
export function replyFromPaths (): { readonly index: string, readonly utils: string, readonly packageJson: string } {
  const here = createRequire(import.meta.url)
  const index = createRequire(here.resolve('@fastify/http-proxy')).resolve('@fastify/reply-from')
  return { index, utils: join(dirname(index), 'lib', 'utils.js'), packageJson: join(dirname(index), 'package.json') }
}

function install (): void {
  const require = createRequire(import.meta.url)
  const paths = replyFromPaths()
  if (require.cache[paths.index] !== undefined) {
    throw new Error('src/reply-from-patch.ts must be imported before @fastify/reply-from is loaded')
  }
  const utils = require(paths.utils) as ReplyFromUtils
  utils.buildURL = buildURL
}

install()
