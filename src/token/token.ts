// Minting, encoding, parsing and verifying COS access tokens.
// Pure: no I/O, no environment, no logging. Clocks and randomness are injected
// where a test needs to pin them.
//
//   message   = <accessKey>:<timestamp>:<nonce>
//   signature = base64(HMAC-SHA256(secret, message))            (standard, padded)
//   token     = <accessKey>/<timestamp>/<nonce>/<signature>     (raw form)
//   header    = "Bearer " + (encoding === 'url' ? QueryEscape(token) : token)
import { createHmac, createSecretKey, timingSafeEqual, type KeyObject } from 'node:crypto'
import { createMintingClock, createNonceSource, wallClockNs } from './token-clock.js'

export { createMintingClock, createNonceSource, createTimestampSource, wallClockNs, type MintingClock, type TimestampSourceOptions } from './token-clock.js'

export type TokenEncoding = 'url' | 'none'
export const TOKEN_ENCODINGS: readonly TokenEncoding[] = ['url', 'none']

export interface TokenFields {
  readonly accessKey: string
  readonly timestamp: string
  readonly nonce: string
  readonly signature: string
}

/** HMAC key from the secret's UTF-8 bytes. A KeyObject never prints its material. */
export function secretKey (secret: string): KeyObject {
  return createSecretKey(Buffer.from(secret, 'utf8'))
}

export function sign (accessKey: string, timestamp: string, nonce: string, key: KeyObject | string): string {
  return createHmac('sha256', key).update(`${accessKey}:${timestamp}:${nonce}`).digest('base64')
}

export function formatToken (f: TokenFields): string {
  return `${f.accessKey}/${f.timestamp}/${f.nonce}/${f.signature}`
}

// ---------------------------------------------------------------------------
// Go's url.QueryEscape / url.QueryUnescape, byte for byte.

const HEX = '0123456789ABCDEF'
// 1 = kept as is. Go keeps only the RFC 3986 unreserved set in query components.
const UNRESERVED = new Uint8Array(128)
for (let c = 0; c < 128; c++) {
  const ch = String.fromCharCode(c)
  if (/[A-Za-z0-9\-_.~]/.test(ch)) UNRESERVED[c] = 1
}

export function queryEscape (s: string): string {
  let i = 0
  while (i < s.length) {
    const c = s.charCodeAt(i)
    if (c >= 128 || UNRESERVED[c] !== 1) break
    i++
  }
  if (i === s.length) return s
  let out = s.slice(0, i)
  const bytes = Buffer.from(s.slice(i), 'utf8')
  for (const b of bytes) {
    if (b < 128 && UNRESERVED[b] === 1) out += String.fromCharCode(b)
    else if (b === 0x20) out += '+'
    else out += '%' + HEX.charAt(b >> 4) + HEX.charAt(b & 15)
  }
  return out
}

function unhex (c: number): number {
  if (c >= 48 && c <= 57) return c - 48
  if (c >= 65 && c <= 70) return c - 55
  if (c >= 97 && c <= 102) return c - 87
  return -1
}

/** Go's url.QueryUnescape: `+` is a space, `%XX` a byte; a malformed escape returns undefined. */
export function queryUnescape (s: string): string | undefined {
  if (!s.includes('%') && !s.includes('+')) return s
  const out: number[] = []
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c === 0x25) {
      const hi = unhex(s.charCodeAt(i + 1))
      const lo = unhex(s.charCodeAt(i + 2))
      if (hi < 0 || lo < 0) return undefined
      out.push(hi * 16 + lo)
      i += 2
    } else if (c === 0x2b) {
      out.push(0x20)
    } else {
      // Whole code point: a surrogate pair encoded one half at a time would
      // become two U+FFFD instead of the character's four UTF-8 bytes.
      const cp = s.codePointAt(i) ?? 0
      for (const b of Buffer.from(String.fromCodePoint(cp), 'utf8')) out.push(b)
      if (cp > 0xffff) i++
    }
  }
  return Buffer.from(out).toString('utf8')
}

export function encodeToken (raw: string, encoding: TokenEncoding): string {
  return encoding === 'url' ? queryEscape(raw) : raw
}

// ---------------------------------------------------------------------------
// Parsing and verification.

export type ParseResult =
  | { readonly ok: true, readonly fields: TokenFields }
  | { readonly ok: false, readonly reason: string }

const DECIMAL = /^(0|[1-9][0-9]*)$/
const BASE64_SHA256 = /^[A-Za-z0-9+/]{43}=$/

/**
 * Accepts the raw form or its URL-encoded form (a raw token always holds `/`,
 * an encoded one never does). Splits on the first three `/` only, because the
 * Base64 signature may itself contain `/`.
 */
export function parseToken (input: string): ParseResult {
  let raw = input.startsWith('Bearer ') ? input.slice(7) : input
  if (!raw.includes('/')) {
    const decoded = queryUnescape(raw)
    if (decoded === undefined) return { ok: false, reason: 'malformed token: invalid percent-encoding' }
    raw = decoded
  }
  const a = raw.indexOf('/')
  const b = a < 0 ? -1 : raw.indexOf('/', a + 1)
  const c = b < 0 ? -1 : raw.indexOf('/', b + 1)
  if (c < 0) return { ok: false, reason: 'malformed token: expected <accessKey>/<timestamp>/<nonce>/<signature>' }
  const fields: TokenFields = {
    accessKey: raw.slice(0, a),
    timestamp: raw.slice(a + 1, b),
    nonce: raw.slice(b + 1, c),
    signature: raw.slice(c + 1),
  }
  if (fields.accessKey === '') return { ok: false, reason: 'malformed token: empty access key' }
  if (!DECIMAL.test(fields.timestamp)) return { ok: false, reason: 'malformed token: timestamp is not a decimal integer' }
  if (fields.nonce === '') return { ok: false, reason: 'malformed token: empty nonce' }
  if (!BASE64_SHA256.test(fields.signature)) return { ok: false, reason: 'malformed token: signature is not a Base64 SHA-256 digest' }
  return { ok: true, fields }
}

export type VerifyFailure = 'malformed' | 'wrong_key' | 'bad_signature' | 'stale'
export type VerifyResult =
  | { readonly ok: true, readonly fields: TokenFields }
  | { readonly ok: false, readonly code: VerifyFailure, readonly reason: string }

export interface VerifyOptions {
  readonly accessKey: string
  readonly key: KeyObject | string
  /** Accept timestamps within ±maxSkewNs of nowNs; unset = no age check. */
  readonly maxSkewNs?: bigint
  readonly nowNs?: bigint
}

export function verifyToken (token: string, opts: VerifyOptions): VerifyResult {
  const parsed = parseToken(token)
  if (!parsed.ok) return { ok: false, code: 'malformed', reason: parsed.reason }
  const f = parsed.fields
  if (f.accessKey !== opts.accessKey) return { ok: false, code: 'wrong_key', reason: 'token was minted for a different access key' }
  const expected = Buffer.from(sign(f.accessKey, f.timestamp, f.nonce, opts.key), 'latin1')
  const given = Buffer.from(f.signature, 'latin1')
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) {
    return { ok: false, code: 'bad_signature', reason: 'signature does not match' }
  }
  if (opts.maxSkewNs !== undefined) {
    const now = opts.nowNs ?? wallClockNs()
    const delta = now - BigInt(f.timestamp)
    if (delta > opts.maxSkewNs || -delta > opts.maxSkewNs) {
      return { ok: false, code: 'stale', reason: `timestamp is ${formatSeconds(delta)} s away from now` }
    }
  }
  return { ok: true, fields: f }
}

function formatSeconds (ns: bigint): string {
  const abs = ns < 0n ? -ns : ns
  return (ns < 0n ? '-' : '') + (abs / 1_000_000_000n).toString()
}

// ---------------------------------------------------------------------------
// Minting.

export interface MintInput {
  readonly accessKey: string
  readonly key: KeyObject | string
  /** Decimal ns; "0" (or absent) = now, as the sample generator does. */
  readonly timestamp?: string
  readonly nonce?: string
}

/** One-off mint (CLI, tests). Returns the raw token fields. */
export function mintFields (input: MintInput): TokenFields {
  const timestamp = input.timestamp === undefined || input.timestamp === '0' ? sharedTimestamps() : input.timestamp
  const nonce = input.nonce ?? sharedNonces()
  return { accessKey: input.accessKey, timestamp, nonce, signature: sign(input.accessKey, timestamp, nonce, input.key) }
}

/**
 * The one clock every HeaderMinter stamps with by default, so timestamps
 * increase across key rotations. Its offset is the proxy's to set
 * (COS_CLOCK_SKEW_CORRECTION, see upstream-clock.ts).
 */
export const mintingClock = createMintingClock()
const sharedTimestamps = mintingClock.next
const sharedNonces = createNonceSource(16)

/**
 * A Base64 SHA-256 signature as QueryEscape writes it: `+`, `/` and the one
 * `=` of padding escaped. String replaces, not one regex with a callback
 * per match (~0.15 µs less a token, measured on Node 24).
 */
function escapeSignature (sig: string): string {
  let s = sig
  if (s.includes('+')) s = s.replaceAll('+', '%2B')
  if (s.includes('/')) s = s.replaceAll('/', '%2F')
  // '=' is only ever padding, at the end (one for 32 bytes).
  if (!s.endsWith('=')) return s
  return s.endsWith('==') ? s.slice(0, -2) + '%3D%3D' : s.slice(0, -1) + '%3D'
}

/**
 * Mints `Authorization` header values for one access key pair. The escaped
 * access-key prefix is computed once; per request only the timestamp, nonce
 * and signature are new. Timestamp and nonce are decimal and hex, which need
 * no escaping; the Base64 signature needs only `+`, `/` and `=` escaped.
 */
export class HeaderMinter {
  readonly accessKey: string
  readonly encoding: TokenEncoding
  readonly #key: KeyObject
  readonly #headerPrefix: string
  readonly #sep: string
  readonly #nextTimestamp: () => string
  readonly #nextNonce: () => string

  constructor (accessKey: string, key: KeyObject, encoding: TokenEncoding,
    nextTimestamp: () => string = sharedTimestamps, nextNonce: () => string = createNonceSource()) {
    this.accessKey = accessKey
    this.encoding = encoding
    this.#key = key
    this.#sep = encoding === 'url' ? '%2F' : '/'
    this.#headerPrefix = 'Bearer ' + encodeToken(accessKey, encoding) + this.#sep
    this.#nextTimestamp = nextTimestamp
    this.#nextNonce = nextNonce
  }

  /** A fresh `Bearer <token>` value. */
  next (): string {
    const ts = this.#nextTimestamp()
    const nonce = this.#nextNonce()
    const sig = createHmac('sha256', this.#key).update(this.accessKey + ':' + ts + ':' + nonce).digest('base64')
    const s = this.#sep
    return this.#headerPrefix + ts + s + nonce + s + (s === '/' ? sig : escapeSignature(sig))
  }

  /**
   * True when `authorization` (a header value this proxy sent) was minted with
   * this pair: after an upstream 401, tells whether the pair has been replaced
   * since the request went out. Off the hot path: one HMAC.
   */
  signed (authorization: string): boolean {
    return verifyToken(authorization, { accessKey: this.accessKey, key: this.#key }).ok
  }

  /** True when both minters hold the same key pair (used to detect rotation). */
  samePair (other: HeaderMinter): boolean {
    return this.accessKey === other.accessKey && this.#key.equals(other.#key)
  }
}
