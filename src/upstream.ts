// Connections to the upstreams: one keep-alive undici Pool per origin (or,
// behind a corporate egress proxy, a ProxyAgent), behind a dispatcher whose
// pool can be replaced when TLS material changes (a rotated CA bundle or
// client certificate), without a restart and without cutting requests in
// flight on the old pool. An upstream request is aborted as soon as the
// client it answers goes away.
import { EventEmitter } from 'node:events'
import { unwatchFile, watchFile, type Stats } from 'node:fs'
import type { Socket } from 'node:net'
import { rootCertificates } from 'node:tls'
import type { FastifyBaseLogger } from 'fastify'
import { Dispatcher, Pool, ProxyAgent, errors, type buildConnector } from 'undici'
import { readBoundedFileSync } from './bounded-file.js'
import { ConfigError, type Config } from './config.js'
import { egressProxyFor, type Egress, type EgressProxy } from './egress.js'
import { classifyUpstreamError } from './metrics.js'

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
  /** Sockets per upstream origin; requests beyond them wait in the pool's queue. */
  readonly maxConnections: number
}

/** The same for every upstream connection, direct or through an egress proxy. */
function poolOptions (opts: UpstreamOptions): Pool.Options {
  return {
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: opts.bodyIdleTimeoutMs,
    // Keep idle sockets a little under the common 5 s server default, so the
    // proxy closes them first instead of writing into a socket being closed.
    keepAliveTimeout: 4_000,
    connections: opts.maxConnections,
  }
}

function createPool (origin: string, opts: UpstreamOptions, tls: TlsMaterial): Pool {
  return new Pool(origin, { connect: { timeout: opts.connectTimeoutMs, ...tls }, ...poolOptions(opts) })
}

/**
 * A failure at the egress proxy rather than the upstream. Its message names
 * the proxy by scheme://host:port only and is what the client is told. No
 * `code` of its own: the codes on its cause still decide the status (504 for
 * a timeout), the retry and the metrics, as for a direct connection.
 */
export class EgressProxyError extends Error {
  constructor (proxy: EgressProxy, problem: string, cause?: unknown) {
    super(`the egress proxy ${proxy.address} ${problem}`, cause === undefined ? undefined : { cause })
    this.name = 'EgressProxyError'
  }
}

function proxyAuthenticationProblem (proxy: EgressProxy): string {
  return proxy.authorization === undefined
    ? `asks for credentials (407): give them in ${proxy.variable} as http://user:password@host:port`
    : `refused the credentials in ${proxy.variable} (407)`
}

/** Why the proxy could not be used, from the error that got in the way (as the metrics classify it). */
function unreachableProblem (err: unknown): string {
  switch (err instanceof Error ? classifyUpstreamError(err) : 'other') {
    case 'timeout': return 'did not answer in time'
    case 'tls': return 'could not be reached: TLS with it failed (is its CA in COS_CA_FILE?)'
    case 'dns': return 'could not be reached: its name does not resolve'
    default: return 'could not be reached'
  }
}

type PoolConnectOptions = Parameters<Pool['connect']>[0]

/** The client ProxyAgent sends CONNECT with: whatever goes wrong before the tunnel is open is the proxy's. */
class TunnelClient extends Pool {
  readonly #proxy: EgressProxy

  constructor (proxy: EgressProxy, url: URL, opts: Pool.Options) {
    super(url, opts)
    this.#proxy = proxy
  }

  // ProxyAgent calls the promise form only.
  override connect (options: PoolConnectOptions): Promise<Dispatcher.ConnectData>
  override connect (options: PoolConnectOptions, callback: (err: Error | null, data: Dispatcher.ConnectData) => void): void
  override connect (options: PoolConnectOptions, callback?: (err: Error | null, data: Dispatcher.ConnectData) => void): Promise<Dispatcher.ConnectData> | undefined {
    if (callback !== undefined) {
      super.connect(options, callback)
      return undefined
    }
    return super.connect(options).then(data => {
      if (data.statusCode === 200) return data
      data.socket.destroy()
      throw new EgressProxyError(this.#proxy, data.statusCode === 407 ? proxyAuthenticationProblem(this.#proxy) : `refused the tunnel to the upstream (${data.statusCode})`)
    }, (err: unknown) => { throw new EgressProxyError(this.#proxy, unreachableProblem(err), err) })
  }
}

/** A connector whose failures are the proxy's: the connection to it could not be made. */
function connectingToProxy (proxy: EgressProxy, connect: buildConnector.connector): buildConnector.connector {
  return (options, callback) => {
    connect(options, (err, socket) => {
      if (err === null) callback(null, socket)
      else callback(new EgressProxyError(proxy, unreachableProblem(err), err), null)
    })
  }
}

/**
 * An upstream reached through an egress proxy. https:// upstreams go
 * through a CONNECT tunnel with the upstream's own TLS inside it
 * (COS_CA_FILE, the client certificate); http:// ones as absolute-form
 * requests, as curl and Go send them (many proxies allow CONNECT to port 443
 * only: Squid's default). Timeouts and keep-alive are those of a direct pool.
 */
class EgressAgent extends ProxyAgent {
  constructor (proxy: EgressProxy, opts: UpstreamOptions, tls: TlsMaterial) {
    const pool = poolOptions(opts)
    const proxyOrigin = new URL(proxy.address).origin
    // Node's TLS options type wants a mutable array.
    const { ca: roots, ...clientCertificate } = tls
    const ca = roots === undefined ? {} : { ca: [...roots] }
    super({
      uri: proxy.address,
      ...(proxy.authorization === undefined ? {} : { token: proxy.authorization.reveal() }),
      proxyTunnel: false,
      requestTls: { ...clientCertificate, ...ca, timeout: opts.connectTimeoutMs },
      // The added CA bundle may be the one that signs an https:// proxy's
      // certificate; the client certificate is for the upstream only.
      proxyTls: { ...ca, timeout: opts.connectTimeoutMs },
      // A proxy that never answers CONNECT counts against the connect timeout.
      clientFactory: (url, o) => new TunnelClient(proxy, url, { ...o, ...pool, headersTimeout: opts.connectTimeoutMs }),
      // Called for the pools to tunnelled upstreams, and with the proxy's own
      // origin for the pool that carries absolute-form requests.
      factory: (origin, o) => {
        const options = o as Pool.Options
        if (new URL(origin).origin !== proxyOrigin || typeof options.connect !== 'function') return new Pool(origin, options)
        return new Pool(origin, { ...options, ...pool, connect: connectingToProxy(proxy, options.connect) })
      },
      ...pool,
    })
  }

  override dispatch (options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    // A client's Proxy-Authorization is blanked to undefined (proxy.ts), and
    // ProxyAgent refuses any request whose headers so much as name one.
    const headers = options.headers
    if (headers != null && !Array.isArray(headers) && 'proxy-authorization' in headers) {
      delete (headers as Record<string, unknown>)['proxy-authorization']
    }
    return super.dispatch(options, handler)
  }
}

/**
 * The client-facing message for a failure at an egress proxy, or undefined
 * when the failure was not the proxy's. `httpProxy` is the proxy of http://
 * upstreams: undici's absolute-form client reports that proxy's 407 as an
 * InvalidArgumentError with this message and nothing else to tell it by.
 */
export function egressProblem (error: Error, httpProxy: EgressProxy | undefined): string | undefined {
  let e: unknown = error
  for (let depth = 0; depth < 5 && e instanceof Error; depth++, e = e.cause) {
    if (e instanceof EgressProxyError) return e.message
    if (httpProxy !== undefined && e instanceof errors.InvalidArgumentError && e.message === 'Proxy Authentication Required (407)') {
      return new EgressProxyError(httpProxy, proxyAuthenticationProblem(httpProxy)).message
    }
  }
  return undefined
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
