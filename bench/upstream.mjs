// The benchmark's upstream: as fast as node:http goes, so that what is
// measured is the server in front of it. Listens on 127.0.0.1 (ephemeral
// port) and prints {"port":N} on stdout once listening.
//   POST /upload  reads the whole body, answers {"received":<bytes>}
//   POST /exchange reads the whole body, answers 1 MiB of bytes
//   GET  /big     1 MiB of bytes
//   anything else a ~200-byte JSON body
import { createServer } from 'node:http'
import process from 'node:process'

const MIB = 1024 * 1024
// Built once: the upstream must cost as little per request as possible.
const SMALL = Buffer.from(JSON.stringify({
  id: 'c0ffee00-1234-4abc-8def-0123456789ab',
  name: 'bench-cluster',
  region: 'eu-west-1',
  nodes: 12,
  status: 'ready',
  labels: { team: 'platform', tier: 'gold' },
  updatedAt: '2026-01-01T00:00:00Z',
}))
const BIG = Buffer.alloc(MIB, 'a')
const JSON_HEADERS = { 'content-type': 'application/json', 'content-length': SMALL.length }
const BIG_HEADERS = { 'content-type': 'application/octet-stream', 'content-length': BIG.length }

const server = createServer((req, res) => {
  if (req.method === 'POST' && (req.url === '/upload' || req.url === '/exchange')) {
    let received = 0
    req.on('data', chunk => { received += chunk.length })
    req.on('end', () => {
      if (req.url === '/exchange') {
        res.writeHead(200, BIG_HEADERS)
        res.end(BIG)
        return
      }
      const body = `{"received":${received}}`
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
      res.end(body)
    })
    return
  }
  if (req.url === '/big') {
    res.writeHead(200, BIG_HEADERS)
    res.end(BIG)
    return
  }
  // Drain any body so the keep-alive connection stays usable.
  req.resume()
  res.writeHead(200, JSON_HEADERS)
  res.end(SMALL)
})

server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port, smallBytes: SMALL.length }) + '\n')
})
process.on('SIGTERM', () => process.exit(0))
// The benchmark keeps our stdin open; if it dies, so do we.
process.stdin.on('end', () => process.exit(0)).resume()
