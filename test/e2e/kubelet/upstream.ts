// The token-verifying upstream of test/e2e/kubelet/kubelet.e2e.ts's injected pods, run inside the node's
// network namespace (nsenter --net=… node --import tsx test/e2e/kubelet/upstream.ts HOST PORT).
// Unlike `cos-auth-proxy mock-api` it accepts a changing set of key pairs, as the real API does
// across a rotation (the new key issued before the Secret changes, the old one revoked after),
// set by lines on stdin: `accept <key> <secret>`, `revoke <key>`. A path with `/slow` is
// answered after SLOW_MS, for a request still in flight when its pod is deleted.
// stdout: one JSON line per request {t, remote, key, path, status}, and {listening} first.
import { createServer } from 'node:http'
import { createInterface } from 'node:readline'
import type { AddressInfo } from 'node:net'
import { parseToken, secretKey, verifyToken } from '../../../src/token/token.js'

const SLOW_MS = 4000
const MAX_SKEW_NS = 300n * 1_000_000_000n
const [host = '127.0.0.1', port = '0'] = process.argv.slice(2)
const accepted = new Map<string, ReturnType<typeof secretKey>>()

createInterface({ input: process.stdin }).on('line', line => {
  const [verb, key = '', secret = ''] = line.trim().split(/\s+/)
  if (verb === 'accept') accepted.set(key, secretKey(secret))
  else if (verb === 'revoke') accepted.delete(key)
  console.log(JSON.stringify({ t: new Date().toISOString(), [verb ?? '?']: key }))
}).on('close', () => { process.exit(0) })

function check (header: string | undefined): { key: string, status: number } {
  const token = header?.startsWith('Bearer ') === true ? header.slice(7) : ''
  const parsed = parseToken(token)
  if (!parsed.ok) return { key: '', status: 401 }
  const key = parsed.fields.accessKey
  const hmac = accepted.get(key)
  if (hmac === undefined) return { key, status: 401 }
  return { key, status: verifyToken(token, { accessKey: key, key: hmac, maxSkewNs: MAX_SKEW_NS }).ok ? 200 : 401 }
}

const server = createServer((req, res) => {
  const { key, status } = check(req.headers.authorization)
  const answer = (): void => {
    console.log(JSON.stringify({ t: new Date().toISOString(), remote: req.socket.remoteAddress, key, path: req.url, status }))
    res.writeHead(status, { 'content-type': 'application/json', date: new Date().toUTCString() })
    res.end(status === 200 ? '{"clusters":[]}' : '{"error":{"code":"unauthorized","message":"token refused"}}')
  }
  req.resume()
  if (status === 200 && req.url?.includes('/slow') === true) setTimeout(answer, SLOW_MS)
  else answer()
})
server.keepAliveTimeout = 60_000
server.listen(Number(port), host, () => {
  console.log(JSON.stringify({ listening: (server.address() as AddressInfo).port }))
})
process.on('SIGTERM', () => { process.exit(0) })
