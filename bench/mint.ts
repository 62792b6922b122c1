// Token-minting micro-benchmark: what each hot-path choice in src/token/token.ts
// buys, measured on the built code (dist/token/token.js).
//
//   node --import tsx bench/mint.ts [--quick] [--json]
//
// Rows: HeaderMinter.next() as the proxy calls it; the same choices composed
// here (a check that the composition costs nothing); each choice undone on its
// own; all four undone (the naive minter); and HMAC-SHA256 alone for scale.
import { createHmac, randomBytes, type KeyObject } from 'node:crypto'
import { resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { fixed, table } from './format.js'

// dist/ has no type declarations; its types are src/'s.
type TokenModule = typeof import('../src/token/token.js')
const token = await import(new URL('../dist/token/token.js', import.meta.url).href) as TokenModule

const ACCESS_KEY = 'AKIDBENCHMARK01'
const SECRET = 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY'

interface Choices {
  /** KeyObject built once per key pair, or the secret string handed to createHmac each time. */
  readonly key: 'keyObject' | 'string'
  /** 16 bytes from a pool filled 256 nonces at a time, or randomBytes(16) per nonce. */
  readonly nonce: 'pool' | 'randomBytes'
  /** ns timestamp as two doubles (ms + ns-in-ms), or as a BigInt. */
  readonly timestamp: 'doubles' | 'bigint'
  /** Escaped access-key prefix cached and only the signature's + / = escaped, or QueryEscape of the whole token. */
  readonly escape: 'cached' | 'whole'
}

const PRODUCTION: Choices = { key: 'keyObject', nonce: 'pool', timestamp: 'doubles', escape: 'cached' }
const NAIVE: Choices = { key: 'string', nonce: 'randomBytes', timestamp: 'bigint', escape: 'whole' }

/** Go's url.QueryEscape the way one would first write it: encodeURIComponent plus the four it keeps. */
function naiveQueryEscape (s: string): string {
  return encodeURIComponent(s)
    .replace(/[!'()*]/g, c => '%' + c.charCodeAt(0).toString(16).toUpperCase())
    .replace(/%20/g, '+')
}

function bigintTimestamps (): () => string {
  const anchorNs = BigInt(Date.now()) * 1_000_000n
  const anchorHr = process.hrtime.bigint()
  return () => (anchorNs + process.hrtime.bigint() - anchorHr).toString()
}

const SIG_ESCAPES: Readonly<Record<string, string>> = { '+': '%2B', '/': '%2F', '=': '%3D' }

/** A `Bearer <token>` minter made of the given choices (url encoding, as the proxy's default). */
function compose (c: Choices): () => string {
  const key: KeyObject | string = c.key === 'keyObject' ? token.secretKey(SECRET) : SECRET
  const nextNonce = c.nonce === 'pool' ? token.createNonceSource() : () => randomBytes(16).toString('hex')
  const nextTimestamp = c.timestamp === 'doubles' ? token.createTimestampSource() : bigintTimestamps()
  const prefix = 'Bearer ' + token.queryEscape(ACCESS_KEY) + '%2F'
  return () => {
    const ts = nextTimestamp()
    const nonce = nextNonce()
    const sig = createHmac('sha256', key).update(ACCESS_KEY + ':' + ts + ':' + nonce).digest('base64')
    return c.escape === 'cached'
      ? prefix + ts + '%2F' + nonce + '%2F' + sig.replace(/[+/=]/g, ch => SIG_ESCAPES[ch] ?? ch)
      : 'Bearer ' + naiveQueryEscape(`${ACCESS_KEY}/${ts}/${nonce}/${sig}`)
  }
}

interface Variant { readonly name: string, readonly mint: () => string, readonly verifies: boolean }

function variants (): Variant[] {
  const minter = new token.HeaderMinter(ACCESS_KEY, token.secretKey(SECRET), 'url')
  const hmacKey = token.secretKey(SECRET)
  const hmacOnly = (): string => createHmac('sha256', hmacKey).update(ACCESS_KEY + ':1700000000000000000:0123456789abcdef0123456789abcdef').digest('base64')
  return [
    { name: 'HeaderMinter.next() (dist, production)', mint: () => minter.next(), verifies: true },
    { name: 'same choices composed here', mint: compose(PRODUCTION), verifies: true },
    { name: 'HMAC key: secret string each time', mint: compose({ ...PRODUCTION, key: 'string' }), verifies: true },
    { name: 'nonce: randomBytes(16) each time', mint: compose({ ...PRODUCTION, nonce: 'randomBytes' }), verifies: true },
    { name: 'timestamp: BigInt', mint: compose({ ...PRODUCTION, timestamp: 'bigint' }), verifies: true },
    { name: 'escape: QueryEscape of the whole token', mint: compose({ ...PRODUCTION, escape: 'whole' }), verifies: true },
    { name: 'naive: all four of the above', mint: compose(NAIVE), verifies: true },
    { name: '(HMAC-SHA256 alone, for scale)', mint: hmacOnly, verifies: false },
  ]
}

/** Every minter must produce a token the verifier accepts, or its speed means nothing. */
function check (v: Variant): void {
  if (!v.verifies) return
  const header = v.mint()
  const result = token.verifyToken(header, { accessKey: ACCESS_KEY, key: token.secretKey(SECRET) })
  if (!result.ok) throw new Error(`${v.name}: minted a token that does not verify (${result.reason})`)
}

// Results are folded into this so the work cannot be optimised away.
let sink = 0

function opsPerSecond (mint: () => string, ms: number): number {
  let ops = 0
  const start = performance.now()
  let now = start
  while (now - start < ms) {
    for (let i = 0; i < 1000; i++) sink += mint().length
    ops += 1000
    now = performance.now()
  }
  return ops / ((now - start) / 1000)
}

export interface MintRow { readonly name: string, readonly opsPerSec: number, readonly nsPerOp: number, readonly extraNsPerOp: number }
export interface MintResult { readonly rounds: number, readonly msPerRound: number, readonly rows: MintRow[] }

export function runMint (quick: boolean): MintResult {
  const rounds = quick ? 2 : 5
  const msPerRound = quick ? 100 : 200
  const list = variants()
  for (const v of list) { check(v); opsPerSecond(v.mint, quick ? 50 : 100) } // warm up (JIT)
  const samples = list.map(() => [] as number[])
  // Interleaved rounds: a slow moment of the machine hits every variant alike.
  for (let r = 0; r < rounds; r++) list.forEach((v, i) => samples[i]?.push(opsPerSecond(v.mint, msPerRound)))
  const medianOf = (xs: number[]): number => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1] ?? Number.NaN }
  const base = 1e9 / medianOf(samples[0] ?? [])
  const rows = list.map((v, i) => {
    const ops = medianOf(samples[i] ?? [])
    return { name: v.name, opsPerSec: ops, nsPerOp: 1e9 / ops, extraNsPerOp: 1e9 / ops - base }
  })
  if (sink === -1) process.stdout.write('') // keeps `sink` observable
  return { rounds, msPerRound, rows }
}

export function mintTable (result: MintResult): string {
  return table(['minting (url encoding)', 'ops/s', 'ns/op', 'ns/op vs production'],
    result.rows.map(r => [r.name, Math.round(r.opsPerSec), Math.round(r.nsPerOp), (r.extraNsPerOp >= 0 ? '+' : '') + fixed(r.extraNsPerOp, 0)]))
}

// Run as a script (run.ts starts it as a child pinned to the measured core).
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false }, json: { type: 'boolean', default: false } } })
  const result = runMint(values.quick)
  process.stdout.write(values.json ? JSON.stringify(result) + '\n' : `${mintTable(result)}\n(median of ${result.rounds} interleaved rounds of ${result.msPerRound} ms, Node ${process.version})\n`)
}
