// The path a request takes upstream. Path segments that merely contain dots
// (`..x`, `x..`, `...`, `.well-known`) are names, forwarded byte for byte;
// real dot-segments (`.`, `..`, encoded) stay refused by the guard
// (test/bundle.test.ts checks the same in the bundle that ships). A plain
// path is taken as it is, anything else as the URL parser reads it
// (reply-from's buildURL, kept in src/upstream/upstream-path.ts): the property test holds the two to
// the same answer.
import fc from 'fast-check'
import t from 'tap'
import { startProxy, startUpstream } from '../support/helpers.js'
import { buildURL, upstreamPath } from '../../src/upstream/upstream-path.js'
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

t.test('buildURL refuses a ".." segment itself, and keeps reply-from\'s other checks', async t => {
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

t.test('a plain path is taken as it is only where the URL parser would read it so: 20,000 generated paths', async t => {
  const origin = 'http://127.0.0.1:8081'
  const alphabet = fc.constantFrom('a', 'Z', '0', '/', '.', '-', '_', '~', '%', '2', 'e', 'E', '\\', ' ', '"', '#', '<', '>', '`', '{', '}', '|', '^', "'", '!', '$', '&', '(', ')', '*', '+', ',', ';', '=', ':', '@', '[', ']', '\u00e9', '\t')
  const paths = fc.array(alphabet, { maxLength: 24 }).map(cs => '/' + cs.join(''))
  const query = fc.constantFrom('', '?', '?a=1', '?a=%2F&b=/x?y')
  let checked = 0
  fc.assert(fc.property(paths, query, (dest, q) => {
    let expected: string
    try {
      expected = buildURL(dest, origin).pathname
    } catch {
      return true // refused either way: upstreamPath only takes the plain ones without parsing, and those parse
    }
    checked++
    const got = upstreamPath(dest, origin, '/client/path' + q)
    return got === expected + (q.length > 0 ? q : '')
  }), { numRuns: 20_000 })
  t.ok(checked > 10_000, `most generated paths were compared (${checked})`)
})

t.test('the query goes up as the client sent it; an empty one is kept as the client wrote it', async t => {
  const origin = 'http://127.0.0.1:8081'
  t.equal(upstreamPath('/v1/x', origin, '/optimize/x?b=2&a=%20'), '/v1/x?b=2&a=%20')
  t.equal(upstreamPath('/v1/x', origin, '/optimize/x?'), '/v1/x?')
  t.equal(upstreamPath('/v1/x', origin, '/optimize/x'), '/v1/x')
  t.equal(upstreamPath('/v1/a b', origin, '/optimize/a%20b'), '/v1/a%20b', 'not plain: the parser\'s reading')
})
