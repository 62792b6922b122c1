// Forwarding headers are claims a client makes about itself; the upstream must
// never receive them as the proxy's word. Checked on the bytes the upstream
// received (a TCP tap), not only on what its parser made of them.
import t from 'tap'
import { startProxy, startUpstream } from '../support/helpers.js'
import { parseRequests, rawRequest, startTap } from '../support/raw.js'

const SPOOFED = [
  'X-Forwarded-For: 203.0.113.7',
  'x-forwarded-for: 198.51.100.1, 10.0.0.1',
  'X-Forwarded-Host: admin.internal.example',
  'X-Forwarded-Proto: https',
  'X-Forwarded-Port: 443',
  'X-Forwarded-Prefix: /admin',
  'Forwarded: for=203.0.113.7;host=admin.internal.example;proto=https',
  'X-Real-IP: 203.0.113.7',
]
const FORWARDING = /^(forwarded|x-forwarded-[a-z-]+|x-real-ip|via):/i

t.test('client-supplied forwarding headers never reach the upstream, and the proxy adds none of its own (on the wire)', async t => {
  const up = await startUpstream()
  const tap = await startTap(Number(new URL(up.url).port))
  const proxy = await startProxy({ COS_API_URL: tap.url, COS_MANAGEMENT_API_URL: tap.url })
  t.teardown(async () => { await proxy.close(); await tap.close(); await up.close() })

  const spoofed = (method: string, path: string, body = ''): string =>
    `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${SPOOFED.join('\r\n')}\r\nX-Custom: kept\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`
  const requests = [
    spoofed('GET', '/catch-all'),
    spoofed('POST', '/management/clusters', '{"a":1}'),
    'GET /plain HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n',
  ]
  for (const request of requests) t.equal((await rawRequest(proxy.port, request)).finals[0]?.status, 200)

  const sent = tap.connections.flatMap(c => parseRequests(Buffer.concat(c)))
  t.equal(sent.length, requests.length, 'every request was forwarded')
  const wire = tap.text()
  const forwardingLines = wire.split('\r\n').filter(line => FORWARDING.test(line))
  t.same(forwardingLines, [], 'no Forwarded, X-Forwarded-*, X-Real-IP or Via line on the wire')
  t.notOk(wire.includes('203.0.113.7') || wire.includes('admin.internal.example'), 'no spoofed value anywhere')
  t.same(up.received.map(r => r.headers['x-custom']), ['kept', 'kept', undefined], 'other headers pass unchanged')
  t.equal(up.received[1]?.bodyBytes, 7, 'the body too')
})
