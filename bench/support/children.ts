// Child processes. Every one is registered so that it is stopped on normal
// exit, on an error and on Ctrl-C. Also what starting one needs: a free
// port, its first line, its readiness, a scratch directory and a log file.
import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, mkdtempSync, openSync, rmSync } from 'node:fs'
import { get as httpGet } from 'node:http'
import { createServer, type AddressInfo } from 'node:net'
import type { Writable } from 'node:stream'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { nodePath, ROOT } from './node.js'

export interface Child {
  readonly name: string
  readonly pid: number
  readonly proc: ChildProcess
  readonly exited: Promise<void>
  exitCode?: number | null
}

const children = new Set<Child>()

export interface SpawnOptions {
  readonly env?: NodeJS.ProcessEnv
  readonly cwd?: string
  /** Run under `taskset -c <core>` (taskset execs node: the pid is node's). */
  readonly core?: number
  /** Where stdout goes: piped to us, an already open file descriptor, or another child's stdin. */
  readonly stdout?: 'pipe' | number | Writable
  readonly nodeArgs?: readonly string[]
  /**
   * A cgroup (v1 or v2) directory the process joins before it execs, as the
   * kubelet starts a container's process inside its memory cgroup: every
   * byte it ever allocates is charged there (bench/soak.ts).
   */
  readonly cgroup?: string
  /** Another Node binary for this process only (a fresh copy, bench/support/fresh-binary.ts); default nodePath(). */
  readonly node?: string
}

export function spawnNode (name: string, script: string, args: readonly string[], opts: SpawnOptions = {}): Child {
  return spawnProgram(name, opts.node ?? nodePath(), [...(opts.nodeArgs ?? []), script, ...args], opts)
}

/** Any executable (e.g. the Go signer), registered and pinned as spawnNode's children are. */
export function spawnProgram (name: string, program: string, args: readonly string[], opts: Omit<SpawnOptions, 'nodeArgs'> = {}): Child {
  const [pinned, pinnedArgv] = opts.core === undefined
    ? [program, args]
    : ['taskset', ['-c', String(opts.core), program, ...args]]
  // sh writes its own pid into the cgroup, then execs: the pid stays the program's.
  const [command, argv] = opts.cgroup === undefined
    ? [pinned, pinnedArgv]
    : ['sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', opts.cgroup, pinned, ...pinnedArgv]]
  // stdin is a pipe the child never gets data from: our own bench children
  // exit when it closes, so they do not outlive a killed benchmark.
  const proc = spawn(command, argv, {
    cwd: opts.cwd ?? ROOT,
    env: opts.env ?? process.env,
    stdio: ['pipe', opts.stdout ?? 'pipe', 'pipe'],
  })
  if (proc.pid === undefined) throw new Error(`${name}: could not start ${command}`)
  let stderr = ''
  proc.stderr?.setEncoding('utf8')
  proc.stderr?.on('data', (s: string) => { if (stderr.length < 4000) stderr += s })
  const child: Child = {
    name,
    pid: proc.pid,
    proc,
    exited: new Promise<void>(resolve => {
      proc.once('exit', code => {
        child.exitCode = code
        children.delete(child)
        if (code !== 0 && code !== null && !stopping.has(child)) process.stderr.write(`bench: ${name} exited with ${code}\n${stderr}`)
        resolve()
      })
    }),
  }
  children.add(child)
  return child
}

const stopping = new Set<Child>()

/** SIGTERM, then SIGKILL if it has not exited after `graceMs`. */
export async function stopChild (child: Child, graceMs = 3000): Promise<void> {
  if (!children.has(child)) return
  stopping.add(child)
  child.proc.kill('SIGTERM')
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), graceMs)
  await child.exited
  clearTimeout(timer)
  stopping.delete(child)
}

export async function stopAll (): Promise<void> {
  await Promise.all([...children].map(c => stopChild(c, 1500)))
}

let handlersInstalled = false

/** Ctrl-C, SIGTERM and any exit path stop the children. */
export function installCleanup (): void {
  if (handlersInstalled) return
  handlersInstalled = true
  // Last resort, synchronous: whatever is still alive when we exit is killed.
  process.on('exit', () => { for (const c of children) c.proc.kill('SIGKILL') })
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      process.stderr.write(`\nbench: ${signal}: stopping ${children.size} child process(es)\n`)
      stopAll().finally(() => process.exit(130))
    })
  }
}

/** The first line a child writes on stdout that is a JSON object, parsed (`--trace-gc` writes its lines there too). */
export async function firstJsonLine (child: Child, timeoutMs = 10_000): Promise<Record<string, unknown>> {
  const stdout = child.proc.stdout
  if (stdout === null) throw new Error(`${child.name}: stdout is not piped`)
  const lines = createInterface({ input: stdout })
  const timeout = new AbortController()
  try {
    const line = await Promise.race([
      new Promise<string>(resolve => {
        const take = (l: string): void => { if (l.startsWith('{')) { lines.off('line', take); resolve(l) } }
        lines.on('line', take)
      }),
      child.exited.then(() => { throw new Error(`${child.name} exited before it was ready`) }),
      sleep(timeoutMs, undefined, { signal: timeout.signal }).then(() => { throw new Error(`${child.name} not ready after ${timeoutMs} ms`) }),
    ])
    return JSON.parse(line) as Record<string, unknown>
  } finally {
    timeout.abort()
    lines.close()
  }
}

export async function freePort (): Promise<number> {
  const server = createServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  await new Promise<void>(resolve => server.close(() => resolve()))
  return port
}

function statusOf (url: string): Promise<number> {
  return new Promise(resolve => {
    // agent:false: no keep-alive connection lingers into the measurement.
    const req = httpGet(url, { agent: false }, res => { res.resume(); resolve(res.statusCode ?? 0) })
    req.on('error', () => resolve(0))
  })
}

/** Polls `url` until it answers 200 (through the proxy: the whole path works). */
export async function waitFor200 (child: Child, url: string, timeoutMs = 10_000, pollMs = 20): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (!children.has(child)) throw new Error(`${child.name} exited before it was ready`)
    if (await statusOf(url) === 200) return
    await sleep(pollMs)
  }
  throw new Error(`${child.name}: ${url} did not answer 200 within ${timeoutMs} ms`)
}

export function scratchDir (): { path: string, remove: () => void } {
  const path = mkdtempSync(join(tmpdir(), 'cos-bench-'))
  return { path, remove: () => { rmSync(path, { recursive: true, force: true }) } }
}

export function openLog (path: string): { fd: number, close: () => void } {
  const fd = openSync(path, 'w')
  return { fd, close: () => { closeSync(fd) } }
}
