// Connection housekeeping on a real HTTP server: idle connections are reaped,
// at a cap a newcomer displaces the idlest connection, never one whose
// response is under way, and refused peers are answered and closed at accept.
import { createServer, type Server, type ServerResponse } from 'node:http'
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { refuseAtAccept } from '../../src/client/connection-refusals.js'
import { trackConnections } from '../../src/client/connections.js'
import { listenOnLoopback } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'

interface Client { readonly socket: Socket, readonly received: () => string, readonly closed: Promise<void>, isClosed: () => boolean }

async function client (port: number, request?: string, opts: { localAddress?: string, allowHalfOpen?: boolean } = {}): Promise<Client> {
  const socket = connect({ host: '127.0.0.1', port, ...opts })
  let data = ''
  let closed = false
  socket.on('data', (d: Buffer) => { data += d.toString('latin1') })
  socket.on('error', () => { /* a reset counts as closed */ })
  const done = new Promise<void>(resolve => socket.once('close', () => { closed = true; resolve() }))
  await new Promise<void>(resolve => { socket.once('connect', () => resolve()); socket.once('close', () => resolve()) })
  if (request !== undefined && !socket.destroyed) socket.write(request)
  return { socket, received: () => data, closed: done, isClosed: () => closed }
}

const GET = 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

interface Holding { readonly server: Server, readonly port: number, pending: () => number, release: () => void }

/** A server whose responses wait until released; `pending` counts them. `before` runs before the cap is set up. */
async function holdingServer (t: Test, idleMs: number, max: number, opts: { keepBodies?: boolean, before?: (server: Server) => void } = {}): Promise<Holding> {
  const held: ServerResponse[] = []
  const server = createServer((_req, res) => { held.push(res) })
  opts.before?.(server)
  trackConnections(server, { idleMs, maxConnections: max, keepBodies: opts.keepBodies ?? false })
  const port = await listenOnLoopback(server)
  const release = (): void => { for (const res of held.splice(0)) res.end('done') }
  t.teardown(() => new Promise<void>(resolve => { release(); server.closeAllConnections(); server.close(() => resolve()) }))
  return { server, port, pending: () => held.length, release }
}

t.test('at the cap, a new connection displaces the one idle longest, never one with a response under way', async t => {
  const s = await holdingServer(t, 60_000, 3)
  const busy = await client(s.port, GET)
  const idleOld = await client(s.port)
  await sleep(20)
  const idleNew = await client(s.port)
  while (s.pending() < 1) await sleep(5)
  const newcomer = await client(s.port, GET)
  await idleOld.closed
  while (s.pending() < 2) await sleep(5)
  t.ok(idleOld.isClosed(), 'the connection idle longest was closed')
  t.notOk(idleNew.isClosed(), 'the more recent idle one was kept')
  t.notOk(busy.isClosed(), 'the connection with a response under way was kept')
  t.equal(s.pending(), 2, "the newcomer's request is being served")
  s.release()
  await sleep(50)
  t.match(busy.received(), /^HTTP\/1\.1 200 /, 'the busy connection got its response')
  t.match(newcomer.received(), /^HTTP\/1\.1 200 /, 'and so did the newcomer')
  for (const c of [busy, idleNew, newcomer]) c.socket.destroy()
})

t.test('at the cap, a connection whose request body is still arriving is displaced like an idle one: slow bodies cannot lock a newcomer out', async t => {
  const s = await holdingServer(t, 60_000, 2)
  const slowBody = await client(s.port, 'POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx')
  // The server has the request (its handler holds the response) but not the body.
  while (s.pending() < 1) await sleep(5)
  const busy = await client(s.port, GET)
  while (s.pending() < 2) await sleep(5)
  const newcomer = await client(s.port, GET)
  await Promise.race([slowBody.closed, sleep(2000)])
  t.ok(slowBody.isClosed(), 'the connection still sending its body was closed')
  t.notOk(busy.isClosed(), 'the one waiting for its answer was kept')
  for (let i = 0; i < 400 && s.pending() < 3 && !newcomer.isClosed(); i++) await sleep(5)
  t.notOk(newcomer.isClosed(), "the newcomer's request is being served")
  s.release()
  await sleep(50)
  t.match(newcomer.received(), /^HTTP\/1\.1 200 /, 'and answered')
  for (const c of [busy, newcomer]) c.socket.destroy()
})

t.test('a slow upload is not idle: it is never reaped while its body arrives (the request timeout is its bound)', async t => {
  const s = await holdingServer(t, 100, Infinity)
  const upload = await client(s.port, 'POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx')
  while (s.pending() < 1) await sleep(5)
  await sleep(600)
  t.notOk(upload.isClosed(), 'still open six idle periods later')
  upload.socket.destroy()
})

t.test('when every connection has a response under way, a newcomer over the cap is closed', async t => {
  const s = await holdingServer(t, 60_000, 2)
  const busy = [await client(s.port, GET), await client(s.port, GET)]
  while (s.pending() < 2) await sleep(5)
  const newcomer = await client(s.port, GET)
  await newcomer.closed
  t.equal(newcomer.received(), '', 'the newcomer was closed without an answer')
  t.same(busy.map(c => c.isClosed()), [false, false], 'the busy connections were kept')
  s.release()
  await sleep(50)
  t.same(busy.map(c => /^HTTP\/1\.1 200 /.test(c.received())), [true, true], 'and answered')
  for (const c of busy) c.socket.destroy()
})

t.test('without a cap nothing is displaced; idle connections are reaped after idleMs either way', async t => {
  const s = await holdingServer(t, 200, Infinity)
  const idle = await Promise.all(Array.from({ length: 20 }, () => client(s.port)))
  await sleep(50)
  t.same(idle.filter(c => c.isClosed()).length, 0, 'twenty idle connections are held')
  const start = Date.now()
  await Promise.all(idle.map(c => c.closed))
  t.ok(Date.now() - start < 2000, `all reaped ${Date.now() - start} ms later (idle 200 ms)`)
})

t.test('at the cap, an idle connection is displaced before one whose request body is still arriving', async t => {
  const s = await holdingServer(t, 60_000, 3)
  const slowBody = await client(s.port, 'POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx')
  while (s.pending() < 1) await sleep(5)
  await sleep(20)
  // Busy more recently than the upload was: only the order of preference puts it first.
  const idle = await client(s.port)
  const busy = await client(s.port, GET)
  while (s.pending() < 2) await sleep(5)
  const newcomer = await client(s.port, GET)
  await Promise.race([idle.closed, sleep(scaled(2000))])
  t.ok(idle.isClosed(), 'the idle connection was closed')
  t.notOk(slowBody.isClosed(), 'the one sending its body was kept')
  for (let i = 0; i < 400 && s.pending() < 3 && !newcomer.isClosed(); i++) await sleep(5)
  t.equal(s.pending(), 3, "the newcomer's request is being served")
  for (const c of [slowBody, busy, newcomer]) c.socket.destroy()
})

t.test('with keepBodies (the proxy port), a request whose body is arriving is never displaced: a newcomer over the cap is closed', async t => {
  const s = await holdingServer(t, 60_000, 2, { keepBodies: true })
  const upload = await client(s.port, 'POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx')
  const busy = await client(s.port, GET)
  while (s.pending() < 2) await sleep(5)
  const newcomer = await client(s.port, GET)
  await Promise.race([newcomer.closed, sleep(scaled(2000))])
  t.ok(newcomer.isClosed(), 'the newcomer was closed')
  t.equal(newcomer.received(), '', 'without an answer')
  t.same([upload.isClosed(), busy.isClosed()], [false, false], 'the upload and the request waiting for its answer were kept')
  for (const c of [upload, busy]) c.socket.destroy()
})

const REFUSED = '127.0.0.2'
const ANSWER = 'HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\nconnection: close\r\n\r\nno'

async function canBind (address: string): Promise<boolean> {
  const s = createServer()
  const port = await listenOnLoopback(s)
  const c = await client(port, undefined, { localAddress: address })
  const ok = !c.isClosed()
  c.socket.destroy()
  await new Promise<void>(resolve => s.close(() => { resolve() }))
  return ok
}

/** A holding server that refuses REFUSED at accept; counts what each side saw. */
async function refusingServer (t: Test, max: number, linger = { ms: 60_000, max: 64 }): Promise<Holding & { refused: () => number, seen: () => number }> {
  let refused = 0
  let seen = 0
  const s = await holdingServer(t, 60_000, max, {
    before: server => {
      refuseAtAccept(server, socket => socket.remoteAddress === REFUSED, ANSWER, () => { refused++ }, linger)
      server.on('connection', () => { seen++ })
    },
  })
  return { ...s, refused: () => refused, seen: () => seen }
}

t.test('a refused peer is answered and closed at accept: never parsed, no slot of the cap, unseen by connection listeners', async t => {
  if (!await canBind(REFUSED)) { t.pass(`skipped: cannot bind ${REFUSED} here`); return }
  const s = await refusingServer(t, 2)
  // Both slots taken by requests in progress: a refused peer would have found none either way.
  const busy = [await client(s.port, GET), await client(s.port, GET)]
  while (s.pending() < 2) await sleep(5)
  const refused = await Promise.all(Array.from({ length: 10 }, async () => await client(s.port, GET, { localAddress: REFUSED })))
  await Promise.race([Promise.all(refused.map(c => c.closed)), sleep(scaled(2000))])
  t.same(refused.filter(c => !c.isClosed()).length, 0, 'every refused connection was closed by the server')
  t.same(refused.filter(c => c.received() !== ANSWER).map(c => c.received()), [], 'each got the answer, and nothing else')
  t.equal(s.refused(), 10, 'each was counted')
  t.equal(s.pending(), 2, 'no request of theirs reached the server')
  t.equal(s.seen(), 2, "no 'connection' listener saw them")
  t.same(busy.map(c => c.isClosed()), [false, false], 'the requests in progress were kept')
  s.release()
  await sleep(50)
  t.same(busy.map(c => /^HTTP\/1\.1 200 /.test(c.received())), [true, true], 'and answered')
  for (const c of busy) c.socket.destroy()
})

t.test('a refused peer that never closes is closed after the linger, and at most `max` linger at once', async t => {
  if (!await canBind(REFUSED)) { t.pass(`skipped: cannot bind ${REFUSED} here`); return }
  const connections = async (server: Server): Promise<number> => await new Promise(resolve => { server.getConnections((_err, n) => { resolve(n) }) })
  // Half-open peers: they read the answer and its end, but never close their side.
  const many = await refusingServer(t, 100, { ms: 60_000, max: 5 })
  const held = await Promise.all(Array.from({ length: 20 }, async () => await client(many.port, undefined, { localAddress: REFUSED, allowHalfOpen: true })))
  for (let i = 0; i < 200 && many.refused() < 20; i++) await sleep(5)
  t.equal(many.refused(), 20, 'all twenty refused')
  t.ok(await connections(many.server) <= 5, `the server holds at most 5 of them (${await connections(many.server)}) though none closed its side`)
  // Counted when the answer is written; on a busy machine a client may read it a moment later.
  for (const until = Date.now() + scaled(2000); Date.now() < until && held.some(c => c.received() !== ANSWER);) await sleep(10)
  t.same(held.filter(c => c.received() !== ANSWER).length, 0, 'each got the answer first')

  const brief = await refusingServer(t, 100, { ms: 200, max: 64 })
  const waiting = await Promise.all(Array.from({ length: 5 }, async () => await client(brief.port, undefined, { localAddress: REFUSED, allowHalfOpen: true })))
  const start = Date.now()
  while (await connections(brief.server) > 0 && Date.now() - start < scaled(3000)) await sleep(20)
  t.equal(await connections(brief.server), 0, `all closed by the server ${Date.now() - start} ms after (linger 200 ms)`)
  for (const c of [...held, ...waiting]) c.socket.destroy()
})
