// The framework floor: a bare @fastify/http-proxy in front of the same
// upstream, no signing, no routing rules, no metrics, Fastify's defaults
// (whose default is no logger). Whatever the real proxy costs beyond this is
// ours. Listens on 127.0.0.1 (ephemeral port) and prints {"port":N} on stdout.
import process from 'node:process'
import Fastify from 'fastify'
import httpProxy from '@fastify/http-proxy'

const upstream = process.env.BENCH_UPSTREAM
if (upstream === undefined) {
  process.stderr.write('floor: BENCH_UPSTREAM is not set\n')
  process.exit(64)
}
const app = Fastify({ logger: false })
await app.register(httpProxy, { upstream })
await app.listen({ host: '127.0.0.1', port: 0 })
process.stdout.write(JSON.stringify({ port: app.server.address().port }) + '\n')
process.on('SIGTERM', () => { app.close().then(() => process.exit(0), () => process.exit(1)) })
// The benchmark keeps our stdin open; if it dies, so do we.
process.stdin.on('end', () => process.exit(0)).resume()
