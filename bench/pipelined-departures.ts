// Issue 27, flaw 1 at scale: CONNECTIONS client connections, each writing a
// GET the upstream never answers and PIPELINED POSTs behind it in one write,
// all closed once the upstream has executed what it will. Every request the
// upstream saw must have one request line and one requests_total sample, and
// the in-flight gauge must come back to 0. In one process (proxy, upstream,
// clients): a correctness figure, not a performance one.
//
//   npx tsx bench/pipelined-departures.ts [connections=400] [pipelined=20]
import { createServer } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { Writable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig } from '../src/config/config.js'
import { CredentialStore, readPair } from '../src/credentials/credentials.js'
import { createLogger } from '../src/observability/logger.js'
import { ProxyMetrics } from '../src/observability/metrics.js'
import { buildProxyServer, metricsObserver } from '../src/proxy/proxy-server.js'

const CONNECTIONS = Number(process.argv[2] ?? 400)
const PIPELINED = Number(process.argv[3] ?? 20)

function sampled (text: string, name: string): number {
  let sum = 0
  for (const line of text.split('\n')) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  return sum
}

let executed = 0
let gets = 0
const held = new Set<() => void>()
const upstream = createServer((req, res) => {
  if (req.method === 'GET') { gets++; held.add(() => res.end()); return }
  req.resume()
  req.on('end', () => { executed++; res.setHeader('content-type', 'application/json'); res.end('{"ok":true}') })
})
await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))

let lines = 0
const sink = new Writable({
  write (chunk: Buffer, _enc, cb) {
    for (const line of chunk.toString('utf8').split('\n')) if (line.includes('"msg":"request"')) lines++
    cb()
  },
})
const config = loadConfig({
  env: { COS_API_URL: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`, COS_ACCESS_KEY: 'AKIDBENCH', COS_ACCESS_KEY_SECRET: 'bench-secret', COS_LISTEN_PORT: '0', COS_MAX_CONNECTIONS: String(CONNECTIONS + 100) },
  dotenv: false,
})
const pair = await readPair(config.credentials, config.tokenEncoding)
if (!pair.ok) throw new Error(pair.problem)
const metrics = new ProxyMetrics({ defaultMetrics: false })
const app = await buildProxyServer({ config, credentials: new CredentialStore(pair.minter), logger: createLogger('info', sink), observer: metricsObserver(metrics) })
await app.listen({ host: '127.0.0.1', port: 0 })
const port = (app.server.address() as AddressInfo).port

const heapBefore = process.memoryUsage().heapUsed
const body = '{"n":1}'
const post = `POST /v1/items HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`
const burst = 'GET /v1/slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' + post.repeat(PIPELINED)
const sockets: Socket[] = []
for (let i = 0; i < CONNECTIONS; i++) {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => undefined)
  socket.on('data', () => undefined)
  socket.once('connect', () => socket.write(burst))
  sockets.push(socket)
}
// Until the upstream has taken what it will: nothing new for 1 s.
for (let last = -1; last !== executed + gets;) { last = executed + gets; await sleep(1000) }
const seen = executed + gets
for (const s of sockets) s.destroy()
const deadline = Date.now() + 10_000
while (Date.now() < deadline && sampled(await metrics.text(), 'cos_auth_proxy_in_flight_requests') !== 0) await sleep(100)
await sleep(500)
const text = await metrics.text()
globalThis.gc?.()
const report = {
  connections: CONNECTIONS,
  pipelined: PIPELINED,
  upstreamGets: gets,
  upstreamPostsExecuted: executed,
  requestLines: lines,
  requestsTotal: sampled(text, 'cos_auth_proxy_requests_total'),
  abortedTotal: sampled(text, 'cos_auth_proxy_requests_aborted_total'),
  inFlight: sampled(text, 'cos_auth_proxy_in_flight_requests'),
  everySeenAccounted: lines >= seen && sampled(text, 'cos_auth_proxy_requests_total') >= seen,
  heapMbBefore: Math.round(heapBefore / 1e5) / 10,
  heapMbAfter: Math.round(process.memoryUsage().heapUsed / 1e5) / 10,
}
console.log(JSON.stringify(report, null, 2))
for (const release of held) release()
await app.close()
upstream.closeAllConnections()
upstream.close()
