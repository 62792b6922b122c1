// The one hardened listener (src/client/listener.ts) with each listener's
// policy as that listener states it (the proxy's, the admin's, the
// webhook's over TLS), on real sockets on 127.0.0.1: the cap displaces an
// idle connection and never one being answered, the headers deadline holds,
// pipelining is bounded per connection (refused with 503 or the connection
// closed, as the policy says); and the tracker's options one by one
// (refusal at the cap, until when an answer keeps a connection busy, the
// bound across a listener's connections).
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import { connect as netConnect, type Socket } from 'node:net'
import { connect as tlsConnect } from 'node:tls'
import t, { type Test } from 'tap'
import { adminListener, ADMIN_LIMITS } from '../../src/admin/admin.js'
import { pipelinedBeyondBound, pipelinedWaiting, type ConnectionPolicy } from '../../src/client/connections.js'
import { listenerServer, type ListenerPolicy } from '../../src/client/listener.js'
import { WEBHOOK_LIMITS, webhookListener } from '../../src/inject/limits.js'
import { proxyListener } from '../../src/proxy/proxy-server.js'
import { listenOnLoopback, until } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'
import { makePki } from '../support/tls-fixtures.js'

const pki = makePki()
t.teardown(() => { pki.cleanup() })

const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

interface Listener { readonly name: string, readonly policy: ListenerPolicy, readonly tls: boolean }

/** The three listeners' policies as their modules state them (the proxy's from the default client settings). */
const LISTENERS: readonly Listener[] = [
  { name: 'proxy', policy: proxyListener({ headersTimeoutMs: 10_000, requestTimeoutMs: 30_000, keepAliveTimeoutMs: 5_000, maxConnections: 1024 }), tls: false },
  { name: 'admin', policy: adminListener(ADMIN_LIMITS), tls: false },
  { name: 'webhook', policy: webhookListener(WEBHOOK_LIMITS), tls: true },
]

/** `policy` with its connection options changed (a smaller cap for a test). */
function withConnections (policy: ListenerPolicy, connections: Partial<ConnectionPolicy>, deadlines: Partial<ListenerPolicy> = {}): ListenerPolicy {
  return { ...policy, ...deadlines, connections: { ...policy.connections, ...connections } }
}

/** The listener's server, HTTPS with the test's certificate for the webhook. */
function build (listener: Listener, policy: ListenerPolicy, handler: (req: IncomingMessage, res: ServerResponse) => void): Server {
  return listener.tls ? listenerServer(policy, { cert: pki.serverCert, key: pki.serverKey })(handler) : listenerServer(policy)(handler)
}

interface Served { readonly server: Server, readonly port: number, readonly held: () => number, readonly release: () => void }

/**
 * A listener whose answers wait until released (`held` counts them), but
 * the first request of a connection whose path is /now, answered at once;
 * a request beyond the pipelining bound is refused 503 as the proxy's and
 * admin's onRequest hooks do.
 */
async function serve (t: Test, listener: Listener, policy = listener.policy): Promise<Served> {
  const held: ServerResponse[] = []
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    if (pipelinedBeyondBound(res)) {
      res.writeHead(503, { connection: 'close' }).end('too many pipelined')
      return
    }
    if (req.url === '/now') res.end('now')
    else held.push(res)
  }
  const server = build(listener, policy, handler)
  const port = await listenOnLoopback(server)
  const release = (): void => { for (const res of held.splice(0)) res.end('done') }
  t.teardown(() => new Promise<void>(resolve => { release(); server.closeAllConnections(); server.close(() => resolve()) }))
  return { server, port, held: () => held.length, release }
}

interface Client { readonly socket: Socket, received: string, closed: boolean, readonly whenClosed: Promise<void> }

/** A connection, TLS for the webhook, once it is ready to carry requests. */
async function client (listener: Listener, port: number, request?: string): Promise<Client> {
  const socket: Socket = listener.tls ? tlsConnect({ host: '127.0.0.1', port, ca: pki.ca }) : netConnect({ host: '127.0.0.1', port })
  const c: Client = { socket, received: '', closed: false, whenClosed: new Promise(resolve => socket.once('close', () => { c.closed = true; resolve() })) }
  socket.on('data', (d: Buffer) => { c.received += d.toString('latin1') })
  socket.on('error', () => { /* a reset counts as closed */ })
  await new Promise<void>(resolve => { socket.once(listener.tls ? 'secureConnect' : 'connect', () => resolve()); socket.once('close', () => resolve()) })
  if (request !== undefined && !socket.destroyed) socket.write(request)
  return c
}

const GET = (path = '/'): string => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`

for (const listener of LISTENERS) {
  t.test(`${listener.name} listener: at the cap a newcomer displaces the idle connection, never one being answered`, async t => {
    const s = await serve(t, listener, withConnections(listener.policy, { maxConnections: 2 }))
    const busy = await client(listener, s.port, GET())
    t.ok(await until(() => s.held() === 1), 'the first request is being answered')
    const idle = await client(listener, s.port)
    const newcomer = await client(listener, s.port, GET())
    await Promise.race([idle.whenClosed, sleep(scaled(2000))])
    t.ok(idle.closed, 'the idle connection made way')
    t.ok(await until(() => s.held() === 2), "the newcomer's request is being answered")
    t.notOk(busy.closed, 'the connection being answered was kept')
    s.release()
    t.ok(await until(() => busy.received.startsWith('HTTP/1.1 200') && newcomer.received.startsWith('HTTP/1.1 200')), 'both got their answers')
    const over = await client(listener, s.port, GET())
    await Promise.race([over.whenClosed, sleep(200)])
    t.notOk(over.closed, 'once answered, the connections are idle again: one of them makes way for the next newcomer')
    for (const c of [busy, newcomer, over]) c.socket.destroy()
  })

  t.test(`${listener.name} listener: headers that do not arrive by the headers deadline cannot hold the connection`, async t => {
    const s = await serve(t, listener, withConnections(listener.policy, {}, { headersTimeoutMs: 500, requestTimeoutMs: 500 }))
    const slow = await client(listener, s.port, 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n')
    const started = performance.now()
    // One header line every 100 ms: each byte resets a socket timeout, never Node's headers deadline.
    const trickle = setInterval(() => { if (!slow.closed) slow.socket.write('x-slow: 1\r\n') }, 100)
    t.teardown(() => { clearInterval(trickle) })
    await Promise.race([slow.whenClosed, sleep(scaled(5000))])
    t.ok(slow.closed, `closed ${Math.round(performance.now() - started)} ms later (deadline 500 ms, checked every 500 ms)`)
    t.equal(s.held(), 0, 'nothing reached the handler')
  })

  t.test(`${listener.name} listener: one connection cannot have more requests outstanding than its bound`, async t => {
    const s = await serve(t, listener)
    const bound = listener.policy.connections.pipelinedPerConnection ?? 4
    const c = await client(listener, s.port, GET().repeat(bound + 3))
    t.ok(await until(() => s.held() >= 1), 'the first request is being answered')
    await sleep(100)
    if (listener.policy.connections.beyondBound === 'close') {
      await Promise.race([c.whenClosed, sleep(scaled(2000))])
      t.ok(c.closed, `past ${bound} outstanding, the connection is closed before the server sees more`)
    } else {
      s.release()
      await Promise.race([c.whenClosed, sleep(scaled(2000))])
      t.ok(await until(() => c.received.split('HTTP/1.1 200').length - 1 === bound && c.received.includes('HTTP/1.1 503')), `${bound} answered, then request ${bound + 1} refused 503 (the refusal closes the connection in the real listeners)`)
    }
    t.ok(s.held() <= bound, `${s.held()} requests reached the handler, at most ${bound}`)
    c.socket.destroy()
  })
}

const PROXY = LISTENERS[0] as Listener
const WEBHOOK = LISTENERS[2] as Listener

t.test("atCap 'refuse': the newcomer is closed, the idle connections are kept", async t => {
  const s = await serve(t, PROXY, withConnections(PROXY.policy, { maxConnections: 2, atCap: 'refuse' }))
  const idle = [await client(PROXY, s.port), await client(PROXY, s.port)]
  const newcomer = await client(PROXY, s.port, GET())
  await Promise.race([newcomer.whenClosed, sleep(scaled(2000))])
  t.ok(newcomer.closed, 'the newcomer was closed')
  t.same(idle.map(c => c.closed), [false, false], 'the idle ones were kept')
  for (const c of idle) c.socket.destroy()
})

t.test("busyUntil: an answer handed to the socket and not read keeps its connection busy with 'written', idle with 'ended'", async t => {
  for (const busyUntil of ['written', 'ended'] as const) {
    const big = Buffer.alloc(16 * 1024 * 1024, 'x')
    const server = listenerServer(withConnections(WEBHOOK.policy, { maxConnections: 1, busyUntil }), { cert: pki.serverCert, key: pki.serverKey })((_req, res) => { res.end(big) }) as Server
    const port = await listenOnLoopback(server)
    const reader = await client(WEBHOOK, port)
    reader.socket.pause() // never reads its answer
    reader.socket.write(GET())
    await sleep(200)
    const newcomer = await client(WEBHOOK, port, GET('/now'))
    await Promise.race([newcomer.whenClosed, until(() => newcomer.received.startsWith('HTTP/1.1 200'), scaled(2000))])
    if (busyUntil === 'written') {
      t.ok(newcomer.closed, "'written': the client not reading is still being answered; the newcomer is closed")
    } else {
      t.ok(!newcomer.closed && newcomer.received.startsWith('HTTP/1.1 200'), "'ended': the client not reading is idle and makes way: the newcomer is answered")
      // Paused, the reader sees its connection closed only once it reads again.
      reader.socket.resume()
      await Promise.race([reader.whenClosed, sleep(scaled(2000))])
      t.ok(reader.closed, 'the client not reading was the one closed')
    }
    reader.socket.destroy()
    newcomer.socket.destroy()
    server.closeAllConnections()
    await new Promise(resolve => server.close(resolve))
  }
})

t.test('pipelinedPerListener: requests waiting behind another are bounded across all of a listener\'s connections', async t => {
  const s = await serve(t, PROXY, withConnections(PROXY.policy, { pipelinedPerListener: 4 }))
  // Three connections, each one request in progress and two behind it: six would wait, four may.
  const clients = await Promise.all([0, 1, 2].map(async () => await client(PROXY, s.port, GET().repeat(3))))
  // All nine parsed before any answer is released (the first of each connection and
  // the four the bound admits are held; the two beyond it queue their 503 behind the
  // first answer of their connection): a release after two connections only would
  // let the third's requests in under the bound, and refuse nothing.
  t.ok(await until(() => s.held() >= 7 && pipelinedWaiting(s.server) >= 6), `every connection has its requests in: ${s.held()} held, ${pipelinedWaiting(s.server)} waiting`)
  s.release()
  t.ok(await until(() => clients.reduce((n, c) => n + c.received.split('HTTP/1.1 503').length - 1, 0) >= 1), 'the ones beyond the listener\'s bound are refused')
  for (const c of clients) c.socket.destroy()
})

t.test('webhook listener: a TLS handshake never finished cannot hold the connection past the headers deadline', async t => {
  const s = await serve(t, WEBHOOK, withConnections(WEBHOOK.policy, {}, { headersTimeoutMs: 500, requestTimeoutMs: 500 }))
  const tcp = netConnect({ host: '127.0.0.1', port: s.port })
  tcp.on('error', () => { /* a reset counts as closed */ })
  const closed = new Promise<boolean>(resolve => tcp.once('close', () => resolve(true)))
  t.teardown(() => { tcp.destroy() })
  t.ok(await Promise.race([closed, sleep(scaled(5000)).then(() => false)]), 'closed without a byte sent (Node\'s default would hold it 120 s)')
})

for (const listener of LISTENERS) {
  t.test(`${listener.name} listener: requests pipelined behind one whose client leaves are closed with the connection, each once, whatever logs them`, async t => {
    const closes: number[] = []
    const server = build(listener, listener.policy, (_req, res) => {
      const at = closes.push(0) - 1
      res.on('close', () => { closes[at] = (closes[at] ?? 0) + 1 })
    })
    const port = await listenOnLoopback(server)
    t.teardown(() => new Promise<void>(resolve => { server.closeAllConnections(); server.close(() => resolve()) }))
    const c = await client(listener, port, GET().repeat(3))
    t.ok(await until(() => closes.length === 3), 'three requests reached the handler, two queued behind the first')
    c.socket.destroy()
    t.ok(await until(() => closes.every(n => n > 0)), 'every response closed with its connection, the queued ones included')
    await sleep(50)
    t.same(closes, [1, 1, 1], 'each once')
  })
}
