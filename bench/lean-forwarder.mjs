// A yardstick, not a proxy: Fastify forwarding each request with one
// undici Pool.dispatch and a handler that collects the body, with neither
// @fastify/http-proxy nor @fastify/reply-from (no signing, no checks, hop-by-hop
// response headers dropped, nothing else). bench/forwarding-cost.sh runs it
// beside bench/floor.mjs and the proxy: what forwarding itself costs in this
// stack, against what the http-proxy + reply-from path costs
// (docs/performance.md).
import process from 'node:process'
import Fastify from 'fastify'
import { Pool } from 'undici'
const upstream = process.env.BENCH_UPSTREAM
if (upstream === undefined) {
  process.stderr.write('lean-forwarder: BENCH_UPSTREAM is not set\n')
  process.exit(64)
}
const pool = new Pool(upstream, { connections: 32, pipelining: 1 })
const app = Fastify({ logger: false })
const HOP = new Set(['connection', 'keep-alive', 'transfer-encoding'])
app.all('/*', (request, reply) => {
  const chunks = []
  let status = 0, headers
  pool.dispatch({ path: request.url, method: request.method, headers: { ...request.headers, host: undefined, connection: undefined } }, {
    onConnect () {},
    onHeaders (statusCode, rawHeaders) { status = statusCode; headers = rawHeaders; return true },
    onData (chunk) { chunks.push(chunk); return true },
    onComplete () {
      reply.code(status)
      for (let i = 0; i < headers.length; i += 2) { const k = headers[i].toString('latin1').toLowerCase(); if (!HOP.has(k)) reply.header(k, headers[i + 1].toString('latin1')) }
      reply.send(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks))
    },
    onError (err) { reply.code(502).send({ error: String(err) }) },
  })
})
await app.listen({ host: '127.0.0.1', port: 0 })
process.stdout.write(JSON.stringify({ port: app.server.address().port }) + '\n')
