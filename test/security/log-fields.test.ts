// No logged field is unbounded (issue 27): what an upstream sends in an
// answer undici's parser refuses (`err.data`, the raw bytes) reaches the
// proxy's `request failed` line capped, and every other way a value from
// outside gets into a line is cut too, while redaction still holds.
import type { Socket } from 'node:net'
import t from 'tap'
import { Secret } from '../../src/config/secret.js'
import { createLogger } from '../../src/observability/logger.js'
import { LogCapture, SECRET, startProxy } from '../support/helpers.js'
import { get, rawRequest, startRawUpstream } from '../support/raw.js'

// Bounds with room to spare over the logger's limits (LOG_LIMITS in src/observability/logger.ts).
const DATA = 1024
const FIELD = 4096
const STACK = 16 * 1024
const LINE = 64 * 1024

t.test('an upstream\'s refused bytes (err.data) are not logged whole', async t => {
  // A head undici refuses (a space in a header name), then 200 KB in the same write.
  const garbage = 'G'.repeat(200_000)
  const upstream = await startRawUpstream((_head, socket: Socket) => {
    socket.end(`HTTP/1.1 200 OK\r\nBad Header: x\r\nContent-Length: ${garbage.length}\r\n\r\n${garbage}`)
  })
  const proxy = await startProxy({ COS_MANAGEMENT_API_URL: upstream.url })
  t.teardown(async () => { await proxy.close(); await upstream.close() })
  const res = await rawRequest(proxy.port, get('/management/x', 'Connection: close\r\n'), { timeoutMs: 5000 })
  t.equal(res.responses[0]?.status, 502)
  const line = proxy.logs.records.find(r => r.msg === 'request failed')
  t.ok(line, 'the failure is logged')
  const err = line?.err as { data?: string, message?: string } | undefined
  t.type(err?.data, 'string', 'with the bytes undici refused')
  t.ok((err?.data ?? '').length <= DATA, `err.data capped: ${(err?.data ?? '').length} characters`)
  t.match(err?.data, /more characters\]$/)
  t.ok(Math.max(...proxy.logs.lines.map(l => l.length)) < 16 * 1024, 'no line over 16 KiB')
})

t.test('a huge value anywhere in a line is cut, and redaction still holds', async t => {
  const logs = new LogCapture()
  const logger = createLogger('info', logs)
  const huge = 'h'.repeat(1_000_000)
  const deep: unknown[] = []
  let at = deep
  for (let i = 0; i < 10_000; i++) { const next: unknown[] = []; at.push(next); at = next }
  const fields = {
    problem: huge,
    nested: { list: Array.from({ length: 10_000 }, (_, i) => i), [huge]: 1, inner: { value: huge } },
    deep,
    credential: new Secret(SECRET),
    authorization: `Bearer ${SECRET}`,
    secret: SECRET,
    token: `${SECRET}${huge}`,
  }
  const before = JSON.stringify(fields.nested.inner)
  logger.info(fields, 'fields')
  logger.error({ err: Object.assign(new Error(huge), { data: huge, code: 'E_TEST' }) }, 'an error')
  logger.warn(huge)
  logger.child({ binding: huge }).info('child')
  t.equal(JSON.stringify(fields.nested.inner), before, 'the caller\'s object is not changed')
  t.equal(logs.lines.length, 4)
  for (const l of logs.lines) t.ok(l.length < LINE, `line of ${l.length} characters`)
  t.notOk(logs.text.includes(SECRET), 'no secret')
  const [first, second, third, fourth] = logs.records as [Record<string, unknown>, Record<string, unknown>, Record<string, unknown>, Record<string, unknown>]
  t.match(first.problem, /^h+…\[\d+ more characters\]$/)
  t.equal(first.credential, '[redacted]')
  t.equal(first.authorization, '[redacted]')
  t.equal(first.secret, '[redacted]')
  t.equal(first.token, '[redacted]', 'a long redacted field is still redacted')
  const nested = first.nested as { list: unknown[], inner: { value: string } }
  t.ok(nested.list.length <= 100, 'a long array: its first entries and how many more')
  t.match(nested.inner.value, /^h+…\[\d+ more characters\]$/, 'nested strings capped')
  t.ok(Object.keys(nested).every(k => k.length < FIELD), 'keys capped')
  t.ok(JSON.stringify(first.deep).length < 100, 'deep arrays cut at the depth limit')
  const err = second.err as { message: string, stack: string, data: string, code: string }
  t.equal(err.code, 'E_TEST')
  t.ok(err.message.length <= FIELD && err.stack.length <= STACK && err.data.length <= DATA, 'message, stack and data capped')
  t.ok(String(third.msg).length < LINE, 'a huge message cut by the line backstop')
  t.ok(String(fourth.binding).length <= FIELD, 'a binding capped')
})
