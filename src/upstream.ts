// Connections to the upstreams: one keep-alive undici Pool per origin, behind a
// dispatcher whose pool can be replaced when TLS material changes (a rotated
// CA bundle or client certificate), without a restart and without cutting
// requests in flight on the old pool.
import { unwatchFile, watchFile, type Stats } from 'node:fs'
import { rootCertificates } from 'node:tls'
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool } from 'undici'
import { readBoundedFileSync } from './bounded-file.js'
import { ConfigError, type Config } from './config.js'

export interface TlsMaterial {
  readonly ca?: readonly string[]
  readonly cert?: string
  readonly key?: string
}

/** Room for a large CA bundle (the Mozilla one is ~220 KB); a file past it is refused unread. */
export const TLS_FILE_MAX_BYTES = 1024 * 1024

/**
 * Reads COS_CA_FILE / COS_CLIENT_CERT_FILE / COS_CLIENT_KEY_FILE. Throws
 * ConfigError naming the file's variable. Synchronous (start-up, and a
 * change seen by watchFile), but a FIFO, device or huge file at a path is
 * refused without waiting on it or reading it whole.
 */
export function readTlsMaterial (files: Config['tls']): TlsMaterial {
  const read = (variable: string, path: string | undefined, marker: RegExp): string | undefined => {
    if (path === undefined) return undefined
    const file = readBoundedFileSync(path, TLS_FILE_MAX_BYTES)
    if (!file.ok) throw new ConfigError(variable, file.problem)
    // Contents are never echoed: a key file is a secret.
    if (!marker.test(file.text)) throw new ConfigError(variable, `${JSON.stringify(path)} holds no PEM block of the expected kind`)
    return file.text
  }
  const ca = read('COS_CA_FILE', files.caFile, /-----BEGIN CERTIFICATE-----/)
  const cert = read('COS_CLIENT_CERT_FILE', files.clientCertFile, /-----BEGIN CERTIFICATE-----/)
  const key = read('COS_CLIENT_KEY_FILE', files.clientKeyFile, /-----BEGIN [A-Z ]*PRIVATE KEY-----/)
  return {
    // "Adds" a bundle: Node's `ca` option replaces the default roots, so keep them.
    ...(ca === undefined ? {} : { ca: [...rootCertificates, ca] }),
    ...(cert === undefined ? {} : { cert }),
    ...(key === undefined ? {} : { key }),
  }
}

export interface UpstreamOptions {
  readonly connectTimeoutMs: number
  /** Time to response headers. */
  readonly headersTimeoutMs: number
  /** Longest silence while a body streams. */
  readonly bodyIdleTimeoutMs: number
}

function createPool (origin: string, opts: UpstreamOptions, tls: TlsMaterial): Pool {
  return new Pool(origin, {
    connect: { timeout: opts.connectTimeoutMs, ...tls },
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: opts.bodyIdleTimeoutMs,
    // Keep idle sockets a little under the common 5 s server default, so the
    // proxy closes them first instead of writing into a socket being closed.
    keepAliveTimeout: 4_000,
  })
}

/** A Dispatcher whose underlying pool can be replaced; @fastify/reply-from sees one stable object. */
export class SwappableDispatcher extends Dispatcher {
  #pool: Pool

  constructor (pool: Pool) {
    super()
    this.#pool = pool
  }

  override dispatch (options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return this.#pool.dispatch(options, handler)
  }

  /** Installs `next`; the old pool finishes what it has and closes. */
  replace (next: Pool): Promise<void> {
    const old = this.#pool
    this.#pool = next
    return old.close()
  }

  override close (): Promise<void> {
    return this.#pool.close()
  }

  override destroy (): Promise<void> {
    return this.#pool.destroy()
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
  readonly #dispatchers = new Map<string, SwappableDispatcher>()
  #tls: TlsMaterial
  #watched: string[] = []

  constructor (opts: UpstreamOptions & { readonly tls: Config['tls'], readonly logger: FastifyBaseLogger }) {
    this.#opts = opts
    this.#files = opts.tls
    this.#logger = opts.logger
    this.#tls = readTlsMaterial(opts.tls)
  }

  dispatcherFor (origin: string): SwappableDispatcher {
    let d = this.#dispatchers.get(origin)
    if (d === undefined) {
      d = new SwappableDispatcher(createPool(origin, this.#opts, this.#tls))
      this.#dispatchers.set(origin, d)
    }
    return d
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
      d.replace(createPool(origin, this.#opts, next)).catch((err: unknown) => this.#logger.warn({ err }, 'closing the previous upstream pool failed'))
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

  async close (): Promise<void> {
    for (const p of this.#watched) unwatchFile(p)
    this.#watched = []
    await Promise.all([...this.#dispatchers.values()].map(d => d.close()))
  }
}
