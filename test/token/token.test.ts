// Tests for src/token/token.ts: the signed access token of the authentication spec
// (/work/shared/spec/authentication-spec.md, §5) and the pieces around it.
//
//   message   = <accessKey>:<timestamp>:<nonce>
//   signature = base64(HMAC-SHA256(utf8(secret), utf8(message)))   (standard, padded)
//   token     = <accessKey>/<timestamp>/<nonce>/<signature>
//   header    = "Bearer " + (url ? Go url.QueryEscape(token) : token)
//
// Property tests use fast-check with at most RUNS cases each, so the whole file
// runs in a few seconds. A failing property reports fast-check's shrunk
// counterexample as the "found" value of the assertion.
import t from 'tap'
import fc from 'fast-check'
import { createHmac } from 'node:crypto'
import {
  HeaderMinter,
  TOKEN_ENCODINGS,
  createMintingClock,
  createNonceSource,
  createTimestampSource,
  encodeToken,
  formatToken,
  mintFields,
  parseToken,
  queryEscape,
  queryUnescape,
  secretKey,
  sign,
  verifyToken,
  wallClockNs,
  type TokenEncoding,
  type TokenFields,
} from '../../src/token/token.js'

// ---------------------------------------------------------------------------
// Helpers

const RUNS = 200

/** Runs a property; undefined when it holds, otherwise fast-check's report with the counterexample. */
function failureOf<Ts> (property: fc.IProperty<Ts>, numRuns = RUNS): string | undefined {
  const details = fc.check(property, { numRuns })
  return details.failed ? (fc.defaultReportMessage(details) ?? 'property failed') : undefined
}

/** Index of the first value that is not greater than its predecessor (compared as BigInt), or -1. */
function firstNonIncreasing (values: readonly string[]): number {
  for (let i = 1; i < values.length; i++) {
    if (BigInt(values[i] ?? '') <= BigInt(values[i - 1] ?? '')) return i
  }
  return -1
}

/** Reference signature, written straight from the spec with explicit UTF-8 bytes. */
function referenceSignature (accessKey: string, timestamp: string, nonce: string, secret: string): string {
  return createHmac('sha256', Buffer.from(secret, 'utf8'))
    .update(Buffer.from(`${accessKey}:${timestamp}:${nonce}`, 'utf8'))
    .digest('base64')
}

/** Go's QueryEscape derived from encodeURIComponent: the two differ only in space and `!*'()`. */
function goEscapeViaJs (s: string): string {
  return encodeURIComponent(s)
    .replace(/%20/g, '+')
    .replace(/[!*'()]/g, c => '%' + c.charCodeAt(0).toString(16).toUpperCase())
}

const DECIMAL_19 = /^[1-9][0-9]{18}$/
const NONCE_SHAPE = /^[0-9a-f]{32}$/
const QUERY_ESCAPED = /^(?:[A-Za-z0-9\-_.~+]|%[0-9A-F]{2})*$/
const MS = 1_000_000n

// ---------------------------------------------------------------------------
// Arbitraries

/** Strings of any code points (no lone surrogates), weighted towards ASCII punctuation. */
const text = (constraints: { minLength?: number, maxLength?: number } = {}): fc.Arbitrary<string> => fc.oneof(
  fc.string({ unit: 'binary-ascii', maxLength: 30, ...constraints }),
  fc.string({ unit: 'binary', maxLength: 30, ...constraints }),
  fc.string({ unit: 'grapheme', maxLength: 30, ...constraints }),
)
/**
 * Access keys a token can carry: non-empty and without `/` (the field separator).
 * A key starting with "Bearer " is excluded too: parseToken would take it for the header scheme.
 */
const accessKeyArb = text({ minLength: 1 }).filter(s => !s.includes('/') && !s.startsWith('Bearer '))
/**
 * Decimal timestamps, 1 to 2^64 - 1, in canonical form (no leading zeros).
 * Not "0": mintFields replaces that with the current time (spec §5.3 rule 5, tested on its own).
 */
const timestampArb = fc.bigInt({ min: 1n, max: (1n << 64n) - 1n }).map(n => n.toString())
/** Nonces in the shape createNonceSource produces. */
const nonceArb = fc.uint8Array({ minLength: 16, maxLength: 16 }).map(b => Buffer.from(b).toString('hex'))
const secretArb = text({ minLength: 1, maxLength: 64 })
const encodingArb = fc.constantFrom<TokenEncoding>(...TOKEN_ENCODINGS)

// ---------------------------------------------------------------------------
// Test vectors

interface Vector extends TokenFields {
  readonly secret: string
  readonly raw: string
  readonly url: string
}

const AKID: Vector = {
  accessKey: 'AKIDEXAMPLE',
  timestamp: '1700000000000000000',
  nonce: '0123456789abcdef0123456789abcdef',
  secret: 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY',
  signature: 'NhCKVQ6+PLT1iIAIpmxmvBc22Mee/uRrpIlpowzJpaA=',
  raw: 'AKIDEXAMPLE/1700000000000000000/0123456789abcdef0123456789abcdef/NhCKVQ6+PLT1iIAIpmxmvBc22Mee/uRrpIlpowzJpaA=',
  url: 'AKIDEXAMPLE%2F1700000000000000000%2F0123456789abcdef0123456789abcdef%2FNhCKVQ6%2BPLT1iIAIpmxmvBc22Mee%2FuRrpIlpowzJpaA%3D',
}

/** Its signature starts with `/`, so the raw token has an empty-looking fifth "field". */
const DEMO: Vector = {
  accessKey: 'ak-demo',
  timestamp: '1732233445566778899',
  nonce: '6f1c2d3e4b5a69788796a5b4c3d2e1f0',
  secret: 's3cr3t',
  signature: '/qdJdGQPdmSfIiyibr/xvIxwCeOWNdGUqbH5V+UEcZI=',
  raw: 'ak-demo/1732233445566778899/6f1c2d3e4b5a69788796a5b4c3d2e1f0//qdJdGQPdmSfIiyibr/xvIxwCeOWNdGUqbH5V+UEcZI=',
  url: 'ak-demo%2F1732233445566778899%2F6f1c2d3e4b5a69788796a5b4c3d2e1f0%2F%2FqdJdGQPdmSfIiyibr%2FxvIxwCeOWNdGUqbH5V%2BUEcZI%3D',
}

const VECTORS: readonly Vector[] = [AKID, DEMO]

const fieldsOf = (v: Vector): TokenFields =>
  ({ accessKey: v.accessKey, timestamp: v.timestamp, nonce: v.nonce, signature: v.signature })

// ---------------------------------------------------------------------------
// 1. Test vectors through every entry point

t.test('the published test vectors', t => {
  for (const v of VECTORS) {
    t.test(`vector ${v.accessKey}`, t => {
      t.equal(sign(v.accessKey, v.timestamp, v.nonce, v.secret), v.signature, 'sign() with the secret as a string')
      t.equal(sign(v.accessKey, v.timestamp, v.nonce, secretKey(v.secret)), v.signature, 'sign() with secretKey(secret)')
      t.equal(referenceSignature(v.accessKey, v.timestamp, v.nonce, v.secret), v.signature, 'the vector matches the spec definition')

      t.equal(formatToken(fieldsOf(v)), v.raw, 'formatToken() joins the four fields with /')
      t.equal(encodeToken(v.raw, 'url'), v.url, 'encodeToken(url) is Go QueryEscape of the whole token')
      t.equal(encodeToken(v.raw, 'none'), v.raw, 'encodeToken(none) leaves the token alone')

      const input = { accessKey: v.accessKey, timestamp: v.timestamp, nonce: v.nonce }
      t.strictSame(mintFields({ ...input, key: v.secret }), fieldsOf(v), 'mintFields() with a string key')
      t.strictSame(mintFields({ ...input, key: secretKey(v.secret) }), fieldsOf(v), 'mintFields() with a KeyObject')

      const minter = (encoding: TokenEncoding): HeaderMinter =>
        new HeaderMinter(v.accessKey, secretKey(v.secret), encoding, () => v.timestamp, () => v.nonce)
      t.equal(minter('url').next(), 'Bearer ' + v.url, 'HeaderMinter(url).next() is "Bearer " + encoded token')
      t.equal(minter('none').next(), 'Bearer ' + v.raw, 'HeaderMinter(none).next() is "Bearer " + raw token')

      t.strictSame(parseToken(v.raw), { ok: true, fields: fieldsOf(v) }, 'parseToken() reads the raw form')
      t.strictSame(parseToken(v.url), { ok: true, fields: fieldsOf(v) }, 'parseToken() reads the encoded form')
      t.strictSame(verifyToken(v.raw, { accessKey: v.accessKey, key: v.secret }), { ok: true, fields: fieldsOf(v) },
        'verifyToken() accepts the vector')
      t.end()
    })
  }
  t.equal(TOKEN_ENCODINGS.join(','), 'url,none', 'the two encodings are url and none')
  t.end()
})

// ---------------------------------------------------------------------------
// 2. The testable rules of spec §5.3

t.test('spec §5.3 rule 1: the secret is never part of the message or token', t => {
  // A marker no generated access key, nonce or signature can contain by chance.
  const MARKER = 'SECRET-MARKER-9b41d7'
  const keyArb = accessKeyArb.filter(s => !s.includes(MARKER))
  t.equal(failureOf(fc.property(keyArb, timestampArb, nonceArb, text(), encodingArb, (accessKey, timestamp, nonce, tail, encoding) => {
    const secret = MARKER + tail
    const raw = formatToken(mintFields({ accessKey, key: secret, timestamp, nonce }))
    const header = new HeaderMinter(accessKey, secretKey(secret), encoding, () => timestamp, () => nonce).next()
    return [raw, encodeToken(raw, 'url'), header].every(s => !s.includes(MARKER))
  })), undefined, 'no token or header contains the secret')

  t.equal(failureOf(fc.property(accessKeyArb, timestampArb, nonceArb, fc.uniqueArray(secretArb, { minLength: 2, maxLength: 2 }),
    (accessKey, timestamp, nonce, [s1 = '', s2 = '']) => {
      const a = mintFields({ accessKey, key: s1, timestamp, nonce })
      const b = mintFields({ accessKey, key: s2, timestamp, nonce })
      return a.accessKey === b.accessKey && a.timestamp === b.timestamp && a.nonce === b.nonce && a.signature !== b.signature
    })), undefined, 'two secrets give tokens that differ only in the signature field')
  t.end()
})

t.test('spec §5.3 rule 2: the signature is deterministic', t => {
  t.equal(failureOf(fc.property(accessKeyArb, timestampArb, nonceArb, secretArb, (accessKey, timestamp, nonce, secret) => {
    const first = sign(accessKey, timestamp, nonce, secret)
    return sign(accessKey, timestamp, nonce, secret) === first &&
      sign(accessKey, timestamp, nonce, secretKey(secret)) === first &&
      mintFields({ accessKey, key: secretKey(secret), timestamp, nonce }).signature === first
  })), undefined, 'same inputs, same signature, whether the key is a string or a KeyObject')

  t.equal(failureOf(fc.property(text(), text(), text(), secretArb, (accessKey, timestamp, nonce, secret) =>
    sign(accessKey, timestamp, nonce, secret) === referenceSignature(accessKey, timestamp, nonce, secret),
  )), undefined, 'it is HMAC-SHA256 over the UTF-8 message, keyed with the UTF-8 secret, in padded Base64')
  t.end()
})

t.test('spec §5.3 rule 3: changing accessKey, timestamp or nonce changes the signature', t => {
  const pair = <T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T[]> => fc.uniqueArray(arb, { minLength: 2, maxLength: 2 })
  t.equal(failureOf(fc.property(pair(accessKeyArb), timestampArb, nonceArb, secretArb, ([a1 = '', a2 = ''], ts, nonce, secret) =>
    sign(a1, ts, nonce, secret) !== sign(a2, ts, nonce, secret))), undefined, 'a different access key')
  t.equal(failureOf(fc.property(accessKeyArb, pair(timestampArb), nonceArb, secretArb, (ak, [ts1 = '', ts2 = ''], nonce, secret) =>
    sign(ak, ts1, nonce, secret) !== sign(ak, ts2, nonce, secret))), undefined, 'a different timestamp')
  t.equal(failureOf(fc.property(accessKeyArb, timestampArb, pair(nonceArb), secretArb, (ak, ts, [n1 = '', n2 = ''], secret) =>
    sign(ak, ts, n1, secret) !== sign(ak, ts, n2, secret))), undefined, 'a different nonce')
  t.not(sign(AKID.accessKey, '1700000000000000001', AKID.nonce, AKID.secret), AKID.signature, 'one nanosecond later is a different signature')
  t.end()
})

t.test('spec §5.3 rule 4: exactly four fields, in order', t => {
  t.equal(failureOf(fc.property(accessKeyArb, timestampArb, nonceArb, secretArb, (accessKey, timestamp, nonce, secret) => {
    const fields = mintFields({ accessKey, key: secret, timestamp, nonce })
    const raw = formatToken(fields)
    const parts = raw.split('/')
    const inOrder = parts[0] === accessKey && parts[1] === timestamp && parts[2] === nonce &&
      parts.slice(3).join('/') === fields.signature
    const back = parseToken(raw)
    return inOrder && back.ok && JSON.stringify(back.fields) === JSON.stringify(fields)
  })), undefined, 'parseToken(formatToken(f)) gives f back for any access key without /')

  // The DEMO vector's signature holds two `/`; the parser splits on the first three only.
  t.equal(DEMO.raw.split('/').length, 6, 'the DEMO raw token has six /-separated pieces')
  t.strictSame(parseToken(DEMO.raw), { ok: true, fields: fieldsOf(DEMO) }, 'yet it parses to four fields')
  t.end()
})

t.test('spec §5.3 rule 5: timestamp 0 or absent means "now" in nanoseconds', t => {
  for (const timestamp of ['0', undefined]) {
    const before = wallClockNs()
    const f = mintFields({ accessKey: 'ak', key: 'secret', nonce: AKID.nonce, ...(timestamp === undefined ? {} : { timestamp }) })
    const after = wallClockNs()
    const label = timestamp === undefined ? 'absent' : '"0"'
    t.match(f.timestamp, DECIMAL_19, `${label}: a 19-digit decimal`)
    // Wall time has ms resolution; the source may also lag its anchor by < 1 ms. A second is ample.
    const ts = BigInt(f.timestamp)
    t.ok(ts >= before - 1000n * MS && ts <= after + 1000n * MS, `${label}: within a second of Date.now() × 1e6`,
      { found: f.timestamp, before: before.toString(), after: after.toString() })
    t.equal(f.signature, sign('ak', f.timestamp, AKID.nonce, 'secret'), `${label}: the signature covers the substituted timestamp`)
  }

  const stamps = Array.from({ length: 100 }, () => mintFields({ accessKey: 'ak', key: 'k', timestamp: '0' }).timestamp)
  t.equal(firstNonIncreasing(stamps), -1, 'successive substituted timestamps strictly increase')

  const noNonce = [mintFields({ accessKey: 'ak', key: 'k' }), mintFields({ accessKey: 'ak', key: 'k' })]
  t.match(noNonce[0]?.nonce, NONCE_SHAPE, 'an absent nonce is drawn: 32 lowercase hex chars')
  t.not(noNonce[0]?.nonce, noNonce[1]?.nonce, 'and is fresh every time')

  t.equal(failureOf(fc.property(timestampArb, ts =>
    mintFields({ accessKey: 'ak', key: 'k', timestamp: ts, nonce: 'n' }).timestamp === ts)),
  undefined, 'any other timestamp is used verbatim')
  t.end()
})

t.test('spec §5.3 rule 6: the url encoding step is applied', t => {
  t.equal(failureOf(fc.property(accessKeyArb, timestampArb, nonceArb, secretArb, (accessKey, timestamp, nonce, secret) => {
    const raw = formatToken(mintFields({ accessKey, key: secret, timestamp, nonce }))
    const encoded = encodeToken(raw, 'url')
    const header = (encoding: TokenEncoding): string =>
      new HeaderMinter(accessKey, secretKey(secret), encoding, () => timestamp, () => nonce).next()
    return encoded === queryEscape(raw) &&
      queryUnescape(encoded) === raw &&
      !encoded.includes('/') &&
      header('url') === 'Bearer ' + encoded &&
      header('none') === 'Bearer ' + raw &&
      encodeToken(raw, 'none') === raw
  })), undefined, 'encoded == queryEscape(raw), queryUnescape inverts it, and the header carries it')
  t.end()
})

// ---------------------------------------------------------------------------
// 3. Go url.QueryEscape / url.QueryUnescape parity

t.test('queryEscape gives what Go url.QueryEscape gives', t => {
  // Expected strings written by hand from Go's algorithm (net/url, mode encodeQueryComponent).
  const table: readonly [string, string, string][] = [
    ['empty string', '', ''],
    ['letters and digits', 'azAZ09', 'azAZ09'],
    ['unreserved punctuation is kept', '~-._', '~-._'],
    ['a space becomes +', 'a b', 'a+b'],
    ['every space becomes +', '  x  ', '++x++'],
    ['encodeURIComponent keeps these, Go does not', "!*'()", '%21%2A%27%28%29'],
    ['Base64 specials', '+/=', '%2B%2F%3D'],
    ['a literal +', 'a+b', 'a%2Bb'],
    ['percent', '%', '%25'],
    ['an already escaped sequence is escaped again', '%41', '%2541'],
    ['sub-delims and gen-delims', '$&,:;?@#[]', '%24%26%2C%3A%3B%3F%40%23%5B%5D'],
    ['other ASCII punctuation', '"<>\\^`{|}', '%22%3C%3E%5C%5E%60%7B%7C%7D'],
    ['NUL', '\u0000', '%00'],
    ['tab, LF, CR', '\t\n\r', '%09%0A%0D'],
    ['DEL', '\u007f', '%7F'],
    ['two-byte UTF-8', 'é', '%C3%A9'],
    ['U+0080', '\u0080', '%C2%80'],
    ['decomposed u + combining diaeresis', 'u\u0308', 'u%CC%88'],
    ['three-byte UTF-8', '日本', '%E6%97%A5%E6%9C%AC'],
    ['euro sign', '€', '%E2%82%AC'],
    ['four-byte UTF-8 (emoji)', '😀', '%F0%9F%98%80'],
    ['U+FFFD', '\ufffd', '%EF%BF%BD'],
    ['Go documentation example', 'my/cool+blog&about,stuff', 'my%2Fcool%2Bblog%26about%2Cstuff'],
    ['a token with a space in the access key', 'ak demo/1/n/a+b/c=', 'ak+demo%2F1%2Fn%2Fa%2Bb%2Fc%3D'],
    ['escape after a kept prefix', 'abc def', 'abc+def'],
    ['non-ASCII after a kept prefix', 'key-é', 'key-%C3%A9'],
  ]
  for (const [name, input, expected] of table) t.equal(queryEscape(input), expected, name)
  // Go strings are bytes and cannot hold a lone UTF-16 surrogate; JS replaces it with U+FFFD when encoding.
  t.equal(queryEscape('a\ud800b'), 'a%EF%BF%BDb', 'a lone surrogate is encoded as U+FFFD')
  t.end()
})

t.test('queryEscape properties', t => {
  t.equal(failureOf(fc.property(text({ maxLength: 60 }), s => QUERY_ESCAPED.test(queryEscape(s)))), undefined,
    'output holds only [A-Za-z0-9-_.~+] and %XX with upper-case hex')
  t.equal(failureOf(fc.property(text({ maxLength: 60 }), s => queryEscape(s) === goEscapeViaJs(s))), undefined,
    'output differs from encodeURIComponent exactly in space (+) and !*\'() (escaped)')
  t.equal(failureOf(fc.property(text({ maxLength: 60 }), s => queryUnescape(queryEscape(s)) === s)), undefined,
    'queryUnescape inverts it')
  t.equal(failureOf(fc.property(fc.string({ unit: 'binary', maxLength: 30 }), fc.string({ unit: 'binary', maxLength: 30 }),
    (a, b) => queryEscape(a + b) === queryEscape(a) + queryEscape(b))), undefined,
  'it works character by character: escape(a + b) == escape(a) + escape(b)')
  t.end()
})

t.test('queryUnescape reads what Go url.QueryUnescape reads', t => {
  const table: readonly [string, string, string][] = [
    ['plain text is returned as is', 'plain-text', 'plain-text'],
    ['empty string', '', ''],
    ['+ is a space', 'a+b', 'a b'],
    ['%20 is a space too', 'a%20b', 'a b'],
    ['%2B is a literal +', 'a%2Bb', 'a+b'],
    ['lower-case hex is accepted', '%2b%2f%3d', '+/='],
    ['multi-byte UTF-8', '%C3%A9%E6%97%A5%F0%9F%98%80', 'é日😀'],
    ['unescaped non-ASCII next to escapes', 'é+日%21', 'é 日!'],
    ['an unescaped emoji next to + and %XX', '😀+%21😀', '😀 !😀'],
    ['%25 is a literal percent', '%2541', '%41'],
  ]
  for (const [name, input, expected] of table) t.equal(queryUnescape(input), expected, name)

  const malformed: readonly [string, string][] = [
    ['a lone %', '%'],
    ['% with one hex digit', '%4'],
    ['% at the end', 'abc%'],
    ['non-hex first digit', '%G1'],
    ['non-hex second digit', '%1G'],
    ['%%', '%%41'],
    ['% followed by a space', '% 41'],
    ['malformed escape after a valid one', '%41%zz'],
  ]
  for (const [name, input] of malformed) t.equal(queryUnescape(input), undefined, `malformed: ${name}`)

  t.equal(failureOf(fc.property(text({ maxLength: 60 }), s => queryUnescape(encodeURIComponent(s)) === s)), undefined,
    'it also decodes encodeURIComponent output')
  t.end()
})

// ---------------------------------------------------------------------------
// 4. parseToken

t.test('parseToken', t => {
  t.test('accepts the raw form, the encoded form and either after "Bearer "', t => {
    for (const v of VECTORS) {
      const expected = { ok: true, fields: fieldsOf(v) }
      t.strictSame(parseToken(v.raw), expected, `${v.accessKey}: raw`)
      t.strictSame(parseToken(v.url), expected, `${v.accessKey}: encoded`)
      t.strictSame(parseToken('Bearer ' + v.raw), expected, `${v.accessKey}: Bearer raw`)
      t.strictSame(parseToken('Bearer ' + v.url), expected, `${v.accessKey}: Bearer encoded`)
      t.strictSame(parseToken(v.url.replace(/%2F/g, '%2f').replace(/%3D/g, '%3d')), expected, `${v.accessKey}: lower-case escapes`)
    }
    t.end()
  })

  t.test('keeps every / after the third in the signature', t => {
    const r = parseToken(DEMO.raw)
    t.strictSame(r, { ok: true, fields: fieldsOf(DEMO) }, 'four fields')
    t.equal(r.ok && r.fields.signature, '/qdJdGQPdmSfIiyibr/xvIxwCeOWNdGUqbH5V+UEcZI=', 'signature with its leading and inner /')
    t.end()
  })

  t.test('decodes the access key of an encoded token, but never a raw one', t => {
    const encoded = queryEscape(`ak demo+1/${AKID.timestamp}/${AKID.nonce}/${AKID.signature}`)
    const rest = { timestamp: AKID.timestamp, nonce: AKID.nonce, signature: AKID.signature }
    t.ok(encoded.startsWith('ak+demo%2B1%2F'), 'the access key is escaped in the encoded form')
    t.strictSame(parseToken(encoded), { ok: true, fields: { accessKey: 'ak demo+1', ...rest } }, 'encoded: + is a space, %2B a plus')
    t.strictSame(parseToken(`a+b%41/${AKID.timestamp}/${AKID.nonce}/${AKID.signature}`), { ok: true, fields: { accessKey: 'a+b%41', ...rest } },
      'raw: + and % are literal')
    t.end()
  })

  t.test('rejects malformed tokens with a reason', t => {
    const { timestamp: ts, nonce, signature: sig } = AKID
    const cases: readonly [string, string, RegExp][] = [
      ['empty input', '', /expected <accessKey>/],
      ['"Bearer " and nothing else', 'Bearer ', /expected <accessKey>/],
      ['one field', 'AKIDEXAMPLE', /expected <accessKey>/],
      ['two fields', `ak/${ts}`, /expected <accessKey>/],
      ['three fields', `ak/${ts}/${nonce}`, /expected <accessKey>/],
      ['three fields, encoded', `ak%2F${ts}%2F${nonce}`, /expected <accessKey>/],
      ['five fields', `ak/${ts}/${nonce}/${sig}/extra`, /signature/],
      ['empty access key', `/${ts}/${nonce}/${sig}`, /empty access key/],
      ['empty timestamp', `ak//${nonce}/${sig}`, /timestamp/],
      ['empty nonce', `ak/${ts}//${sig}`, /empty nonce/],
      ['empty signature', `ak/${ts}/${nonce}/`, /signature/],
      ['negative timestamp', `ak/-1/${nonce}/${sig}`, /timestamp/],
      ['timestamp with a plus sign', `ak/+1/${nonce}/${sig}`, /timestamp/],
      ['timestamp with a leading zero', `ak/0${ts}/${nonce}/${sig}`, /timestamp/],
      ['timestamp in exponent notation', `ak/1.7e18/${nonce}/${sig}`, /timestamp/],
      ['fractional timestamp', `ak/1.5/${nonce}/${sig}`, /timestamp/],
      ['hexadecimal timestamp', `ak/0x1f/${nonce}/${sig}`, /timestamp/],
      ['timestamp with a space', `ak/ 1/${nonce}/${sig}`, /timestamp/],
      ['timestamp in non-ASCII digits', `ak/١٢٣/${nonce}/${sig}`, /timestamp/],
      ['signature without its padding', `ak/${ts}/${nonce}/${sig.slice(0, -1)}`, /signature/],
      ['signature one character too long', `ak/${ts}/${nonce}/A${sig}`, /signature/],
      ['signature with two padding characters', `ak/${ts}/${nonce}/${'A'.repeat(42)}==`, /signature/],
      ['signature in the URL-safe alphabet', `ak/${ts}/${nonce}/${sig.replace('+', '-')}`, /signature/],
      ['signature in hex', `ak/${ts}/${nonce}/${'ab'.repeat(32)}`, /signature/],
      ['invalid percent-encoding', `ak%2F${ts}%2F${nonce}%2F%ZZ`, /percent-encoding/],
    ]
    for (const [name, input, reason] of cases) t.match(parseToken(input), { ok: false, reason }, name)
    t.end()
  })
  t.end()
})

// ---------------------------------------------------------------------------
// 5. verifyToken

t.test('verifyToken', t => {
  const accessKey = 'AKID-verify'
  const secret = 'verify-secret'
  const fresh = mintFields({ accessKey, key: secret })
  const raw = formatToken(fresh)
  const ok = { ok: true, fields: fresh }

  t.test('accepts a fresh token in every form, keyed with a string or a KeyObject', t => {
    for (const key of [secret, secretKey(secret)]) {
      const kind = typeof key === 'string' ? 'string key' : 'KeyObject'
      t.strictSame(verifyToken(raw, { accessKey, key }), ok, `${kind}: raw`)
      t.strictSame(verifyToken(encodeToken(raw, 'url'), { accessKey, key }), ok, `${kind}: encoded`)
      t.strictSame(verifyToken('Bearer ' + raw, { accessKey, key }), ok, `${kind}: Bearer raw`)
      t.strictSame(verifyToken('Bearer ' + encodeToken(raw, 'url'), { accessKey, key }), ok, `${kind}: Bearer encoded`)
    }
    t.end()
  })

  t.test('rejects a token minted for another access key as wrong_key', t => {
    t.match(verifyToken(raw, { accessKey: 'AKID-other', key: secret }), { ok: false, code: 'wrong_key' }, 'other expected key')
    const other = formatToken(mintFields({ accessKey: 'AKID-other', key: secret }))
    t.match(verifyToken(other, { accessKey, key: secret }), { ok: false, code: 'wrong_key' }, 'other key in the token')
    t.end()
  })

  t.test('rejects any tampering as bad_signature', t => {
    const tampered = (f: Partial<TokenFields>): string => formatToken({ ...fresh, ...f })
    const flip = (s: string, i: number, a: string, b: string): string => s.slice(0, i) + (s[i] === a ? b : a) + s.slice(i + 1)
    const opts = { accessKey, key: secret }
    t.match(verifyToken(tampered({ timestamp: (BigInt(fresh.timestamp) + 1n).toString() }), opts),
      { ok: false, code: 'bad_signature' }, 'timestamp + 1 ns')
    t.match(verifyToken(tampered({ nonce: flip(fresh.nonce, 0, 'a', 'b') }), opts), { ok: false, code: 'bad_signature' }, 'one nonce character')
    t.match(verifyToken(tampered({ signature: flip(fresh.signature, 0, 'A', 'B') }), opts), { ok: false, code: 'bad_signature' }, 'one signature character')
    t.match(verifyToken(tampered({ signature: AKID.signature }), opts), { ok: false, code: 'bad_signature' }, 'another token\'s signature')
    t.match(verifyToken(raw, { accessKey, key: 'another-secret' }), { ok: false, code: 'bad_signature' }, 'verified with a different secret (string)')
    t.match(verifyToken(raw, { accessKey, key: secretKey('another-secret') }), { ok: false, code: 'bad_signature' }, 'verified with a different secret (KeyObject)')
    t.end()
  })

  t.test('rejects a malformed token as malformed', t => {
    for (const bad of ['', 'garbage', 'Bearer ', `${accessKey}/${fresh.timestamp}/${fresh.nonce}`, `${accessKey}/now/${fresh.nonce}/${fresh.signature}`, 'a%ZZ']) {
      t.match(verifyToken(bad, { accessKey, key: secret }), { ok: false, code: 'malformed', reason: /^malformed token/ }, JSON.stringify(bad))
    }
    t.end()
  })

  t.test('with maxSkewNs, rejects timestamps outside the window as stale', t => {
    const ts = BigInt(AKID.timestamp)
    const skew = 300n * 1_000_000_000n
    const check = (nowNs: bigint): ReturnType<typeof verifyToken> =>
      verifyToken(AKID.raw, { accessKey: AKID.accessKey, key: AKID.secret, maxSkewNs: skew, nowNs })
    t.match(check(ts), { ok: true }, 'now == timestamp')
    t.match(check(ts + skew), { ok: true }, 'exactly maxSkewNs old')
    t.match(check(ts - skew), { ok: true }, 'exactly maxSkewNs in the future')
    t.match(check(ts + skew / 2n), { ok: true }, 'inside the window')
    t.match(check(ts + skew + 1n), { ok: false, code: 'stale', reason: /is 300 s away/ }, 'one ns too old')
    t.match(check(ts - skew - 1n), { ok: false, code: 'stale', reason: /-300 s/ }, 'one ns too far in the future')
    t.match(check(ts + 3600n * 1_000_000_000n), { ok: false, code: 'stale', reason: /3600 s/ }, 'an hour old')

    const wallOpts = { accessKey, key: secret, maxSkewNs: 60n * 1_000_000_000n }
    t.match(verifyToken(raw, wallOpts), { ok: true }, 'without nowNs: a fresh token is inside the window of the wall clock')
    t.match(verifyToken(AKID.raw, { ...wallOpts, accessKey: AKID.accessKey, key: AKID.secret }), { ok: false, code: 'stale' },
      'without nowNs: a 2023 token is stale')
    t.match(verifyToken(AKID.raw, { accessKey: AKID.accessKey, key: AKID.secret, nowNs: ts + 3600n * 1_000_000_000n }), { ok: true },
      'without maxSkewNs: no age check at all')
    t.end()
  })

  t.test('checks the signature before freshness', t => {
    const forged = formatToken({ ...fieldsOf(AKID), nonce: 'f'.repeat(32) })
    t.match(verifyToken(forged, { accessKey: AKID.accessKey, key: AKID.secret, maxSkewNs: 1n, nowNs: 0n }),
      { ok: false, code: 'bad_signature' }, 'a forged, stale token is reported as bad_signature')
    t.end()
  })

  t.test('accepts every minted token and only with its own secret (property)', t => {
    t.equal(failureOf(fc.property(accessKeyArb, timestampArb, nonceArb, fc.uniqueArray(secretArb, { minLength: 2, maxLength: 2 }), encodingArb,
      (ak, timestamp, nonce, [s1 = '', s2 = ''], encoding) => {
        const token = encodeToken(formatToken(mintFields({ accessKey: ak, key: s1, timestamp, nonce })), encoding)
        const good = verifyToken(token, { accessKey: ak, key: secretKey(s1) })
        const bad = verifyToken(token, { accessKey: ak, key: s2 })
        return good.ok && !bad.ok && bad.code === 'bad_signature'
      })), undefined, 'verify(mint(secret)) holds with that secret and fails with any other')
    t.end()
  })
  t.end()
})

// ---------------------------------------------------------------------------
// 6. Timestamps

/** A timestamp source on hand-driven clocks: `clock.wall` is integer ms, `clock.mono` fractional ms. */
function drivenSource (wall: number, mono = 1234.5, reanchorMs?: number): { clock: { wall: number, mono: number }, next: () => string } {
  const clock = { wall, mono }
  const next = createTimestampSource({
    wallMs: () => clock.wall,
    monoMs: () => clock.mono,
    ...(reanchorMs === undefined ? {} : { reanchorMs }),
  })
  return { clock, next }
}

const W = 1_700_000_000_000 // 2023-11-14T22:13:20Z, in ms
const ns = (ms: number, sub = 0n): string => (BigInt(ms) * MS + sub).toString()

/**
 * Drives a minting clock through `steps` of simulated real time (an integer
 * count of ns: the wall clock shows it floored to ms, the monotonic clock in
 * fractional ms from an arbitrary origin), changing its offset where a step
 * says so. True when every value strictly increases and stays within
 * shifted − 1 ms ≤ value ≤ max(shifted, previous + 1 ns), shifted being real
 * time plus the offset in force.
 */
function tracksShiftedTime (phaseNs: number, steps: readonly { readonly advanceNs: number, readonly offsetMs: number | null }[]): boolean {
  let elapsed = phaseNs // ns since W ms
  const time = { wall: W, mono: 777.25 + elapsed / 1e6 }
  const clock = createMintingClock({ wallMs: () => time.wall, monoMs: () => time.mono })
  let prev = -1n
  for (const step of steps) {
    elapsed += step.advanceNs
    time.wall = W + Math.floor(elapsed / 1e6)
    time.mono = 777.25 + elapsed / 1e6
    if (step.offsetMs !== null) clock.offsetMs = step.offsetMs
    const v = BigInt(clock.next())
    const shifted = (BigInt(W) + BigInt(clock.offsetMs)) * MS + BigInt(elapsed)
    // At most 1 ms behind (the anchor's ms is floored), never ahead except by the +1 ns bumps.
    const upper = prev + 1n > shifted + 2n ? prev + 1n : shifted + 2n
    if (v <= prev || v < shifted - MS - 2n || v > upper) return false
    prev = v
  }
  return true
}

t.test('createTimestampSource', t => {
  t.test('gives 19-digit decimal nanoseconds for current-era times', t => {
    const { clock, next } = drivenSource(W)
    t.equal(next(), '1700000000000000000', 'wall ms × 1e6 at the anchor')
    clock.mono += 0.5
    t.equal(next(), '1700000000000500000', 'plus the monotonic time since the anchor, in ns')
    const real = createTimestampSource()()
    t.match(real, DECIMAL_19, 'the default clocks give 19 digits too')
    t.end()
  })

  t.test('strictly increases when the monotonic clock does not advance', t => {
    const { next } = drivenSource(W)
    const values = Array.from({ length: 5000 }, () => next())
    t.equal(firstNonIncreasing(values), -1, '5000 calls in the same ns strictly increase')
    t.equal(values[0], ns(W), 'the first is the anchor')
    t.equal(values[4999], ns(W, 4999n), 'each later one is 1 ns after the previous')
    t.end()
  })

  t.test('carries the sub-millisecond part over into the next millisecond', t => {
    const { clock, next } = drivenSource(W)
    next()
    clock.mono += 1 - 2 ** -20 // exactly representable; 999999.05 ns after the anchor
    t.equal(next(), ns(W, 999_999n), 'last ns of the millisecond')
    t.equal(next(), ns(W + 1), 'same instant again: 999999 rolls over to the next ms')
    t.equal(next(), ns(W + 1, 1n), 'and continues from there')
    clock.mono += 0.5
    t.equal(next(), ns(W + 1, 499_999n), 'real time is used again once it is ahead')
    t.end()
  })

  t.test('never goes back when the wall clock steps backwards at a re-anchor', t => {
    const { clock, next } = drivenSource(W)
    const values = [next()]
    clock.mono += 999
    values.push(next())
    t.equal(values[1], ns(W + 999), 'before the step: wall-anchored time')
    clock.mono += 1 // 1000 ms after the anchor: re-anchor
    clock.wall = W + 1000 - 5000 // the wall clock was stepped back 5 s
    for (let i = 0; i < 100; i++) {
      values.push(next())
      clock.mono += 10
      clock.wall += 10
    }
    t.equal(firstNonIncreasing(values), -1, 'strictly increasing across the step')
    t.equal(values.at(-1), ns(W + 999, 100n), 'held at 1 ns steps while the wall clock is behind')
    clock.mono += 5000
    clock.wall += 5000 // the wall clock now reads W + 2000, ahead of the held value
    values.push(next())
    t.equal(values.at(-1), ns(W + 2000), 'back on wall time once it has caught up, at the next re-anchor')
    t.equal(firstNonIncreasing(values), -1, 'and still strictly increasing')
    t.end()
  })

  t.test('follows the wall clock forward at each re-anchor', t => {
    const { clock, next } = drivenSource(W, 50, 100)
    next()
    clock.wall += 3_600_000 // NTP stepped the wall clock forward an hour
    clock.mono += 99
    t.equal(next(), ns(W + 99), 'before the re-anchor interval elapses, monotonic time rules')
    clock.mono += 1
    t.equal(next(), ns(W + 3_600_000), 'at reanchorMs, the new wall time is taken')
    t.end()
  })

  t.test('survives a monotonic clock that goes backwards', t => {
    const { clock, next } = drivenSource(W)
    const values = [next()]
    clock.mono += 2
    values.push(next())
    clock.mono -= 10 // below the anchor: forces a re-anchor
    values.push(next(), next())
    t.equal(firstNonIncreasing(values), -1, 'strictly increasing')
    t.end()
  })

  t.test('tracks simulated real time within a millisecond (property)', t => {
    // Real time is an integer count of ns; the wall clock shows it floored to ms,
    // the monotonic clock shows it in fractional ms from an arbitrary origin.
    t.equal(failureOf(fc.property(
      fc.integer({ min: 0, max: 999_999 }),
      fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2_000_000 }), fc.integer({ min: 0, max: 3_000_000_000 })), { minLength: 1, maxLength: 60 }),
      (phase, steps) => tracksShiftedTime(phase, [0, ...steps].map(advanceNs => ({ advanceNs, offsetMs: null }))),
    )), undefined, 'strictly increasing, and real − 1 ms ≤ value ≤ max(real, previous + 1 ns)')
    t.end()
  })

  t.test('the default source: 10,000 consecutive values strictly increase', t => {
    const next = createTimestampSource()
    const before = wallClockNs()
    const values = Array.from({ length: 10_000 }, () => next())
    const after = wallClockNs()
    t.equal(firstNonIncreasing(values), -1, 'strictly increasing as BigInt')
    t.ok(values.every(v => DECIMAL_19.test(v)), 'all 19-digit decimals')
    const first = BigInt(values[0] ?? '0')
    const last = BigInt(values.at(-1) ?? '0')
    t.ok(first >= before - 1000n * MS && last <= after + 1000n * MS, 'close to the wall clock',
      { first: first.toString(), last: last.toString(), before: before.toString(), after: after.toString() })
    t.end()
  })
  t.end()
})

t.test('createMintingClock: the offset of COS_CLOCK_SKEW_CORRECTION', t => {
  /** A minting clock on hand-driven clocks, like drivenSource. */
  function drivenClock (wall: number, mono = 1234.5): { time: { wall: number, mono: number }, clock: ReturnType<typeof createMintingClock> } {
    const time = { wall, mono }
    return { time, clock: createMintingClock({ wallMs: () => time.wall, monoMs: () => time.mono }) }
  }
  const S300 = 300_000

  t.test('an offset ahead moves the very next timestamp forward by exactly that many whole ms', t => {
    const { time, clock } = drivenClock(W)
    t.equal(clock.next(), ns(W))
    time.mono += 0.25
    clock.offsetMs = S300
    t.equal(clock.next(), ns(W + S300, 250_000n), 'shifted by 300 s, the sub-ms part untouched')
    t.equal(clock.localMs(), W + 0.25, 'localMs is the local clock, before the offset')
    t.end()
  })

  t.test('timestamps stay strictly increasing across an offset that goes back: held at 1 ns steps until the shifted time catches up', t => {
    const { time, clock } = drivenClock(W)
    clock.offsetMs = S300
    const values = [clock.next()]
    clock.offsetMs = -S300 // the estimate swung the other way: 10 min back
    for (let i = 0; i < 100; i++) {
      time.mono += 1000
      time.wall += 1000
      values.push(clock.next())
    }
    t.equal(firstNonIncreasing(values), -1, 'strictly increasing')
    t.equal(values.at(-1), ns(W + S300, 100n), 'held at the last value + 1 ns while the shifted time is behind it')
    time.mono += 600_000
    time.wall += 600_000 // the shifted time (W + 700 s − 300 s) is past the held value (W + 300 s)
    values.push(clock.next())
    t.equal(values.at(-1), ns(W + 100_000 + 600_000 - S300), 'back on shifted time once it has caught up')
    t.equal(firstNonIncreasing(values), -1, 'and still strictly increasing')
    t.end()
  })

  t.test('strictly increasing and on shifted time whatever the offset does (property)', t => {
    t.equal(failureOf(fc.property(
      fc.array(fc.record({
        advanceNs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2_000_000 }), fc.integer({ min: 0, max: 3_000_000_000 })),
        offsetMs: fc.option(fc.integer({ min: -3_600_000, max: 3_600_000 })),
      }), { minLength: 1, maxLength: 60 }),
      (steps) => tracksShiftedTime(0, steps),
    )), undefined, 'strictly increasing, and shifted − 1 ms ≤ value ≤ max(shifted, previous + 1 ns)')
    t.end()
  })

  t.test('following the upstream\'s clock, a step of the wall clock is taken out of the offset: NTP fixing the node moves no timestamp', t => {
    const { time, clock } = drivenClock(W)
    clock.followSteps = true
    clock.offsetMs = S300 // the node is 5 min behind the upstream
    const values = [clock.next()]
    time.mono += 500
    time.wall += 500 + S300 // NTP steps the node's clock forward 5 min
    values.push(clock.next())
    t.equal(values.at(-1), ns(W + S300 + 500), 'until the re-anchor, the monotonic clock rules')
    time.mono += 600
    time.wall += 600
    values.push(clock.next())
    t.equal(clock.offsetMs, 0, 'at the re-anchor the step is taken out of the offset')
    t.equal(values.at(-1), ns(W + S300 + 1100), 'the timestamps go on where they were, on the upstream\'s clock')
    time.mono += 1000
    time.wall -= 2 * S300 - 1000 // stepped back 10 min
    values.push(clock.next())
    t.equal(clock.offsetMs, 2 * S300, 'a step back is taken out too')
    t.equal(values.at(-1), ns(W + S300 + 2100))
    t.equal(firstNonIncreasing(values), -1, 'strictly increasing')
    t.end()
  })

  t.test('a wall clock that only slews is left alone, and without followSteps a step is not taken out', t => {
    const slewing = drivenClock(W)
    slewing.clock.followSteps = true
    slewing.clock.offsetMs = S300
    slewing.clock.next()
    slewing.time.mono += 1000
    slewing.time.wall += 1000 + 999 // under a second off: not a step
    slewing.clock.next()
    t.equal(slewing.clock.offsetMs, S300, 'the offset is kept')
    const plain = drivenClock(W)
    plain.clock.offsetMs = S300
    plain.clock.next()
    plain.time.mono += 1000
    plain.time.wall += 1000 + 3_600_000
    t.equal(plain.clock.next(), ns(W + 3_601_000 + S300), 'the step moves the timestamps')
    t.equal(plain.clock.offsetMs, S300)
    t.end()
  })
  t.end()
})

// ---------------------------------------------------------------------------
// 7. Nonces

t.test('createNonceSource', t => {
  t.test('default pool: 32 lowercase hex chars, 10,000 draws all distinct', t => {
    const next = createNonceSource()
    const nonces = Array.from({ length: 10_000 }, () => next()) // 39 pool refills of 256
    t.ok(nonces.every(n => NONCE_SHAPE.test(n)), 'every nonce is 32 lowercase hex chars')
    t.equal(new Set(nonces).size, nonces.length, 'no nonce repeats')
    t.end()
  })

  t.test('small pools refill correctly', t => {
    for (const pool of [1, 3]) {
      const next = createNonceSource(pool)
      const nonces = Array.from({ length: 2000 }, () => next())
      t.ok(nonces.every(n => NONCE_SHAPE.test(n)), `pool of ${pool}: well-formed`)
      t.equal(new Set(nonces).size, nonces.length, `pool of ${pool}: all distinct`)
    }
    t.end()
  })

  t.test('two sources draw independently', t => {
    const a = createNonceSource()
    const b = createNonceSource()
    const fromA = Array.from({ length: 512 }, () => a())
    const fromB = new Set(Array.from({ length: 512 }, () => b()))
    t.notOk(fromA.some(n => fromB.has(n)), 'no nonce is shared')
    t.end()
  })
  t.end()
})

// ---------------------------------------------------------------------------
// 8. HeaderMinter

t.test('HeaderMinter', t => {
  t.test('exposes its access key and encoding', t => {
    const m = new HeaderMinter('ak', secretKey('s'), 'url')
    t.equal(m.accessKey, 'ak', 'accessKey')
    t.equal(m.encoding, 'url', 'encoding')
    t.end()
  })

  t.test('samePair compares the key pair, not the objects', t => {
    const m = new HeaderMinter('ak', secretKey('secret'), 'url')
    t.ok(m.samePair(new HeaderMinter('ak', secretKey('secret'), 'url')), 'same pair, another KeyObject instance')
    t.ok(m.samePair(new HeaderMinter('ak', secretKey('secret'), 'none')), 'same pair, other encoding')
    t.ok(m.samePair(m), 'itself')
    t.notOk(m.samePair(new HeaderMinter('ak2', secretKey('secret'), 'url')), 'different access key')
    t.notOk(m.samePair(new HeaderMinter('ak', secretKey('secret2'), 'url')), 'different secret')
    t.notOk(m.samePair(new HeaderMinter('ak', secretKey('secre'), 'url')), 'a prefix of the secret')
    t.end()
  })

  t.test('signed tells the headers it minted from those of another pair, in both encodings', t => {
    for (const encoding of TOKEN_ENCODINGS) {
      const m = new HeaderMinter('ak demo', secretKey('secret'), encoding)
      t.ok(m.signed(m.next()), `${encoding}: its own header`)
      t.ok(m.signed(new HeaderMinter('ak demo', secretKey('secret'), 'url').next()), `${encoding}: the same pair, minted elsewhere`)
      t.notOk(m.signed(new HeaderMinter('ak demo', secretKey('secret2'), encoding).next()), `${encoding}: same key, another secret`)
      t.notOk(m.signed(new HeaderMinter('ak2', secretKey('secret'), encoding).next()), `${encoding}: another key`)
      t.notOk(m.signed(''), `${encoding}: nothing`)
    }
    t.end()
  })

  t.test('next() verifies, for both encodings and access keys that need escaping', t => {
    for (const accessKey of ['AKIDEXAMPLE', 'ak demo', 'ak+demo', 'ключ~é 1+2=3&x']) {
      for (const encoding of TOKEN_ENCODINGS) {
        const header = new HeaderMinter(accessKey, secretKey('minter-secret'), encoding).next()
        t.ok(header.startsWith('Bearer '), `${JSON.stringify(accessKey)}, ${encoding}: Bearer scheme`)
        const r = verifyToken(header, { accessKey, key: 'minter-secret', maxSkewNs: 60n * 1_000_000_000n })
        const label = `${JSON.stringify(accessKey)}, ${encoding}`
        t.match(r, { ok: true, fields: { timestamp: DECIMAL_19, nonce: NONCE_SHAPE } }, `${label}: verifies, within a minute of now`)
        t.equal(r.ok && r.fields.accessKey, accessKey, `${label}: carries the access key unchanged`)
      }
    }
    const encoded = new HeaderMinter('ak demo+1', secretKey('s'), 'url').next()
    t.ok(encoded.startsWith('Bearer ak+demo%2B1%2F'), 'the url form escapes the access key as Go does')
    t.notOk(encoded.slice(7).includes('/'), 'and holds no raw /')
    t.end()
  })

  t.test('successive next() calls differ', t => {
    const m = new HeaderMinter('ak', secretKey('s'), 'none')
    const first = m.next()
    const second = m.next()
    t.not(first, second, 'two successive headers differ')
    const headers = Array.from({ length: 1000 }, () => m.next())
    t.equal(new Set(headers).size, headers.length, '1000 headers all distinct')
    const parsed = headers.map(h => parseToken(h))
    const stamps = parsed.map(p => (p.ok ? p.fields.timestamp : '0'))
    t.equal(firstNonIncreasing(stamps), -1, 'their timestamps strictly increase')
    t.equal(new Set(parsed.map(p => (p.ok ? p.fields.nonce : ''))).size, headers.length, 'their nonces are all distinct')
    t.end()
  })

  t.test('its fast path equals the general path (property)', t => {
    t.equal(failureOf(fc.property(text({ minLength: 1 }), timestampArb, nonceArb, secretArb, encodingArb, (accessKey, timestamp, nonce, secret, encoding) => {
      const header = new HeaderMinter(accessKey, secretKey(secret), encoding, () => timestamp, () => nonce).next()
      const token = formatToken(mintFields({ accessKey, key: secret, timestamp, nonce }))
      return header === 'Bearer ' + encodeToken(token, encoding)
    })), undefined, 'next() == "Bearer " + encodeToken(formatToken(mintFields(...)), encoding), for any access key')
    t.end()
  })
  t.end()
})
