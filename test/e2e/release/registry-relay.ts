// The release test's registry, seen from inside a network namespace at the same address
// (issue 44): `crane registry serve` listens on the host's 127.0.0.1:PORT, which a
// namespace's own loopback does not reach; the kubelet node's containerd (and helm, run in
// the namespace) must pull `127.0.0.1:PORT/…`, the reference the release printed. Two
// halves, two child processes joined by a unix socket in a temporary directory (a path
// socket: both sides share the file system, not the network):
//   host side       node registry-relay.ts --listen <dir>/registry.sock --to 127.0.0.1:PORT
//   namespace side  nsenter --net=<ns> node registry-relay.ts --listen 127.0.0.1:PORT
//                   --to <dir>/registry.sock (127.0.0.1:PORT of the namespace's own loopback)
// Children, not this process: the test harness waits for helm and kubectl with spawnSync,
// which would stall a half served by this process's event loop (and the pull with it).
// Nothing listens anywhere but on the host's loopback (the registry), the namespace's
// loopback and the socket. The namespace side prints one JSON line per HTTP request line it
// carries ({"request":"GET /v2/…"}), so a test can say what was fetched through it. Each half
// exits when its stdin closes (its parent gone) or on SIGTERM.
//
// As a program: node --import tsx test/e2e/release/registry-relay.ts --listen ADDR --to ADDR
//   (ADDR: HOST:PORT, or the path of a unix socket)
import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { ROOT } from '../harness/processes.js'

const HERE = fileURLToPath(import.meta.url)

export interface Relay {
  /** The temporary directory that holds the socket (gone after stop). */
  readonly dir: string
  /** The two halves' PIDs: the host side's, the namespace side's (nsenter execs node in place). */
  readonly pids: readonly number[]
  /** The HTTP request lines the namespace side carried so far, e.g. "GET /v2/". */
  requests: () => string[]
  /** Stops both halves and removes the directory; synchronous, idempotent. */
  stop: () => void
}

/** HOST:PORT, or a unix socket's path (it starts with /). */
type Address = { host: string, port: number } | { path: string }
function address (a: string): Address {
  if (a.startsWith('/')) return { path: a }
  const i = a.lastIndexOf(':')
  const port = Number(a.slice(i + 1))
  if (i < 1 || !Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`not HOST:PORT nor a socket path: ${a}`)
  return { host: a.slice(0, i), port }
}

/** One half, its "listening" line awaited; its request lines (if it reports any) kept in `lines`. */
async function half (args: readonly string[], lines: string[], timeoutMs: number): Promise<ChildProcess> {
  const child = spawn(args[0] ?? '', args.slice(1), { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] })
  let errors = ''
  child.stderr.on('data', (b: Buffer) => { errors = (errors + b.toString()).slice(-2000) })
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => { reject(new Error(`not listening after ${timeoutMs} ms: ${errors.trim()}`)) }, timeoutMs)
      child.once('exit', code => { clearTimeout(timer); reject(new Error(`exited (${String(code)}): ${errors.trim()}`)) })
      createInterface({ input: child.stdout }).on('line', line => {
        try {
          const o = JSON.parse(line) as { listening?: string, request?: string }
          if (o.listening !== undefined) { clearTimeout(timer); resolve() }
          if (o.request !== undefined) lines.push(o.request)
        } catch { errors = (errors + line).slice(-2000) }
      })
    })
  } catch (err) {
    child.kill('SIGKILL')
    throw new Error(`relay ${args.slice(-4).join(' ')}: ${err instanceof Error ? err.message : String(err)}`, { cause: err })
  }
  return child
}

/**
 * Starts the relay: `registry` (127.0.0.1:PORT on the host) answers at the same address
 * inside the network namespace `netnsPath` (/run/netns/NAME, or /proc/PID/ns/net).
 */
export async function startRelay (opts: { registry: string, netnsPath: string, timeoutMs?: number }): Promise<Relay> {
  address(opts.registry)
  const dir = mkdtempSync(join(tmpdir(), 'cos-registry-relay-'))
  const socketPath = join(dir, 'registry.sock')
  const node = [process.execPath, '--import', 'tsx', HERE]
  const children: ChildProcess[] = []
  const lines: string[] = []
  let stopped = false
  const stop = (): void => {
    if (stopped) return
    stopped = true
    for (const c of children) {
      if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL')
      c.stdin?.destroy()
    }
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    children.push(await half([...node, '--listen', socketPath, '--to', opts.registry], [], opts.timeoutMs ?? 30_000))
    children.push(await half(['nsenter', `--net=${opts.netnsPath}`, ...node, '--listen', opts.registry, '--to', socketPath], lines, opts.timeoutMs ?? 30_000))
  } catch (err) {
    stop()
    throw err
  }
  return { dir, pids: children.map(c => c.pid ?? -1), requests: () => [...lines], stop }
}

// ---------------------------------------------------------------- a half, as a program
const REQUEST_LINE = /^(GET|HEAD|POST|PUT|PATCH|DELETE) (\S+) HTTP\/1\.[01]$/

/** Reports the request lines in a client's bytes (a pull's are headers only). */
function reportRequests (client: Socket): void {
  let partial = ''
  client.on('data', (b: Buffer) => {
    const parts = (partial + b.toString('latin1')).split('\r\n')
    partial = (parts.pop() ?? '').slice(-8192)
    for (const p of parts) {
      const m = REQUEST_LINE.exec(p)
      if (m !== null) process.stdout.write(`${JSON.stringify({ request: `${m[1] ?? ''} ${m[2] ?? ''}` })}\n`)
    }
  })
}

function relay (listenOn: string, to: string): void {
  const from = address(listenOn)
  const target = address(to)
  const server = createServer(client => {
    if (!('path' in from)) reportRequests(client)
    const upstream = 'path' in target ? connect(target.path) : connect(target.port, target.host)
    client.pipe(upstream)
    upstream.pipe(client)
    const end = (): void => { client.destroy(); upstream.destroy() }
    client.on('error', end).on('close', end)
    upstream.on('error', end).on('close', end)
  })
  server.on('error', err => { process.stderr.write(`relay: ${err.message}\n`); process.exit(1) })
  const listening = (): void => { process.stdout.write(`${JSON.stringify({ listening: listenOn })}\n`) }
  if ('path' in from) {
    if (existsSync(from.path)) rmSync(from.path)
    server.listen(from.path, listening)
  } else server.listen(from.port, from.host, listening)
  process.stdin.resume()
  process.stdin.on('close', () => { process.exit(0) })
  process.on('SIGTERM', () => { process.exit(0) })
}

if (process.argv[1] === HERE) {
  const arg = (name: string): string => {
    const i = process.argv.indexOf(name)
    const v = i < 0 ? undefined : process.argv[i + 1]
    if (v === undefined) { process.stderr.write(`usage: registry-relay.ts --listen ADDR --to ADDR (no ${name})\n`); process.exit(2) }
    return v
  }
  relay(arg('--listen'), arg('--to'))
}
