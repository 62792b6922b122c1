// Connections to the upstreams: one keep-alive undici Pool per origin, behind a
// dispatcher whose pool can be replaced when TLS material changes (a rotated
// CA bundle or client certificate), without a restart and without cutting
// requests in flight on the old pool. An upstream request is aborted as soon as
// the client it answers goes away.
import { EventEmitter } from 'node:events'
import { readFileSync, unwatchFile, watchFile, type Stats } from 'node:fs'
import type { Socket } from 'node:net'
import { rootCertificates } from 'node:tls'
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool, errors } from 'undici'
import { ConfigError, type Config } from './config.js'

export interface TlsMaterial {
  readonly ca?: readonly string[]
  readonly cert?: string
  readonly key?: string
}

/** Reads COS_CA_FILE / COS_CLIENT_CERT_FILE / COS_CLIENT_KEY_FILE. Throws ConfigError naming the file's variable. */
export function readTlsMaterial (files: Config['tls']): TlsMaterial {
  const read = (variable: string, path: string | undefined, marker: RegExp): string | undefined => {
    if (path === undefined) return undefined
    let text: string
    try {
      text = readFileSync(path, 'utf8')
    } catch (err) {
      throw new ConfigError(variable, `cannot read ${JSON.stringify(path)} (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
    }
    // Contents are never echoed: a key file is a secret.
    if (!marker.test(text)) throw new ConfigError(variable, `${JSON.stringify(path)} holds no PEM block of the expected kind`)
    return text
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

// The key, on an upstream request's headers, of the signal that aborts it.
// undici sends only a headers object's string keys, so this never leaves.
const ABORT_SIGNAL = Symbol('cos-auth-proxy.abortSignal')
type SignalledHeaders = Record<typeof ABORT_SIGNAL, ClientGone | undefined>

// One instance for every connection: a stack would point here and say nothing.
const CLIENT_GONE = Object.assign(new errors.RequestAbortedError('the client closed its connection'), { stack: 'AbortError: the client closed its connection' })

/**
 * Emits 'abort' when a client connection closes: nobody is left to read
 * what the upstream would answer. One per connection, shared by the requests
 * on it; the socket rather than the response, whose 'close' never fires for
 * a pipelined request queued behind another. An EventEmitter, which undici
 * takes as a signal as it takes an AbortSignal: its listeners cost a quarter
 * of an AbortSignal's (~60 against ~300 ns per request, measured).
 */
class ClientGone extends EventEmitter {
  aborted = false
  reason: Error | undefined

  constructor (socket: Socket) {
    super()
    // Every request in flight on the connection listens, pipelined ones included.
    this.setMaxListeners(0)
    if (socket.closed) this.#abort()
    else socket.once('close', () => this.#abort())
  }

  #abort (): void {
    this.aborted = true
    this.reason = CLIENT_GONE
    this.emit('abort')
  }
}

const clientsGone = new WeakMap<Socket, ClientGone>()

/**
 * Ties an upstream request to the client connection it answers, by marking
 * the headers it will be sent with: SwappableDispatcher aborts the request,
 * at any stage, once that connection closes. (@fastify/reply-from passes no
 * signal to undici, and before the response headers it notices nothing.)
 */
export function abortWhenClientGone (headers: object, socket: Socket): void {
  let gone = clientsGone.get(socket)
  if (gone === undefined) {
    gone = new ClientGone(socket)
    clientsGone.set(socket, gone)
  }
  (headers as SignalledHeaders)[ABORT_SIGNAL] = gone
}

type RequestCallback<T> = (err: Error | null, data: Dispatcher.ResponseData<T>) => void

/** A Dispatcher whose underlying pool can be replaced; @fastify/reply-from sees one stable object. */
export class SwappableDispatcher extends Dispatcher {
  #pool: Pool
  /** Replaced pools still finishing their requests. */
  readonly #retiring = new Set<Pool>()

  constructor (pool: Pool) {
    super()
    this.#pool = pool
  }

  override dispatch (options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return this.#pool.dispatch(options, handler)
  }

  // The signal marked on the headers (abortWhenClientGone) goes in here: undici
  // reads `signal` when request() builds its handler, before dispatch. It is
  // set on the options themselves, which reply-from builds afresh for each
  // attempt (lib/request.js); `{ ...options, signal }` would cost ~2 µs on
  // Node 20 (a spread plus a key leaves V8's fast path).
  override request<T = null> (options: Dispatcher.RequestOptions<T>, callback: RequestCallback<T>): void
  override request<T = null> (options: Dispatcher.RequestOptions<T>): Promise<Dispatcher.ResponseData<T>>
  override request<T = null> (options: Dispatcher.RequestOptions<T>, callback?: RequestCallback<T>): void | Promise<Dispatcher.ResponseData<T>> {
    const signal = (options.headers as Partial<SignalledHeaders> | null | undefined)?.[ABORT_SIGNAL]
    if (signal !== undefined) options.signal = signal
    return callback === undefined ? super.request(options) : super.request(options, callback)
  }

  get stats (): Pool['stats'] {
    return this.#pool.stats
  }

  /** Installs `next`; the old pool finishes what it has and closes. */
  replace (next: Pool): Promise<void> {
    const old = this.#pool
    this.#pool = next
    this.#retiring.add(old)
    return old.close().finally(() => this.#retiring.delete(old))
  }

  override close (): Promise<void> {
    // After destroy() there is nothing left to wait for (and undici would reject).
    return this.#pool.destroyed ? Promise.resolve() : this.#pool.close()
  }

  /** Aborts every request still in flight, on the current pool and on replaced ones. */
  override async destroy (): Promise<void> {
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
