// The one cluster client of the end-to-end suites: the Kubernetes REST API of whatever cluster a
// kubeconfig names (its current context: the server, its CA, a client certificate or a bearer
// token, inline or in files), so the same checks run against the control plane a suite starts
// or a cluster one already has. helm and kubectl are given the same kubeconfig.
import { readFileSync } from 'node:fs'
import type { IncomingHttpHeaders } from 'node:http'
import { request } from 'node:https'
import { dirname, resolve } from 'node:path'
import { parse } from 'yaml'
import { until } from './processes.js'

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

export interface Reply { readonly status: number, readonly body: unknown, readonly text: string, readonly headers: IncomingHttpHeaders }

export class Cluster {
  readonly url: string
  private readonly tls: { ca?: Buffer, cert?: Buffer, key?: Buffer, rejectUnauthorized: boolean }
  private readonly auth: Record<string, string>

  /** The cluster of `kubeconfig`'s current context (or of `context`). */
  constructor (readonly kubeconfig: string, context?: string) {
    const config = parse(readFileSync(kubeconfig, 'utf8')) as unknown
    const named = (kind: string, name: unknown): Json => {
      const entry = list(config, kind).find(e => e.name === name)
      if (entry === undefined) throw new Error(`${kubeconfig}: no ${kind} entry named ${String(name)}`)
      return entry
    }
    const ctx = named('contexts', context ?? str(config, 'current-context'))
    const cluster = get(named('clusters', str(ctx, 'context', 'cluster')), 'cluster')
    const user = get(named('users', str(ctx, 'context', 'user')), 'user')
    /** A credential given inline (base64 `<name>-data`) or as a file relative to the kubeconfig. */
    const bytes = (of: unknown, name: string): Buffer | undefined => {
      const data = str(of, `${name}-data`)
      if (data !== undefined) return Buffer.from(data, 'base64')
      const file = str(of, name)
      return file === undefined ? undefined : readFileSync(resolve(dirname(kubeconfig), file))
    }
    const server = str(cluster, 'server')
    if (server === undefined) throw new Error(`${kubeconfig}: the cluster has no server`)
    this.url = server
    this.tls = { ca: bytes(cluster, 'certificate-authority'), cert: bytes(user, 'client-certificate'), key: bytes(user, 'client-key'), rejectUnauthorized: get(cluster, 'insecure-skip-tls-verify') !== true }
    const token = str(user, 'token') ?? (str(user, 'tokenFile') === undefined ? undefined : readFileSync(resolve(dirname(kubeconfig), str(user, 'tokenFile') ?? ''), 'utf8').trim())
    this.auth = token === undefined ? {} : { authorization: `Bearer ${token}` }
    if (token === undefined && this.tls.cert === undefined) throw new Error(`${kubeconfig}: the user has neither a client certificate nor a token (exec and auth-provider plugins are not read here)`)
  }

  call (method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<Reply> {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body)
    return new Promise((resolve, reject) => {
      const req = request(new URL(path, this.url), {
        method,
        ...this.tls,
        headers: { accept: 'application/json', ...this.auth, ...(payload === undefined ? {} : { 'content-type': contentType, 'content-length': Buffer.byteLength(payload) }) },
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

  /** PUT: the whole object replaced (without a resourceVersion: unconditionally, as `kubectl replace`). */
  async replace (path: string, object: unknown): Promise<Json> {
    const r = await this.call('PUT', path, object)
    if (r.status !== 200 && r.status !== 201) throw new Error(`PUT ${path}: ${r.status} ${r.text.slice(0, 500)}`)
    return r.body as Json
  }

  /** Server-side apply of `object` at its own path (as `kubectl apply --server-side --force-conflicts`). */
  async apply (path: string, object: unknown): Promise<Json> {
    const r = await this.call('PATCH', `${path}?fieldManager=cos-e2e&force=true`, object, 'application/apply-patch+yaml')
    if (r.status !== 200 && r.status !== 201) throw new Error(`apply ${path}: ${r.status} ${r.text.slice(0, 500)}`)
    return r.body as Json
  }

  /** A GET's text that must succeed: a container's log, a node's metrics through the API server's proxy. */
  async text (path: string): Promise<string> {
    const r = await this.call('GET', path)
    if (r.status !== 200) throw new Error(`GET ${path}: ${r.status} ${r.text.slice(0, 300)}`)
    return r.text
  }

  /** A container's log (`kubectl logs POD -c CONTAINER`). */
  log (ns: string, pod: string, container: string): Promise<string> {
    return this.text(`/api/v1/namespaces/${ns}/pods/${pod}/log?container=${encodeURIComponent(container)}`)
  }

  /**
   * A container's log followed (`kubectl logs -f`), kept as it comes until the API server ends
   * it (the container stopped) or `stop`.
   */
  followLog (ns: string, pod: string, container: string): { text: () => string, ended: Promise<void>, stop: () => void } {
    const out: string[] = []
    const req = request(new URL(`/api/v1/namespaces/${ns}/pods/${pod}/log?container=${encodeURIComponent(container)}&follow=true`, this.url),
      { method: 'GET', ...this.tls, headers: { ...this.auth } })
    const ended = new Promise<void>(resolve => {
      req.on('response', res => {
        res.on('data', (c: Buffer) => { out.push(c.toString()) })
        res.on('close', () => { resolve() })
        res.on('error', () => { resolve() })
      })
      req.on('error', () => { resolve() })
      req.on('close', () => { resolve() })
    })
    req.end()
    return { text: () => out.join(''), ended, stop: () => { req.destroy() } }
  }

  /** DELETE; `options`: a DeleteOptions body ({ propagationPolicy: 'Foreground' }). A 404 is done. */
  async remove (path: string, options?: unknown): Promise<void> {
    const r = await this.call('DELETE', path, options)
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
