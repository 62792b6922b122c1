// Connections to the upstreams: one keep-alive undici Pool per origin (or,
// behind a corporate egress proxy, a ProxyAgent: egress-agent.ts), behind a
// dispatcher whose pool can be replaced when TLS material changes (a rotated
// CA bundle or client certificate), without a restart and without cutting
// requests in flight on the old pool.
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool } from 'undici'
import { ConfigError, type Config } from '../config/config.js'
import { MountedFiles, type MountedOutcome, type Parsed } from '../mounted/mounted-files.js'
import { EgressAgent, egressProblem } from './egress-agent.js'
import { egressProxyFor, type Egress, type EgressProxy } from './egress.js'
import { createPool, readTlsMaterial, tlsExpiry, tlsFiles, type TlsExpiry, type TlsMaterial, type UpstreamOptions } from './upstream-pool.js'

export type { TlsExpiry }

/** A Dispatcher whose underlying pool can be replaced; the proxy's routes see one stable object. */
export class SwappableDispatcher extends Dispatcher {
  #pool: Dispatcher
  /** Replaced pools still finishing their requests. */
  readonly #retiring = new Set<Dispatcher>()
  #destroyed = false

  constructor (pool: Dispatcher) {
    super()
    this.#pool = pool
  }

  override dispatch (options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return this.#pool.dispatch(options, handler)
  }

  /** The pool's counters; undefined behind an egress proxy (a ProxyAgent keeps its pools to itself). */
  get stats (): Pool['stats'] | undefined {
    return this.#pool instanceof Pool ? this.#pool.stats : undefined
  }

  /** Installs `next`; the old pool finishes what it has and closes. */
  replace (next: Dispatcher): Promise<void> {
    const old = this.#pool
    this.#pool = next
    this.#retiring.add(old)
    return old.close().finally(() => this.#retiring.delete(old))
  }

  override close (): Promise<void> {
    // After destroy() there is nothing left to wait for (and undici would reject).
    return this.#destroyed ? Promise.resolve() : this.#pool.close()
  }

  /** Aborts every request still in flight, on the current pool and on replaced ones. */
  override async destroy (): Promise<void> {
    this.#destroyed = true
    await Promise.all([this.#pool, ...this.#retiring].map(p => p.destroy()))
  }
}

/**
 * All upstream connections. TLS files are read at start (an error is a config
 * error) and then followed by the mounted-file watcher (src/mounted/: their
 * directories watched, a Kubernetes `..data` swap seen, a poll as well); a
 * changed, valid set replaces the pools, an invalid one is logged once and
 * ignored.
 */
export class Upstreams {
  readonly #opts: UpstreamOptions
  readonly #files: Config['tls']
  readonly #logger: FastifyBaseLogger
  readonly #egress: Egress
  readonly #dispatchers = new Map<string, SwappableDispatcher>()
  #tls: TlsMaterial
  #expiry: TlsExpiry
  #watcher: MountedFiles<TlsMaterial, void> | undefined

  constructor (opts: UpstreamOptions & { readonly tls: Config['tls'], readonly logger: FastifyBaseLogger, readonly egress?: Egress }) {
    this.#opts = opts
    this.#files = opts.tls
    this.#logger = opts.logger
    this.#egress = opts.egress ?? { noProxy: [] }
    this.#tls = readTlsMaterial(opts.tls)
    this.#expiry = tlsExpiry(this.#tls)
  }

  /** When the certificates in force expire (the metrics read it at scrape time); set each time new files are taken, kept when they are refused. */
  get certificateExpiry (): TlsExpiry {
    return this.#expiry
  }

  dispatcherFor (origin: string): SwappableDispatcher {
    let d = this.#dispatchers.get(origin)
    if (d === undefined) {
      d = new SwappableDispatcher(this.#create(origin, this.#tls))
      this.#dispatchers.set(origin, d)
    }
    return d
  }

  /** The egress proxy `origin` is reached through; undefined = directly (none set, or NO_PROXY). */
  egressProxyFor (origin: string): EgressProxy | undefined {
    return egressProxyFor(this.#egress, origin)
  }

  /** What to tell the client when `error` was the egress proxy's; undefined otherwise. */
  egressProblem (error: Error): string | undefined {
    return egressProblem(error, this.#egress.http)
  }

  #create (origin: string, tls: TlsMaterial): Dispatcher {
    const proxy = this.egressProxyFor(origin)
    return proxy === undefined ? createPool(origin, this.#opts, tls) : new EgressAgent(proxy, this.#opts, tls)
  }

  /** Re-read the TLS files now; on success replace every pool. Returns whether anything changed. */
  reloadTls (): boolean {
    let next: TlsMaterial
    try {
      next = readTlsMaterial(this.#files)
    } catch (err) {
      this.#refused((err as ConfigError).variable, (err as Error).message)
      return false
    }
    return this.#take(next)
  }

  /** Follows the TLS files: their directories' events, and a read every `intervalMs` as well. */
  watch (intervalMs: number): void {
    const files = tlsFiles(this.#files)
    if (files.length === 0 || this.#watcher !== undefined) return
    const parse = (texts: readonly string[]): Parsed<TlsMaterial> => {
      try {
        return { ok: true, value: readTlsMaterial(this.#files, new Map(files.map((f, i) => [f.path, texts[i] ?? '']))) }
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err
        return { ok: false, variable: err.variable, problem: err.message.slice(err.variable.length + 1) }
      }
    }
    const report = (o: MountedOutcome<TlsMaterial>): void => {
      if ((o.result === 'rejected' || o.result === 'unreadable') && !o.repeated) this.#refused(o.variable, `${o.variable} ${o.problem}`)
    }
    this.#watcher = new MountedFiles({ files, what: 'TLS files', parse, inForce: m => sameMaterial(m, this.#tls), apply: m => { this.#take(m) }, report, closed: undefined, pollMs: intervalMs, logger: this.#logger })
    this.#watcher.start().catch((err: unknown) => { this.#logger.error({ err }, 'TLS files: reading them again failed; keeping the previous ones') })
  }

  #refused (variable: string, problem: string): void {
    this.#logger.error({ variable, problem }, 'TLS files changed but cannot be used; keeping the previous ones')
  }

  /** Puts `next` in force (every pool replaced) unless it is what is in force. */
  #take (next: TlsMaterial): boolean {
    if (sameMaterial(next, this.#tls)) return false
    this.#tls = next
    this.#expiry = tlsExpiry(next)
    for (const [origin, d] of this.#dispatchers) {
      d.replace(this.#create(origin, next)).catch((err: unknown) => this.#logger.warn({ err }, 'closing the previous upstream pool failed'))
    }
    this.#logger.info('TLS files changed: new upstream connections use them')
    return true
  }

  /** Stops watching the files and waits for the requests in flight. */
  async close (): Promise<void> {
    this.#unwatch()
    await Promise.all([...this.#dispatchers.values()].map(d => d.close()))
  }

  /** Stops watching the files, aborts every request in flight and closes every connection now. */
  async destroy (): Promise<void> {
    this.#unwatch()
    await Promise.all([...this.#dispatchers.values()].map(d => d.destroy()))
  }

  #unwatch (): void {
    this.#watcher?.close()
    this.#watcher = undefined
  }
}

function sameMaterial (a: TlsMaterial, b: TlsMaterial): boolean {
  return JSON.stringify(a) === JSON.stringify(b)
}
