// What test/compose's checks share: the engine of scripts/compose-engine.sh (docker-compose and
// podman inside a network namespace of their own), docker-compose runs, the Docker-compatible
// API over the service's socket, the health checks podman cannot schedule here, and the secrets
// that must never be printed.
import { spawn } from 'node:child_process'
import { request } from 'node:http'
import { join } from 'node:path'
import { ROOT, type Run, sh, sleep } from '../harness/processes.js'

export const ENGINE = join(ROOT, 'scripts/compose-engine.sh')
export const EXAMPLE = join(ROOT, 'examples/compose.yaml')
export const OUTSIDER = join(ROOT, 'test/e2e/compose/outsider.yaml')

export interface Engine { readonly run: string, readonly netns: string, readonly project: string, readonly socket: string }
export interface Compose { readonly files: readonly string[], readonly env: Readonly<Record<string, string>> }

// ---------------------------------------------------------------- secrets
const secrets = new Set<string>()
const leaks: string[] = []
/** A value that must never appear in anything this runner prints or reads back. */
export const secret = (value: string): string => { secrets.add(value); return value }
/** The places a secret was found (in what `clean` was given), for the final check. */
export const leaked = (): readonly string[] => leaks
/** `text` with every secret blotted out; where one was found is recorded. */
export function clean (text: string, where: string): string {
  let out = text
  for (const s of secrets) {
    if (out.includes(s)) { leaks.push(where); out = out.replaceAll(s, '[SECRET]') }
  }
  return out
}
export const say = (text: string, where = 'runner output'): void => { console.log(clean(text, where)) }
/** docker-compose's progress output (carriage returns between states) as plain lines, indented. */
export const indent = (text: string): string => text.split(/\r\n|\r|\n/).map(l => l.trimEnd()).filter(l => l !== '').map(l => `    | ${l}`).join('\n')

// ---------------------------------------------------------------- the engine
const withRun = (e: Engine, env: Readonly<Record<string, string>> = {}): NodeJS.ProcessEnv => ({ ...process.env, ...env, COS_COMPOSE_RUN: e.run })

export function engineUp (args: readonly string[]): { engine?: Engine, output: string } {
  const r = sh('bash', [ENGINE, 'up', ...args], { timeoutMs: 600_000 })
  const get = (name: string): string | undefined => new RegExp(`${name}=(\\S+)`).exec(r.stdout)?.[1]
  const [run, netns, project] = [get('COS_COMPOSE_RUN'), get('COS_COMPOSE_NETNS'), get('COS_COMPOSE_PROJECT')]
  const output = `${r.stdout}${r.stderr}`.trim()
  if (r.code !== 0 || run === undefined || netns === undefined || project === undefined) return { output }
  return { engine: { run, netns, project, socket: join(run, 'podman.sock') }, output }
}
export const engineDown = (e: Engine): Run => sh('bash', [ENGINE, 'down'], { env: withRun(e), timeoutMs: 300_000 })

/** A command inside the namespace (DOCKER_HOST and podman's configuration set), to its end. */
export const inEngine = (e: Engine, args: readonly string[], opts: { env?: Readonly<Record<string, string>>, timeoutMs?: number } = {}): Run =>
  sh('bash', [ENGINE, 'exec', ...args], { env: withRun(e, opts.env), timeoutMs: opts.timeoutMs ?? 120_000 })

const running = new Set<() => void>()
/** Ends every command still running in the background (an interrupted run). */
export const killRunning = (): void => { for (const kill of running) kill() }

/** The same, in the background: `done` resolves when it ends (killed after timeoutMs); `kill` ends it now. */
export function inEngineAsync (e: Engine, args: readonly string[], opts: { env?: Readonly<Record<string, string>>, timeoutMs: number }): { done: Promise<Run>, kill: () => void } {
  const child = spawn('bash', [ENGINE, 'exec', ...args], { env: withRun(e, opts.env), stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (b: Buffer) => { stdout += b.toString() })
  child.stderr.on('data', (b: Buffer) => { stderr += b.toString() })
  const kill = (): void => { if (child.exitCode === null) child.kill('SIGKILL') }
  running.add(kill)
  const timer = setTimeout(kill, opts.timeoutMs)
  const done = new Promise<Run>(resolve => {
    child.on('close', code => { clearTimeout(timer); running.delete(kill); resolve({ code: code ?? 1, stdout, stderr }) })
  })
  return { done, kill }
}

export const composeArgs = (e: Engine, c: Compose, args: readonly string[]): string[] =>
  ['docker-compose', '-p', e.project, ...c.files.flatMap(f => ['-f', f]), ...args]
/** docker-compose on the project, as a user runs it (here: with DOCKER_HOST at the service). */
export const compose = (e: Engine, c: Compose, args: readonly string[], timeoutMs = 300_000): Run =>
  inEngine(e, composeArgs(e, c, args), { env: { COMPOSE_HTTP_TIMEOUT: '300', ...c.env }, timeoutMs })
/** A service's log as `docker-compose logs` shows it (secrets blotted out, and recorded if found). */
export const serviceLog = (e: Engine, c: Compose, service: string): string =>
  clean(compose(e, c, ['logs', '--no-color', service], 60_000).stdout, `${service}'s log`)
/** GET from inside the namespace (so 127.0.0.1 is its loopback): body and status, 000 when nothing answered. */
export function curl (e: Engine, url: string): { status: string, body: string } {
  const out = inEngine(e, ['curl', '-s', '-m', '10', '-w', '\n%{http_code}', url]).stdout
  const cut = out.lastIndexOf('\n')
  return { status: out.slice(cut + 1), body: out.slice(0, Math.max(cut, 0)) }
}
/** A command in one of the project's containers (`podman exec`, never the API's exec: see docs). */
export const podmanExec = (e: Engine, container: string, args: readonly string[], timeoutMs = 60_000): Run =>
  inEngine(e, ['podman', 'exec', container, ...args], { timeoutMs })

// ---------------------------------------------------------------- the API
export interface Summary { Id: string, Names: string[], State: string, Labels: Record<string, string> | null }
export interface Inspect {
  Id: string
  Name: string
  Created: string
  State: { Status: string, Running: boolean, StartedAt: string, ExitCode: number, Health?: { Status: string, Log: Array<{ Start: string, End: string, ExitCode: number }> | null } }
  Config: { Healthcheck?: { Test?: string[], Interval?: number } }
  NetworkSettings: { Networks: Record<string, { IPAddress: string }>, Ports?: Record<string, Array<{ HostIp: string, HostPort: string }> | null> }
}

/** GET path; the body as parsed JSON, of the shape the caller names. */
export function api (e: Engine, path: string): Promise<{ status: number, body: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: e.socket, path, timeout: 120_000 }, res => {
      let text = ''
      res.on('data', (b: Buffer) => { text += b.toString() })
      res.on('end', () => {
        try { resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as unknown }) } catch (err) { reject(err instanceof Error ? err : new Error(String(err))) }
      })
    })
    req.on('timeout', () => { req.destroy(new Error(`${path}: no answer in 120 s`)) })
    req.on('error', reject)
    req.end()
  })
}
const label = (e: Engine): string => encodeURIComponent(JSON.stringify({ label: [`com.docker.compose.project=${e.project}`] }))
/** The project's containers (all, stopped ones too), by service name. */
export async function containers (e: Engine): Promise<Map<string, Summary>> {
  const list = (await api(e, `/containers/json?all=true&filters=${label(e)}`)).body as Summary[]
  return new Map(list.map(c => [c.Labels?.['com.docker.compose.service'] ?? c.Names[0] ?? c.Id, c]))
}
export const inspect = async (e: Engine, id: string): Promise<Inspect> => (await api(e, `/containers/${id}/json`)).body as Inspect
export const networks = async (e: Engine): Promise<string[]> =>
  ((await api(e, '/networks')).body as Array<{ Name: string }>).map(n => n.Name).filter(n => n.startsWith(`${e.project}_`))
export const volumes = async (e: Engine): Promise<string[]> =>
  (((await api(e, '/volumes')).body as { Volumes: Array<{ Name: string }> | null }).Volumes ?? []).map(v => v.Name)

/**
 * Podman leaves the scheduling of health checks to systemd (a transient timer per container);
 * with no systemd running, as here, no check ever runs and every container stays "starting".
 * This does the timer's job: each running container of the project that has a healthcheck gets
 * `GET /libpod/containers/{id}/healthcheck` (= `podman healthcheck run`) every Interval from its
 * start. Podman runs the check, applies start_period and retries, and records the result that
 * docker-compose then reads.
 */
export function healthTicker (e: Engine): { stop: () => void, runs: () => number } {
  const known = new Map<string, { interval: number, last: number } | null>()
  let runs = 0
  let busy = false
  let stopped = false
  const tick = async (): Promise<void> => {
    for (const c of (await containers(e)).values()) {
      if (stopped || c.State !== 'running') continue
      if (!known.has(c.Id)) {
        const i = await inspect(e, c.Id)
        const test = i.Config.Healthcheck?.Test ?? []
        known.set(c.Id, test.length === 0 || test[0] === 'NONE' ? null : { interval: (i.Config.Healthcheck?.Interval ?? 30e9) / 1e6, last: Date.parse(i.State.StartedAt) })
      }
      const h = known.get(c.Id)
      if (h === null || h === undefined || Date.now() < h.last + h.interval) continue
      h.last = Date.now()
      runs++
      await api(e, `/v4.0.0/libpod/containers/${c.Id}/healthcheck`).catch(() => undefined)
    }
  }
  const timer = setInterval(() => {
    if (busy || stopped) return
    busy = true
    tick().catch(() => undefined).finally(() => { busy = false })
  }, 500)
  return { stop: () => { stopped = true; clearInterval(timer) }, runs: () => runs }
}

/** Polls probe every half second until it returns something other than undefined. */
export async function waitFor<T> (what: string, seconds: number, probe: () => Promise<T | undefined> | T | undefined): Promise<T> {
  const end = Date.now() + seconds * 1000
  for (;;) {
    const v = await probe()
    if (v !== undefined) return v
    if (Date.now() > end) throw new Error(`timed out after ${seconds} s: ${what}`)
    await sleep(500)
  }
}

/** The `died` events of the project's containers since `since` (podman's own events log): name and exit code. */
export function died (e: Engine, since: Date): Array<{ name: string, exitCode: number, time: number }> {
  const r = inEngine(e, ['podman', 'events', '--stream=false', '--since', since.toISOString(), '--filter', 'event=died',
    '--format', '{{.Name}} {{.ContainerExitCode}} {{.Time.UnixMilli}}'])
  return r.stdout.trim().split('\n').filter(l => l.startsWith(`${e.project}_`)).map(l => {
    const [name = '', code = '', time = ''] = l.split(' ')
    return { name, exitCode: Number(code), time: Number(time) }
  })
}
