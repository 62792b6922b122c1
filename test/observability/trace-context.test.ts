// W3C trace context, end to end: `traceparent` and `tracestate` reach the
// upstream byte for byte (valid, malformed, or not at all when the client
// sent none: the proxy starts no trace), and every line that belongs to a
// request carries the request's `trace_id`, `span_id` (the caller's) and
// `trace_flags` when its `traceparent` is valid, and none of them otherwise.
// A real upstream on 127.0.0.1, the real proxy, its real JSON lines.
import t from 'tap'
import { addTraceFields, validTraceparent } from '../../src/client/trace-context.js'
import { REFUSING_PORT, send, stallingUpstream, startProxy, startUpstream, until, type RunningProxy, type Upstream } from '../support/helpers.js'

type Line = Record<string, unknown>

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const SPAN_ID = '00f067aa0ba902b7'
const VALID = `00-${TRACE_ID}-${SPAN_ID}-01`
const FIELDS = { trace_id: TRACE_ID, span_id: SPAN_ID, trace_flags: '01' }
const TRACESTATE = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7 , vendor@x=a b'

/** Received as sent, and not valid (W3C Trace Context level 1, §3.2). */
const MALFORMED: Record<string, string> = {
  'upper-case hex': VALID.toUpperCase(),
  'version ff': `ff-${TRACE_ID}-${SPAN_ID}-01`,
  'an all-zero trace id': `00-${'0'.repeat(32)}-${SPAN_ID}-01`,
  'an all-zero parent id': `00-${TRACE_ID}-${'0'.repeat(16)}-01`,
  'version 00 with more after it': `${VALID}-extra`,
  'a short trace id': `00-${TRACE_ID.slice(1)}-${SPAN_ID}-01`,
  'not hex': `00-${TRACE_ID.slice(0, 31)}g-${SPAN_ID}-01`,
  'a later version not followed by a dash': `01-${TRACE_ID}-${SPAN_ID}-01x`,
  'two headers joined': `${VALID}, ${VALID}`,
  'garbage': 'not a traceparent',
}

const TRACE_KEYS = ['trace_id', 'span_id', 'trace_flags']
const traceKeys = (line: Line | undefined): string[] => Object.keys(line ?? {}).filter(k => TRACE_KEYS.includes(k))

/** The value of `name` in raw headers, as many times as it came. */
function rawValues (raw: readonly string[], name: string): string[] {
  const out: string[] = []
  for (let i = 0; i + 1 < raw.length; i += 2) if (raw[i]?.toLowerCase() === name) out.push(raw[i + 1] ?? '')
  return out
}

/** The lines of the request `act` sends (by its x-request-id), once its request line is written. */
async function linesOf (proxy: RunningProxy, act: () => Promise<{ headers: Record<string, unknown> } | undefined>): Promise<Line[]> {
  const before = proxy.logs.records.length
  const res = await act()
  const id = res?.headers['x-request-id']
  if (!await until(() => proxy.logs.records.slice(before).some(r => r.msg === 'request'), 5000)) throw new Error('no request line')
  await new Promise(resolve => setTimeout(resolve, 50))
  return proxy.logs.records.slice(before).filter(r => id === undefined || r.reqId === id)
}

t.test('validTraceparent: W3C Trace Context level 1, version 00 exact, later versions by their prefix', async t => {
  t.ok(validTraceparent(VALID), 'version 00')
  t.ok(validTraceparent(`00-${TRACE_ID}-${SPAN_ID}-00`), 'not sampled')
  t.ok(validTraceparent(`01-${TRACE_ID}-${SPAN_ID}-01`), 'a later version, 55 characters')
  t.ok(validTraceparent(`cc-${TRACE_ID}-${SPAN_ID}-01-what-the-future-holds`), 'a later version with more after a dash')
  for (const [what, value] of Object.entries(MALFORMED)) t.notOk(validTraceparent(value), what)
  t.notOk(validTraceparent(undefined), 'none')
  t.notOk(validTraceparent([VALID, VALID]), 'an array')
  t.same(addTraceFields({}, `cc-${TRACE_ID}-${SPAN_ID}-03-x`), { ...FIELDS, trace_flags: '01' }, 'a later version: the sampled bit alone')
  t.same(addTraceFields({}, `00-${TRACE_ID}-${SPAN_ID}-03`), { ...FIELDS, trace_flags: '03' }, 'version 00: the flags as sent')
})

t.test('traceparent and tracestate reach the upstream byte for byte; a request without them reaches it without them', async t => {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const proxy = await startProxy({ COS_API_URL: upstream.url })
  t.teardown(() => proxy.close())
  const cases: [string, Record<string, string>][] = [
    ['valid', { traceparent: VALID, tracestate: TRACESTATE }],
    ...Object.entries(MALFORMED).filter(([what]) => what !== 'two headers joined').map(([what, v]): [string, Record<string, string>] => [what, { traceparent: v, tracestate: 'x=,=,,' }]),
    ['none', {}],
  ]
  for (const [what, headers] of cases) {
    const n = upstream.received.length
    const res = await send(`${proxy.url}/v1/x`, { headers })
    t.equal(res.status, 200, `${what}: answered`)
    const got = upstream.received[n]
    for (const name of ['traceparent', 'tracestate']) {
      const sent = headers[name]
      t.same(rawValues(got?.rawHeaders ?? [], name), sent === undefined ? [] : [sent], `${what}: ${name} ${sent === undefined ? 'not invented' : 'as sent'}`)
    }
  }
})

t.test('the request line carries trace_id, span_id and trace_flags of a valid traceparent, and no trace field otherwise', async t => {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const proxy = await startProxy({ COS_API_URL: upstream.url, COS_ACCESS_LOG: 'all' })
  t.teardown(() => proxy.close())
  const [valid] = await linesOf(proxy, () => send(`${proxy.url}/v1/x`, { headers: { traceparent: VALID } }))
  t.match(valid, { msg: 'request', status: 200, route: 'api', ...FIELDS }, 'valid: the trace fields')
  for (const [what, value] of [...Object.entries(MALFORMED), ['none', undefined] as const]) {
    const [line] = await linesOf(proxy, () => send(`${proxy.url}/v1/x`, { headers: value === undefined ? {} : { traceparent: value } }))
    t.match(line, { msg: 'request', status: 200 }, `${what}: the request line`)
    t.same(traceKeys(line), [], `${what}: no trace field`)
  }
  t.notOk(proxy.logs.text.includes('not a traceparent'), 'a malformed header\'s bytes reach no line')
})

t.test('a request the guard refuses (403 forbidden_origin): its line carries the trace', async t => {
  const proxy = await startProxy({ COS_API_URL: `http://127.0.0.1:${REFUSING_PORT}` })
  t.teardown(() => proxy.close())
  const lines = await linesOf(proxy, () => send(`${proxy.url}/v1/x`, { headers: { traceparent: VALID, origin: 'https://evil.example' } }))
  t.match(lines, [{ msg: 'request', status: 403, ...FIELDS }])
})

t.test('a request Fastify refuses (415, a content type it cannot read): the debug `request refused` line carries the trace', async t => {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const proxy = await startProxy({ COS_API_URL: upstream.url }, 'debug')
  t.teardown(() => proxy.close())
  const lines = await linesOf(proxy, () => send(`${proxy.url}/v1/x`, { method: 'POST', headers: { traceparent: VALID, 'content-type': '/;;' }, body: 'xxxxx' }))
  t.match(lines.find(l => l.msg === 'request refused'), { level: 'debug', ...FIELDS }, 'request refused')
  t.match(lines.find(l => l.msg === 'request'), { status: 415, ...FIELDS }, 'the request line')
  t.equal(upstream.received.length, 0, 'nothing forwarded')
})

t.test('upstream failures: `request failed` (502, 504) and the connect retry carry the trace; a malformed traceparent none', async t => {
  const silent = await stallingUpstream()
  t.teardown(() => silent.close())
  const refused = await startProxy({ COS_API_URL: `http://127.0.0.1:${REFUSING_PORT}`, COS_CONNECT_TIMEOUT_MS: '300' }, 'debug')
  t.teardown(() => refused.close())
  const lines = await linesOf(refused, () => send(`${refused.url}/v1/x`, { headers: { traceparent: VALID } }))
  t.match(lines.find(l => l.msg === 'upstream request retried'), { level: 'debug', reason: 'connect', route: 'api', ...FIELDS }, 'the retry line')
  t.match(lines.find(l => l.msg === 'request failed'), { level: 'error', status: 502, ...FIELDS }, 'request failed (502)')
  t.match(lines.find(l => l.msg === 'request'), { status: 502, ...FIELDS }, 'the request line')

  const malformed = await linesOf(refused, () => send(`${refused.url}/v1/x`, { headers: { traceparent: MALFORMED['version ff'] ?? '' } }))
  t.equal(malformed.length, 3, 'malformed: the same three lines')
  for (const line of malformed) t.same(traceKeys(line), [], `malformed: no trace field in "${String(line.msg)}"`)

  const timeout = await startProxy({ COS_API_URL: silent.url, COS_UPSTREAM_TIMEOUT_MS: '300' })
  t.teardown(() => timeout.close())
  const timedOut = await linesOf(timeout, () => send(`${timeout.url}/v1/x`, { headers: { traceparent: VALID } }))
  t.match(timedOut.find(l => l.msg === 'request failed'), { level: 'error', status: 504, ...FIELDS }, 'request failed (504)')
})

t.test('the upstream 401 and 403 warnings carry the trace of the refusal that made them due', async t => {
  for (const status of [401, 403]) {
    const upstream: Upstream = await startUpstream((_req, res) => { res.statusCode = status; res.end('{}') })
    const proxy = await startProxy({ COS_API_URL: upstream.url })
    try {
      const before = proxy.logs.records.length
      await send(`${proxy.url}/v1/x`, { headers: { traceparent: VALID } })
      t.ok(await until(() => proxy.logs.records.slice(before).some(r => String(r.msg).startsWith('auth:')), 5000), `${status}: warned`)
      const warning = proxy.logs.records.slice(before).find(r => String(r.msg).startsWith('auth:'))
      t.match(warning, { level: 'warn', status, ...FIELDS }, `${status}: the warning's trace fields`)
    } finally {
      await proxy.close()
      await upstream.close()
    }
  }
})
