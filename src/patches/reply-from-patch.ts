// Puts src/patches/reply-from-build-url.ts's buildURL into @fastify/reply-from when
// this module is loaded from dist/ or through tsx (with node_modules). The
// bundle that ships has it put in at build time instead (scripts/bundle.mjs
// replaces this module with an empty one there).
//
// reply-from's index.js takes buildURL out of lib/utils.js once, when it is
// first loaded, so this module must run before that: proxy.ts imports it
// ahead of @fastify/http-proxy, and it throws if it comes too late.
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { buildURL } from './reply-from-build-url.js'

export { PATCHED_REPLY_FROM, buildURL } from './reply-from-build-url.js'

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
    throw new Error('src/patches/reply-from-patch.ts must be imported before @fastify/reply-from is loaded')
  }
  const utils = require(paths.utils) as { buildURL: typeof buildURL }
  utils.buildURL = buildURL
}

install()
