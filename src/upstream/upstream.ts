// Connections to the upstreams: one keep-alive undici Pool per origin (or,
// behind a corporate egress proxy, a ProxyAgent: egress-agent.ts), behind a
// dispatcher whose pool can be replaced when TLS material changes (a rotated
// CA bundle or client certificate), without a restart and without cutting
// requests in flight on the old pool.
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool } from 'undici'
import type { Config } from '../config/config.js'
import { MountedFiles } from '../mounted/mounted-files.js'
import { parsed, reportOnce, type MountedOutcome } from '../mounted/outcomes.js'
import { EgressAgent, egressProblem } from './egress-agent.js'
import { egressProxyFor, type Egress, type EgressProxy } from './egress.js'
import { createPool, readTlsMaterial, tlsExpiry, tlsFiles, tlsTexts, type TlsExpiry, type TlsMaterial, type UpstreamOptions } from './upstream-pool.js'

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
 * error), the watcher's value in force, and then followed by the mounted-file
 * watcher (src/mounted/: their directories watched, a Kubernetes `..data`
 * swap seen, a poll as well); a changed, valid set replaces the pools, an
 * invalid one is logged once and ignored.
 */
export class Upstreams {
  readonly #opts: UpstreamOptions
  readonly #logger: FastifyBaseLogger
  readonly #egress: Egress
  readonly #dispatchers = new Map<string, SwappableDispatcher>()
  #tls: TlsMaterial
  #expiry: TlsExpiry
  readonly #watcher: MountedFiles<TlsMaterial, MountedOutcome<TlsMaterial> | undefined>

  /** `tlsReloadMs`: the TLS files' poll once watched (COS_CREDENTIALS_RELOAD_MS). */
  constructor (opts: UpstreamOptions & { readonly tls: Config['tls'], readonly tlsReloadMs: number, readonly logger: FastifyBaseLogger, readonly egress?: Egress }) {
    this.#opts = opts
    this.#logger = opts.logger
    this.#egress = opts.egress ?? { noProxy: [] }
    this.#tls = readTlsMaterial(opts.tls)
    this.#expiry = tlsExpiry(this.#tls)
    const files = tlsFiles(opts.tls)
    this.#watcher = new MountedFiles({
      files,
      what: 'TLS files',
      parse: texts => parsed(() => readTlsMaterial(opts.tls, new Map(files.map((f, i) => [f.path, texts[i] ?? ''])))),
      readAtStart: tlsTexts(this.#tls),
      inForce: m => sameMaterial(m, this.#tls),
      apply: m => { this.#take(m) },
      report: reportOnce({
        applied: () => { this.#logger.info('TLS files changed: new upstream connections use them') },
        // A ConfigError's message names the file's variable first; a read failure's reason does not.
        rejected: o => { this.#refused(o.variable, o.problem) },
        unreadable: o => { this.#refused(o.variable, `${o.variable} ${o.problem}`) },
      }),
      closed: undefined,
      pollMs: opts.tlsReloadMs,
      logger: opts.logger,
    })
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

  /**
   * Looks at the TLS files now, through the watcher (its settling, dedupe and
   * one report per bad content, as for a look an event or the poll makes):
   * whether a changed set was put in force, every pool replaced.
   */
  async reloadTls (): Promise<boolean> {
    return (await this.#watcher.reload())?.result === 'applied'
  }

  /** Follows the TLS files: their directories' events, and a look every `tlsReloadMs` as well. */
  watch (): void {
    this.#watcher.start().catch((err: unknown) => { this.#logger.error({ err }, 'TLS files: reading them again failed; keeping the previous ones') })
  }

  #refused (variable: string, problem: string): void {
    this.#logger.error({ variable, problem }, 'TLS files changed but cannot be used; keeping the previous ones')
  }

  /** Puts `next` in force: every pool replaced (the watcher has found it differs from what is in force). */
  #take (next: TlsMaterial): void {
    this.#tls = next
    this.#expiry = tlsExpiry(next)
    for (const [origin, d] of this.#dispatchers) {
      d.replace(this.#create(origin, next)).catch((err: unknown) => this.#logger.warn({ err }, 'closing the previous upstream pool failed'))
    }
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
    this.#watcher.close()
  }
}

function sameMaterial (a: TlsMaterial, b: TlsMaterial): boolean {
  return JSON.stringify(a) === JSON.stringify(b)
}
