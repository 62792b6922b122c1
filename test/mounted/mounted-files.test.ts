// The mounted-file watcher itself, with a consumer of the test's own: what
// it parses (only new bytes), what it reports (one outcome per look), what it
// refuses (a file still changing, a value `apply` throws on) and what it
// never says (the contents of a file, in an outcome or a log line). The swap
// cases, through the real consumers, are in swaps.test.ts.
import { execFileSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { MountedFiles, type MountedOutcome } from '../../src/mounted/mounted-files.js'
import { createLogger } from '../../src/observability/logger.js'
import { LogCapture, until } from '../support/helpers.js'

const tmp = mkdtempSync(join(tmpdir(), 'cos-mounted-unit-'))
t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })

const SECRET = 'Unit-Secret-Marker-91c4'

interface Probe {
  readonly files: MountedFiles<string, MountedOutcome<string>>
  readonly outcomes: MountedOutcome<string>[]
  readonly applied: string[]
  readonly parses: () => number
  readonly logs: LogCapture
}

let n = 0
function probe (t: Test, paths: readonly string[], opts: { readonly apply?: (v: string) => void, readonly pollMs?: number, readonly readTimeoutMs?: number, readonly holdPartialMs?: number, readonly readAtStart?: readonly string[] } = {}): Probe {
  const outcomes: MountedOutcome<string>[] = []
  const applied: string[] = []
  const logs = new LogCapture()
  let parses = 0
  const files = new MountedFiles<string, MountedOutcome<string>>({
    files: paths.map((path, i) => ({ path, variable: `TEST_FILE_${i}`, maxBytes: 4096 })),
    what: `probe ${++n}`,
    parse: texts => {
      parses++
      const text = texts.join('|')
      // A consumer's problem names the setting, never the text.
      return text.includes('bad') ? { ok: false, variable: 'TEST_FILE_0', problem: 'is not a good value' } : { ok: true, value: text }
    },
    apply: v => { opts.apply?.(v); applied.push(v) },
    report: o => { outcomes.push(o); return o },
    closed: { result: 'unchanged', recovered: false },
    pollMs: opts.pollMs ?? 600_000,
    logger: createLogger('trace', logs),
    ...(opts.readTimeoutMs === undefined ? {} : { readTimeoutMs: opts.readTimeoutMs }),
    ...(opts.holdPartialMs === undefined ? {} : { holdPartialMs: opts.holdPartialMs }),
    ...(opts.readAtStart === undefined ? {} : { readAtStart: opts.readAtStart }),
  })
  t.teardown(() => { files.close() })
  return { files, outcomes, applied, parses: () => parses, logs }
}

/** A file holding 'one', and a probe on it that has applied it. */
async function onOne (t: Test, name: string, opts: Parameters<typeof probe>[2] = {}): Promise<{ readonly file: string, readonly p: Probe }> {
  const file = join(dir(name), 'value')
  writeFileSync(file, 'one')
  const p = probe(t, [file], opts)
  t.same(await p.files.start(), { result: 'applied', value: 'one' }, 'the first read applied')
  return { file, p }
}

function dir (name: string): string {
  const d = join(tmp, name)
  mkdirSync(d, { recursive: true })
  return d
}

t.test('bytes already in force are not parsed again, and a first read that agrees with itself is applied once', async t => {
  const file = join(dir('dedupe'), 'value')
  writeFileSync(file, 'one')
  const p = probe(t, [file])
  t.same(await p.files.start(), { result: 'applied', value: 'one' })
  for (let i = 0; i < 5; i++) t.same(await p.files.reload(), { result: 'unchanged', recovered: false })
  t.equal(p.parses(), 1, 'parsed once')
  t.same(p.applied, ['one'])
})

t.test('what a consumer read and parsed at start is not parsed again: the first look finds those bytes unchanged, and a later change is taken', async t => {
  const file = join(dir('read-at-start'), 'value')
  writeFileSync(file, 'one')
  const p = probe(t, [file], { readAtStart: ['one'] })
  t.same(await p.files.start(), { result: 'unchanged', recovered: false }, 'the first look: the bytes start-up read are in force')
  t.equal(p.parses(), 0, 'nothing parsed')
  writeFileSync(file, 'two')
  t.same(await p.files.reload(), { result: 'applied', value: 'two' })
  t.equal(p.parses(), 1, 'only the new bytes parsed')

  const changed = join(dir('changed-since-start'), 'value')
  writeFileSync(changed, 'two')
  const q = probe(t, [changed], { readAtStart: ['one'] })
  t.same(await q.files.start(), { result: 'applied', value: 'two' }, 'a file changed since start-up read it is taken by the first look')
})

t.test('a refused content is parsed once and reported as repeated after that; the value in force stays', async t => {
  const { file, p } = await onOne(t, 'repeated')
  writeFileSync(file, 'bad')
  t.match(await p.files.reload(), { result: 'rejected', variable: 'TEST_FILE_0', problem: 'is not a good value', repeated: false })
  t.match(await p.files.reload(), { result: 'rejected', repeated: true })
  t.equal(p.parses(), 2, 'the bad bytes parsed once')
  writeFileSync(file, 'one')
  t.same(await p.files.reload(), { result: 'unchanged', recovered: true }, 'back to the value in force: recovered')
  t.same(p.applied, ['one'])
})

t.test('a value apply throws on is refused, and the previous one stays in force', async t => {
  const { file, p } = await onOne(t, 'apply', { apply: v => { if (v === 'two') throw new Error('the server would not take it') } })
  writeFileSync(file, 'two')
  t.match(await p.files.reload(), { result: 'rejected', problem: 'the server would not take it', repeated: false })
  writeFileSync(file, 'one')
  t.match(await p.files.reload(), { result: 'unchanged', recovered: true }, 'the value in force never changed')
})

t.test('a file that keeps changing while it is read is not taken: unreadable, the value in force stays', async t => {
  const { file, p } = await onOne(t, 'changing')
  let i = 0
  writeFileSync(file, 'v0')
  const writer = setInterval(() => { writeFileSync(file, `v${++i}`) }, 10)
  t.teardown(() => { clearInterval(writer) })
  const outcome = await p.files.reload()
  clearInterval(writer)
  t.match(outcome, { result: 'unreadable', variable: 'TEST_FILE_0', problem: /^kept changing for 200 ms while being read$/ })
  t.same(p.applied, ['one'])
})

t.test('a file truncated then written is settled past: the whole new content, never the empty one', async t => {
  const { file, p } = await onOne(t, 'truncate')
  truncateSync(file, 0)
  const look = p.files.reload()
  setTimeout(() => { writeFileSync(file, 'two') }, 20)
  t.same(await look, { result: 'applied', value: 'two' })
  t.same(p.applied, ['one', 'two'])
})

t.test('a change to some of the files is held for the rest (holdPartialMs): never applied half, not at all if reverted, and taken alone once the hold ends', async t => {
  const d = dir('partial')
  const [a, b] = [join(d, 'a'), join(d, 'b')]
  writeFileSync(a, 'a1')
  writeFileSync(b, 'b1')
  const p = probe(t, [a, b], { holdPartialMs: 800 })
  t.same(await p.files.start(), { result: 'applied', value: 'a1|b1' })
  writeFileSync(a, 'a2')
  await sleep(250) // five times the settling: without the hold, a2|b1 would be in force by now
  writeFileSync(b, 'b2')
  t.ok(await until(() => p.applied.includes('a2|b2'), 3000), 'the rest came: the whole new value applied')
  writeFileSync(a, 'a3')
  await sleep(250)
  writeFileSync(a, 'a2')
  await sleep(1000) // past the hold
  writeFileSync(b, 'b3')
  t.ok(await until(() => p.applied.includes('a2|b3'), 3000), 'a file that changes alone is taken once the hold ends')
  t.same(p.applied, ['a1|b1', 'a2|b2', 'a2|b3'], 'nothing half, nothing reverted, ever applied')
})

t.test('no secret in an outcome or a log line: files refused unread, missing, unparsable, half written or still changing', async t => {
  const d = dir('secrets')
  const [a, b] = [join(d, 'a'), join(d, 'b')]
  writeFileSync(a, `${SECRET}-a`)
  writeFileSync(b, `${SECRET}-b`)
  const p = probe(t, [a, b], { pollMs: 30 })
  await p.files.start()
  const changes: [string, () => void][] = [
    ['too large', () => { writeFileSync(a, `${SECRET} `.repeat(1000)) }],
    ['refused by the checks', () => { writeFileSync(a, `bad ${SECRET}`) }],
    ['a FIFO', () => { rmSync(b); execFileSync('mkfifo', [b]) }],
    ['a directory', () => { rmSync(b); mkdirSync(b) }],
    ['missing', () => { rmSync(b, { recursive: true }) }],
  ]
  for (const [name, change] of changes) {
    const from = p.outcomes.length
    change()
    t.ok(await until(() => p.outcomes.slice(from).some(o => o.result === 'rejected' || o.result === 'unreadable')), `${name}: refused`)
  }
  const text = JSON.stringify(p.outcomes.filter(o => o.result !== 'applied')) + p.logs.text
  t.ok(p.logs.lines.length + p.outcomes.length > 5, 'outcomes and log lines to look at')
  t.notOk(text.includes(SECRET), 'the contents of no file')
})

t.test('close(): nothing is reported after it, and a reload resolves at once', async t => {
  const { file, p } = await onOne(t, 'close', { pollMs: 20 })
  p.files.close()
  p.files.close()
  const count = p.outcomes.length
  writeFileSync(file, 'two')
  t.same(await p.files.reload(), { result: 'unchanged', recovered: false })
  await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(p.outcomes.length, count, 'no outcomes after close')
  t.same(p.applied, ['one'])
})
