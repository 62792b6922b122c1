// Upstreams reached through a corporate egress proxy (HTTPS_PROXY,
// HTTP_PROXY): the agent, and its failures told apart from the upstream's
// and named for the client.
import { Dispatcher, Pool, ProxyAgent, errors, type buildConnector } from 'undici'
import type { EgressProxy } from './egress.js'
import { classifyUpstreamError } from './upstream-error-kinds.js'
import { poolOptions, type TlsMaterial, type UpstreamOptions } from './upstream-pool.js'

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
export class EgressAgent extends ProxyAgent {
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
    // A client's Proxy-Authorization is blanked to undefined (upstream-headers.ts), and
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
