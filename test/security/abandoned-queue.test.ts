// Clients that leave while their requests wait in the upstream pool's queue
// (every upstream connection busy, COS_UPSTREAM_MAX_CONNECTIONS reached):
// their requests are dropped from the queue without touching a socket, so
// they cost the upstream nothing, not even a fresh connection each (with
// https:// that would be a TLS handshake each).
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer, upstreamsFor } from '../../src/proxy/proxy-server.js'
import { LogCapture, send, testConfig, until } from '../support/helpers.js'
import { pathOf, startRawUpstream, type RawUpstream } from '../support/raw.js'

const OK = 'HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok'

/** An upstream that answers at once, except `/busy`, held until release(); it counts the connections it accepts. */
async function countingServer (): Promise<RawUpstream & { release: () => void }> {
  const held: Socket[] = []
  const up = await startRawUpstream((head, socket) => {
    if (pathOf(head) === '/busy') held.push(socket)
    else socket.write(OK)
  })
  return { ...up, release: () => { for (const s of held.splice(0)) s.write(OK) } }
}

/** A raw client that sends one request and keeps its connection until destroyed. */
async function client (port: number, path: string): Promise<Socket> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => undefined)
  await new Promise(resolve => socket.once('connect', resolve))
  socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`)
  return socket
}

t.test('abandoned requests queued in the pool open no new upstream connection: 50 dropped from the queue with COS_UPSTREAM_MAX_CONNECTIONS=2 held busy', async t => {
  const up = await countingServer()
  const config = testConfig({ COS_API_URL: up.url, COS_UPSTREAM_MAX_CONNECTIONS: '2' })
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) throw new Error(pair.problem)
  const logs = new LogCapture()
  const logger = createLogger('info', logs)
  const upstreams = upstreamsFor(config, logger)
  const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger, upstreams })
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  if (address === null || typeof address === 'string') throw new Error('no port')
  const clients: Socket[] = []
  t.teardown(async () => { for (const c of clients) c.destroy(); up.release(); await app.close(); await up.close() })
  const pool = upstreams.dispatcherFor(new URL(up.url).origin)
  const queued = (): number => pool.stats?.pending ?? -1

  clients.push(await client(address.port, '/busy'), await client(address.port, '/busy'))
  t.ok(await until(() => up.heads.length === 2, 5000), 'two requests hold both upstream connections')
  const abandoned = await Promise.all(Array.from({ length: 50 }, () => client(address.port, '/queued')))
  clients.push(...abandoned)
  t.ok(await until(() => queued() === 50, 5000), `50 requests wait in the pool's queue (${queued()})`)
  for (const c of abandoned) c.destroy()
  t.ok(await until(() => logs.records.filter(r => r.msg === 'request' && r.status === 499).length === 50, 5000), 'the 50 are logged as 499 once their clients are gone')

  up.release()
  t.ok(await until(() => pool.stats?.pending === 0 && pool.stats.running === 0, 5000), 'the queue empties')
  const res = await send(`http://127.0.0.1:${address.port}/after`)
  t.equal(res.status, 200, 'the next request is answered')
  t.equal(up.accepted(), 2, 'the upstream accepted no connection beyond the two it had')
  t.same(up.heads.filter(p => p === '/queued'), [], 'no abandoned request reached the upstream')
})
