// The CLI that ships (the bundle, dist/cos-auth-proxy.mjs) run as a child
// process, as users and the image run it, with only the environment a test
// gives it.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { ACCESS_KEY, SECRET } from './helpers.js'
import { imageFlags } from './image-flags.js'
import { spawnNode, spawnNodeConfined, type Confinement } from './node-child.js'
import { scaled } from './time-scale.js'

export const CLI = fileURLToPath(new URL('../../dist/cos-auth-proxy.mjs', import.meta.url))
// An empty working directory, so no stray .env is read.
const CWD = mkdtempSync(join(tmpdir(), 'cos-cli-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

export const CREDS = { COS_ACCESS_KEY: ACCESS_KEY, COS_ACCESS_KEY_SECRET: SECRET }

function childEnv (env: Record<string, string>): NodeJS.ProcessEnv {
  // Ephemeral admin port: test files run in parallel.
  return { PATH: process.env.PATH, COS_ADMIN_PORT: '0', ...env }
}

export interface Result { code: number | null, stdout: string, stderr: string }

/** Runs a command to its end; withoutCapabilities: with none (root then obeys file modes as any user does). */
export function run (args: string[], env: Record<string, string>, opts: { withoutCapabilities?: boolean } = {}): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawnNode([CLI, ...args], { cwd: CWD, env: childEnv(env) }, opts.withoutCapabilities === true ? ['--bounding-set=-all', '--inh-caps=-all'] : [])
    child.stdin.end()
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
    child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
    const timer = setTimeout(() => child.kill('SIGKILL'), scaled(15_000))
    child.on('error', reject)
    child.on('close', code => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
  })
}

export interface Daemon { child: ChildProcessWithoutNullStreams, stdout: () => string, stderr: () => string, exited: Promise<number | null> }

/** Starts a long-running command and waits until `ready` matches its output; asImage: with the image's Node flags and environment. */
export async function start (args: string[], env: Record<string, string>, ready: RegExp, opts: { asImage?: boolean } & Confinement = {}): Promise<{ daemon: Daemon, match: RegExpMatchArray }> {
  const image = opts.asImage === true ? imageFlags() : { nodeArgs: [], env: {} }
  const child = spawnNodeConfined([...image.nodeArgs, CLI, ...args], { cwd: CWD, env: { ...image.env, ...childEnv(env) } }, opts)
  let out = ''
  let err = ''
  const exited = new Promise<number | null>(resolve => child.on('close', code => resolve(code)))
  const daemon = { child, stdout: () => out, stderr: () => err, exited }
  const match = await new Promise<RegExpMatchArray>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`not ready: ${out}${err}`)) }, scaled(15_000))
    const check = (): void => {
      const m = (out + err).match(ready)
      if (m) { clearTimeout(timer); resolve(m) }
    }
    child.stdout.on('data', (d: Buffer) => { out += d.toString(); check() })
    child.stderr.on('data', (d: Buffer) => { err += d.toString(); check() })
    void exited.then(code => { clearTimeout(timer); reject(new Error(`exited ${code}: ${out}${err}`)) })
  })
  return { daemon, match }
}
