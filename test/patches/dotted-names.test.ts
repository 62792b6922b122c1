// Path segments that merely contain dots (`..x`, `x..`, `...`, `.well-known`)
// are names, forwarded byte for byte; real dot-segments (`.`, `..`, encoded)
// stay refused by the guard. @fastify/reply-from refused the former with a
// substring check; src/patches/reply-from-build-url.ts replaces it (test/bundle.test.ts
// checks the same in the bundle that ships), and the last test here
// pins the dependency that replacement was written against.
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import t from 'tap'
// helpers.js first: it loads the proxy (and so reply-from) as the program
// does. Were the patch not imported ahead of reply-from there, importing it
// below would throw and fail this file.
import { startProxy, startUpstream } from '../support/helpers.js'
import { PATCHED_REPLY_FROM, buildURL, replyFromPaths } from '../../src/patches/reply-from-patch.js'
import { DOT_SEGMENTS, DOTTED_NAMES } from '../support/dotted-paths.js'
import { errorOf, get, rawRequest } from '../support/raw.js'

t.test('segments that only contain dots are forwarded byte for byte, not refused as "invalid characters"', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_OPTIMIZE_API_URL: `${up.url}/opt/v1`, COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const [target, forwarded] of DOTTED_NAMES) {
    const res = await rawRequest(proxy.port, get(target))
    t.equal(res.finals[0]?.status, 200, `${target}: 200 (${errorOf(res.finals[0])?.message ?? 'forwarded'})`)
    t.equal(up.received.at(-1)?.url, forwarded, `${target}: the upstream got ${forwarded}`)
  }
  t.equal(up.received.length, DOTTED_NAMES.length, 'each forwarded once')
})

t.test('real dot-segments stay refused by the guard, raw or encoded, and reach no upstream', async t => {
  const up = await startUpstream()
  const proxy = await startProxy({ COS_OPTIMIZE_API_URL: `${up.url}/opt/v1`, COS_API_URL: up.url })
  t.teardown(async () => { await proxy.close(); await up.close() })
  for (const target of DOT_SEGMENTS) {
    const res = await rawRequest(proxy.port, get(target))
    t.equal(res.finals[0]?.status, 400, `${target}: 400`)
    t.equal(errorOf(res.finals[0])?.message, 'dot-segment in path', `${target}: refused by the guard`)
  }
  t.equal(up.received.length, 0, 'nothing forwarded')
})

t.test('the replaced buildURL refuses a ".." segment itself, and keeps reply-from\'s other checks', async t => {
  const base = 'http://127.0.0.1:1' // as @fastify/http-proxy calls it: the upstream's origin
  for (const source of ['/a/../b', '..', '/a/..', '../a', '/a/%2e%2e/b', '/a/%2E%2E', '/a\\..\\b']) {
    t.throws(() => buildURL(source, base), { message: 'source/request contain invalid characters', statusCode: 400 }, `${source}: refused`)
  }
  t.equal(buildURL('/a..b/..x/.../x.', base).pathname, '/a..b/..x/.../x.', 'names with dots kept')
  t.equal(buildURL('x../..y', base).href, 'http://127.0.0.1:1/x../..y', 'relative names with dots kept')
  t.equal(buildURL('//other-host/x', base).href, 'http://127.0.0.1:1//other-host/x', 'a leading "//" cannot change the host')
  t.throws(() => buildURL('http://other-host/x', base), { message: 'source must be a relative path string' }, 'an absolute URL is refused')
  t.equal(buildURL('/a', [base]).href, 'http://127.0.0.1:1/a', 'a base given as an array')
})

// If either fails, @fastify/reply-from changed: compare its lib/utils.js
// buildURL with src/patches/reply-from-build-url.ts, carry its changes over (or drop the
// patch if it now checks whole segments), then update the version and hash.
t.test('reply-from is the version the patch was written for, and the patch is in force in it', async t => {
  const paths = replyFromPaths()
  const pkg = JSON.parse(readFileSync(paths.packageJson, 'utf8')) as { version: string }
  t.equal(pkg.version, PATCHED_REPLY_FROM, '@fastify/reply-from version')
  const utilsSource = readFileSync(paths.utils, 'utf8')
  t.equal(createHash('sha256').update(utilsSource).digest('hex'), '6df0f98ea45428dcf9487119793ea39fff5f82cb4f19e953a84b7e2f11b0e739', 'lib/utils.js is the one the patch copies buildURL from')
  t.match(readFileSync(paths.index, 'utf8'), /\bbuildURL\s*\} = require\('\.\/lib\/utils'\)/, 'index.js takes buildURL from lib/utils.js at load')
  const require = createRequire(import.meta.url)
  t.equal((require(paths.utils) as { buildURL: unknown }).buildURL, buildURL, 'the buildURL reply-from loaded is the replacement')
  t.ok(require.cache[paths.index] !== undefined, 'reply-from was loaded from the path checked')
})
