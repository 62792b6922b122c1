// The control plane of scripts/kube-control-plane.sh, and the two ways the suite
// talks to it: its REST API over HTTPS with the admin client certificate (no
// kubectl needed), and helm with the kubeconfig the script wrote.
import { execFile, spawnSync, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { request } from 'node:https'
import type { IncomingHttpHeaders } from 'node:http'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const ROOT = fileURLToPath(new URL('../..', import.meta.url))
export const SCRIPT = join(ROOT, 'scripts', 'kube-control-plane.sh')

export type Json = Record<string, unknown>

export function isObject (v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

/** A path into parsed JSON: get(pod, 'spec', 'initContainers', 0, 'name'). */
export function get (v: unknown, ...path: (string | number)[]): unknown {
  let cur = v
  for (const p of path) {
    if (typeof p === 'number') cur = Array.isArray(cur) ? cur[p] : undefined
    else cur = isObject(cur) ? cur[p] : undefined
  }
  return cur
}

export function list (v: unknown, ...path: (string | number)[]): Json[] {
  const l = get(v, ...path)
  return Array.isArray(l) ? l.filter(isObject) : []
}

export function str (v: unknown, ...path: (string | number)[]): string | undefined {
  const s = get(v, ...path)
  return typeof s === 'string' ? s : undefined
}

export const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

/** Polls until `probe` returns something other than undefined, or throws after `ms`. */
export async function until<T> (what: string, ms: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await probe()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`)
    await sleep(250)
  }
}

export interface Reply { readonly status: number, readonly body: unknown, readonly text: string, readonly headers: IncomingHttpHeaders }

export class Cluster {
  readonly url: string
  readonly kubeconfig: string
  readonly runDir: string
  private readonly tls: { ca: Buffer, cert: Buffer, key: Buffer }

  constructor (env: Readonly<Record<string, string>>) {
    const need = (name: string): string => {
      const v = env[name]
      if (v === undefined) throw new Error(`${name} missing from '${SCRIPT} env'`)
      return v
    }
    this.url = need('COS_KUBE_URL')
    this.kubeconfig = need('KUBECONFIG')
    this.runDir = need('COS_KUBE_RUN')
    const pki = join(this.runDir, 'pki')
    this.tls = { ca: readFileSync(join(pki, 'ca.crt')), cert: readFileSync(join(pki, 'admin.crt')), key: readFileSync(join(pki, 'admin.key')) }
  }

  call (method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<Reply> {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body)
    return new Promise((resolve, reject) => {
      const req = request(new URL(path, this.url), {
        method,
        ...this.tls,
        headers: { accept: 'application/json', ...(payload === undefined ? {} : { 'content-type': contentType, 'content-length': Buffer.byteLength(payload) }) },
        timeout: 30_000,
      }, res => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString()
          let parsed: unknown = text
          try { parsed = JSON.parse(text) } catch { /* metrics and other text bodies */ }
          resolve({ status: res.statusCode ?? 0, body: parsed, text, headers: res.headers })
        })
        res.on('error', reject)
      })
      req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in 30 s`)))
      req.on('error', reject)
      req.end(payload)
    })
  }

  /** GET that must succeed. */
  async read (path: string): Promise<Json> {
    const r = await this.call('GET', path)
    if (r.status !== 200 || !isObject(r.body)) throw new Error(`GET ${path}: ${r.status} ${r.text.slice(0, 300)}`)
    return r.body
  }

  /** 404 → undefined. */
  async find (path: string): Promise<Json | undefined> {
    const r = await this.call('GET', path)
    if (r.status === 404) return undefined
    if (r.status !== 200 || !isObject(r.body)) throw new Error(`GET ${path}: ${r.status} ${r.text.slice(0, 300)}`)
    return r.body
  }

  async items (path: string): Promise<Json[]> {
    return list(await this.read(path), 'items')
  }

  async create (path: string, object: unknown): Promise<Json> {
    const r = await this.call('POST', path, object)
    if (r.status !== 201 && r.status !== 200) throw new Error(`POST ${path}: ${r.status} ${r.text.slice(0, 500)}`)
    return r.body as Json
  }

  async patch (path: string, patch: unknown, type: 'merge' | 'json' | 'strategic' = 'merge'): Promise<Json> {
    const ct = { merge: 'application/merge-patch+json', json: 'application/json-patch+json', strategic: 'application/strategic-merge-patch+json' }[type]
    const r = await this.call('PATCH', path, patch, ct)
    if (r.status !== 200) throw new Error(`PATCH ${path}: ${r.status} ${r.text.slice(0, 500)}`)
    return r.body as Json
  }

  async remove (path: string): Promise<void> {
    const r = await this.call('DELETE', path)
    if (r.status !== 200 && r.status !== 202 && r.status !== 404) throw new Error(`DELETE ${path}: ${r.status} ${r.text.slice(0, 300)}`)
  }

  async namespace (name: string, labels: Record<string, string> = {}): Promise<void> {
    await this.create('/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } })
    // The controller manager makes the default ServiceAccount, without which Pods are refused.
    await until(`ServiceAccount default in ${name}`, 60_000, () => this.find(`/api/v1/namespaces/${name}/serviceaccounts/default`))
  }

  /** Pods of a namespace matching a label selector. */
  pods (ns: string, selector: string): Promise<Json[]> {
    return this.items(`/api/v1/namespaces/${ns}/pods?labelSelector=${encodeURIComponent(selector)}`)
  }

  /** Waits until exactly `n` pods match (the controller manager made them). */
  waitPods (ns: string, selector: string, n: number, ms = 90_000): Promise<Json[]> {
    return until(`${n} pod(s) ${selector} in ${ns}`, ms, async () => {
      const pods = await this.pods(ns, selector)
      return pods.length === n ? pods : undefined
    })
  }
}

let scratchBase = tmpdir()
/** Temporary directories of the run go under the run directory, which stop() removes (on signals too). */
export function setScratchBase (dir: string): void { scratchBase = dir }
export function scratch (prefix: string): string { return mkdtempSync(join(scratchBase, prefix)) }

/** Every child still running, killed by killChildren() when the suite is stopped. */
const children = new Set<ChildProcess>()
export function track (child: ChildProcess): void {
  children.add(child)
  child.on('close', () => children.delete(child))
}
export function killChildren (): void {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
}

export interface Run { readonly code: number | null, readonly stdout: string, readonly stderr: string }

/** A command with a bounded time; never throws for a non-zero exit. */
export function run (file: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv, input?: string, timeoutMs?: number, cwd?: string } = {}): Promise<Run> {
  return new Promise(resolve => {
    const child = execFile(file, args, { env: options.env ?? process.env, cwd: options.cwd ?? ROOT, timeout: options.timeoutMs ?? 120_000, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : null
        resolve({ code, stdout, stderr: err !== null && code === null ? `${stderr}\n${err.message}` : stderr })
      })
    track(child)
    if (options.input !== undefined) child.stdin?.end(options.input)
  })
}

/** `scripts/kube-control-plane.sh <command>`, synchronously (start, stop, env). */
export function controlPlane (command: string, env: NodeJS.ProcessEnv = process.env): { code: number | null, stdout: string, stderr: string } {
  const r = spawnSync('bash', [SCRIPT, command], { env, encoding: 'utf8', timeout: 300_000 })
  return { code: r.status, stdout: r.stdout, stderr: r.stderr }
}

/** `export A=b` lines → a record. */
export function parseExports (text: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const m of text.matchAll(/^export ([A-Z_]+)=(.*)$/gm)) out[m[1] as string] = m[2] as string
  return out
}
