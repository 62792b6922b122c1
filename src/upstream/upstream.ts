// Connections to the upstreams: one keep-alive undici Pool per origin (or,
// behind a corporate egress proxy, a ProxyAgent: egress-agent.ts), behind a
// dispatcher whose pool can be replaced when TLS material changes (a rotated
// CA bundle or client certificate), without a restart and without cutting
// requests in flight on the old pool.
import { unwatchFile, watchFile, type Stats } from 'node:fs'
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool } from 'undici'
import type { Config, ConfigError } from '../config/config.js'
import { EgressAgent, egressProblem } from './egress-agent.js'
import { egressProxyFor, type Egress, type EgressProxy } from './egress.js'
import { createPool, readTlsMaterial, type TlsMaterial, type UpstreamOptions } from './upstream-pool.js'

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
 * error) and polled for changes (fs.watchFile stats through symlinks, so a
 * Kubernetes `..data` swap is seen); a changed, valid set replaces the pools,
 * an invalid one is logged and ignored.
 */
export class Upstreams {
  readonly #opts: UpstreamOptions
  readonly #files: Config['tls']
  readonly #logger: FastifyBaseLogger
  readonly #egress: Egress
  readonly #dispatchers = new Map<string, SwappableDispatcher>()
  #tls: TlsMaterial
  #watched: string[] = []

  constructor (opts: UpstreamOptions & { readonly tls: Config['tls'], readonly logger: FastifyBaseLogger, readonly egress?: Egress }) {
    this.#opts = opts
    this.#files = opts.tls
    this.#logger = opts.logger
    this.#egress = opts.egress ?? { noProxy: [] }
    this.#tls = readTlsMaterial(opts.tls)
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

  /** Re-read the TLS files; on success replace every pool. Returns whether anything changed. */
  reloadTls (): boolean {
    let next: TlsMaterial
    try {
      next = readTlsMaterial(this.#files)
    } catch (err) {
      this.#logger.error({ variable: (err as ConfigError).variable, problem: (err as Error).message }, 'TLS files changed but cannot be used; keeping the previous ones')
      return false
    }
    if (JSON.stringify(next) === JSON.stringify(this.#tls)) return false
    this.#tls = next
    for (const [origin, d] of this.#dispatchers) {
      d.replace(this.#create(origin, next)).catch((err: unknown) => this.#logger.warn({ err }, 'closing the previous upstream pool failed'))
    }
    this.#logger.info('TLS files changed: new upstream connections use them')
    return true
  }

  watch (intervalMs: number): void {
    const paths = [this.#files.caFile, this.#files.clientCertFile, this.#files.clientKeyFile].filter((p): p is string => p !== undefined)
    const onChange = (curr: Stats, prev: Stats): void => {
      if (curr.mtimeMs !== prev.mtimeMs || curr.ino !== prev.ino || curr.size !== prev.size) this.reloadTls()
    }
    for (const p of paths) watchFile(p, { interval: intervalMs, persistent: false }, onChange)
    this.#watched = paths
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
    for (const p of this.#watched) unwatchFile(p)
    this.#watched = []
  }
}
