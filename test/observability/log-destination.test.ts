import { execFileSync } from 'node:child_process'
import { closeSync, constants, mkdtempSync, openSync, readFileSync, readSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setImmediate as turn, setTimeout as sleep } from 'node:timers/promises'
import { scaled } from '../support/time-scale.js'
import t, { type Test } from 'tap'
import { BatchedStdout } from '../../src/observability/log-destination.js'
import { createLogger } from '../../src/observability/logger.js'

function scratch (t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'cos-logdest-'))
  t.teardown(() => { rmSync(dir, { recursive: true, force: true }) })
  return dir
}

/** A FIFO whose write end is non-blocking, so a full pipe answers EAGAIN. */
function fifo (t: Test): { reader: number, writer: number } {
  const path = join(scratch(t), 'fifo')
  execFileSync('mkfifo', [path])
  const reader = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK)
  const writer = openSync(path, constants.O_WRONLY | constants.O_NONBLOCK)
  t.teardown(() => { for (const fd of [reader, writer]) try { closeSync(fd) } catch { /* already closed */ } })
  return { reader, writer }
}

function drain (fd: number): string {
  const buf = Buffer.alloc(1 << 16)
  let out = ''
  for (;;) {
    let n: number
    try { n = readSync(fd, buf) } catch { break } // EAGAIN: empty
    if (n === 0) break
    out += buf.toString('utf8', 0, n)
  }
  return out
}

t.test('lines go out together, in order, maxDelayMs after the first of them: not per turn of the event loop', async t => {
  const path = join(scratch(t), 'log')
  const fd = openSync(path, 'w')
  t.teardown(() => { closeSync(fd) })
  // 1 s: two turns of the event loop take far less even on a busy machine (40 ms did not, once).
  const out = new BatchedStdout({ fd, maxDelayMs: 1000 })
  out.write('{"n":1}\n')
  out.write('{"n":2}\n')
  await turn()
  out.write('{"n":3,"text":"é"}\n')
  await turn()
  t.equal(readFileSync(path, 'utf8'), '', 'nothing written after two turns')
  const deadline = Date.now() + scaled(5000)
  while (readFileSync(path, 'utf8') === '' && Date.now() < deadline) await sleep(50)
  t.equal(readFileSync(path, 'utf8'), '{"n":1}\n{"n":2}\n{"n":3,"text":"é"}\n', 'all three in one batch, in order, UTF-8 intact')
  out.write('{"n":4}\n')
  out.flushSync()
  t.equal(readFileSync(path, 'utf8').split('\n').length - 1, 4, 'flushSync writes at once')
  t.equal(out.dropped, 0)
})

t.test('a batch that reaches 64 KiB is written at once, without waiting for its delay', async t => {
  const path = join(scratch(t), 'log')
  const fd = openSync(path, 'w')
  t.teardown(() => { closeSync(fd) })
  const out = new BatchedStdout({ fd, maxDelayMs: 60_000 })
  const line = JSON.stringify({ pad: 'z'.repeat(1000) }) + '\n'
  for (let i = 0; i < 70; i++) out.write(line)
  t.ok(readFileSync(path, 'utf8').length >= 64 * 1024, 'written before the 60 s delay')
  out.flushSync()
  t.equal(readFileSync(path, 'utf8').length, 70 * line.length, 'every line, once')
})

t.test('flush(cb) writes what is pending before calling back (the exit path)', async t => {
  const path = join(scratch(t), 'log')
  const fd = openSync(path, 'w')
  t.teardown(() => { closeSync(fd) })
  const logger = createLogger('info', new BatchedStdout({ fd }))
  logger.info({ route: 'api' }, 'last words')
  let flushed = ''
  logger.flush(() => { flushed = readFileSync(path, 'utf8') })
  t.match(flushed, /"msg":"last words"/, 'the line is in the file when the callback runs')
  t.match(JSON.parse(flushed) as unknown, { level: 'info', name: 'cos-auth-proxy', route: 'api', time: /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/ }, 'the shape of every line: ISO time, level label, name')
})

t.test('a full non-blocking pipe (EAGAIN) delays lines, never loses or reorders them', async t => {
  const { reader, writer } = fifo(t)
  const out = new BatchedStdout({ fd: writer, retryMs: 5 })
  const line = (i: number): string => JSON.stringify({ i, pad: 'x'.repeat(200) }) + '\n'
  // ~290 KiB: more than a pipe holds (64 KiB by default).
  for (let i = 0; i < 1000; i++) out.write(line(i))
  out.flushSync()
  let received = drain(reader)
  t.ok(received.length < 1000 * line(0).length, 'the pipe took only part of it at first')
  for (let i = 0; i < 200 && received.length < 1000 * line(999).length; i++) {
    out.write(line(1000 + i)) // more lines while stalled: they queue behind
    await sleep(10)
    received += drain(reader)
  }
  await sleep(30)
  received += drain(reader)
  const got = received.trimEnd().split('\n').map(l => (JSON.parse(l) as { i: number }).i)
  t.same(got, got.map((_, k) => k), `${got.length} lines arrived in order, none missing`)
  t.ok(got.length >= 1000, 'the first thousand all arrived')
  t.equal(out.dropped, 0)
})

t.test('while the reader is stuck, what is held is bounded and the excess is counted', async t => {
  const { writer } = fifo(t)
  const out = new BatchedStdout({ fd: writer, maxPendingBytes: 100_000, retryMs: 5 })
  const line = 'y'.repeat(999) + '\n'
  for (let i = 0; i < 1000; i++) { out.write(line); if (i % 50 === 0) out.flushSync() }
  t.ok(out.dropped > 500, `${out.dropped} lines dropped rather than held`)
  t.ok(out.dropped < 1000, 'what fitted was kept')
})

t.test('a reader that went away (EPIPE) costs lines, not the process', async t => {
  const path = join(scratch(t), 'fifo')
  execFileSync('mkfifo', [path])
  const reader = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK)
  const writer = openSync(path, constants.O_WRONLY | constants.O_NONBLOCK)
  t.teardown(() => { closeSync(writer) })
  closeSync(reader)
  const out = new BatchedStdout({ fd: writer })
  out.write('a\n')
  out.write('b\n')
  t.doesNotThrow(() => { out.flushSync() })
  t.equal(out.dropped, 2, 'both lines counted as dropped')
})
