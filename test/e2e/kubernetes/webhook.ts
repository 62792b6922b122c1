// `cos-auth-proxy inject` (the bundle that ships) run on 127.0.0.1 with the
// settings the chart's injector Deployment gives it, the serving certificate from
// the chart's Secret and the sidecar definition from the chart's ConfigMap, as
// files in a directory the test owns. Also `inject --print` with the same settings.
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, renameSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { type Cluster, get, isObject, type Json, list, str } from '../harness/cluster.js'
import { ROOT, run, track, until } from '../harness/processes.js'

export const CLI = join(ROOT, 'dist', 'cos-auth-proxy.mjs')

export interface Listening { readonly port: number, readonly adminPort: number, readonly version: string }

/** The files the webhook reads, written as the kubelet writes a mounted Secret and ConfigMap. */
export class WebhookFiles {
  constructor (readonly dir: string) {
    mkdirSync(join(dir, 'tls'), { recursive: true })
    mkdirSync(join(dir, 'sidecar'), { recursive: true })
  }

  get sidecarFile (): string { return join(this.dir, 'sidecar', 'sidecar.json') }

  /** tls.crt and tls.key from the chart's Secret. */
  async fromSecret (c: Cluster, ns: string, name: string): Promise<void> {
    const secret = await c.read(`/api/v1/namespaces/${ns}/secrets/${name}`)
    for (const k of ['tls.crt', 'tls.key']) {
      writeFileSync(join(this.dir, 'tls', k), Buffer.from(str(secret, 'data', k) ?? '', 'base64'), { mode: 0o600 })
    }
  }

  /** sidecar.json from the chart's ConfigMap, replaced in one rename (as the kubelet swaps ..data). */
  async fromConfigMap (c: Cluster, ns: string, name: string): Promise<string> {
    const cm = await c.read(`/api/v1/namespaces/${ns}/configmaps/${name}`)
    const text = str(cm, 'data', 'sidecar.json')
    if (text === undefined) throw new Error(`ConfigMap ${ns}/${name} has no sidecar.json`)
    const tmp = `${this.sidecarFile}.tmp`
    writeFileSync(tmp, text)
    renameSync(tmp, this.sidecarFile)
    return text
  }

  /** The injector container's env as the chart rendered it, with the paths and listeners of this machine. */
  async env (c: Cluster, ns: string, deployment: string): Promise<Record<string, string>> {
    const d = await c.read(`/apis/apps/v1/namespaces/${ns}/deployments/${deployment}`)
    const container = list(d, 'spec', 'template', 'spec', 'containers').find(k => k.name === 'injector')
    const env: Record<string, string> = {}
    for (const e of list(container, 'env')) if (typeof e.name === 'string' && typeof e.value === 'string') env[e.name] = e.value
    return {
      ...env,
      COS_INJECT_HOST: '127.0.0.1',
      COS_INJECT_PORT: '0',
      COS_ADMIN_HOST: '127.0.0.1',
      COS_ADMIN_PORT: '0',
      COS_INJECT_TLS_CERT_FILE: join(this.dir, 'tls', 'tls.crt'),
      COS_INJECT_TLS_KEY_FILE: join(this.dir, 'tls', 'tls.key'),
      COS_INJECT_SIDECAR_FILE: this.sidecarFile,
      // The test stops it and starts it again: no drain delay.
      COS_SHUTDOWN_DELAY_MS: '0',
      COS_SHUTDOWN_TIMEOUT_MS: '2000',
    }
  }
}

export class Webhook {
  private child: ChildProcess | undefined
  private out = ''
  private exited: Promise<number | null> = Promise.resolve(null)

  constructor (private readonly env: Record<string, string>) {}

  get log (): string { return this.out }

  /** Lines of its JSON log with this message start. */
  lines (message: string): Json[] {
    return this.out.split('\n').flatMap(l => {
      try {
        const o = JSON.parse(l) as unknown
        return isObject(o) && typeof o.msg === 'string' && o.msg.startsWith(message) ? [o] : []
      } catch { return [] }
    })
  }

  async start (): Promise<Listening> {
    this.out = ''
    const child = spawn(process.execPath, [CLI, 'inject'], { env: { PATH: process.env.PATH, ...this.env }, stdio: ['ignore', 'pipe', 'pipe'] })
    this.child = child
    track(child)
    this.exited = new Promise(resolve => child.on('close', code => resolve(code)))
    child.stdout.on('data', (d: Buffer) => { this.out += d.toString() })
    child.stderr.on('data', (d: Buffer) => { this.out += d.toString() })
    const line = await until('the webhook listening', 20_000, async () => {
      if (child.exitCode !== null) throw new Error(`inject exited ${child.exitCode}: ${this.out.slice(0, 2000)}`)
      return this.lines('cos-auth-proxy injection webhook listening')[0]
    })
    return { port: Number(get(line, 'port')), adminPort: Number(get(line, 'admin', 'port')), version: str(line, 'version') ?? '' }
  }

  /** SIGTERM, as the kubelet stops it; SIGKILL if it has not exited in 10 s. */
  async stop (): Promise<number | null> {
    const child = this.child
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return child?.exitCode ?? null
    child.kill('SIGTERM')
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000)
    const code = await this.exited
    clearTimeout(timer)
    return code
  }

  /** SIGSTOP / SIGCONT: a webhook that accepts connections (the kernel does) and never answers. */
  pause (): void { this.child?.kill('SIGSTOP') }
  resume (): void { this.child?.kill('SIGCONT') }

  /** Teardown and signals: no waiting. */
  kill (): void {
    if (this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill('SIGCONT')
      this.child.kill('SIGKILL')
    }
  }
}

/** `cos-auth-proxy inject --print` on a JSON object, with the webhook's settings. */
export async function printInjected (env: Record<string, string>, object: unknown): Promise<Json> {
  const r = await run(process.execPath, [CLI, 'inject', '--print'], { env: { PATH: process.env.PATH, ...env }, input: JSON.stringify(object), timeoutMs: 30_000 })
  if (r.code !== 0) throw new Error(`inject --print: exit ${r.code}: ${r.stderr}`)
  return JSON.parse(r.stdout) as Json
}
