// Request smuggling probes: CL.TE, TE.CL, TE.TE and friends, each followed on
// the same socket by a "GET /smuggled" that must never reach the upstream as a
// request of its own. A TCP tap in front of the upstream keeps the exact bytes
// the proxy sent, so the framing it chose can be checked too.
import t, { type Test } from 'tap'
import { parseToken, secretKey, verifyToken } from '../../src/token/token.js'
import { ACCESS_KEY, SECRET, startProxy, type Received, type RunningProxy } from '../support/helpers.js'
import { errorOf, get, parseRequests, rawRequest, startCountingUpstream, startTap, type CountingUpstream, type Tap } from '../support/raw.js'

const key = secretKey(SECRET)
const SMUGGLED = 'GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'
const H = 'Host: 127.0.0.1\r\n'

interface Rig { readonly proxy: RunningProxy, readonly up: CountingUpstream, readonly tap: Tap }

async function rig (t: Test, handler?: Parameters<typeof startCountingUpstream>[0]): Promise<Rig> {
  const up = await startCountingUpstream(handler)
  const tap = await startTap(Number(new URL(up.url).port))
  const proxy = await startProxy({ COS_API_URL: tap.url })
  t.teardown(async () => { await proxy.close(); await tap.close(); await up.close() })
  return { proxy, up, tap }
}

/** Request lines the proxy wrote upstream, read from the tapped bytes by their framing. */
function tappedRequestLines (r: Rig): string[] {
  return r.tap.connections.flatMap(c => parseRequests(Buffer.concat(c)).map(x => x.requestLine))
}

function smuggledSeen (r: Rig): boolean {
  return r.up.seen.some(line => line.includes('/smuggled')) || tappedRequestLines(r).some(line => line.includes('/smuggled'))
}

const settle = (): Promise<void> => new Promise(resolve => setTimeout(resolve, 60))

function tokenOk (rec: Received): boolean {
  const auth = rec.headers.authorization ?? ''
  return auth.startsWith('Bearer ') && parseToken(auth).ok && verifyToken(auth.slice('Bearer '.length), { accessKey: ACCESS_KEY, key }).ok &&
    rec.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'authorization').length === 1
}

/** Every request head the proxy wrote to the upstream: never both framings, never a Transfer-Encoding other than chunked. */
function upstreamFramingSane (t: Test, r: Rig, label: string): void {
  for (const conn of r.tap.connections) {
    for (const req of parseRequests(Buffer.concat(conn))) {
      const cl = req.headers['content-length']?.length ?? 0
      const te = req.headers['transfer-encoding'] ?? []
      if (cl + te.length > 1 || te.some(v => v.toLowerCase() !== 'chunked')) {
        t.fail(`${label}: the proxy sent ambiguous framing upstream for ${req.requestLine}: ${JSON.stringify(req.headers)}`)
        return
      }
    }
  }
  t.pass(`${label}: every request the proxy sent upstream has one plain framing`)
}

async function followUp (t: Test, r: Rig, label: string): Promise<void> {
  const before = r.up.received.length
  const res = await rawRequest(r.proxy.port, get('/after'))
  t.equal(res.finals[0]?.status, 200, `${label}: a normal request afterwards is answered`)
  t.equal(r.up.received.length - before, 1, `${label}: and forwarded once`)
}

const P = `POST /x HTTP/1.1\r\n${H}`

t.test('ambiguous framing + a pipelined GET /smuggled: 400, connection closed, the upstream sees nothing', async t => {
  const cases: [string, string][] = [
    ['CL.TE', `${P}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['CL.TE, smuggle in the CL body', `${P}Content-Length: ${5 + SMUGGLED.length}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE.CL', `${P}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n${(SMUGGLED.length).toString(16)}\r\n${SMUGGLED}\r\n0\r\n\r\n`],
    ['TE.TE: chunked + x', `${P}Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE.TE: chunked + chunked', `${P}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE "chunked, chunked"', `${P}Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE "chunked, identity"', `${P}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE "xchunked"', `${P}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE "chunked;q=1"', `${P}Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE "chunked" quoted', `${P}Transfer-Encoding: "chunked"\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE tab before colon', `${P}Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE space before colon', `${P}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE obs-fold', `${P}Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE + CL where CL is folded', `${P}Transfer-Encoding: chunked\r\nX: y\r\n Content-Length: 4\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE with NUL', `${P}Transfer-Encoding: chunked\x00\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE with vertical tab', `${P}Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE with form feed', `${P}Transfer-Encoding:\x0cchunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['TE with bare CR', `${P}Transfer-Encoding:\rchunked\r\n\r\n0\r\n\r\n${SMUGGLED}`],
    ['double CL, same value', `${P}Content-Length: 0\r\nContent-Length: 0\r\n\r\n${SMUGGLED}`],
    ['double CL, different values', `${P}Content-Length: 0\r\nContent-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`],
    ['CL list "0, 36"', `${P}Content-Length: 0, ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`],
    ['CL with a sign', `${P}Content-Length: +0\r\n\r\n${SMUGGLED}`],
    ['CL with a decimal point', `${P}Content-Length: 0.0\r\n\r\n${SMUGGLED}`],
    ['CL with trailing junk', `${P}Content-Length: 0 x\r\n\r\n${SMUGGLED}`],
    ['CL with space before colon', `${P}Content-Length : ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`],
    ['bare LF framing', `POST /x HTTP/1.1\nHost: a\nContent-Length: 0\n\n${SMUGGLED}`],
    ['HTTP/1.0 with TE', `POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n${SMUGGLED}`],
  ]
  const r = await rig(t)
  for (const [name, bytes] of cases) {
    const before = r.up.seen.length
    const res = await rawRequest(r.proxy.port, Buffer.from(bytes, 'latin1'), { expect: 2, settleMs: 100, timeoutMs: 2500 })
    await settle()
    t.equal(res.finals.length, 1, `${name}: one response only (nothing answered for the smuggled request)`)
    t.equal(res.finals[0]?.status, 400, `${name}: 400`)
    t.equal(errorOf(res.finals[0])?.code, 'bad_request', `${name}: JSON bad_request`)
    t.ok(res.closedByPeer, `${name}: the proxy closed the connection`)
    t.same(r.up.seen.slice(before), [], `${name}: the upstream saw no request`)
    t.notOk(smuggledSeen(r), `${name}: GET /smuggled never reached the upstream`)
    await followUp(t, r, name)
  }
  upstreamFramingSane(t, r, 'refused cases')
})

t.test('errors found inside a streamed chunked body: 400, the upstream never gets a complete request, nothing smuggled', async t => {
  const r = await rig(t)
  const cases: [string, string][] = [
    ['Content-Length in the trailers', `${P}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 0\r\n\r\n${SMUGGLED}`],
    ['Transfer-Encoding in the trailers', `${P}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n${SMUGGLED}`],
    ['obs-fold in the trailers', `${P}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: a\r\n b\r\n\r\n${SMUGGLED}`],
    ['chunk data longer than announced', `${P}Transfer-Encoding: chunked\r\n\r\n5\r\nhello world\r\n0\r\n\r\n${SMUGGLED}`],
    ['chunk size followed by bare LF', `${P}Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n${SMUGGLED}`],
    ['chunk size with junk', `${P}Transfer-Encoding: chunked\r\n\r\n0x0\r\n\r\n${SMUGGLED}`],
    ['chunk size overflow', `${P}Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n\r\n${SMUGGLED}`],
    ['chunk without CRLF after data', `${P}Transfer-Encoding: chunked\r\n\r\n2\r\nhi0\r\n\r\n${SMUGGLED}`],
  ]
  for (const [name, bytes] of cases) {
    const before = r.up.received.length
    const res = await rawRequest(r.proxy.port, Buffer.from(bytes, 'latin1'), { expect: 2, settleMs: 100, timeoutMs: 2500 })
    await settle()
    t.equal(res.finals.length, 1, `${name}: one response`)
    t.equal(res.finals[0]?.status, 400, `${name}: 400`)
    t.equal(r.up.received.length - before, 0, `${name}: no complete request at the upstream`)
    t.notOk(smuggledSeen(r), `${name}: GET /smuggled never reached the upstream`)
  }
  await followUp(t, r, 'body-level errors')
})

t.test('framings the proxy accepts: the smuggle attempt inside the body stays body bytes', async t => {
  const body = SMUGGLED
  const hex = body.length.toString(16)
  const chunked = `${hex}\r\n${body}\r\n0\r\n\r\n`
  const cases: [string, string, number][] = [
    ['TE with two spaces', `${P}Transfer-Encoding:  chunked\r\n\r\n${chunked}`, body.length],
    ['TE with trailing space', `${P}Transfer-Encoding: chunked \r\n\r\n${chunked}`, body.length],
    ['TE after a tab', `${P}Transfer-Encoding:\tchunked\r\n\r\n${chunked}`, body.length],
    ['TE upper-case', `${P}Transfer-Encoding: CHUNKED\r\n\r\n${chunked}`, body.length],
    ['TE name in odd case', `${P}tRaNsFeR-eNcOdInG: chunked\r\n\r\n${chunked}`, body.length],
    ['chunk extension', `${P}Transfer-Encoding: chunked\r\n\r\n${hex};ext="a b"\r\n${body}\r\n0\r\n\r\n`, body.length],
    ['chunked with a trailer', `${P}Transfer-Encoding: chunked\r\n\r\n${hex}\r\n${body}\r\n0\r\nX-Trailer: 1\r\n\r\n`, body.length],
    ['chunk size with leading zeros', `${P}Transfer-Encoding: chunked\r\n\r\n000${hex}\r\n${body}\r\n0\r\n\r\n`, body.length],
    ['CL with leading zeros', `${P}Content-Length: 0${body.length}\r\n\r\n${body}`, body.length],
    ['CL with surrounding spaces', `${P}Content-Length:   ${body.length}  \r\n\r\n${body}`, body.length],
    ['CL and look-alike TE names', `${P}Content-Length: ${body.length}\r\nTransfer-Encoding-: chunked\r\nTransfer_Encoding: chunked\r\n\r\n${body}`, body.length],
    ['CL and a look-alike X-Transfer-Encoding', `${P}Content-Length: ${body.length}\r\nX-Transfer-Encoding: chunked\r\n\r\n${body}`, body.length],
    ['CL and "Transfer-Encoding" inside another value', `${P}Content-Length: ${body.length}\r\nX-A: b\r\nX-Note: Transfer-Encoding: chunked\r\n\r\n${body}`, body.length],
    ['Connection: content-length (hop-by-hop trick)', `${P}Connection: Content-Length\r\nContent-Length: ${body.length}\r\n\r\n${body}`, body.length],
    ['Connection: transfer-encoding (hop-by-hop trick)', `${P}Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`, body.length],
  ]
  const r = await rig(t)
  for (const [name, bytes, length] of cases) {
    const before = r.up.received.length
    const seenBefore = r.up.seen.length
    const res = await rawRequest(r.proxy.port, Buffer.from(bytes + get('/next'), 'latin1'), { expect: 2, timeoutMs: 2500 })
    await settle()
    t.same(res.finals.map(f => f.status), [200, 200], `${name}: the request and the next one answered, in order`)
    t.same(r.up.seen.slice(seenBefore).sort(), ['GET /next', 'POST /x'], `${name}: exactly the two requests reached the upstream`)
    const rec = r.up.received.slice(before).find(x => x.url === '/x')
    t.equal(rec?.bodyBytes, length, `${name}: the upstream got the body the proxy parsed (${length} bytes)`)
    t.notOk(smuggledSeen(r), `${name}: GET /smuggled never reached the upstream as a request`)
    for (const x of r.up.received.slice(before)) t.ok(tokenOk(x), `${name}: ${x.url} carries exactly one valid proxy token`)
  }
  upstreamFramingSane(t, r, 'accepted cases')
  await followUp(t, r, 'accepted cases')
})

t.test('Transfer-Encoding with a coding before the final chunked: refused, or re-framed with the smuggle attempt kept as body', async t => {
  // RFC 9112 §6.1 says 501 for a coding the recipient does not understand; the
  // contract only requires a final chunked. Either way nothing may be smuggled
  // and the upstream must see one plain framing.
  const r = await rig(t)
  const chunk = `${SMUGGLED.length.toString(16)}\r\n${SMUGGLED}\r\n0\r\n\r\n`
  for (const coding of ['x, chunked', 'identity, chunked', 'gzip, chunked', 'chunked;x=1, chunked']) {
    const before = r.up.received.length
    const seen = r.up.seen.length
    const res = await rawRequest(r.proxy.port, Buffer.from(`${P}Transfer-Encoding: ${coding}\r\nConnection: close\r\n\r\n${chunk}`, 'latin1'), { timeoutMs: 2500 })
    await settle()
    const status = res.finals[0]?.status ?? 0
    t.ok(status === 200 || status === 400 || status === 501, `TE "${coding}": answered ${status}`)
    if (status === 200) {
      t.same(r.up.received.slice(before).map(x => [x.url, x.bodyBytes]), [['/x', SMUGGLED.length]], `TE "${coding}": one request upstream, the smuggle attempt as its body`)
      t.comment(`TE "${coding}" was accepted and forwarded as plain chunked (the "${coding.split(',')[0] ?? ''}" coding is dropped silently)`)
    } else {
      t.same(r.up.seen.slice(seen), [], `TE "${coding}": refused, nothing forwarded`)
    }
    t.notOk(smuggledSeen(r), `TE "${coding}": GET /smuggled never reached the upstream as a request`)
  }
  upstreamFramingSane(t, r, 'codings before chunked')
  await followUp(t, r, 'codings before chunked')
})

t.test('the body of a refused request is never read as a request of its own', async t => {
  const up = await startCountingUpstream()
  const proxy = await startProxy({ COS_API_URL: up.url, COS_MANAGEMENT_API_URL: up.url, COS_MANAGEMENT_ALLOWED_METHODS: 'GET', COS_MAX_BODY_BYTES: '1000', COS_REQUIRE_HEADER: 'X-COS-Proxy' })
  t.teardown(async () => { await proxy.close(); await up.close() })
  const R = 'X-COS-Proxy: 1\r\n'
  const withBody = (line: string, headers: string): string => `${line}\r\n${H}${headers}Content-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`
  const cases: [string, string][] = [
    ['dot-segment (guard 400)', withBody('POST /a/../b HTTP/1.1', R)],
    ['upgrade (guard 405)', withBody('POST /ws HTTP/1.1', `${R}Connection: Upgrade\r\nUpgrade: websocket\r\n`)],
    ['missing required header (guard 403)', withBody('POST /x HTTP/1.1', '')],
    ['method not allowed (route 405)', withBody('POST /management/x HTTP/1.1', R)],
    ['absolute-form (guard 400)', withBody('POST http://other/x HTTP/1.1', R)],
    ['TRACE (not routed)', withBody('TRACE /x HTTP/1.1', R)],
  ]
  for (const [name, bytes] of cases) {
    const before = up.seen.length
    const res = await rawRequest(proxy.port, bytes, { expect: 2, settleMs: 200, timeoutMs: 700 })
    await settle()
    t.equal(res.finals.length, 1, `${name}: one response`)
    t.ok((res.finals[0]?.status ?? 0) >= 400, `${name}: refused (${res.finals[0]?.status})`)
    t.same(up.seen.slice(before), [], `${name}: nothing reached the upstream`)
  }
})

t.test('legitimate pipelining: each request is re-framed and signed on its own, answers in order', async t => {
  const r = await rig(t)
  const before = r.up.received.length
  const res = await rawRequest(r.proxy.port, `GET /a HTTP/1.1\r\n${H}\r\nPOST /b HTTP/1.1\r\n${H}Content-Length: 5\r\n\r\nhelloGET /c HTTP/1.1\r\n${H}Connection: close\r\n\r\n`, { expect: 3 })
  await settle()
  t.same(res.finals.map(f => f.status), [200, 200, 200])
  const got = r.up.received.slice(before)
  t.same(got.map(x => x.url).sort(), ['/a', '/b', '/c'])
  t.equal(new Set(got.map(x => x.headers.authorization)).size, 3, 'three different tokens')
  for (const x of got) t.ok(tokenOk(x), `${x.url}: one valid token`)
  // GET with a body: the body is never forwarded, and never parsed as a request
  const seen = r.up.seen.length
  const getBody = await rawRequest(r.proxy.port, `GET /g HTTP/1.1\r\n${H}Content-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}${get('/h')}`, { expect: 2 })
  await settle()
  t.same(getBody.finals.map(f => f.status), [200, 200], 'GET with a body, then another request')
  t.same(r.up.seen.slice(seen).sort(), ['GET /g', 'GET /h'])
  t.notOk(smuggledSeen(r), 'the GET body was not read as a request')
  upstreamFramingSane(t, r, 'pipelining')
})

t.test('a malformed request pipelined behind one in flight never corrupts or replaces that one\'s response', async t => {
  // The upstream sends its headers and most of the body, then the rest 300 ms
  // later. Over 16 KiB, so the proxy streams it: its headers are on the wire
  // before the malformed request arrives.
  const head = '0123456789'.repeat(1700)
  const r = await rig(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': String(head.length + 10) })
    res.write(head)
    setTimeout(() => res.end('abcdefghij'), 300)
  })
  const cases: [string, string][] = [
    ['garbage', 'GARBAGE\r\n\r\n'],
    ['CL.TE', `${P}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`],
    ['oversized header', `GET /b HTTP/1.1\r\n${H}X-Big: ${'b'.repeat(20_000)}\r\n\r\n`],
    ['CONNECT', 'CONNECT other-host:443 HTTP/1.1\r\nHost: other-host:443\r\n\r\n'],
  ]
  for (const [name, second] of cases) {
    const res = await rawRequest(r.proxy.port, [`GET /first HTTP/1.1\r\n${H}\r\n`, second], { gapMs: 100, expect: 2, timeoutMs: 2500 })
    // The upstream's response first (whole, or cut short by a close): never foreign bytes inside it.
    t.match(res.text, /^HTTP\/1\.1 200 /, `${name}: the first bytes on the wire are the upstream's response`)
    const full = head + 'abcdefghij'
    const afterHead = res.text.slice(res.text.indexOf('\r\n\r\n') + 4)
    t.ok(afterHead.startsWith(full) || full.startsWith(afterHead), `${name}: nothing is written into the body in flight (got ${JSON.stringify(afterHead.slice(0, 60))})`)
  }
  // A small body the proxy collects before answering (its headers are not
  // sent yet): the client gets the whole response or a close, nothing else.
  const small = await rig(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '20' })
    res.write('0123456789')
    setTimeout(() => res.end('abcdefghij'), 300)
  })
  for (const [name, second] of cases) {
    const res = await rawRequest(small.proxy.port, [`GET /first HTTP/1.1\r\n${H}\r\n`, second], { gapMs: 100, expect: 2, timeoutMs: 2500 })
    const first = res.finals[0]
    t.ok(first === undefined || (first.status === 200 && res.text.includes('\r\n\r\n0123456789abcdefghij')),
      `${name}, small body: the whole upstream response or a close (got ${JSON.stringify(res.text.slice(0, 40))})`)
  }
  // The same when the upstream has received the request but not answered
  // yet: the client must not get a 400 for a request the upstream executed.
  const slow = await rig(t, (_req, res) => { setTimeout(() => { res.setHeader('content-type', 'application/json'); res.end('{"ok":true}') }, 300) })
  for (const [name, second] of cases) {
    const before = slow.up.received.length
    const res = await rawRequest(slow.proxy.port, [`POST /pay HTTP/1.1\r\n${H}Content-Length: 2\r\n\r\nhi`, second], { gapMs: 150, expect: 2, timeoutMs: 2500 })
    t.equal(slow.up.received.length - before, 1, `${name}: POST /pay was executed by the upstream`)
    // The upstream's 200 first, or a close without an answer; never an error the client would pin on POST /pay.
    const first = res.finals[0]?.status
    t.ok(first === undefined || first === 200, `${name}: the client's first response is the upstream's 200 (or none), not an error for the pipelined request (got ${res.finals.map(f => f.status).join(', ')})`)
  }
})
