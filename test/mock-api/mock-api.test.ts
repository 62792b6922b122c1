import t, { type Test } from 'tap'
import { createHash, randomBytes } from 'node:crypto'
import { request, type IncomingHttpHeaders, type OutgoingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable, Writable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { pino } from 'pino'
import { buildMockApi, type MockApiOptions } from '../../src/mock-api/mock-api.js'
import {
  HeaderMinter, TOKEN_ENCODINGS, encodeToken, formatToken, mintFields, secretKey, sign,
  type TokenEncoding, type TokenFields,
} from '../../src/token/token.js'

const ACCESS_KEY = 'ak-mock-test'
const SECRET = 'mock-api-test-secret-0123456789'
const KEY = secretKey(SECRET)
const MINUTE_NS = 60_000_000_000n
// A fixed "now" for the clock-controlled servers: 2024-11-22T00:00:00Z.
const T0 = 1_732_233_600_000_000_000n

interface Server { readonly base: string, readonly port: number }
interface ErrorBody { readonly error: { readonly code: string, readonly message: string } }
interface EchoBody {
  readonly method: string
  readonly url: string
  readonly headers: Record<string, string | undefined>
  readonly bodyBytes?: number
  readonly bodySha256?: string
}

async function start (t: { teardown: (fn: () => unknown) => void }, opts: Partial<MockApiOptions> = {}): Promise<Server> {
  const app = buildMockApi({ accessKey: ACCESS_KEY, key: KEY, ...opts })
  t.teardown(() => app.close())
  await app.listen({ host: '127.0.0.1', port: 0 })
  const { port } = app.server.address() as AddressInfo
  return { base: `http://127.0.0.1:${port}`, port }
}

function bearer (f: TokenFields, encoding: TokenEncoding = 'url'): string {
  return 'Bearer ' + encodeToken(formatToken(f), encoding)
}

function get (server: Server, path: string, authorization?: string): Promise<Response> {
  return fetch(server.base + path, authorization === undefined ? {} : { headers: { authorization } })
}

interface RawResponse { readonly status: number, readonly headers: IncomingHttpHeaders, readonly body: string }

/** node:http, so the request line goes out byte for byte and the body can be streamed. */
async function rawRequest (server: Server, method: string, path: string, headers: OutgoingHttpHeaders,
  body?: Iterable<Buffer>): Promise<RawResponse> {
  const req = request({ host: '127.0.0.1', port: server.port, method, path, headers })
  const response = new Promise<RawResponse>((resolve, reject) => {
    req.on('error', reject)
    req.on('response', (res) => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('error', reject)
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }) })
    })
  })
  if (body === undefined) req.end()
  else await pipeline(Readable.from(body), req)
  return await response
}

async function expectRejected (t: Test, res: Response, code: string): Promise<ErrorBody> {
  t.equal(res.status, 401, `${code}: status`)
  t.equal(res.headers.get('www-authenticate'), 'Bearer', `${code}: www-authenticate`)
  t.match(res.headers.get('content-type'), /^application\/json/)
  const body = await res.json() as ErrorBody
  t.equal(body.error.code, code)
  t.type(body.error.message, 'string')
  return body
}

t.test('accepts HeaderMinter tokens on every sample route and on /echo', async (t) => {
  const server = await start(t)
  const lists = ['/management/v1/notification-rules', '/management/v1/clusters', '/optimize/v1/workloads/recommendations']
  for (const encoding of TOKEN_ENCODINGS) {
    const minter = new HeaderMinter(ACCESS_KEY, KEY, encoding)
    for (const path of lists) {
      const res = await get(server, path, minter.next())
      t.equal(res.status, 200, `${encoding} ${path}`)
      const body = await res.json() as { items: unknown[] }
      t.ok(Array.isArray(body.items) && body.items.length > 0, `${path} lists items`)
    }
    const res = await get(server, '/echo', minter.next())
    t.equal(res.status, 200, `${encoding} /echo`)
    const echo = await res.json() as EchoBody
    t.equal(echo.method, 'GET')
    t.equal(echo.url, '/echo')
    t.equal(echo.headers.authorization, undefined, 'authorization is not echoed')
    t.equal(echo.bodyBytes, undefined, 'no body, no body fields')
  }
})

t.test('every failure code, and a tampered request never reaches a handler', async (t) => {
  const server = await start(t)
  const fresh = (over: Partial<TokenFields> = {}): TokenFields => ({ ...mintFields({ accessKey: ACCESS_KEY, key: KEY }), ...over })
  const good = fresh()
  const flip = (s: string): string => (s.startsWith('A') ? 'B' : 'A') + s.slice(1)
  const otherSecret = mintFields({ accessKey: ACCESS_KEY, key: secretKey('another-secret') })
  const replayed = bearer(fresh())
  t.equal((await get(server, '/echo', replayed)).status, 200, 'first use of the replayed token')

  const cases: readonly { name: string, authorization: string | undefined, code: string, fields?: TokenFields }[] = [
    { name: 'no header', authorization: undefined, code: 'missing_token' },
    { name: 'Basic scheme', authorization: 'Basic ' + Buffer.from(`${ACCESS_KEY}:${SECRET}`).toString('base64'), code: 'missing_token' },
    { name: 'lower-case scheme', authorization: 'bearer ' + encodeToken(formatToken(good), 'url'), code: 'missing_token' },
    { name: 'scheme only', authorization: 'Bearer', code: 'missing_token' },
    { name: 'garbage', authorization: 'Bearer not-a-token', code: 'malformed_token' },
    { name: 'bad percent-encoding', authorization: 'Bearer ak%2F1%2Fn%2Fsig%zz', code: 'malformed_token' },
    { name: 'three fields', authorization: `Bearer ${ACCESS_KEY}/${good.timestamp}/${good.signature}`, code: 'malformed_token' },
    { name: 'non-decimal timestamp', authorization: bearer(fresh({ timestamp: '0x10' }), 'none'), code: 'malformed_token' },
    { name: 'scheme twice', authorization: 'Bearer ' + bearer(good, 'none'), code: 'malformed_token' },
    { name: 'two spaces', authorization: 'Bearer  ' + encodeToken(formatToken(good), 'url'), code: 'malformed_token' },
    { name: 'wrong access key', authorization: new HeaderMinter('ak-someone-else', KEY, 'url').next(), code: 'wrong_key' },
    { name: 'flipped signature character', authorization: bearer({ ...good, signature: flip(good.signature) }), code: 'bad_signature', fields: good },
    { name: 'flipped signature character, raw form', authorization: bearer({ ...good, signature: flip(good.signature) }, 'none'), code: 'bad_signature', fields: good },
    { name: 'nonce changed after signing', authorization: bearer({ ...good, nonce: good.nonce + '0' }), code: 'bad_signature', fields: { ...good, nonce: good.nonce + '0' } },
    { name: 'signed with another secret', authorization: bearer(otherSecret), code: 'bad_signature', fields: otherSecret },
    { name: 'same token again', authorization: replayed, code: 'replayed_nonce' },
  ]
  for (const c of cases) {
    const body = await expectRejected(t, await get(server, '/echo', c.authorization), c.code)
    if (c.fields !== undefined) {
      const expected = sign(c.fields.accessKey, c.fields.timestamp, c.fields.nonce, KEY)
      t.notOk(body.error.message.includes(expected), `${c.name}: message holds no expected signature`)
      t.notOk(body.error.message.includes(encodeToken(expected, 'url')), `${c.name}: nor its encoded form`)
    }
    t.notOk(body.error.message.includes(SECRET), `${c.name}: message holds no secret`)

    // With a body and on an unknown path too: the hook answers before any route or parser.
    const headers: Record<string, string> = { 'content-type': 'application/octet-stream' }
    if (c.authorization !== undefined) headers.authorization = c.authorization
    const init: RequestInit = { method: 'POST', body: Buffer.alloc(64 * 1024, 1), headers }
    for (const path of ['/echo/x', '/no/such/path']) {
      const res = await fetch(server.base + path, init)
      const text = await res.text()
      t.equal(res.status, 401, `${c.name}: POST ${path} is refused`)
      t.notOk(text.includes('bodySha256'), `${c.name}: POST ${path} never reached a handler`)
    }
  }
})

t.test('timestamps outside ±5 minutes are stale; the window is inclusive', async (t) => {
  const server = await start(t, { now: () => T0 })
  const at = (offset: bigint): string => bearer(mintFields({ accessKey: ACCESS_KEY, key: KEY, timestamp: (T0 + offset).toString() }))
  for (const offset of [-6n * MINUTE_NS, 6n * MINUTE_NS, -5n * MINUTE_NS - 1n, 5n * MINUTE_NS + 1n]) {
    await expectRejected(t, await get(server, '/echo', at(offset)), 'stale_timestamp')
  }
  for (const offset of [-5n * MINUTE_NS, -4n * MINUTE_NS, 0n, 4n * MINUTE_NS, 5n * MINUTE_NS]) {
    t.equal((await get(server, '/echo', at(offset))).status, 200, `offset ${offset / MINUTE_NS} min accepted`)
  }
})

t.test('every answer\'s Date header shows the clock tokens are checked against, refusals and framework errors included', async (t) => {
  const server = await start(t, { now: () => T0 + 999_999_999n })
  const expected = 'Fri, 22 Nov 2024 00:00:00 GMT' // T0, whole seconds
  const ok = await get(server, '/management/v1/clusters', bearer(mintFields({ accessKey: ACCESS_KEY, key: KEY, timestamp: T0.toString() })))
  t.equal(ok.status, 200)
  t.equal(ok.headers.get('date'), expected)
  const refused = await get(server, '/management/v1/clusters')
  t.equal(refused.status, 401)
  t.equal(refused.headers.get('date'), expected)
  const malformed = await rawRequest(server, 'GET', '/%zz', {})
  t.equal(malformed.status, 401)
  t.equal(malformed.headers.date, expected)
})

t.test('maxSkewMs narrows the window', async (t) => {
  const server = await start(t, { now: () => T0, maxSkewMs: 1000 })
  const at = (offset: bigint): string => bearer(mintFields({ accessKey: ACCESS_KEY, key: KEY, timestamp: (T0 + offset).toString() }))
  await expectRejected(t, await get(server, '/echo', at(-2_000_000_000n)), 'stale_timestamp')
  t.equal((await get(server, '/echo', at(-1_000_000_000n))).status, 200)
})

t.test('replay protection', async (t) => {
  let now = T0
  const server = await start(t, { now: () => now })
  const mint = (nonce: string, offset = 0n): TokenFields =>
    mintFields({ accessKey: ACCESS_KEY, key: KEY, nonce, timestamp: (T0 + offset).toString() })

  t.test('the same token in the other encoding is still a replay', async (t) => {
    const f = mint('n-encodings')
    t.equal((await get(server, '/echo', bearer(f, 'url'))).status, 200)
    await expectRejected(t, await get(server, '/echo', bearer(f, 'none')), 'replayed_nonce')
  })

  t.test('a nonce reused with another timestamp is a replay', async (t) => {
    t.equal((await get(server, '/echo', bearer(mint('n-reuse')))).status, 200)
    await expectRejected(t, await get(server, '/echo', bearer(mint('n-reuse', 1n))), 'replayed_nonce')
  })

  t.test('rejected tokens do not consume their nonce', async (t) => {
    const forged = mintFields({ accessKey: ACCESS_KEY, key: secretKey('forger'), nonce: 'n-forged', timestamp: T0.toString() })
    await expectRejected(t, await get(server, '/echo', bearer(forged)), 'bad_signature')
    await expectRejected(t, await get(server, '/echo', bearer(mint('n-forged', -6n * MINUTE_NS))), 'stale_timestamp')
    t.equal((await get(server, '/echo', bearer(mint('n-forged')))).status, 200)
  })

  t.test('a nonce is held until its token is stale, not for 5 minutes after acceptance', async (t) => {
    const future = mint('n-future', 4n * MINUTE_NS)
    t.equal((await get(server, '/echo', bearer(future))).status, 200)
    now = T0 + 6n * MINUTE_NS // token still fresh (2 min old), nonce accepted 6 min ago
    await expectRejected(t, await get(server, '/echo', bearer(future)), 'replayed_nonce')
    now = T0 + 10n * MINUTE_NS
    await expectRejected(t, await get(server, '/echo', bearer(future)), 'stale_timestamp')
    t.equal((await get(server, '/echo', bearer(mint('n-future', 10n * MINUTE_NS)))).status, 200,
      'the nonce is free again once its old token can no longer be accepted')
  })
})

t.test('an expired nonce queued behind a live one is free again', async (t) => {
  let now = T0
  const server = await start(t, { now: () => now })
  const mint = (nonce: string, at: bigint): string =>
    bearer(mintFields({ accessKey: ACCESS_KEY, key: KEY, nonce, timestamp: at.toString() }))
  t.equal((await get(server, '/echo', mint('n-live', T0 + 5n * MINUTE_NS))).status, 200)
  t.equal((await get(server, '/echo', mint('n-old', T0 - 5n * MINUTE_NS))).status, 200)
  now = T0 + MINUTE_NS
  t.equal((await get(server, '/echo', mint('n-old', now))).status, 200)
  await expectRejected(t, await get(server, '/echo', mint('n-live', now)), 'replayed_nonce')
})

t.test('the nonce cache is capped, evicting the oldest', async (t) => {
  const server = await start(t, { maxNonces: 2 })
  const fields = ['n-a', 'n-b', 'n-c'].map((nonce) => mintFields({ accessKey: ACCESS_KEY, key: KEY, nonce }))
  for (const f of fields) t.equal((await get(server, '/echo', bearer(f))).status, 200)
  const [a, , c] = fields
  if (a === undefined || c === undefined) throw new Error('unreachable')
  t.equal((await get(server, '/echo', bearer(a))).status, 200, 'oldest nonce was evicted')
  await expectRejected(t, await get(server, '/echo', bearer(c)), 'replayed_nonce')
})

t.test('/echo', async (t) => {
  const server = await start(t)
  const minter = new HeaderMinter(ACCESS_KEY, KEY, 'url')

  t.test('any method, any sub-path, raw URL byte for byte', async (t) => {
    const paths = ['/echo/a%2Fb?x=%7e&y=1&y=2&flag', '/echo?q=a+b%20c&empty=&=v#', '/echo/%E2%82%AC/./x//y?%ZZ']
    for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']) {
      for (const path of paths) {
        const res = await rawRequest(server, method, path, { authorization: minter.next(), 'x-request-tag': 'tag-1' })
        t.equal(res.status, 200, `${method} ${path}`)
        const echo = JSON.parse(res.body) as EchoBody
        t.equal(echo.method, method)
        t.equal(echo.url, path)
        t.equal(echo.headers['x-request-tag'], 'tag-1')
        t.notOk('authorization' in echo.headers)
      }
    }
  })

  t.test('a 5 MiB streamed body is counted and hashed', async (t) => {
    const chunks = Array.from({ length: 80 }, () => randomBytes(64 * 1024))
    const expected = createHash('sha256')
    for (const chunk of chunks) expected.update(chunk)
    const res = await rawRequest(server, 'POST', '/echo/upload', {
      authorization: minter.next(), 'content-type': 'application/octet-stream', 'transfer-encoding': 'chunked',
    }, chunks)
    t.equal(res.status, 200)
    const echo = JSON.parse(res.body) as EchoBody
    t.equal(echo.bodyBytes, 5 * 1024 * 1024)
    t.equal(echo.bodySha256, expected.digest('hex'))
  })

  t.test('small and empty bodies', async (t) => {
    const res = await fetch(server.base + '/echo', { method: 'PUT', headers: { authorization: minter.next(), 'content-type': 'application/json' }, body: '{"a":1}' })
    const echo = await res.json() as EchoBody
    t.equal(echo.bodyBytes, 7)
    t.equal(echo.bodySha256, createHash('sha256').update('{"a":1}').digest('hex'))
    t.equal(echo.headers['content-type'], 'application/json')
    const empty = await fetch(server.base + '/echo', { method: 'POST', headers: { authorization: minter.next() } })
    t.equal((await empty.json() as EchoBody).bodyBytes, undefined, 'no body, no body fields')
  })
})

t.test('unknown paths and unparseable URLs are authenticated first', async (t) => {
  const server = await start(t)
  const minter = new HeaderMinter(ACCESS_KEY, KEY, 'none')
  await expectRejected(t, await get(server, '/management/v1/nope'), 'missing_token')
  const res = await get(server, '/management/v1/nope?x=1', minter.next())
  t.equal(res.status, 404)
  t.same(await res.json(), { error: { code: 'not_found', message: 'no route for GET /management/v1/nope' } })
  const post = await fetch(server.base + '/nope', { method: 'POST', headers: { authorization: minter.next() }, body: 'x' })
  t.equal(post.status, 404)
  t.equal(((await post.json()) as ErrorBody).error.code, 'not_found')
  t.equal((await get(server, '/management/v1/clusters/')).status, 401)

  const bad = await rawRequest(server, 'GET', '/%zz', {})
  t.equal(bad.status, 401)
  t.equal((JSON.parse(bad.body) as ErrorBody).error.code, 'missing_token')
  const badAuthed = await rawRequest(server, 'GET', '/%zz', { authorization: minter.next() })
  t.equal(badAuthed.status, 400)
  t.equal((JSON.parse(badAuthed.body) as ErrorBody).error.code, 'bad_request')
})

t.test('nothing logged holds a token, a signature or the secret', async (t) => {
  const lines: string[] = []
  const sink = new Writable({ write (chunk: Buffer, _enc, cb) { lines.push(chunk.toString('utf8')); cb() } })
  const server = await start(t, { logger: pino({ level: 'trace' }, sink) })
  const f = mintFields({ accessKey: ACCESS_KEY, key: KEY })
  const headers = [bearer(f), bearer(f), bearer({ ...f, signature: sign(ACCESS_KEY, f.timestamp, 'x', KEY) }), 'Bearer garbage-token']
  for (const h of headers) await (await get(server, '/echo?q=1', h)).arrayBuffer()
  const log = lines.join('')
  t.match(log, /request rejected/)
  t.match(log, /replayed_nonce/)
  for (const needle of ['Bearer', 'authorization', f.signature, encodeToken(f.signature, 'url'), f.nonce, 'garbage-token', SECRET]) {
    t.notOk(log.includes(needle), `log does not contain ${needle.slice(0, 12)}…`)
  }
})

t.test('options are validated', (t) => {
  t.throws(() => buildMockApi({ accessKey: '', key: KEY }), TypeError)
  t.throws(() => buildMockApi({ accessKey: ACCESS_KEY, key: KEY, maxSkewMs: -1 }), TypeError)
  t.throws(() => buildMockApi({ accessKey: ACCESS_KEY, key: KEY, maxSkewMs: 1.5 }), TypeError)
  t.throws(() => buildMockApi({ accessKey: ACCESS_KEY, key: KEY, maxNonces: 0 }), TypeError)
  t.end()
})
