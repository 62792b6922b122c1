// The metrics registry, read back through its own exposition text: every
// method moves its series, labels stay within fixed sets, histograms are well
// formed; and classifyUpstreamError on real and constructed failures.
import { createServer as createNetServer, type Server, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { register as globalRegistry } from 'prom-client'
import t from 'tap'
import { request } from 'undici'
import { classifyUpstreamError, LATENCY_BUCKETS, ProxyMetrics, type UpstreamErrorKind } from '../../src/observability/metrics.js'
import { listenOnLoopback } from '../support/helpers.js'

// ── a tiny parser for `name{a="x",b="y"} value` lines ─────────────────────────

interface Sample { readonly name: string, readonly labels: Readonly<Record<string, string>>, readonly value: number }
interface Exposition { readonly samples: readonly Sample[], readonly types: ReadonlyMap<string, string> }

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g

function parse (text: string): Exposition {
  const samples: Sample[] = []
  const types = new Map<string, string>()
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('# HELP ')) continue
    if (line.startsWith('# TYPE ')) {
      const [name, type] = line.slice(7).split(' ')
      types.set(name ?? '', type ?? '')
      continue
    }
    const m = SAMPLE.exec(line)
    if (m === null) throw new Error(`unparsable exposition line: ${line}`)
    const labels: Record<string, string> = {}
    for (const [, k, v] of (m[2] ?? '').matchAll(LABEL)) labels[k ?? ''] = v ?? ''
    const raw = m[3] ?? ''
    samples.push({ name: m[1] ?? '', labels, value: raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : Number(raw) })
  }
  return { samples, types }
}

/** Samples of `name` whose labels include every pair in `labels`. */
function find (e: Exposition, name: string, labels: Record<string, string> = {}): Sample[] {
  return e.samples.filter(s => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
}

/** The one sample's value; throws when there is none or several. */
function value (e: Exposition, name: string, labels: Record<string, string> = {}): number {
  const found = find(e, name, labels)
  if (found.length !== 1) throw new Error(`${name}${JSON.stringify(labels)}: ${found.length} samples`)
  return (found[0] as Sample).value
}

async function scrape (m: ProxyMetrics): Promise<Exposition> {
  return parse(await m.text())
}

const P = 'cos_auth_proxy_'

// ── the registry ──────────────────────────────────────────────────────────────

t.test('log lines the stdout destination dropped are read at scrape time', async t => {
  let dropped = 0
  const m = new ProxyMetrics({ defaultMetrics: false, logLinesDropped: () => dropped })
  t.equal(value(await scrape(m), `${P}log_lines_dropped_total`), 0)
  dropped = 7
  t.equal(value(await scrape(m), `${P}log_lines_dropped_total`), 7)
})

t.test('a fresh registry declares every metric with its type; fixed sets start at 0; no per-route series yet', async t => {
  const e = await scrape(new ProxyMetrics({ defaultMetrics: false }))
  t.same(Object.fromEntries([...e.types].filter(([name]) => name.startsWith(P))), {
    [`${P}requests_total`]: 'counter',
    [`${P}requests_aborted_total`]: 'counter',
    [`${P}request_duration_seconds`]: 'histogram',
    [`${P}upstream_duration_seconds`]: 'histogram',
    [`${P}added_duration_seconds`]: 'histogram',
    [`${P}upstream_responses_total`]: 'counter',
    [`${P}upstream_errors_total`]: 'counter',
    [`${P}upstream_retries_total`]: 'counter',
    [`${P}response_failures_total`]: 'counter',
    [`${P}tokens_minted_total`]: 'counter',
    [`${P}credential_reloads_total`]: 'counter',
    [`${P}credential_reads_refused_total`]: 'counter',
    [`${P}credential_last_reload_timestamp_seconds`]: 'gauge',
    [`${P}upstream_clock_skew_seconds`]: 'gauge',
    [`${P}ready`]: 'gauge',
    [`${P}certificate_expiration_timestamp_seconds`]: 'gauge',
    [`${P}in_flight_requests`]: 'gauge',
  })
  t.equal(value(e, `${P}ready`), 0, 'not ready until told how to tell')
  for (const result of ['applied', 'unchanged', 'rejected']) t.equal(value(e, `${P}credential_reloads_total`, { result }), 0, result)
  t.equal(value(e, `${P}tokens_minted_total`), 0)
  t.equal(value(e, `${P}credential_last_reload_timestamp_seconds`), 0)
  t.equal(value(e, `${P}in_flight_requests`), 0)
  for (const name of ['requests_total', 'requests_aborted_total', 'request_duration_seconds_count', 'upstream_duration_seconds_count', 'added_duration_seconds_count', 'upstream_responses_total', 'upstream_errors_total', 'upstream_retries_total', 'response_failures_total', 'upstream_clock_skew_seconds', 'certificate_expiration_timestamp_seconds']) {
    t.same(find(e, P + name), [], `${name}: no series before anything happened`)
  }
})

t.test('the certificate expiry gauge is read at scrape time: one series per certificate set, none for a file without one', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  let expiry: { client?: number, ca?: number } = { client: 1_800_000_000 }
  m.observeCertificates(() => expiry)
  let e = await scrape(m)
  t.equal(value(e, `${P}certificate_expiration_timestamp_seconds`, { certificate: 'client' }), 1_800_000_000)
  t.equal(find(e, `${P}certificate_expiration_timestamp_seconds`).length, 1, 'no ca series')
  expiry = { client: 1_900_000_000, ca: 1_700_000_000 }
  e = await scrape(m)
  t.equal(value(e, `${P}certificate_expiration_timestamp_seconds`, { certificate: 'client' }), 1_900_000_000)
  t.equal(value(e, `${P}certificate_expiration_timestamp_seconds`, { certificate: 'ca' }), 1_700_000_000)
})

t.test('requestFinished counts by route, method and status class', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  m.requestFinished('management', 'GET', 200, 0.01, 0.009)
  m.requestFinished('management', 'GET', 204, 0.01, 0.009)
  m.requestFinished('management', 'POST', 201, 0.01, 0.009)
  m.requestFinished('optimize', 'GET', 404, 0.01, 0.009)
  m.requestFinished('api', 'DELETE', 503, 0.01, 0.009)
  m.requestFinished('api', 'PATCH', 302, 0.01, 0.009)
  m.requestFinished('api', 'OPTIONS', 101, 0.01, undefined)
  const e = await scrape(m)
  const count = (route: string, method: string, status_class: string): number => value(e, `${P}requests_total`, { route, method, status_class })
  t.equal(count('management', 'GET', '2xx'), 2)
  t.equal(count('management', 'POST', '2xx'), 1)
  t.equal(count('optimize', 'GET', '4xx'), 1)
  t.equal(count('api', 'DELETE', '5xx'), 1)
  t.equal(count('api', 'PATCH', '3xx'), 1)
  t.equal(count('api', 'OPTIONS', '1xx'), 1)
  t.equal(find(e, `${P}requests_total`).length, 6, 'only the combinations seen')
})

t.test('requests whose connection closed before the response finished are counted per route, on top of requests_total', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  m.requestFinished('management', 'GET', 499, 0.5, undefined, true)
  m.requestFinished('management', 'GET', 200, 2, 0.01, true)
  m.requestFinished('management', 'GET', 200, 0.01, 0.01, false)
  m.requestFinished('optimize', 'GET', 200, 0.01, 0.01)
  const e = await scrape(m)
  t.equal(value(e, `${P}requests_aborted_total`, { route: 'management' }), 2)
  t.equal(find(e, `${P}requests_aborted_total`).length, 1, 'no series for a route without aborts')
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'GET', status_class: '4xx' }), 1)
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'GET', status_class: '2xx' }), 2)
})

t.test('labels stay bounded: raw paths, odd methods and odd statuses fold into fixed values', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const rawPath = '/management/v1/clusters/c-8d2f?owner=alice'
  m.requestFinished(rawPath, 'GET', 200, 0.01, 0.01)
  m.requestFinished('mgmt', 'GET', 200, 0.01, 0.01)
  m.requestFinished('none', 'GET', 404, 0.001, undefined)
  m.requestFinished('management', 'PROPFIND', 207, 0.01, 0.01)
  m.requestFinished('management', 'get', 200, 0.01, 0.01) // methods are case-sensitive
  m.requestFinished('management', 'GET', 999, 0.01, 0.01) // Node lets 600-999 through
  m.upstreamError(rawPath, 'refused')
  m.retried(rawPath, 'connect')
  const text = await m.text()
  t.notMatch(text, 'clusters', 'the raw path never becomes a label')
  t.notMatch(text, 'alice')
  const e = parse(text)
  t.equal(value(e, `${P}requests_total`, { route: 'none', method: 'GET', status_class: '2xx' }), 2, 'unknown route names count as none')
  t.equal(value(e, `${P}requests_total`, { route: 'none', method: 'GET', status_class: '4xx' }), 1)
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'OTHER', status_class: '2xx' }), 2, 'PROPFIND and get are OTHER')
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'GET', status_class: '5xx' }), 1, '999 counts as 5xx')
  t.equal(value(e, `${P}upstream_errors_total`, { route: 'none', kind: 'refused' }), 1)
  t.equal(value(e, `${P}upstream_retries_total`, { route: 'none', reason: 'connect' }), 1)

  const allowed: Record<string, ReadonlySet<string>> = {
    route: new Set(['management', 'optimize', 'api', 'none']),
    method: new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH', 'OTHER']),
    status_class: new Set(['1xx', '2xx', '3xx', '4xx', '5xx', 'throttled']),
    kind: new Set(['refused', 'reset', 'timeout', 'tls', 'dns', 'other']),
    reason: new Set(['connect', 'unauthorized', 'not_a_regular_file', 'too_large', 'read_timeout']),
    result: new Set(['applied', 'unchanged', 'rejected']),
    le: new Set([...LATENCY_BUCKETS.map(String), '+Inf']),
  }
  for (const s of e.samples.filter(s => s.name.startsWith(P))) {
    for (const [k, v] of Object.entries(s.labels)) {
      t.ok(allowed[k]?.has(v), `${s.name} ${k}="${v}" is in the fixed set`)
    }
  }
})

t.test('histograms: cumulative buckets in order, +Inf = count, sum and count; upstream only when given', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const totals = [0.0003, 0.002, 0.002, 0.7, 45]
  for (const s of totals) m.requestFinished('optimize', 'GET', 200, s, undefined)
  m.requestFinished('optimize', 'GET', 200, 0.004, 0.0001)
  m.requestFinished('optimize', 'GET', 200, 0.6, 0.5)
  m.requestFinished('optimize', 'GET', 200, Number.NaN, Number.POSITIVE_INFINITY) // never poisons the sums
  const e = await scrape(m)
  t.equal(value(e, `${P}requests_total`, { route: 'optimize', method: 'GET', status_class: '2xx' }), 8, 'the request is counted all the same')

  const total = `${P}request_duration_seconds`
  const buckets = find(e, `${total}_bucket`, { route: 'optimize' })
  t.same(buckets.map(b => b.labels.le), [...LATENCY_BUCKETS.map(String), '+Inf'], 'every bound, ascending, then +Inf')
  const le = (bound: string): number => value(e, `${total}_bucket`, { route: 'optimize', le: bound })
  t.equal(le('0.0005'), 1)
  t.equal(le('0.001'), 1)
  t.equal(le('0.0025'), 3)
  t.equal(le('0.005'), 4)
  t.equal(le('0.5'), 4)
  t.equal(le('1'), 6)
  t.equal(le('30'), 6, '45 s is past the last bound')
  t.equal(le('+Inf'), 7)
  t.ok(buckets.every((b, i) => i === 0 || b.value >= (buckets[i - 1] as Sample).value), 'cumulative')
  t.equal(value(e, `${total}_count`, { route: 'optimize' }), 7)
  t.ok(Math.abs(value(e, `${total}_sum`, { route: 'optimize' }) - (45.7043 + 0.604)) < 1e-9)

  const upstream = `${P}upstream_duration_seconds`
  t.equal(value(e, `${upstream}_count`, { route: 'optimize' }), 2, 'undefined upstream time is not observed')
  t.equal(value(e, `${upstream}_bucket`, { route: 'optimize', le: '0.0005' }), 1)
  t.equal(value(e, `${upstream}_bucket`, { route: 'optimize', le: '0.25' }), 1)
  t.equal(value(e, `${upstream}_bucket`, { route: 'optimize', le: '0.5' }), 2, 'a value on a bound falls in that bucket')
  t.ok(Math.abs(value(e, `${upstream}_sum`, { route: 'optimize' }) - 0.5001) < 1e-9)
  t.same(find(e, `${total}_count`, { route: 'management' }), [], 'routes with nothing observed have no series')
})

t.test('the added duration is total minus upstream time, over the requests the upstream answered only: never negative', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  m.requestFinished('api', 'GET', 200, 0.012, 0.010)
  m.requestFinished('api', 'GET', 200, 0.3, 0.1)
  // Refused (503), hung up (499), unreachable (502): time in the proxy, no upstream answer.
  m.requestFinished('api', 'GET', 503, 0.2, undefined)
  m.requestFinished('api', 'GET', 499, 5, undefined)
  m.requestFinished('api', 'GET', 502, 1, undefined)
  // Timers read at different points can disagree by a hair; never below 0.
  m.requestFinished('api', 'GET', 200, 0.0049, 0.005)
  m.requestFinished('api', 'GET', 200, Number.NaN, 0.1)
  const e = await scrape(m)
  const added = `${P}added_duration_seconds`
  t.equal(value(e, `${added}_count`, { route: 'api' }), 3)
  t.ok(Math.abs(value(e, `${added}_sum`, { route: 'api' }) - 0.202) < 1e-9, 'sum of the differences')
  t.equal(value(e, `${added}_bucket`, { route: 'api', le: '0.0005' }), 1, 'the negative difference counts as 0')
  t.equal(value(e, `${added}_bucket`, { route: 'api', le: '0.0025' }), 2)
  t.equal(value(e, `${P}upstream_duration_seconds_count`, { route: 'api' }), 4)
})

t.test('upstreamResponse counts the upstream\'s answers by status class, apart from what the proxy answered itself', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  m.upstreamResponse('management', 200)
  m.upstreamResponse('management', 503)
  m.upstreamResponse('management', 500)
  m.upstreamResponse('/raw', 404)
  m.requestFinished('optimize', 'GET', 503, 0.001, undefined)
  const e = await scrape(m)
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: '5xx' }), 2)
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: '2xx' }), 1)
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: '1xx' }), 0, 'every class of a route that reached the upstream')
  t.equal(value(e, `${P}upstream_errors_total`, { route: 'management', kind: 'refused' }), 0, 'and every error kind, at 0')
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'none', status_class: '4xx' }), 1)
  t.same(find(e, `${P}upstream_responses_total`, { route: 'optimize' }), [], 'a 503 the proxy made is not an upstream answer')
})

t.test('a 429, and a 503 with Retry-After, count as status_class="throttled", apart from 4xx and 5xx; a 503 without it stays 5xx', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  m.upstreamResponse('management', 429, false)
  m.upstreamResponse('management', 503, true)
  m.upstreamResponse('management', 503, false)
  m.upstreamResponse('management', 400, false)
  m.requestFinished('management', 'GET', 429, 0.001, 0.001, false, false)
  m.requestFinished('management', 'GET', 503, 0.001, 0.001, false, true)
  m.requestFinished('management', 'GET', 503, 0.001, undefined, false, false)
  const e = await scrape(m)
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: 'throttled' }), 2)
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: '5xx' }), 1, 'the 503 without Retry-After: an upstream error')
  t.equal(value(e, `${P}upstream_responses_total`, { route: 'management', status_class: '4xx' }), 1, 'the 400 alone')
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'GET', status_class: 'throttled' }), 2)
  t.equal(value(e, `${P}requests_total`, { route: 'management', method: 'GET', status_class: '5xx' }), 1)
})

t.test('in-flight goes up with requestStarted and down with requestFinished', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const inFlight = async (): Promise<number> => value(await scrape(m), `${P}in_flight_requests`)
  m.requestStarted()
  m.requestStarted()
  m.requestStarted()
  t.equal(await inFlight(), 3)
  m.requestFinished('api', 'GET', 200, 0.01, 0.01)
  t.equal(await inFlight(), 2)
  m.requestFinished('api', 'GET', 200, 0.01, 0.01)
  m.requestFinished('api', 'GET', 502, 0.01, undefined)
  t.equal(await inFlight(), 0)
})

t.test('upstream errors, retries, tokens and response failures move their counters', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const kinds: UpstreamErrorKind[] = ['refused', 'reset', 'timeout', 'tls', 'dns', 'other']
  kinds.forEach((kind, i) => { for (let n = 0; n <= i; n++) m.upstreamError('management', kind) })
  m.upstreamError('optimize', 'timeout')
  m.retried('management', 'connect')
  m.retried('management', 'unauthorized')
  m.retried('management', 'unauthorized')
  for (let i = 0; i < 5; i++) m.tokenMinted()
  m.responseFailed('api')
  m.responseFailed('api')
  m.responseFailed('/raw/path')
  const e = await scrape(m)
  kinds.forEach((kind, i) => t.equal(value(e, `${P}upstream_errors_total`, { route: 'management', kind }), i + 1, kind))
  t.equal(value(e, `${P}upstream_errors_total`, { route: 'optimize', kind: 'timeout' }), 1)
  t.equal(find(e, `${P}upstream_errors_total`).length, 12, 'every kind of both routes that reached the upstream, zeros included')
  t.equal(value(e, `${P}upstream_errors_total`, { route: 'optimize', kind: 'refused' }), 0)
  t.equal(find(e, `${P}upstream_responses_total`).length, 12, 'every status class of both routes (throttled included), at 0 until the upstream answers')
  t.same(find(e, `${P}upstream_errors_total`).filter(s => s.labels.route === 'api'), [], 'a route that sent nothing upstream has no upstream series')
  t.equal(value(e, `${P}upstream_retries_total`, { route: 'management', reason: 'connect' }), 1)
  t.equal(value(e, `${P}upstream_retries_total`, { route: 'management', reason: 'unauthorized' }), 2)
  t.equal(value(e, `${P}tokens_minted_total`), 5)
  t.equal(value(e, `${P}response_failures_total`, { route: 'api' }), 2)
  t.equal(value(e, `${P}response_failures_total`, { route: 'none' }), 1, 'unknown route names count as none')
  t.equal(find(e, `${P}response_failures_total`).length, 2)
})

t.test('credential reloads: counted by result; applied and unchanged move the last-good time, rejected does not', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const last = async (): Promise<number> => value(await scrape(m), `${P}credential_last_reload_timestamp_seconds`)
  const before = Date.now() / 1000
  m.credentialReload('applied')
  const applied = await last()
  t.ok(applied >= before && applied <= Date.now() / 1000, 'unix seconds, now')
  await sleep(20)
  m.credentialReload('rejected')
  t.equal(await last(), applied, 'a rejected read is not a good read')
  m.credentialReload('unchanged')
  const unchanged = await last()
  t.ok(unchanged >= applied + 0.015, 'an unchanged read is a good read')
  m.credentialReload('rejected')
  const e = await scrape(m)
  t.equal(value(e, `${P}credential_reloads_total`, { result: 'applied' }), 1)
  t.equal(value(e, `${P}credential_reloads_total`, { result: 'unchanged' }), 1)
  t.equal(value(e, `${P}credential_reloads_total`, { result: 'rejected' }), 2)
})

t.test('credential files refused unread: counted by reason from a fixed set, and as rejected reloads', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  const zero = await scrape(m)
  for (const reason of ['not_a_regular_file', 'too_large', 'read_timeout']) {
    t.equal(value(zero, `${P}credential_reads_refused_total`, { reason }), 0, `${reason} shown at 0 before any`)
  }
  m.credentialReload('rejected', 'not_a_regular_file')
  m.credentialReload('rejected', 'not_a_regular_file')
  m.credentialReload('rejected', 'too_large')
  m.credentialReload('rejected', 'read_timeout')
  m.credentialReload('rejected')
  const e = await scrape(m)
  t.equal(value(e, `${P}credential_reads_refused_total`, { reason: 'not_a_regular_file' }), 2)
  t.equal(value(e, `${P}credential_reads_refused_total`, { reason: 'too_large' }), 1)
  t.equal(value(e, `${P}credential_reads_refused_total`, { reason: 'read_timeout' }), 1)
  t.equal(find(e, `${P}credential_reads_refused_total`).length, 3, 'three series, whatever happens')
  t.equal(value(e, `${P}credential_reloads_total`, { result: 'rejected' }), 5, 'each is also a rejected reload')
})

t.test('the upstream clock skew gauge has no series until measured (0 would claim the clocks agree), then the last measurement, either sign', async t => {
  const m = new ProxyMetrics({ defaultMetrics: false })
  t.same(find(await scrape(m), `${P}upstream_clock_skew_seconds`), [], 'absent before the first measurement')
  m.upstreamClockSkew(300.25)
  t.equal(value(await scrape(m), `${P}upstream_clock_skew_seconds`), 300.25)
  m.upstreamClockSkew(-0.5)
  t.equal(value(await scrape(m), `${P}upstream_clock_skew_seconds`), -0.5)
})

t.test('default process metrics: present by default, absent when switched off', async t => {
  const on = await scrape(new ProxyMetrics())
  for (const name of ['process_cpu_seconds_total', 'process_start_time_seconds', 'nodejs_heap_size_total_bytes', 'nodejs_eventloop_lag_seconds']) {
    t.ok(on.types.has(name), `${name} declared`)
    t.ok(find(on, name).length > 0, `${name} has a value`)
  }
  const off = await scrape(new ProxyMetrics({ defaultMetrics: false }))
  t.same(off.samples.filter(s => !s.name.startsWith(P)), [], 'only the proxy\'s own metrics')
})

t.test('every ProxyMetrics has its own registry; prom-client\'s global one is never touched', async t => {
  const a = new ProxyMetrics()
  const b = new ProxyMetrics() // would throw "already registered" on a shared registry
  a.tokenMinted()
  t.equal(value(await scrape(a), `${P}tokens_minted_total`), 1)
  t.equal(value(await scrape(b), `${P}tokens_minted_total`), 0)
  t.equal(globalRegistry.getMetricsAsArray().length, 0)
  t.equal(a.contentType, 'text/plain; version=0.0.4; charset=utf-8')
  t.equal(a.contentType, a.registry.contentType)
})

// ── classifyUpstreamError ─────────────────────────────────────────────────────

async function listenTcp (onSocket: (s: Socket) => void): Promise<{ port: number, close: () => Promise<void> }> {
  const sockets = new Set<Socket>()
  const server: Server = createNetServer(s => { sockets.add(s); s.on('close', () => sockets.delete(s)); s.on('error', () => undefined); onSocket(s) })
  const port = await listenOnLoopback(server)
  return { port, close: () => new Promise(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }) }
}

/** The error undici rejects with. */
async function failure (url: string, headersTimeout?: number): Promise<Error> {
  try {
    const res = await request(url, { headersTimeout })
    await res.body.dump()
  } catch (err) {
    if (err instanceof Error) return err
    throw err
  }
  throw new Error(`${url} did not fail`)
}

t.test('classifyUpstreamError on real undici failures', async t => {
  const closed = await listenTcp(() => undefined)
  await closed.close()
  t.equal(classifyUpstreamError(await failure(`http://127.0.0.1:${closed.port}/`)), 'refused', 'connection refused')

  const rst = await listenTcp(s => s.once('data', () => s.resetAndDestroy()))
  t.teardown(rst.close)
  t.equal(classifyUpstreamError(await failure(`http://127.0.0.1:${rst.port}/`)), 'reset', 'reset after the request')

  const hangUp = await listenTcp(s => s.once('data', () => s.destroy()))
  t.teardown(hangUp.close)
  t.equal(classifyUpstreamError(await failure(`http://127.0.0.1:${hangUp.port}/`)), 'reset', 'closed without an answer')

  const silent = await listenTcp(() => undefined)
  t.teardown(silent.close)
  t.equal(classifyUpstreamError(await failure(`http://127.0.0.1:${silent.port}/`, 100)), 'timeout', 'no response headers in time')

  const plain = await listenTcp(s => s.once('data', () => s.end('HTTP/1.1 400 Bad Request\r\n\r\n')))
  t.teardown(plain.close)
  const tls = await failure(`https://127.0.0.1:${plain.port}/`)
  t.equal(classifyUpstreamError(tls), 'tls', `TLS to a plain port (${String((tls as { code?: unknown }).code)})`)
})

/** An Error with a code, as Node, undici and @fastify/error make them. */
function coded (code: string, cause?: unknown): Error {
  return Object.assign(new Error(code, { cause }), { code })
}

t.test('classifyUpstreamError on every listed code, bare and as the cause of another error', async t => {
  const table: Record<UpstreamErrorKind, readonly string[]> = {
    refused: ['ECONNREFUSED'],
    reset: ['ECONNRESET', 'EPIPE', 'ECONNABORTED', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'],
    timeout: ['ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'],
    dns: ['ENOTFOUND', 'EAI_AGAIN'],
    tls: ['ERR_TLS_CERT_ALTNAME_INVALID', 'ERR_TLS_HANDSHAKE_TIMEOUT', 'ERR_SSL_WRONG_VERSION_NUMBER', 'CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID',
      'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'HOSTNAME_MISMATCH', 'EPROTO'],
    other: ['EHOSTUNREACH', 'UND_ERR_ABORTED', 'SOMETHING_ELSE'],
  }
  for (const [kind, codes] of Object.entries(table)) {
    for (const code of codes) {
      t.equal(classifyUpstreamError(coded(code)), kind, code)
      t.equal(classifyUpstreamError(coded('WRAPPER', coded(code))), kind, `${code} as the cause`)
    }
  }
  t.equal(classifyUpstreamError(coded('ECONNRESET', coded('ECONNRESET'))), 'reset')
  t.equal(classifyUpstreamError(coded('UND_ERR_SOCKET', coded('UND_ERR_SOCKET', coded('ECONNRESET')))), 'reset')

  const v4 = coded('ECONNREFUSED')
  const v6 = coded('ECONNREFUSED')
  t.equal(classifyUpstreamError(new AggregateError([v4, v6])), 'refused', 'happy eyeballs: read through the first error')
  t.equal(classifyUpstreamError(Object.assign(new AggregateError([v4, v6]), { code: 'ECONNREFUSED' })), 'refused')

  t.equal(classifyUpstreamError(new Error('no code')), 'other')
  t.equal(classifyUpstreamError(Object.assign(new Error('numeric'), { code: 42 })), 'other')
  const loop = coded('WHATEVER')
  loop.cause = loop
  t.equal(classifyUpstreamError(loop), 'other', 'a cause cycle ends')
})
