// A TCP address on one side of a network namespace's boundary made to answer on the other
// side, for the end-to-end suites. Two halves, two child processes joined by a unix socket in
// a temporary directory (a path socket: both sides share the file system, not the network):
//   the target's side   node relay.ts --listen <dir>/relay.sock --to TARGET
//   the other side      node relay.ts --listen LISTEN --to <dir>/relay.sock
// the namespace's half run as `nsenter --net=<ns> node relay.ts …`. Two uses:
//   - the release's registry (issue 44): `crane registry serve` on the host's 127.0.0.1:PORT
//     answers at the same address on the namespace's own loopback, where the kubelet node's
//     containerd and helm pull `127.0.0.1:PORT/…`, the reference the release printed;
//   - the node's API server (127.0.0.1:16443 inside its namespace only) answers on a free port
//     of the host's loopback, so the suites' one cluster client (cluster.ts) and helm reach it
//     with an ordinary kubeconfig (its certificate names 127.0.0.1).
// Children, not this process: the suites wait for helm and curl with spawnSync, which would
// stall a half served by this process's event loop. Nothing listens anywhere but on a
// loopback (the host's or the namespace's) and the socket. With `requests`, the TCP half
// prints one JSON line per HTTP request line it carries ({"request":"GET /v2/…"}), so a test
// can say what was fetched through it. Each half exits when its stdin closes (its parent gone)
// or on SIGTERM.
//
// As a program: node --import tsx test/e2e/harness/relay.ts --listen ADDR --to ADDR [--report-requests]
//   (ADDR: HOST:PORT, or the path of a unix socket)
import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { ROOT } from './processes.js'

const HERE = fileURLToPath(import.meta.url)

export interface Relay {
  /** The temporary directory that holds the socket (gone after stop). */
  readonly dir: string
  /** The two halves' PIDs: the target side's, the listening side's (nsenter execs node in place). */
  readonly pids: readonly number[]
  /** With `requests`: the HTTP request lines the listening half carried so far, e.g. "GET /v2/". */
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
 * Starts a relay: `target` (HOST:PORT on the side `targetOn`) answers at `listen` (HOST:PORT,
 * a loopback address) on the other side of the network namespace `netnsPath` (/run/netns/NAME,
 * or /proc/PID/ns/net). `requests`: keep the HTTP request lines the listening half carries.
 */
export async function startRelay (opts: { target: string, targetOn: 'host' | 'namespace', listen: string, netnsPath: string, requests?: boolean, timeoutMs?: number }): Promise<Relay> {
  address(opts.target)
  address(opts.listen)
  const dir = mkdtempSync(join(tmpdir(), 'cos-relay-'))
  const socketPath = join(dir, 'relay.sock')
  const node = [process.execPath, '--import', 'tsx', HERE]
  const inNs = ['nsenter', `--net=${opts.netnsPath}`]
  const [targetSide, listenSide] = opts.targetOn === 'host' ? [[], inNs] : [inNs, []]
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
    children.push(await half([...targetSide, ...node, '--listen', socketPath, '--to', opts.target], [], opts.timeoutMs ?? 30_000))
    children.push(await half([...listenSide, ...node, '--listen', opts.listen, '--to', socketPath, ...(opts.requests === true ? ['--report-requests'] : [])], lines, opts.timeoutMs ?? 30_000))
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

function relay (listenOn: string, to: string, report: boolean): void {
  const from = address(listenOn)
  const target = address(to)
  const server = createServer(client => {
    if (report) reportRequests(client)
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
    if (v === undefined) { process.stderr.write(`usage: relay.ts --listen ADDR --to ADDR [--report-requests] (no ${name})\n`); process.exit(2) }
    return v
  }
  relay(arg('--listen'), arg('--to'), process.argv.includes('--report-requests'))
}
