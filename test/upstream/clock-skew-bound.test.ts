// COS_CLOCK_SKEW_CORRECTION believes the upstream's Date header, within
// bounds: a Date beyond COS_CLOCK_SKEW_MAX_SECONDS (2100, 1970) moves no
// timestamp, one answer out of line moves nothing until several agree, and
// after a correction ends timestamps are back on real time within the bound,
// strictly increasing throughout (issue 27, flaw 3). Unit tests on
// hand-driven clocks, then a real proxy and a real upstream on 127.0.0.1
// whose Date says 2100 or 1970, the timestamps read from the tokens the
// upstream receives.
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { createMintingClock, HeaderMinter, parseToken, secretKey, wallClockNs } from '../../src/token/token.js'
import { agreedSkewMs, UpstreamClock } from '../../src/upstream/upstream-clock.js'
import { ACCESS_KEY, LogCapture, SECRET, send, startUpstream, testConfig } from '../support/helpers.js'

const YEAR_2100 = 'Fri, 01 Jan 2100 00:00:00 GMT'
const YEAR_1970 = 'Thu, 01 Jan 1970 00:00:00 GMT'
const MS = 1_000_000n

function httpDate (ms: number): string {
  return new Date(ms).toUTCString()
}

function strictlyIncreasing (values: readonly bigint[]): boolean {
  return values.every((v, i) => i === 0 || v > (values[i - 1] as bigint))
}

/** Lines at `level` whose msg matches. */
function linesMatching (logs: LogCapture, level: string, msg: RegExp): Record<string, unknown>[] {
  return logs.records.filter(r => r.level === level && msg.test(String(r.msg)))
}

/**
 * An UpstreamClock correcting a minting clock on hand-driven clocks: `time.wall`
 * (ms since the epoch) and `time.mono` (ms) move together unless a test
 * steps the wall clock; `advance` moves both.
 */
function driven (opts: { maxCorrectionS?: number, refusalLogEveryMs?: number } = {}): {
  time: { wall: number, mono: number }
  advance: (ms: number) => void
  minting: ReturnType<typeof createMintingClock>
  clock: UpstreamClock
  logs: LogCapture
  /** One answer whose Date is `skewS` seconds off this node's (wall) clock, as read now. */
  answer: (skewS: number) => void
} {
  const time = { wall: 1_700_000_000_250, mono: 5000 }
  const minting = createMintingClock({ wallMs: () => Math.floor(time.wall), monoMs: () => time.mono })
  const logs = new LogCapture()
  const clock = new UpstreamClock({ logger: createLogger('info', logs), correct: true, clock: minting, monoMs: () => time.mono, ...opts })
  return {
    time,
    advance: ms => { time.wall += ms; time.mono += ms },
    minting,
    clock,
    logs,
    answer: skewS => { clock.measure(httpDate(time.wall + skewS * 1000), undefined) },
  }
}

t.test('agreedSkewMs: the last two samples agree, and with them at least 3 of those held and more than half; their median', async t => {
  t.equal(agreedSkewMs([], 3, 2000), undefined, 'nothing held')
  t.equal(agreedSkewMs([300_000, 300_500], 3, 2000), undefined, 'two samples are not enough')
  t.equal(agreedSkewMs([300_000, 301_000, 300_500], 3, 2000), 300_500, 'three that agree: their median')
  t.equal(agreedSkewMs([0, 300_000, 500, 1000, 250], 3, 2000), 500, 'four of five agree: the odd one out is ignored')
  t.equal(agreedSkewMs([300_000, 0, 0, 300_000, 300_000], 3, 2000), 300_000, 'the last two and a third of five')
  t.equal(agreedSkewMs([0, 300_000, 0, 300_000, 0], 3, 2000), undefined, 'alternating (two upstream instances that disagree): nothing moves, not a flip per answer')
  t.equal(agreedSkewMs([0, 0, 300_000, 300_000], 3, 2000), undefined, 'two of four is no majority')
  t.equal(agreedSkewMs([0, 1900, 3800], 3, 2000), undefined, 'a drift wider than the noise is not agreement')
})

t.test('UpstreamClock with the correction on', async t => {
  t.test('a Date beyond COS_CLOCK_SKEW_MAX_SECONDS (2100, 1970) moves no timestamp however many answers agree, and is logged once per interval, not once per answer', async t => {
    const { time, advance, minting, clock, logs } = driven({ maxCorrectionS: 600, refusalLogEveryMs: 60_000 })
    for (let i = 0; i < 10; i++) {
      clock.measure(YEAR_2100, undefined)
      advance(1000)
    }
    t.equal(minting.offsetMs, 0, 'not shifted')
    t.ok((clock.skewSeconds ?? 0) > 2e9, 'the measurement (the gauge) still says what the upstream claims')
    const refusals = linesMatching(logs, 'warn', /beyond COS_CLOCK_SKEW_MAX_SECONDS \(600 s\): not followed/)
    t.equal(refusals.length, 1, 'one line for ten answers within the interval')
    t.match(refusals[0], { clockSkewMaxSeconds: 600, refusedSamples: 1, clockOffsetSeconds: 0 })
    t.match(refusals[0]?.msg, /^clock: COS_CLOCK_SKEW_CORRECTION: the upstream's Date puts its clock \d+ s ahead of this node's, beyond COS_CLOCK_SKEW_MAX_SECONDS \(600 s\): not followed/)
    advance(60_000)
    clock.measure(YEAR_1970, undefined)
    t.equal(minting.offsetMs, 0, 'a Date in 1970 moves nothing either')
    const later = linesMatching(logs, 'warn', /beyond COS_CLOCK_SKEW_MAX_SECONDS \(600 s\): not followed/)
    t.equal(later.length, 2, 'the next line once the interval has passed')
    t.match(later[1], { refusedSamples: 10 }, 'counting the answers refused since the last line')
    t.match(later[1]?.msg, /behind this node's/)
    t.equal(linesMatching(logs, 'info', /minted timestamps are shifted/).length, 0, 'no shift was ever announced')

    const before = BigInt(minting.next())
    t.ok(before - BigInt(Math.floor(time.wall)) * MS < 2n * MS, 'timestamps on this node\'s time')

    for (let i = 0; i < 3; i++) { clock.measure(httpDate(time.wall + 300_000), undefined); advance(1000) }
    t.equal(minting.offsetMs, 300_250, 'a skew within the bound is still corrected')
    for (let i = 0; i < 5; i++) { clock.measure(YEAR_2100, undefined); advance(1000) }
    t.equal(minting.offsetMs, 300_250, 'and a Date beyond it leaves that correction as it was')
  })

  t.test('one answer out of line moves nothing: the offset follows when the last two agree with 3 of the last 5, and a skew of the bound itself is followed', async t => {
    const { minting, answer, advance } = driven({ maxCorrectionS: 600 })
    for (const s of [0, 0, 300, 0, 0]) { answer(s); advance(1000) }
    t.equal(minting.offsetMs, 0, 'one +300 s among answers in step is ignored')
    answer(300); advance(1000)
    t.equal(minting.offsetMs, 0, 'one more: the last two disagree')
    answer(300); advance(1000)
    t.equal(minting.offsetMs, 300_250, 'the last two agree, and three of the last five: followed')
    for (const s of [599, 599]) { answer(s); advance(1000) }
    t.equal(minting.offsetMs, 300_250, 'two at 599.25 s of five held: not yet')
    answer(599); advance(1000)
    t.equal(minting.offsetMs, 599_250, 'a third: followed, within the bound')
  })

  t.test('a correction that ends: timestamps strictly increase, are never more than the bound ahead of this node\'s clock, and are back on it after at most the bound', async t => {
    const { time, advance, minting, answer } = driven({ maxCorrectionS: 600 })
    const values: bigint[] = []
    const ahead = (): number => Number(values.at(-1) as bigint - BigInt(Math.floor(time.wall)) * MS) / 1e9
    for (let i = 0; i < 3; i++) { answer(590); advance(1000); values.push(BigInt(minting.next())) }
    t.equal(minting.offsetMs, 590_250)
    t.ok(Math.abs(ahead() - 590.25) < 0.01, `on the upstream's clock (${ahead()} s ahead)`)
    // The upstream's clock is put right: 590 s back.
    for (let i = 0; i < 3; i++) { answer(0); advance(1000); values.push(BigInt(minting.next())) }
    t.equal(minting.offsetMs, 0, 'the correction ends after three answers agree')
    let worst = 0
    for (let i = 0; i < 600; i++) {
      advance(1000)
      values.push(BigInt(minting.next()), BigInt(minting.next()))
      worst = Math.max(worst, ahead())
    }
    t.ok(strictlyIncreasing(values), 'strictly increasing across the change')
    t.ok(worst <= 600, `never more than the bound ahead (at most ${worst} s)`)
    t.ok(Math.abs(ahead()) < 0.01, `back on this node's clock (${ahead()} s)`)
  })

  t.test('a step of the node\'s clock, taken out of the offset, is not undone by the samples held from before it: NTP fixing the node does not bring the old offset back', async t => {
    const { time, advance, minting, answer } = driven({ maxCorrectionS: 600 })
    for (let i = 0; i < 3; i++) { answer(300); advance(1000) }
    t.equal(minting.offsetMs, 300_250)
    time.wall += 300_000 // NTP steps the node forward 5 min
    advance(1000)
    minting.next()
    t.equal(minting.offsetMs, 250, 'the step is taken out of the offset at the re-anchor')
    for (let i = 0; i < 3; i++) { answer(0); advance(1000) }
    t.equal(minting.offsetMs, 250, 'answers in step agree on what the offset already is; the three from before the step are outvoted')
  })

  t.test('with the correction off the bound changes nothing: every Date is measured and reported', async t => {
    const logs = new LogCapture()
    const minting = createMintingClock()
    const clock = new UpstreamClock({ logger: createLogger('info', logs), correct: false, clock: minting, maxCorrectionS: 600 })
    clock.measure(YEAR_2100, undefined)
    t.ok((clock.skewSeconds ?? 0) > 2e9)
    t.equal(minting.offsetMs, 0)
    t.match(linesMatching(logs, 'warn', /^clock: /), [{ msg: /ahead of this node's.*COS_CLOCK_SKEW_CORRECTION=true/ }])
  })
})

interface Token {
  readonly timestamp: bigint
  /** The wall clock (ns) before the client sent the request and once the upstream had it. */
  readonly sentAt: bigint
  readonly receivedAt: bigint
}

interface DateHeader {
  /** The header as it is; when undefined, the real time `aheadMs` on (Node's own Date when 0). */
  value: string | undefined
  aheadMs: number
}

/** A real upstream whose Date header `date` sets, and a proxy with the correction on in front of it. */
async function skewedPair (t: Test, env: Record<string, string> = {}): Promise<{ date: DateHeader, logs: LogCapture, request: () => Promise<Token> }> {
  const date: DateHeader = { value: undefined, aheadMs: 0 }
  const seen: { timestamp: bigint, receivedAt: bigint }[] = []
  const upstream = await startUpstream((req, res) => {
    const receivedAt = wallClockNs()
    const parsed = parseToken(req.headers.authorization ?? '')
    if (parsed.ok) seen.push({ timestamp: BigInt(parsed.fields.timestamp), receivedAt })
    if (date.value !== undefined) res.setHeader('date', date.value)
    else if (date.aheadMs !== 0) res.setHeader('date', httpDate(Date.now() + date.aheadMs))
    res.end('{}')
  })
  t.teardown(() => upstream.close())
  const config = testConfig({ COS_API_URL: upstream.url, COS_CLOCK_SKEW_CORRECTION: 'true', ...env })
  const mintingClock = createMintingClock()
  const minter = new HeaderMinter(ACCESS_KEY, secretKey(SECRET), config.tokenEncoding, mintingClock.next)
  const logs = new LogCapture()
  const app = await buildProxyServer({ config, credentials: new CredentialStore(minter), logger: createLogger('info', logs), diagnostics: { sampleEveryMs: 0 }, mintingClock })
  t.teardown(() => app.close())
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/v1/x`
  return {
    date,
    logs,
    request: async () => {
      const sentAt = wallClockNs()
      const before = seen.length
      const res = await send(url)
      if (res.status !== 200 || seen.length !== before + 1) throw new Error(`status ${res.status}, ${seen.length - before} tokens`)
      const { timestamp, receivedAt } = seen[before] as { timestamp: bigint, receivedAt: bigint }
      return { timestamp, sentAt, receivedAt }
    },
  }
}

// The token is minted after the client sent the request and before the
// upstream has it: real time, to the resolution of the clocks (the minting
// clock's ms is floored to its anchor). 100 ms is for the clocks, not for
// scheduling: a loaded machine delays both ends alike.
const SLACK_NS = 100n * MS

function onRealTime (t: Test, tokens: readonly Token[], what: string): void {
  const off = tokens.filter(k => k.timestamp < k.sentAt - SLACK_NS || k.timestamp > k.receivedAt + SLACK_NS)
  t.same(off.map(k => `${Number(k.timestamp - k.sentAt) / 1e9} s from the time it was sent`), [], what)
}

for (const [year, bad] of [['2100', YEAR_2100], ['1970', YEAR_1970]] as const) {
  t.test(`an upstream whose Date says ${year} never moves token timestamps off real time, and one sane answer after it leaves them on real time (COS_CLOCK_SKEW_CORRECTION=true)`, async t => {
    const { date, logs, request } = await skewedPair(t)
    const tokens: Token[] = []
    for (let i = 0; i < 3; i++) tokens.push(await request())
    onRealTime(t, tokens, 'in step before')

    date.value = bad
    const during: Token[] = []
    for (let i = 0; i < 5; i++) {
      during.push(await request())
      // Timestamps frozen by an offset 56 years back would show against a
      // clock that moved 150 ms on; on real time they move with it.
      await sleep(150)
    }
    onRealTime(t, during, `while the upstream says ${year}: every token on real time`)

    date.value = undefined
    const after: Token[] = []
    for (let i = 0; i < 3; i++) after.push(await request())
    onRealTime(t, after, 'one sane answer after, and every one: on real time')

    const all = [...tokens, ...during, ...after].map(k => k.timestamp)
    t.ok(strictlyIncreasing(all), 'strictly increasing throughout')
    t.equal(linesMatching(logs, 'info', /minted timestamps are shifted/).length, 0, 'no shift')
    const refusals = linesMatching(logs, 'warn', /beyond COS_CLOCK_SKEW_MAX_SECONDS \(600 s\): not followed/)
    t.equal(refusals.length, 1, 'one warning for the five answers, not one each')
  })
}

t.test('a correction that ends (COS_CLOCK_SKEW_MAX_SECONDS=5, an upstream 4 s ahead put right): timestamps strictly increase, are never more than the bound ahead of real time, and are back on it once the bound has passed', async t => {
  const { date, logs, request } = await skewedPair(t, { COS_CLOCK_SKEW_MAX_SECONDS: '5' })
  date.aheadMs = 4000
  const tokens: Token[] = []
  for (let i = 0; i < 4; i++) tokens.push(await request())
  const shifted = linesMatching(logs, 'info', /minted timestamps are shifted by \+/)
  t.equal(shifted.length, 1, 'followed once three answers agree')
  const offset = Number(shifted[0]?.clockOffsetSeconds)
  t.ok(offset > 3 && offset <= 5, `by about 4 s (${offset} s)`)
  const ahead = tokens.at(-1) as Token
  t.ok(ahead.timestamp > ahead.receivedAt + 2000n * MS, 'the last token is on the upstream\'s clock')

  date.aheadMs = 0
  for (let i = 0; i < 4; i++) tokens.push(await request())
  t.equal(linesMatching(logs, 'info', /no longer shifted; timestamps go on from the last one minted/).length, 1, 'the correction ends, and the line says timestamps are held')
  const bound = 5000n * MS
  t.same(tokens.filter(k => k.timestamp > k.receivedAt + bound + SLACK_NS || k.timestamp < k.sentAt - SLACK_NS).map(k => k.timestamp - k.receivedAt), [], 'never more than the bound ahead of real time, never behind it')
  await sleep(5200) // the bound: no hold can outlast it
  const after: Token[] = []
  for (let i = 0; i < 3; i++) after.push(await request())
  onRealTime(t, after, 'back on real time')
  t.ok(strictlyIncreasing([...tokens, ...after].map(k => k.timestamp)), 'strictly increasing throughout')
})
