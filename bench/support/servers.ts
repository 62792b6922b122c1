// The servers a benchmark starts: the upstream (bench/upstream.mjs), the real
// proxy as its image runs it (bench/image.ts) and the framework floor
// (bench/floor.mjs). The Go signer is bench/go-signer.ts's.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import type { Writable } from 'node:stream'
import { imageBuild, type Build } from '../image.js'
import { firstJsonLine, freePort, openLog, spawnNode, spawnProgram, waitFor200, type Child } from './children.js'
import { cpuMs } from './machine.js'
import { BENCH_DIR, ROOT, nodePath } from './node.js'

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
  /** The proxy's admin port. */
  readonly adminPort?: number
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
  /** The proxy's own Node binary (e.g. a fresh copy); the compile cache is still warmed with nodePath(). */
  readonly node?: string
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
  const key = `${nodePath()}\0${options}`
  let accepted = nodeOptionsAccepted.get(key)
  if (accepted === undefined) {
    try {
      execFileSync(nodePath(), ['-e', '0'], { env: { PATH: process.env.PATH, NODE_OPTIONS: options }, stdio: 'ignore' })
      accepted = true
    } catch {
      accepted = false
      console.error(`note: ${nodePath()} does not accept the image's NODE_OPTIONS="${options}"; the proxy runs without it`)
    }
    nodeOptionsAccepted.set(key, accepted)
  }
  return accepted ? { ...rest, NODE_OPTIONS: options } : rest
}

const warmedCaches = new Map<string, string>()

/**
 * The image fills its compile cache at build time, so every pod starts warm:
 * the same warm-up, once per build, into a directory under `scratch` (the
 * image's own directory does not exist here).
 */
function compileCacheEnv (build: Build, scratch: string): Record<string, string> {
  if (build.compileCache === undefined) return {}
  let dir = warmedCaches.get(build.script)
  if (dir === undefined) {
    dir = join(scratch, `compile-cache-${warmedCaches.size}`)
    execFileSync(nodePath(), [...build.nodeArgs, build.script, ...build.compileCache.warmArgs], {
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
      ...(s.node === undefined ? {} : { node: s.node }),
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
  return { child, url, logFile: s.logFile, readyMs, readyCpuMs, logReader, adminPort }
}

/** `where`: a cgroup to run in and another Node binary (a fresh copy), as for the proxy (bench:accept --limit). */
export async function startFloor (upstreamUrl: string, core: number | undefined, nodeArgs?: readonly string[], extraEnv?: Readonly<Record<string, string>>, where: { readonly cgroup?: string, readonly node?: string } = {}): Promise<Server> {
  const t0 = performance.now()
  const child = spawnNode('floor', join(BENCH_DIR, 'floor.mjs'), [], {
    env: { ...process.env, ...extraEnv, BENCH_UPSTREAM: upstreamUrl },
    ...(core === undefined ? {} : { core }),
    ...(nodeArgs === undefined ? {} : { nodeArgs }),
    ...where,
  })
  const ready = await firstJsonLine(child)
  const readyMs = performance.now() - t0
  const readyCpuMs = cpuMs(child.pid)
  const url = `http://127.0.0.1:${String(ready.port)}`
  await waitFor200(child, url + '/ready')
  return { child, url, readyMs, readyCpuMs }
}

