// The kubernetes suite's own small harness: named groups of assertions, run one
// after the other against one control plane, counted, and closed with the line
// CI reads ("N passed, N failed"). A group that throws counts one failure and
// the next group still runs.
import { isDeepStrictEqual, inspect } from 'node:util'

let passed = 0
let failed = 0
let skipped = 0
const failures: string[] = []
let group = ''

export function ok (condition: boolean, message: string, detail?: unknown): boolean {
  if (condition) {
    passed++
    console.log(`  ok ${message}`)
  } else {
    failed++
    failures.push(`${group}: ${message}`)
    console.log(`  not ok ${message}${detail === undefined ? '' : `\n    ${inspect(detail, { depth: 8, breakLength: 160 }).replaceAll('\n', '\n    ')}`}`)
  }
  return condition
}

export function equal (actual: unknown, expected: unknown, message: string): boolean {
  return ok(isDeepStrictEqual(actual, expected), message, { actual, expected })
}

export function skip (message: string): void {
  skipped++
  console.log(`  skip ${message}`)
}

/** Runs one group; an exception is one failure, with its message. */
export async function section (name: string, body: () => Promise<void>): Promise<void> {
  group = name
  const t0 = Date.now()
  console.log(`# ${name}`)
  try {
    await body()
  } catch (err) {
    ok(false, `${name}: ${err instanceof Error ? err.message : String(err)}`)
  }
  console.log(`# ${name}: ${((Date.now() - t0) / 1000).toFixed(1)} s`)
}

export function summary (): { passed: number, failed: number, skipped: number, failures: readonly string[] } {
  return { passed, failed, skipped, failures }
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

/** A runner that cannot run here: says why and how to get what it lacks, and exits 2 (never green by accident). */
export function skipRunner (runner: string, why: string, how: string): never {
  console.log(`${runner}: SKIPPED: ${why}\n${how}`)
  console.log('0 passed, 0 failed, 1 skipped')
  process.exit(2)
}

/**
 * How a runner ends when it is not let finish: on SIGINT, SIGTERM or SIGHUP
 * (exit 130), past `seconds` (exit 1) or at any exit, `stop` runs first
 * (it must be idempotent); the first two end with the closing line, one
 * failure more.
 */
export function stopOnInterruption (runner: string, seconds: number, stop: () => void): void {
  const end = (why: string, code: number): never => {
    console.log(`${runner}: ${why}: stopping`)
    stop()
    console.log(`${passed} passed, ${failed + 1} failed`)
    process.exit(code)
  }
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => end(signal, 130))
  process.on('exit', () => { stop() })
  setTimeout(() => end(`the whole run took over ${seconds} s`, 1), seconds * 1000).unref()
}
