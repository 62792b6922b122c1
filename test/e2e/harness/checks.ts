// The checks of the end-to-end suites, on tap like every other test file: `section` is a tap
// subtest, `ok`/`equal` are assertions of the subtest they run in (found through
// AsyncLocalStorage, so a suite's modules need not pass `t` down), a suite whose prerequisite
// is missing is one visible skip with the how-to, and anything a suite prints is a TAP comment.
// tap counts, reports and ends with `# { total: N, pass: N, fail: N }`: no counter lives here.
// A section that throws is one failure, with its message, and the next section still runs.
import { AsyncLocalStorage } from 'node:async_hooks'
import { format, inspect, isDeepStrictEqual } from 'node:util'
import t, { type Test } from 'tap'

const within = new AsyncLocalStorage<Test>()
/** The subtest the caller runs in (the file's root test outside any section). */
const current = (): Test => within.getStore() ?? t
const shown = (v: unknown): string => inspect(v, { depth: 8, breakLength: 160 })

// A suite's progress lines (console.log) become comments of the subtest they belong to, so that
// nothing a command prints ("ok", "not ok ...") is read as an assertion.
console.log = (...args: unknown[]): void => {
  const text = format(...args)
  try {
    current().comment(text)
  } catch { // after the test has ended (an exit handler): still a comment
    process.stdout.write(text.replace(/^/gm, '# ') + '\n')
  }
}

export function ok (condition: boolean, message: string, detail?: unknown): boolean {
  return current().ok(condition, message, detail === undefined ? {} : { detail: shown(detail) })
}

export function equal (actual: unknown, expected: unknown, message: string): boolean {
  return current().ok(isDeepStrictEqual(actual, expected), message, { found: shown(actual), wanted: shown(expected) })
}

/** One named group of checks: a tap subtest of the caller's test. */
export async function section (name: string, body: () => Promise<void>): Promise<void> {
  await current().test(name, sub => within.run(sub, body))
}

/** Every field of `expected` is in `actual` with the same value (arrays element by element, same length). */
export function contains (actual: unknown, expected: unknown, path = ''): string[] {
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) return [`${path}: expected a list, got ${JSON.stringify(actual)}`]
    if (actual.length !== expected.length) return [`${path}: ${actual.length} items, expected ${expected.length}`]
    return expected.flatMap((e, i) => contains(actual[i], e, `${path}[${i}]`))
  }
  if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) return [`${path}: expected an object, got ${JSON.stringify(actual)}`]
    return Object.entries(expected).flatMap(([k, v]) => contains((actual as Record<string, unknown>)[k], v, `${path}.${k}`))
  }
  return actual === expected ? [] : [`${path}: ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`]
}

/** What a suite lacks on this machine, and how to get it. */
export interface Missing { readonly why: string, readonly how: string }

/**
 * A suite: its first missing prerequisite (checked in order) makes it one skipped test whose
 * reason says what is missing, the how-to printed above it (CI counts a skip as a failure:
 * .ci/run). Otherwise `setUp` runs as the file's t.before (its checks are the file's own; when
 * it throws, that is one failure and nothing else runs), `body` as one subtest named `name`,
 * and `stop` as the file's t.teardown, also on signals and past `timeoutS` (then one failure
 * more and exit 130 or 1). `stop` must be idempotent.
 */
export function suite<C> (name: string, opts: {
  prerequisites: ReadonlyArray<() => Missing | undefined>
  timeoutS: number
  setUp: () => Promise<C>
  stop: () => void
}, body: (context: C) => Promise<void>): void {
  for (const check of opts.prerequisites) {
    const missing = check()
    if (missing === undefined) continue
    t.comment(`${name}: SKIPPED: ${missing.why}\n${missing.how}`)
    t.test(name, { skip: `${missing.why} (how to get it: above)` }, () => {})
    return
  }
  const end = (why: string, code: number): void => {
    t.comment(`${name}: ${why}: stopping`)
    opts.stop()
    try { current().fail(`${name}: ${why}`) } catch { /* the run has ended */ }
    process.exit(code)
  }
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => { end(signal, 130) })
  process.on('exit', () => { opts.stop() })
  setTimeout(() => { end(`the whole run took over ${opts.timeoutS} s`, 1) }, opts.timeoutS * 1000).unref()
  let context: { value: C } | undefined
  t.before(async () => { context = { value: await opts.setUp() } })
  t.teardown(opts.stop)
  void section(name, async () => {
    if (context === undefined) throw new Error(`${name}: not set up`)
    await body(context.value)
  })
}
