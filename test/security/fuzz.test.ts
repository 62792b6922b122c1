// Property-based attacks with fast-check, over raw sockets: request paths
// (prefix look-alikes, dot-segments in every encoding, separators, escapes)
// and header values (every byte). Each request is either forwarded to the
// upstream its path belongs to, with the intended path, or refused with a 4xx;
// never forwarded elsewhere, never with a dot-segment, never a 5xx, and the
// proxy keeps serving.
import fc from 'fast-check'
import t, { type Test } from 'tap'
import { routeFor } from '../../src/client/guard.js'
import { startProxy, type Received, type RunningProxy } from '../support/helpers.js'
import { errorOf, rawRequest, startCountingUpstream, type CountingUpstream } from '../support/raw.js'

type RouteName = 'management' | 'optimize' | 'api'

interface Rig {
  readonly proxy: RunningProxy
  readonly ups: Record<RouteName, CountingUpstream>
  /** Each route's upstream base path, as configured. */
  readonly base: Record<RouteName, string>
}

/** Three upstreams; by default the management URL has no path, the others have one. */
async function rig (t: Test, paths: Record<RouteName, string> = { management: '', optimize: '/opt/v1', api: '/base' }): Promise<Rig> {
  const management = await startCountingUpstream()
  const optimize = await startCountingUpstream()
  const api = await startCountingUpstream()
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: management.url + paths.management, COS_OPTIMIZE_API_URL: optimize.url + paths.optimize, COS_API_URL: api.url + paths.api })
  t.teardown(async () => { await proxy.close(); await Promise.all([management.close(), optimize.close(), api.close()]) })
  const base = { management: '', optimize: '', api: '' }
  for (const route of proxy.config.routes) base[route.name] = route.basePath
  return { proxy, ups: { management, optimize, api }, base }
}

/** Decodes as find-my-way routes: %XX except reserved characters; undefined when malformed. */
function routerDecode (path: string): string | undefined {
  try {
    return decodeURI(path)
  } catch {
    return undefined
  }
}

/** Decodes up to three times (a lenient upstream may decode more than once). */
function decodings (s: string): string[] {
  const out = [s]
  let cur = s
  for (let i = 0; i < 3; i++) {
    let next: string
    try {
      next = decodeURIComponent(cur)
    } catch {
      // decode what can be decoded
      next = cur.replace(/%[0-9A-Fa-f]{2}/g, m => String.fromCharCode(parseInt(m.slice(1), 16)))
    }
    if (next === cur) break
    out.push(next)
    cur = next
  }
  return out
}

/** A dot-segment, a backslash or a NUL in the path after any number of decodings. */
function dangerous (path: string): string | undefined {
  for (const d of decodings(path)) {
    if (d.includes('\\')) return 'backslash'
    if (d.includes('\0')) return 'NUL'
    if (d.split('/').some(seg => seg === '.' || seg === '..')) return 'dot-segment'
  }
  return undefined
}

/** The raw length of the prefix of `raw` that decodes (as the router does) to `prefix`, or -1. */
function rawPrefixLength (raw: string, prefix: string): number {
  const tokens = raw.match(/%[0-9A-Fa-f]{2}|[\s\S]/g) ?? []
  let acc = ''
  for (const token of tokens) {
    acc += token
    const d = routerDecode(acc)
    if (d === prefix) return acc.length
    if (d !== undefined && d.length > prefix.length) return -1
  }
  return -1
}

interface Expected { readonly route: RouteName, readonly url: string }

/** Where a path must go and with which URL, per the routing table of docs/routing.md. */
function expected (r: Rig, target: string): Expected | undefined {
  const q = target.indexOf('?')
  const path = q < 0 ? target : target.slice(0, q)
  const query = q < 0 ? '' : target.slice(q)
  const decoded = routerDecode(path)
  if (decoded === undefined) return undefined
  const route = routeFor(r.proxy.config.routes, decoded)
  if (route === undefined) return undefined
  let dest: string
  if (route.prefix === '') {
    dest = `${r.base.api}/${path.slice(1)}`
  } else {
    const n = rawPrefixLength(path, route.prefix)
    if (n < 0) return undefined
    const rest = path.slice(n)
    dest = r.base[route.name] + rest
    if (dest === '') dest = '/'
  }
  // reply-from builds a WHATWG URL from the destination
  return { route: route.name, url: new URL(dest, 'http://upstream.invalid').pathname + query }
}

type Outcome = { readonly ok: true } | { readonly ok: false, readonly why: string }

async function probe (r: Rig, target: string, headers = ''): Promise<{ status: number, res: Awaited<ReturnType<typeof rawRequest>>, got: [string, Received][] }> {
  const before = Object.fromEntries(Object.entries(r.ups).map(([k, u]) => [k, u.seen.length]))
  const receivedBefore = Object.fromEntries(Object.entries(r.ups).map(([k, u]) => [k, u.received.length]))
  const res = await rawRequest(r.proxy.port, Buffer.from(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\n${headers}Connection: close\r\n\r\n`, 'latin1'), { timeoutMs: 2000, settleMs: 50 })
  const got: [string, Received][] = []
  for (const [k, u] of Object.entries(r.ups)) {
    if (u.seen.length !== before[k]) {
      for (const rec of u.received.slice(receivedBefore[k])) got.push([k, rec])
      if (u.received.length - (receivedBefore[k] ?? 0) !== u.seen.length - (before[k] ?? 0)) got.push([k, { method: '?', url: u.seen.at(-1) ?? '', headers: {}, rawHeaders: [], bodyBytes: 0, bodySha256: '' }])
    }
  }
  return { status: res.finals[0]?.status ?? 0, res, got }
}

function checkPath (r: Rig, target: string, outcome: Awaited<ReturnType<typeof probe>>, requireShape: boolean): Outcome {
  const { status, res, got } = outcome
  const path = target.split('?')[0] ?? ''
  if (status >= 500 || status === 0) return { ok: false, why: `status ${status || 'none'} (${res.text.slice(0, 200)})` }
  if (status >= 400) {
    if (got.length > 0) return { ok: false, why: `refused with ${status} but forwarded to ${got.map(([k, x]) => `${k} ${x.url}`).join(', ')}` }
    if (requireShape && errorOf(res.finals[0]) === undefined) return { ok: false, why: `refused with ${status} but not in the JSON error shape: ${res.finals[0]?.body.toString('latin1').slice(0, 120) ?? ''}` }
    return { ok: true }
  }
  if (status !== 200) return { ok: false, why: `unexpected status ${status}` }
  const danger = dangerous(path)
  if (danger !== undefined) return { ok: false, why: `a path with a ${danger} was forwarded: ${got.map(([k, x]) => `${k} ${x.url}`).join(', ')}` }
  if (got.length !== 1) return { ok: false, why: `200 but ${got.length} upstream requests` }
  const [route, rec] = got[0] as [string, Received]
  const want = expected(r, target)
  if (want === undefined) return { ok: false, why: `forwarded to ${route} ${rec.url} though the path cannot be routed` }
  if (route !== want.route) return { ok: false, why: `forwarded to ${route} (${rec.url}), expected ${want.route}` }
  if (rec.url !== want.url) return { ok: false, why: `forwarded as ${rec.url}, expected ${want.url}` }
  const forwardedDanger = dangerous(rec.url.split('?')[0] ?? '')
  if (forwardedDanger !== undefined) return { ok: false, why: `the upstream got a path with a ${forwardedDanger}: ${rec.url}` }
  return { ok: true }
}

// Building blocks for paths: prefix look-alikes, dots in every encoding, separators, escapes.
const TOKENS = [
  'management', 'optimize', 'Management', 'OPTIMIZE', 'optimizer', 'managements', '%6Danagement', '%6danagement', 'optimiz%65', '%4Fptimize',
  'a', 'b', 'v1', '', '.', '..', '...', '%2e', '%2E', '%2e%2e', '%2E%2e', '.%2e', '%2e.', '%2f', '%2F', '%5c', '%5C', '%00', '%25', '%252e', '%252f', '%25%32%65',
  '%20', ';', ';x=1', '~', '%7E', '%E2%82%AC', '%C3%A9', '@', ':', '+', '$', ',', '=', '!', '\'', '(', ')', '*', '"', '<', '>', '{', '}', '|', '^', '`', '[', ']', '%3F', '%23', '%3B',
]
const segment = fc.array(fc.constantFrom(...TOKENS), { minLength: 1, maxLength: 3 }).map(parts => parts.join(''))
const queryChar = fc.constantFrom('a', '=', '&', '%2e', '..', '/', '%2F', '?', '#', '%00', '%zz', '+', ' '.replace(' ', '%20'), '\\', ';')
const query = fc.option(fc.array(queryChar, { maxLength: 6 }).map(q => `?${q.join('')}`), { nil: '' })
const wellFormedTarget = fc.tuple(fc.array(segment, { minLength: 1, maxLength: 5 }), query)
  .map(([segs, q]) => `/${segs.join('/')}${q}`)
  .filter(target => routerDecode(target.split('?')[0] ?? '') !== undefined)

const anyByteInPath = fc.tuple(
  fc.array(segment, { minLength: 1, maxLength: 3 }),
  fc.array(fc.oneof(fc.constantFrom('%', '%z', '%zz', '%c0%ae', '%E0%A4%A', '%ff', '%u002e', '%%32%65'), fc.integer({ min: 0x21, max: 0xff }).map(c => String.fromCharCode(c))), { maxLength: 4 }),
  query,
).map(([segs, junk, q]) => `/${segs.join('/')}${junk.join('')}${q}`)

t.test('examples through the same oracle: bare prefixes with a query, encoded prefixes, with and without upstream base paths', async t => {
  const targets = [
    '/management', '/management?q=1', '/management?', '/management/?q=1', '/%6Danagement', '/%6Danagement?a=1', '/%6Danagement/x?a=1',
    '/optimize', '/optimize?x=1', '/optimiz%65?x=1', '/optimize/w?x=%2F', '/?q=1', '/', '/other?q=1', '/management/a%2Fb?c',
  ]
  for (const paths of [
    { management: '', optimize: '/opt/v1', api: '/base' },
    { management: '', optimize: '', api: '' },
    { management: '/m', optimize: '/o/', api: '/a' },
  ]) {
    const r = await rig(t, paths)
    for (const target of targets) {
      const check = checkPath(r, target, await probe(r, target), true)
      const want = expected(r, target)
      t.ok(check.ok, `${JSON.stringify(paths)} ${target} → ${want === undefined ? 'refused' : `${want.route} ${want.url}`}${check.ok ? '' : `: ${check.why}`}`)
    }
  }
})

t.test('property: well-formed paths are forwarded to their own upstream with the intended path, or refused with a JSON 4xx', async t => {
  const r = await rig(t)
  const failures: string[] = []
  let forwarded = 0
  let refused = 0
  await fc.assert(fc.asyncProperty(wellFormedTarget, async target => {
    const outcome = await probe(r, target)
    if (outcome.status === 200) forwarded++
    else refused++
    const check = checkPath(r, target, outcome, true)
    if (!check.ok) throw new Error(`${JSON.stringify(target)}: ${check.why}`)
  }), { numRuns: 600 }).catch((err: unknown) => { failures.push(err instanceof Error ? err.message : String(err)) })
  t.same(failures, [], 'no counterexample')
  if (failures.length === 0) t.ok(forwarded > 30 && refused > 30, `both outcomes exercised (${forwarded} forwarded, ${refused} refused)`)
  const after = await rawRequest(r.proxy.port, 'GET /management/ok HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n')
  t.equal(after.finals[0]?.status, 200, 'the proxy still serves')
})

t.test('property: arbitrary bytes and malformed escapes in the path never reach a wrong upstream, never a 5xx', async t => {
  const r = await rig(t)
  const failures: string[] = []
  const statuses = new Map<number, number>()
  await fc.assert(fc.asyncProperty(anyByteInPath, async target => {
    const outcome = await probe(r, target)
    statuses.set(outcome.status, (statuses.get(outcome.status) ?? 0) + 1)
    const check = checkPath(r, target, outcome, false)
    if (!check.ok) throw new Error(`${JSON.stringify(target)}: ${check.why}`)
  }), { numRuns: 400 }).catch((err: unknown) => { failures.push(err instanceof Error ? err.message : String(err)) })
  t.same(failures, [], 'no counterexample')
  if (failures.length === 0) t.ok((statuses.get(200) ?? 0) > 20, `statuses seen: ${JSON.stringify(Object.fromEntries(statuses))}`)
  const after = await rawRequest(r.proxy.port, 'GET /optimize/ok HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n')
  t.equal(after.finals[0]?.status, 200, 'the proxy still serves')
})

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

t.test('property: header values are forwarded byte for byte or refused; CR, LF and NUL always refused; x-request-id sanitised', async t => {
  const r = await rig(t)
  const failures: string[] = []
  const byte = fc.oneof(
    { weight: 8, arbitrary: fc.integer({ min: 0x20, max: 0x7e }) },
    { weight: 2, arbitrary: fc.integer({ min: 0x80, max: 0xff }) },
    { weight: 1, arbitrary: fc.constantFrom(0x09, 0x00, 0x0a, 0x0d, 0x7f, 0x0b, 0x0c, 0x1b) },
  )
  // A CR LF pair would just end the header line (a well-formed request), so
  // it is left out; lone CR, lone LF and CR LF + space (obs-fold) stay in.
  const value = fc.array(byte, { maxLength: 40 }).map(bytes => Buffer.from(bytes).toString('latin1')).filter(v => !/\r\n(?![ \t])/.test(v))
  let forwarded = 0
  await fc.assert(fc.asyncProperty(value, value, async (v, id) => {
    const outcome = await probe(r, '/management/h', `X-Fuzz: ${v}\r\nX-Request-Id: ${id}\r\n`)
    const { status, res, got } = outcome
    const ctl = (s: string): boolean => Buffer.from(s, 'latin1').some(b => (b < 0x20 && b !== 0x09) || b === 0x7f)
    const fatal = Buffer.from(v + id, 'latin1').some(b => b === 0x00 || b === 0x0d || b === 0x0a)
    if (status >= 500 || status === 0) throw new Error(`${JSON.stringify([v, id])}: status ${status || 'none'}`)
    if (fatal && (status !== 400 || got.length > 0)) throw new Error(`${JSON.stringify([v, id])}: CR/LF/NUL not refused (status ${status}, forwarded ${got.length})`)
    if (status === 400) {
      if (got.length > 0) throw new Error(`${JSON.stringify([v, id])}: 400 but forwarded`)
      if (!ctl(v + id)) throw new Error(`${JSON.stringify([v, id])}: a value without control characters was refused`)
      return
    }
    if (status !== 200 || got.length !== 1) throw new Error(`${JSON.stringify([v, id])}: status ${status}, ${got.length} forwarded`)
    forwarded++
    const rec = (got[0] as [string, Received])[1]
    const trimmed = v.replace(/^[ \t]+|[ \t]+$/g, '')
    const sent = rec.rawHeaders[rec.rawHeaders.findIndex((h, i) => i % 2 === 0 && h.toLowerCase() === 'x-fuzz') + 1]
    if (sent !== trimmed) throw new Error(`${JSON.stringify([v, id])}: X-Fuzz forwarded as ${JSON.stringify(sent)}, expected ${JSON.stringify(trimmed)}`)
    const idTrimmed = id.replace(/^[ \t]+|[ \t]+$/g, '')
    const fwdId = rec.headers['x-request-id']
    const wantId = /^[\x21-\x7e]{1,128}$/.test(idTrimmed) ? idTrimmed : undefined
    if (wantId !== undefined ? fwdId !== wantId : !UUID.test(String(fwdId))) throw new Error(`${JSON.stringify([v, id])}: x-request-id forwarded as ${JSON.stringify(fwdId)}`)
    const echoed = res.finals[0]?.headers['x-request-id']?.[0]
    if (echoed !== fwdId) throw new Error(`${JSON.stringify([v, id])}: response x-request-id ${JSON.stringify(echoed)} differs from the forwarded ${JSON.stringify(fwdId)}`)
  }), { numRuns: 400 }).catch((err: unknown) => { failures.push(err instanceof Error ? err.message : String(err)) })
  t.same(failures, [], 'no counterexample')
  if (failures.length === 0) t.ok(forwarded > 100, `${forwarded} forwarded`)
  const after = await rawRequest(r.proxy.port, 'GET /management/ok HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n')
  t.equal(after.finals[0]?.status, 200, 'the proxy still serves')
})
