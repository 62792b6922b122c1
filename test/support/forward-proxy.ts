// A small forward (egress) proxy on 127.0.0.1 for the tests: CONNECT tunnels
// and absolute-form requests, optional Basic Proxy-Authorization, and a record
// of what it was asked. Every target, whatever its host name, is reached on
// 127.0.0.1, so tests can name upstreams that no resolver knows.
import { createServer, request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http'
import { createServer as createHttpsServer } from 'node:https'
import { connect as netConnect, type Socket } from 'node:net'
import { listenOnLoopback } from './helpers.js'

export interface ProxySaw {
  /** CONNECT (a tunnel) or the absolute-form request's method. */
  readonly method: string
  /** host:port for CONNECT, the absolute URL otherwise. */
  readonly target: string
  readonly headers: IncomingHttpHeaders
}

export interface ForwardProxy {
  readonly url: string
  readonly port: number
  readonly saw: ProxySaw[]
  /** Client connections accepted so far. */
  connections: () => number
  close: () => Promise<void>
}

export interface ForwardProxyOptions {
  /** Require `Proxy-Authorization: Basic base64(user:password)`; 407 otherwise. */
  readonly credentials?: { readonly user: string, readonly password: string }
  /** Answer every CONNECT with this status instead of opening the tunnel. */
  readonly refuseConnect?: number
  /** Listen with TLS (an https:// proxy). */
  readonly tls?: { readonly key: string, readonly cert: string }
}

const PROXY_HEADERS = ['proxy-authorization', 'proxy-connection']

function portOf (target: string, fallback: number): number {
  const m = /:(\d+)$/.exec(target)
  return m === null ? fallback : Number(m[1])
}

export async function startForwardProxy (opts: ForwardProxyOptions = {}): Promise<ForwardProxy> {
  const saw: ProxySaw[] = []
  const sockets = new Set<Socket>()
  const expected = opts.credentials === undefined ? undefined : `Basic ${Buffer.from(`${opts.credentials.user}:${opts.credentials.password}`).toString('base64')}`
  const authorized = (headers: IncomingHttpHeaders): boolean => expected === undefined || headers['proxy-authorization'] === expected

  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    const target = req.url ?? ''
    saw.push({ method: req.method ?? '', target, headers: req.headers })
    if (!authorized(req.headers)) {
      res.writeHead(407, { 'proxy-authenticate': 'Basic realm="egress"', 'content-type': 'text/plain' }).end('proxy authentication required')
      return
    }
    const url = new URL(target)
    const headers = Object.fromEntries(Object.entries(req.headers).filter(([name]) => !PROXY_HEADERS.includes(name)))
    const out = httpRequest({ host: '127.0.0.1', port: Number(url.port || 80), method: req.method, path: url.pathname + url.search, headers }, upstream => {
      res.writeHead(upstream.statusCode ?? 502, upstream.headers)
      upstream.pipe(res)
    })
    out.on('error', () => { if (!res.headersSent) res.writeHead(502).end(); else res.destroy() })
    req.pipe(out)
  }
  const server = opts.tls === undefined ? createServer(onRequest) : createHttpsServer(opts.tls, onRequest)
  let connections = 0
  server.on('connection', (s: Socket) => { connections++; sockets.add(s); s.on('close', () => sockets.delete(s)) })
  server.on('connect', (req, client: Socket, head: Buffer) => {
    const target = req.url ?? ''
    saw.push({ method: 'CONNECT', target, headers: req.headers })
    client.on('error', () => undefined)
    if (!authorized(req.headers) || opts.refuseConnect !== undefined) {
      const status = authorized(req.headers) ? opts.refuseConnect : 407
      client.end(`HTTP/1.1 ${status} Refused\r\nproxy-authenticate: Basic realm="egress"\r\ncontent-length: 0\r\n\r\n`)
      return
    }
    const upstream = netConnect(portOf(target, 443), '127.0.0.1', () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
      upstream.write(head)
      upstream.pipe(client)
      client.pipe(upstream)
    })
    sockets.add(upstream)
    upstream.on('close', () => { sockets.delete(upstream); client.destroy() })
    upstream.on('error', () => client.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n'))
    client.on('close', () => upstream.destroy())
  })
  const port = await listenOnLoopback(server)
  return {
    url: `${opts.tls === undefined ? 'http' : 'https'}://127.0.0.1:${port}`,
    port,
    saw,
    connections: () => connections,
    close: () => new Promise(resolve => { for (const s of sockets) s.destroy(); server.close(() => resolve()) }),
  }
}
