// COS_UPSTREAM_MAX_CONNECTIONS: however many clients send at once, the proxy
// opens at most that many sockets per upstream (directly or through an egress
// proxy); the requests beyond them wait their turn and are all answered.
import type { Socket } from 'node:net'
import t from 'tap'
import { startForwardProxy } from '../support/forward-proxy.js'
import { send, startProxy, startUpstream } from '../support/helpers.js'
import { httpsUpstream, makePki } from '../support/tls-fixtures.js'

const BURST = 8
const LIMIT = '2'

/** BURST requests at once to `url`; their statuses. */
async function burst (url: string): Promise<number[]> {
  return (await Promise.all(Array.from({ length: BURST }, () => send(url)))).map(r => r.status)
}

t.test('a burst of concurrent clients cannot open more upstream sockets than COS_UPSTREAM_MAX_CONNECTIONS', async t => {
  // Slow answers keep every socket busy, so an unbounded pool would open one per request.
  const up = await startUpstream((_req, res) => { setTimeout(() => res.end('{}'), 100) })
  const sockets = new Set<Socket>()
  up.server.on('connection', (s: Socket) => sockets.add(s))
  const proxy = await startProxy({ COS_API_URL: up.url, COS_UPSTREAM_MAX_CONNECTIONS: LIMIT })
  t.teardown(async () => { await proxy.close(); await up.close() })

  t.same(await burst(`${proxy.url}/x`), Array.from({ length: BURST }, () => 200), 'every request was answered')
  t.equal(up.received.length, BURST, 'every request reached the upstream')
  t.ok(sockets.size >= 1 && sockets.size <= Number(LIMIT), `the upstream saw ${sockets.size} connections (at most ${LIMIT})`)
})

t.test('behind an egress proxy, neither CONNECT tunnels nor absolute-form connections exceed COS_UPSTREAM_MAX_CONNECTIONS', async t => {
  const pki = makePki()
  const secure = await httpsUpstream(pki, false)
  const plain = await startUpstream((_req, res) => { setTimeout(() => res.end('{}'), 100) })
  const tunnels = await startForwardProxy()
  const forwards = await startForwardProxy()
  const proxy = await startProxy({
    COS_API_URL: secure.url, COS_MANAGEMENT_API_URL: plain.url, COS_CA_FILE: pki.caFile,
    HTTPS_PROXY: tunnels.url, HTTP_PROXY: forwards.url, COS_UPSTREAM_MAX_CONNECTIONS: LIMIT,
  })
  t.teardown(async () => { await proxy.close(); await tunnels.close(); await forwards.close(); await secure.close(); await plain.close(); pki.cleanup() })

  t.same(await burst(`${proxy.url}/x`), Array.from({ length: BURST }, () => 200), 'every https request was answered')
  const connects = tunnels.saw.filter(s => s.method === 'CONNECT').length
  t.ok(connects >= 1 && connects <= Number(LIMIT), `${connects} CONNECT tunnels (at most ${LIMIT})`)

  t.same(await burst(`${proxy.url}/management/x`), Array.from({ length: BURST }, () => 200), 'every http request was answered')
  t.equal(plain.received.length, BURST, 'every http request reached the upstream')
  t.ok(forwards.connections() >= 1 && forwards.connections() <= Number(LIMIT), `${forwards.connections()} connections to the egress proxy (at most ${LIMIT})`)
})
