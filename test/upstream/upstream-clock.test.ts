// The upstream's clock, read off the Date header of its answers: the gauge,
// one log line per change of state (never one per request), and
// COS_CLOCK_SKEW_CORRECTION against a real mock API that checks every token
// against its own, skewed, clock. Real servers on 127.0.0.1 throughout; the
// sampling interval is set to 0 where a test needs every answer measured.
import type { AddressInfo } from 'node:net'
import t, { type Test } from 'tap'
import { createLogger } from '../../src/observability/logger.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { buildMockApi } from '../../src/mock-api/mock-api.js'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { buildProxyServer, metricsObserver, type Diagnostics } from '../../src/proxy/proxy-server.js'
import { createMintingClock, HeaderMinter, mintingClock, parseToken, secretKey, wallClockNs } from '../../src/token/token.js'
import { UpstreamClock } from '../../src/upstream/upstream-clock.js'
import { ACCESS_KEY, LogCapture, REFUSING_PORT, SECRET, json, send, startUpstream, testConfig } from '../support/helpers.js'

const MINUTE_MS = 60_000

// A skew is measured as the upstream's Date + 0.5 s (its resolution) minus
// the local time its answer is read: on a busy machine the answer is read
// late, and the figure comes out lower by that delay. The assertions allow
// DELAY_S of it, and half a second of Date's resolution either way; they
// never depend on the machine being quiet.
const DELAY_S = 6

/** Whether a measured skew (s) is `expected` as a loaded machine may read it. */
function near (measured: number | undefined, expected: number): boolean {
  return measured !== undefined && measured <= expected + 0.6 && measured >= expected - 0.6 - DELAY_S
}

/** A regex source for the whole seconds a log line may give for `expected` (rounded, read late: up to DELAY_S less). */
function secondsNear (expected: number): string {
  const magnitude = Math.abs(expected)
  // Behind reads as a larger magnitude when late, ahead as a smaller one.
  const [lo, hi] = expected >= 0 ? [magnitude - DELAY_S - 1, magnitude + 1] : [magnitude - 1, magnitude + DELAY_S + 1]
  return `(?:${Array.from({ length: hi - lo + 1 }, (_, i) => String(lo + i)).join('|')})`
}

function httpDate (ms: number): string {
  return new Date(ms).toUTCString()
}

interface Proxy {
  readonly url: string
  readonly logs: LogCapture
  readonly metrics: ProxyMetrics
}

/**
 * The real proxy with metrics wired, logging at `info` to memory; closed when
 * the test ends. Each has a minting clock of its own: timestamps never go
 * back, so one shifted 10 min ahead would hold every later test's there.
 */
async function startProxy (t: Test, env: Record<string, string>, diagnostics: Diagnostics = {}): Promise<Proxy> {
  const config = testConfig(env)
  const mintingClock = createMintingClock()
  const minter = new HeaderMinter(ACCESS_KEY, secretKey(SECRET), config.tokenEncoding, mintingClock.next)
  const logs = new LogCapture()
  const metrics = new ProxyMetrics({ defaultMetrics: false })
  const app = await buildProxyServer({ config, credentials: new CredentialStore(minter), logger: createLogger('info', logs), observer: metricsObserver(metrics), diagnostics, mintingClock })
  t.teardown(() => app.close())
  await app.listen({ host: '127.0.0.1', port: 0 })
  return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, logs, metrics }
}

/** The gauge's value, or undefined when it has no series. */
async function skewGauge (metrics: ProxyMetrics): Promise<number | undefined> {
  const line = /^cos_auth_proxy_upstream_clock_skew_seconds (\S+)$/m.exec(await metrics.text())
  return line === null ? undefined : Number(line[1])
}

function linesMatching (logs: LogCapture, level: string, msg: RegExp): Record<string, unknown>[] {
  return logs.records.filter(r => r.level === level && msg.test(String(r.msg)))
}

t.test('an upstream whose clock is 5 minutes ahead: the gauge reads about +300 s and one warning says to check NTP, not one per request; back in step, one "clock ok" line', async t => {
  let aheadMs = 5 * MINUTE_MS
  const upstream = await startUpstream((_req, res) => {
    res.setHeader('date', httpDate(Date.now() + aheadMs))
    res.end('ok')
  })
  t.teardown(() => upstream.close())
  const proxy = await startProxy(t, { COS_API_URL: upstream.url }, { sampleEveryMs: 0 })
  t.equal(await skewGauge(proxy.metrics), undefined, 'no series before an upstream answer')

  for (let i = 0; i < 20; i++) t.equal((await send(`${proxy.url}/v1/x`)).status, 200)
  const ahead = await skewGauge(proxy.metrics)
  t.ok(near(ahead, 300), `gauge ≈ +300 s (${ahead})`)
  const warnings = linesMatching(proxy.logs, 'warn', /^clock: /)
  t.equal(warnings.length, 1, 'one warning for 20 skewed answers')
  t.match(warnings[0]?.msg, new RegExp(`upstream's clock is ${secondsNear(300)} s ahead of this node's .*Check NTP on the node.*COS_CLOCK_SKEW_CORRECTION=true`))
  t.ok(near(Number(warnings[0]?.upstreamClockSkewSeconds), 300), 'the line carries the skew')
  t.equal(warnings[0]?.clockSkewCorrection, false)

  aheadMs = 0
  for (let i = 0; i < 20; i++) t.equal((await send(`${proxy.url}/v1/x`)).status, 200)
  const inStep = await skewGauge(proxy.metrics)
  t.ok(inStep !== undefined && Math.abs(inStep) < 1.5, `gauge ≈ 0 (${inStep})`)
  const ok = linesMatching(proxy.logs, 'info', /^clock ok: /)
  t.equal(ok.length, 1, 'one "clock ok" line for 20 answers in step')
  t.match(ok[0]?.msg, /agrees with this node's again/)
  t.equal(linesMatching(proxy.logs, 'warn', /^clock: /).length, 1, 'and no further warning')

  aheadMs = -5 * MINUTE_MS
  for (let i = 0; i < 5; i++) await send(`${proxy.url}/v1/x`)
  const behind = await skewGauge(proxy.metrics)
  t.ok(near(behind, -300), `an upstream behind reads negative (${behind})`)
  t.match(linesMatching(proxy.logs, 'warn', /^clock: /).at(-1)?.msg, new RegExp(`${secondsNear(-300)} s behind this node's`))
})

t.test('UpstreamClock', async t => {
  const logs = new LogCapture()
  const logger = createLogger('info', logs)
  const wall = { ms: 1_700_000_000_250 }
  const localClock = (): ReturnType<typeof createMintingClock> => createMintingClock({ wallMs: () => Math.floor(wall.ms), monoMs: () => wall.ms - 1_700_000_000_000 })

  t.test('a Date is parsed at most once per sampling interval, however many answers arrive', async t => {
    const measured: number[] = []
    const clock = new UpstreamClock({ logger, correct: false, clock: localClock(), onMeasured: s => { measured.push(s) } })
    const headers = { date: httpDate(wall.ms) }
    for (let i = 0; i < 1000; i++) clock.observe(headers, 5000 + i * 0.5) // 1000 answers in 500 ms
    t.equal(measured.length, 1, 'one measurement for 1000 answers within a second')
    clock.observe(headers, 5999.9)
    t.equal(measured.length, 1)
    clock.observe(headers, 6000)
    t.equal(measured.length, 2, 'the next one a second later')
  })

  t.test('the estimate: Date + 0.5 s (its resolution) + Age − local time; unusable headers are ignored', async t => {
    const clock = new UpstreamClock({ logger, correct: false, clock: localClock() })
    t.equal(clock.skewSeconds, undefined, 'nothing before the first Date')
    t.ok(clock.measure(httpDate(wall.ms + 300_000), undefined))
    t.equal(clock.skewSeconds, 300.25, 'Date floors to the second: 300 s − 0.25 s + 0.5 s')
    t.ok(clock.measure(httpDate(wall.ms - 120_000), '120'), 'a cached answer')
    t.equal(clock.skewSeconds, 0.25, 'its Age is added')
    for (const [date, age] of [[undefined, undefined], ['yesterday-ish', undefined], [['a', 'b'], undefined]] as const) {
      t.notOk(clock.measure(date, age), `${JSON.stringify(date)} is no Date`)
    }
    t.ok(clock.measure(httpDate(wall.ms), 'soon'), 'a malformed Age counts as none')
    t.equal(clock.skewSeconds, 0.25)
  })

  t.test('the report has hysteresis: a skew hovering at the threshold gives one line, not one per answer', async t => {
    const quiet = new LogCapture()
    const clock = new UpstreamClock({ logger: createLogger('info', quiet), correct: false, clock: localClock() })
    for (const s of [61, 59.5, 61, 59, 61, 58.5, 61]) clock.measure(httpDate(wall.ms + s * 1000), undefined)
    t.equal(quiet.records.length, 1, 'one warning while it stays near 60 s')
    t.ok(clock.skewed)
    clock.measure(httpDate(wall.ms + 50_000), undefined)
    t.equal(quiet.records.length, 2, 'clock ok once it is clearly back')
    t.notOk(clock.skewed)
  })

  t.test('with the correction on, the offset moves only when agreeing estimates leave it by more than the noise, and close() gives it back', async t => {
    const quiet = new LogCapture()
    const minting = localClock()
    const clock = new UpstreamClock({ logger: createLogger('info', quiet), correct: true, clock: minting })
    const answers = (s: number, n = 3): void => { for (let i = 0; i < n; i++) clock.measure(httpDate(wall.ms + s * 1000), undefined) }
    t.ok(minting.followSteps, 'steps of the wall clock are followed while correcting')
    answers(1)
    t.equal(minting.offsetMs, 0, 'a skew within the noise is not corrected')
    answers(300)
    t.equal(minting.offsetMs, 300_250, 'whole ms')
    for (const s of [299, 301, 300]) clock.measure(httpDate(wall.ms + s * 1000), undefined)
    t.equal(minting.offsetMs, 300_250, 'noise around it leaves it alone')
    answers(-590)
    t.equal(minting.offsetMs, -589_750, 'a real change moves it, either way')
    const shifts = quiet.records.filter(r => /minted timestamps are shifted/.test(String(r.msg)))
    t.same(shifts.map(r => r.clockOffsetSeconds), [300.25, -589.75], 'one line per change of the offset')
    t.match(shifts[1]?.msg, /timestamps go on from the last one minted, 1 ns apart, until the shifted clock catches up \(at most 890 s\)$/, 'a change back says timestamps are held')
    t.equal(shifts[1]?.previousClockOffsetSeconds, 300.25)
    clock.close()
    t.equal(minting.offsetMs, 0)
    t.notOk(minting.followSteps)
  })
})

interface SkewedApi {
  readonly url: string
  /** Timestamps of every token it received, in order, as BigInt ns. */
  readonly timestamps: bigint[]
  /** The mock's clock minus the real one, ms; change at will. */
  offset: { ms: number }
}

/** The mock COS API on a clock of its own: it checks tokens against it (±1 min) and shows it in Date. */
async function startSkewedApi (t: Test, offsetMs: number): Promise<SkewedApi> {
  const offset = { ms: offsetMs }
  const timestamps: bigint[] = []
  const app = buildMockApi({ accessKey: ACCESS_KEY, key: secretKey(SECRET), maxSkewMs: MINUTE_MS, now: () => wallClockNs() + BigInt(offset.ms) * 1_000_000n })
  app.addHook('onResponse', (request, _reply, done) => {
    const parsed = parseToken(request.headers.authorization ?? '')
    if (parsed.ok) timestamps.push(BigInt(parsed.fields.timestamp))
    done()
  })
  t.teardown(() => app.close())
  await app.listen({ host: '127.0.0.1', port: 0 })
  return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`, timestamps, offset }
}

function strictlyIncreasing (values: readonly bigint[]): boolean {
  return values.every((v, i) => i === 0 || v > (values[i - 1] as bigint))
}

/** How far a token's timestamp is from the real time now, in seconds. */
function secondsFromNow (ns: bigint | undefined): number {
  return Number((ns ?? 0n) - wallClockNs()) / 1e9
}

t.test('COS_CLOCK_SKEW_CORRECTION=true', async t => {
  for (const [name, offsetMs] of [['ahead', 5 * MINUTE_MS], ['behind', -5 * MINUTE_MS]] as const) {
    t.test(`an upstream 5 min ${name} that checks tokens on its own clock: the first request succeeds, the clock having been read before the proxy took requests`, async t => {
      const api = await startSkewedApi(t, offsetMs)
      const proxy = await startProxy(t, { COS_API_URL: api.url, COS_CLOCK_SKEW_CORRECTION: 'true' }, { sampleEveryMs: 0 })
      for (let i = 0; i < 5; i++) {
        const res = await send(`${proxy.url}/management/v1/clusters`)
        t.equal(res.status, 200, JSON.stringify(json(res)))
      }
      t.ok(near(secondsFromNow(api.timestamps.at(-1)), offsetMs / 1000), 'tokens carry the upstream\'s time')
      t.ok(strictlyIncreasing(api.timestamps))
      t.match(linesMatching(proxy.logs, 'warn', /^clock: /)[0]?.msg, /COS_CLOCK_SKEW_CORRECTION is on: minted timestamps follow the upstream's clock/, 'the node\'s clock is still reported')
      t.equal(linesMatching(proxy.logs, 'info', /minted timestamps are shifted by/).length, 1)
    })
  }

  t.test('the upstream\'s clock jumps 5 min ahead while serving: the requests before three answers agree on it are refused, the ones after succeed, timestamps strictly increase across the change', async t => {
    const api = await startSkewedApi(t, 0)
    const proxy = await startProxy(t, { COS_API_URL: api.url, COS_CLOCK_SKEW_CORRECTION: 'true' }, { sampleEveryMs: 0 })
    const statuses: number[] = []
    for (let i = 0; i < 3; i++) statuses.push((await send(`${proxy.url}/echo`)).status)
    api.offset.ms = 5 * MINUTE_MS
    const refused = await send(`${proxy.url}/echo`)
    statuses.push(refused.status)
    t.match(json(refused), { error: { code: 'stale_timestamp' } }, 'tokens minted before the jump was seen are stale')
    for (let i = 0; i < 5; i++) statuses.push((await send(`${proxy.url}/echo`)).status)
    t.same(statuses, [200, 200, 200, 401, 401, 401, 200, 200, 200], 'succeeding again once three answers agree on the new skew')
    t.equal(api.timestamps.length, 9)
    t.ok(strictlyIncreasing(api.timestamps), 'strictly increasing across the change of the offset')
    t.ok(near(secondsFromNow(api.timestamps.at(-1)), 300), 'and on the upstream\'s clock')
  })

  t.test('an upstream 15 min ahead, beyond COS_CLOCK_SKEW_MAX_SECONDS (600 s by default): not followed, and the warning says so; raised to 1200 s, followed', async t => {
    const api = await startSkewedApi(t, 15 * MINUTE_MS)
    const bounded = await startProxy(t, { COS_API_URL: api.url, COS_CLOCK_SKEW_CORRECTION: 'true' }, { sampleEveryMs: 0 })
    t.match(json(await send(`${bounded.url}/echo`)), { error: { code: 'stale_timestamp' } })
    t.match(linesMatching(bounded.logs, 'warn', /^clock: the upstream's clock/), [{ msg: new RegExp(`${secondsNear(900)} s ahead of this node's.*COS_CLOCK_SKEW_CORRECTION is on but does not follow a skew beyond COS_CLOCK_SKEW_MAX_SECONDS \\(600 s\\)$`) }])
    t.equal(linesMatching(bounded.logs, 'warn', new RegExp(`^clock: COS_CLOCK_SKEW_CORRECTION: the upstream's Date puts its clock ${secondsNear(900)} s ahead`)).length, 1, 'one line for the refused samples')
    const raised = await startProxy(t, { COS_API_URL: api.url, COS_CLOCK_SKEW_CORRECTION: 'true', COS_CLOCK_SKEW_MAX_SECONDS: '1200' }, { sampleEveryMs: 0 })
    t.equal((await send(`${raised.url}/echo`)).status, 200)
  })

  t.test('the clock is read at start by HEADs without credentials; an upstream that cannot be reached then does not stop the start', async t => {
    const upstream = await startUpstream((_req, res) => { res.setHeader('date', httpDate(Date.now() + 5 * MINUTE_MS)); res.end() })
    t.teardown(() => upstream.close())
    const proxy = await startProxy(t, { COS_API_URL: `${upstream.url}/api/v1`, COS_CLOCK_SKEW_CORRECTION: 'true' })
    t.same(upstream.received.map(r => [r.method, r.url, r.headers.authorization]), Array(3).fill(['HEAD', '/api/v1', undefined]), 'three HEADs to the base path (as many as must agree), no token')
    const gauge = await skewGauge(proxy.metrics)
    t.ok(near(gauge, 300), `measured before any request (${gauge})`)

    const closed = REFUSING_PORT
    const unreachable = await startProxy(t, { COS_API_URL: `http://127.0.0.1:${closed}`, COS_CLOCK_SKEW_CORRECTION: 'true' })
    t.match(linesMatching(unreachable.logs, 'warn', /could not read the upstream's clock at start/)[0], { upstream: `http://127.0.0.1:${closed}` }, 'logged; the proxy listens anyway')
    t.equal((await send(`${unreachable.url}/x`)).status, 502)
  })

  t.test('by default the process-wide minting clock is the one corrected, and closing the proxy gives it back unshifted', async t => {
    const api = await startSkewedApi(t, 5 * MINUTE_MS)
    const config = testConfig({ COS_API_URL: api.url, COS_CLOCK_SKEW_CORRECTION: 'true' })
    const pair = await readPair(config.credentials, config.tokenEncoding)
    if (!pair.ok) throw new Error(pair.problem)
    const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger: createLogger('silent') })
    await app.listen({ host: '127.0.0.1', port: 0 })
    t.ok(near(mintingClock.offsetMs / 1000, 300), `shifted while it runs (${mintingClock.offsetMs} ms)`)
    t.ok(mintingClock.followSteps)
    await app.close()
    t.equal(mintingClock.offsetMs, 0)
    t.notOk(mintingClock.followSteps)
    const ts = parseToken(pair.minter.next())
    t.ok(ts.ok && near(secondsFromNow(BigInt(ts.fields.timestamp)), 0), 'tokens carry local time again')
  })
})

t.test('without the correction, the same skewed upstream refuses every token as stale, and the warning says what to do', async t => {
  const api = await startSkewedApi(t, 10 * MINUTE_MS)
  const proxy = await startProxy(t, { COS_API_URL: api.url }, { sampleEveryMs: 0 })
  for (let i = 0; i < 3; i++) t.match(json(await send(`${proxy.url}/echo`)), { error: { code: 'stale_timestamp' } })
  t.equal(api.timestamps.length, 3, 'no request was retried')
  t.match(linesMatching(proxy.logs, 'warn', /^clock: /), [{ msg: new RegExp(`${secondsNear(600)} s ahead of this node's.*COS_CLOCK_SKEW_CORRECTION=true`) }])
})
