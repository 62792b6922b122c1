// Processes and waiting, for every end-to-end suite: commands with a bounded time (sync `sh`,
// async `run`, whose children `killChildren` stops), the one `until`, the one `freePort`,
// temporary directories under the run's own (removed by its stop) and elapsed time.
import { execFile, spawnSync, type ChildProcess } from 'node:child_process'
import { mkdtempSync } from 'node:fs'
import { createServer, type AddressInfo, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const ROOT = fileURLToPath(new URL('../../..', import.meta.url))

export interface Run { readonly code: number, readonly stdout: string, readonly stderr: string }

/** A command, synchronously, with a bounded time (default 300 s); never throws for a non-zero exit (killed or not started: 1). */
export function sh (cmd: string, args: readonly string[], opts: { env?: NodeJS.ProcessEnv, timeoutMs?: number, input?: string, cwd?: string } = {}): Run {
  const r = spawnSync(cmd, args, { encoding: 'utf8', env: opts.env ?? process.env, cwd: opts.cwd, timeout: opts.timeoutMs ?? 300_000, input: opts.input, maxBuffer: 64 << 20 })
  return { code: r.status ?? 1, stdout: r.stdout, stderr: r.stderr }
}

/** Every child `run` started that still runs, killed by killChildren() when a suite is stopped. */
const children = new Set<ChildProcess>()
export function track (child: ChildProcess): void {
  children.add(child)
  child.on('close', () => children.delete(child))
}
export function killChildren (): void {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
}

/** A command with a bounded time (default 120 s), not blocking the event loop; never throws for a non-zero exit (killed or not started: 1, and why in stderr). */
export function run (file: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv, input?: string, timeoutMs?: number, cwd?: string } = {}): Promise<Run> {
  return new Promise(resolve => {
    const child = execFile(file, args, { env: options.env ?? process.env, cwd: options.cwd ?? ROOT, timeout: options.timeoutMs ?? 120_000, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : undefined
        resolve({ code: code ?? 1, stdout, stderr: err !== null && code === undefined ? `${stderr}\n${err.message}` : stderr })
      })
    track(child)
    if (options.input !== undefined) child.stdin?.end(options.input)
  })
}

export const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

/** Polls `probe` every `every` ms until it returns something other than undefined; throws after `ms`. */
export async function until<T> (what: string, ms: number, probe: () => T | undefined | Promise<T | undefined>, every = 250): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await probe()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`)
    await sleep(every)
  }
}

export const seconds = (since: number): string => `${((Date.now() - since) / 1000).toFixed(1)} s`

/** A free port on 127.0.0.1 (with `pair`, one whose next port is free too: etcd's peer port). */
export async function freePort (pair = false): Promise<number> {
  const listen = (port: number): Promise<Server | undefined> => new Promise(resolve => {
    const server = createServer()
    server.once('error', () => { resolve(undefined) })
    server.listen(port, '127.0.0.1', () => { resolve(server) })
  })
  for (let i = 0; i < 20; i++) {
    const first = await listen(0)
    if (first === undefined) continue
    const port = (first.address() as AddressInfo).port
    const second = pair && port < 65535 ? await listen(port + 1) : undefined
    await new Promise(resolve => first.close(resolve))
    if (second !== undefined) await new Promise(resolve => second.close(resolve))
    if (!pair || second !== undefined) return port
  }
  throw new Error('no free port on 127.0.0.1')
}

let scratchBase = tmpdir()
/** Temporary directories of the run go under the run directory, which its stop removes (on signals too). */
export function setScratchBase (dir: string): void { scratchBase = dir }
export function scratch (prefix: string): string { return mkdtempSync(join(scratchBase, prefix)) }
