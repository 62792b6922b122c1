// The shortcut in front of @fastify/http-proxy's resolveDestination may skip
// its work but never one of its refusals: whenever destinationWithinPrefix
// says yes, http-proxy's own check (restated below from 11.6.3) accepts too.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import fc from 'fast-check'
import t from 'tap'
import { destinationWithinPrefix, PATCHED_HTTP_PROXY } from '../../src/patches/http-proxy-destination.js'

const require = createRequire(import.meta.url)

/** @fastify/http-proxy 11.6.3's validateDestination + resolveDestination: true when it accepts. */
function httpProxyAccepts (dest: string, rewritePrefix: string, upstream = 'http://127.0.0.1:8081'): boolean {
  const normalized = dest.replaceAll('\t', '').replaceAll('\n', '').replaceAll('\r', '').replaceAll('\0', '').trimStart().replaceAll('\\', '/')
  if (/^[a-zA-Z][a-zA-Z\d+.-]*:/.test(normalized) || normalized.startsWith('//')) return false
  let decoded: string
  try { decoded = decodeURIComponent(normalized) } catch { return false }
  if (decoded.replaceAll('\\', '/').split('/').includes('..')) return false
  const base = new URL(upstream)
  const target = new URL(dest, base)
  const prefix = new URL(rewritePrefix, base)
  const boundary = prefix.pathname.endsWith('/') ? prefix.pathname : `${prefix.pathname}/`
  const within = target.pathname === prefix.pathname || target.pathname.startsWith(boundary)
  return target.origin === base.origin && prefix.origin === base.origin && within
}

t.test('the restated check is http-proxy\'s: same version, same function text', async t => {
  const pkg = require('@fastify/http-proxy/package.json') as { version: string }
  t.equal(pkg.version, PATCHED_HTTP_PROXY, 'bump src/patches/http-proxy-destination.ts and this restatement together with http-proxy')
  const source = readFileSync(require.resolve('@fastify/http-proxy'), 'utf8')
  t.match(source, 'const target = new URL(dest, base)\n  const prefix = new URL(rewritePrefix, base)')
  t.match(source, "if (decoded.split('/').includes('..')) {")
})

t.test('plain paths under the prefix are answered without parsing; the rest is left to http-proxy', async t => {
  t.ok(destinationWithinPrefix('/v1/clusters/abc', '/v1/'))
  t.ok(destinationWithinPrefix('/v1/clusters/file.json', '/v1'))
  t.ok(destinationWithinPrefix('/v1', '/v1'))
  t.ok(destinationWithinPrefix('/anything', '/'))
  t.ok(destinationWithinPrefix('/anything', ''), 'the catch-all route\'s rewrite prefix, as http-proxy computes it')
  t.notOk(destinationWithinPrefix('//evil.example/x', ''))
  t.notOk(destinationWithinPrefix('/v1', '/v1/'), 'http-proxy refuses this one: left to it')
  t.notOk(destinationWithinPrefix('/v2/x', '/v1/'))
  t.notOk(destinationWithinPrefix('/v1x', '/v1'))
  t.notOk(destinationWithinPrefix('//evil.example/v1/x', '/'))
  t.notOk(destinationWithinPrefix('/v1/../x', '/v1/'))
  t.notOk(destinationWithinPrefix('/v1/%2e%2e/x', '/v1/'))
  t.notOk(destinationWithinPrefix('/v1/a\\..\\x', '/v1/'))
  t.notOk(destinationWithinPrefix('/v1/./x', '/v1/'))
  t.notOk(destinationWithinPrefix('/v1/x', '/v1/%2e/'), 'a prefix that is not plain')
  t.notOk(destinationWithinPrefix('http://evil.example/v1/x', '/'))
})

t.test('never a yes where http-proxy says no (random paths and prefixes)', async t => {
  const piece = fc.constantFrom('/', '//', '.', '..', 'v1', 'v1x', 'a', '%2e', '%2E', '%', '%zz', '%2F', '\\', '\t', '\n', '\r', '\0', '#', ' ', 'http:', '@', ':', '~', '-', '_')
  const path = fc.tuple(fc.constantFrom('', '/', '/v1', '/v1/', '/a/b/'), fc.array(piece, { minLength: 0, maxLength: 8 })).map(([head, p]) => head + p.join(''))
  const prefix = fc.constantFrom('/', '/v1', '/v1/', '/a/b', '/a/b/', '', '/v1/./', '/%2e/', 'v1')
  let answered = 0
  fc.assert(fc.property(path, prefix, (dest, rewritePrefix) => {
    if (!destinationWithinPrefix(dest, rewritePrefix)) return true
    answered++
    return httpProxyAccepts(dest, rewritePrefix)
  }), { numRuns: 20000, seed: 22 })
  t.ok(answered > 1000, `the shortcut answered ${answered} of the generated paths itself`)
})
