// Connection housekeeping on a real HTTP server: idle connections are reaped,
// and at a cap a newcomer displaces the idlest connection, never one whose
// response is under way.
import { createServer, type ServerResponse } from 'node:http'
import { connect, type Socket } from 'node:net'
import t, { type Test } from 'tap'
import { reapIdleConnections } from '../../src/client/connections.js'
import { listenOnLoopback } from '../support/helpers.js'

interface Client { readonly socket: Socket, readonly received: () => string, readonly closed: Promise<void>, isClosed: () => boolean }

async function client (port: number, request?: string): Promise<Client> {
  const socket = connect({ host: '127.0.0.1', port })
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

/** A server whose responses wait until released; `pending` counts them. */
async function holdingServer (t: Test, idleMs: number, max: number): Promise<{ port: number, pending: () => number, release: () => void }> {
  const held: ServerResponse[] = []
  const server = createServer((_req, res) => { held.push(res) })
  reapIdleConnections(server, idleMs, max)
  const port = await listenOnLoopback(server)
  const release = (): void => { for (const res of held.splice(0)) res.end('done') }
  t.teardown(() => new Promise<void>(resolve => { release(); server.closeAllConnections(); server.close(() => resolve()) }))
  return { port, pending: () => held.length, release }
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
