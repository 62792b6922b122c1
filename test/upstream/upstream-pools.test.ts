// The upstream pools at the shutdown timeout: destroying them reaches every
// request still in flight, and the drain's close afterwards does not fail.
import { copyFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { createLogger } from '../../src/observability/logger.js'
import { upstreamsFor } from '../../src/proxy/proxy-server.js'
import { stallingUpstream, testConfig } from '../support/helpers.js'
import { makePki } from '../support/tls-fixtures.js'

t.test('at the shutdown timeout a request still on a pool retired by a TLS reload is aborted too, and the close that follows does not fail', async t => {
  const up = await stallingUpstream()
  const pki = makePki()
  t.teardown(async () => { await up.close(); pki.cleanup() })
  const caFile = join(pki.dir, 'bundle.pem')
  copyFileSync(pki.caFile, caFile)
  const upstreams = upstreamsFor(testConfig({ COS_API_URL: up.url, COS_CA_FILE: caFile }), createLogger('silent'))
  const pool = upstreams.dispatcherFor(new URL(up.url).origin)
  const inFlight = pool.request({ origin: up.url, path: '/stalls', method: 'GET' }).then(() => 'answered', (err: unknown) => (err as { code?: string }).code)
  const deadline = Date.now() + 3000
  while (up.heads() === 0 && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 10))
  t.equal(up.heads(), 1, 'the request reached the upstream')

  copyFileSync(pki.otherCaFile, caFile)
  t.ok(await upstreams.reloadTls(), 'the pool was replaced')
  t.equal(pool.stats?.running, 0, 'the request is left on the retired pool, which waits for it')

  const destroyedAt = Date.now()
  await upstreams.destroy()
  t.equal(await inFlight, 'UND_ERR_DESTROYED', 'the request on the retired pool was aborted')
  while (up.closedAt.length === 0 && Date.now() < destroyedAt + 3000) await new Promise(resolve => setTimeout(resolve, 10))
  t.equal(up.closedAt.length, 1, 'the upstream saw its connection closed')
  await t.resolves(upstreams.close(), 'close after destroy resolves (a rejection would fail the drain)')
})
