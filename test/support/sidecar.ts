// The shipped CLI's `serve` (the bundle, dist/cos-auth-proxy.mjs) in a child
// process, as Kubernetes runs it: started, waited for until it logs its
// listening line, probed, signalled.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { jsonLines } from './helpers.js'
import { imageFlags } from './image-flags.js'
import { spawnNodeConfined } from './node-child.js'
import { scaled } from './time-scale.js'

export const CLI = fileURLToPath(new URL('../../dist/cos-auth-proxy.mjs', import.meta.url))

export interface Sidecar {
  readonly child: ChildProcessWithoutNullStreams
  readonly proxy: string
  readonly admin: string
  readonly exited: Promise<{ code: number | null, ms: number }>
  lines: () => Record<string, unknown>[]
  signal: (s: NodeJS.Signals) => number
}

export interface SidecarOptions {
  /** Working directory: an empty one, so no stray .env is read. */
  readonly cwd: string
  /** Soft limit on the child's open descriptors (`ulimit -n`); the child's pid is still node's. */
  readonly fdLimit?: number
  /** The program to run; default the bundle in dist/. */
  readonly cli?: string
  /** With the image's Node flags and environment (image-flags.ts), as a pod runs it. */
  readonly asImage?: boolean
  /** A memory cgroup to run in (bench/cgroup.ts), as a container's limit. */
  readonly cgroupDir?: string
  /** A network namespace to run in (a pod's); its 127.0.0.1 URLs are then the namespace's own. */
  readonly netns?: string
}

function spawnServe (env: NodeJS.ProcessEnv, opts: SidecarOptions): ChildProcessWithoutNullStreams {
  const image = opts.asImage === true ? imageFlags() : { nodeArgs: [], env: {} }
  return spawnNodeConfined([...image.nodeArgs, opts.cli ?? CLI, 'serve'], { cwd: opts.cwd, env: { ...image.env, ...env } }, opts)
}

export async function startSidecar (env: Record<string, string>, opts: SidecarOptions): Promise<Sidecar> {
  const child = spawnServe({ PATH: process.env.PATH, COS_LISTEN_PORT: '0', COS_ADMIN_PORT: '0', ...env }, opts)
  let out = ''
  let err = ''
  let signalledAt = 0
  child.stderr.on('data', (d: Buffer) => { err += d.toString() })
  const exited = new Promise<{ code: number | null, ms: number }>(resolve => child.on('close', code => resolve({ code, ms: Date.now() - signalledAt })))
  const listening = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`no listening line: ${out}${err}`)) }, scaled(10_000))
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const line = jsonLines(out).find(l => l.msg === 'cos-auth-proxy listening')
      if (line !== undefined) { clearTimeout(timer); resolve(line) }
    })
    void exited.then(({ code }) => { clearTimeout(timer); reject(new Error(`exited ${code}: ${out}${err}`)) })
  })
  const admin = listening.admin as { port: number }
  return {
    child,
    proxy: `http://127.0.0.1:${listening.port as number}`,
    admin: `http://127.0.0.1:${admin.port}`,
    exited,
    lines: () => jsonLines(out),
    signal: (s) => { signalledAt = Date.now(); child.kill(s); return signalledAt },
  }
}

export async function until (what: string, check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const deadline = Date.now() + scaled(ms)
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

/** Writes a key pair as the chart mounts it (two files in `dir`) and returns the variables that name them. */
export function writeKeyPair (dir: string, accessKey: string, secret: string): { COS_ACCESS_KEY_FILE: string, COS_ACCESS_KEY_SECRET_FILE: string } {
  const files = { COS_ACCESS_KEY_FILE: join(dir, 'access-key'), COS_ACCESS_KEY_SECRET_FILE: join(dir, 'access-key-secret') }
  writeFileSync(files.COS_ACCESS_KEY_FILE, `${accessKey}\n`)
  writeFileSync(files.COS_ACCESS_KEY_SECRET_FILE, `${secret}\n`)
  return files
}
