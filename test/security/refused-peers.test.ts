// Refused peers and the proxy port's connection cap (issue 43, finding 2). A
// peer outside COS_ALLOW_FROM opened 1,100 idle connections and the allowed
// app then got 0 of 40 requests answered: the allow-list was checked per
// request, the refused connections held the slots of COS_MAX_CONNECTIONS,
// and at the cap Node dropped every newcomer. Now a refused peer is answered
// 403 and closed when it is accepted, holding no slot, and at the cap a
// newcomer displaces an idle keep-alive connection, never a request in
// progress. Refused peers are 127.0.0.2 (all loopback), the app 127.0.0.1.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import type { ServerResponse } from 'node:http'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { listenOnLoopback, send, startProxy, startUpstream } from '../support/helpers.js'
import { errorOf, parseResponses } from '../support/raw.js'
import { REFUSED_LINGER } from '../../src/client/connection-refusals.js'
import { startSidecar, writeKeyPair } from '../support/sidecar.js'
import { scaled } from '../support/time-scale.js'

const CWD = mkdtempSync(join(tmpdir(), 'cos-refused-'))
t.teardown(() => { rmSync(CWD, { recursive: true, force: true }) })

const REFUSED = '127.0.0.2'
const APP = '127.0.0.1'
const FLOOD = 1100
const CAP = 64
/** Below the flood: lingering refused connections must not use the descriptors up either. */
const PROXY_FD_LIMIT = 512
const sleep = (ms: number): Promise<void> => new Promise(resolve => setTimeout(resolve, ms))

/** The soft limit on this process's open descriptors (`ulimit -n`): it holds the flood's client sockets. */
function ownFdLimit (): number {
  const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find(l => l.startsWith('Max open files'))
  const soft = line?.split(/\s{2,}/)[1]
  return soft === undefined || soft === 'unlimited' ? Infinity : Number(soft)
}

async function canBind (address: string): Promise<boolean> {
  const server = createServer(socket => socket.destroy())
  const port = await listenOnLoopback(server)
  const ok = await new Promise<boolean>(resolve => {
    const s = connect({ host: '127.0.0.1', port, localAddress: address })
    s.once('connect', () => { s.destroy(); resolve(true) })
    s.once('error', () => { resolve(false) })
  })
  await new Promise<void>(resolve => server.close(() => { resolve() }))
  return ok
}

interface Peer { readonly socket: Socket, readonly received: () => Buffer, ended: boolean, closed: boolean }

/**
 * Connects from `localAddress` and sends `data` if given; never closes by
 * itself. `halfOpen`: not even once the server has ended the connection (the
 * peer's side stays open until the server closes its descriptor).
 */
async function open (port: number, localAddress: string, data?: string, halfOpen = false): Promise<Peer> {
  return await new Promise(resolve => {
    const socket = connect({ host: '127.0.0.1', port, localAddress, allowHalfOpen: halfOpen })
    const chunks: Buffer[] = []
    const peer: Peer = { socket, received: () => Buffer.concat(chunks), ended: false, closed: false }
    socket.on('data', (d: Buffer) => chunks.push(d))
    socket.on('error', () => { /* a reset counts as closed */ })
    socket.once('end', () => { peer.ended = true })
    socket.once('close', () => { peer.ended = true; peer.closed = true; resolve(peer) })
    socket.once('connect', () => {
      if (data !== undefined) socket.write(data)
      resolve(peer)
    })
  })
}

function openFds (pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length
}

/** The sum of the samples of `name` whose labels include every pair in `labels`. */
function metric (text: string, name: string, labels: Record<string, string>): number {
  return text.split('\n')
    .filter(l => l.startsWith(`${name}{`) && Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`)))
    .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0)
}

t.test('refused peers cannot lock the app out of the proxy port: with 1,100 refused connections open, the app gets every one of 40 requests answered', async t => {
  if (!await canBind(REFUSED)) { t.pass(`skipped: cannot bind ${REFUSED} here`); return }
  t.ok(ownFdLimit() > FLOOD + 200, `this process can hold the flood's ${FLOOD} sockets (ulimit -n ${ownFdLimit()})`)
  const up = await startUpstream()
  const s = await startSidecar({
    COS_API_URL: up.url,
    ...writeKeyPair(CWD, 'AKIDREFUSED', 'refused-SeCrEt'),
    COS_ALLOW_FROM: `${APP}/32`,
    COS_MAX_CONNECTIONS: String(CAP),
  }, { cwd: CWD, asImage: true, fdLimit: PROXY_FD_LIMIT })
  const flood: Peer[] = []
  t.teardown(async () => { for (const p of flood) p.socket.destroy(); s.child.kill('SIGKILL'); await up.close() })
  const port = Number(new URL(s.proxy).port)
  const pid = s.child.pid ?? 0
  const before = (await send(`${s.admin}/metrics`)).body.toString('utf8')
  const fdsBefore = openFds(pid)

  // Opened and left open, never a byte sent, nor a close once the proxy has ended them: the red
  // team's idle connections, held as long as the proxy lets them be.
  let fdsPeak = fdsBefore
  for (let opened = 0; opened < FLOOD; opened += 100) {
    flood.push(...await Promise.all(Array.from({ length: Math.min(100, FLOOD - opened) }, async () => await open(port, REFUSED, undefined, true))))
    fdsPeak = Math.max(fdsPeak, openFds(pid))
  }
  const answers = await Promise.all(Array.from({ length: 40 }, async (_, i) => {
    return await send(`http://${APP}:${port}/app/${i}`).then(r => r.status, (err: unknown) => (err as NodeJS.ErrnoException).code ?? 'error')
  }))
  fdsPeak = Math.max(fdsPeak, openFds(pid))
  const deadline = Date.now() + scaled(5000)
  // Left after the flood: the proxy's keep-alive connections to the upstream (one per request of the app at most).
  const settled = fdsBefore + 40 + 4
  while ((flood.some(p => !p.ended) || openFds(pid) > settled) && Date.now() < deadline) await sleep(50)
  const fdsAfter = openFds(pid)
  const after = (await send(`${s.admin}/metrics`)).body.toString('utf8')
  const refusedLines = s.lines().filter(l => l.msg === 'connection refused: its source address is not in COS_ALLOW_FROM')

  t.comment(`the proxy's descriptors: ${fdsBefore} before, ${fdsPeak} at the peak, ${fdsAfter} after`)
  t.same(answers.filter(a => a !== 200), [], `the app got every one of its 40 requests answered 200 (${answers.filter(a => a === 200).length})`)
  t.equal(up.received.filter(r => r.url.startsWith('/app/')).length, 40, 'all forty forwarded')
  t.equal(flood.filter(p => !p.ended).length, 0, `every refused connection was ended by the proxy (${flood.filter(p => p.ended).length} of ${FLOOD})`)
  t.ok(fdsPeak <= fdsBefore + REFUSED_LINGER.max + 2 * 40 + 16, `refused connections held few descriptors, though none closed its side: peak ${fdsPeak} ≤ ${fdsBefore} + ${REFUSED_LINGER.max} lingering + 40 of the app and 40 to the upstream + 16`)
  t.ok(fdsAfter <= settled, `and none once the flood was answered: ${fdsAfter} ≤ ${fdsBefore} + 40 upstream connections + 4`)
  const refusals = flood.map(p => parseResponses(p.received(), true).responses)
  t.equal(refusals.filter(r => r.length === 1 && r[0]?.status === 403 && errorOf(r[0])?.code === 'forbidden_source').length, FLOOD,
    'each got one answer, 403 forbidden_source, without sending a byte')
  t.ok(refusals.every(r => r[0]?.headers.connection?.[0] === 'close'), 'saying connection: close')
  t.equal(metric(after, 'cos_auth_proxy_requests_total', { route: 'none', status_class: '4xx' }) - metric(before, 'cos_auth_proxy_requests_total', { route: 'none', status_class: '4xx' }), FLOOD,
    'each counted as a request answered 4xx on route none')
  t.equal(refusedLines.length, FLOOD, 'and logged, once each')
  t.ok(refusedLines.every(l => l.peer === REFUSED && l.status === 403 && l.code === 'forbidden_source'), 'naming the peer')
  t.same(s.lines().filter(l => JSON.stringify(l).includes('EMFILE')).map(l => l.msg), [], 'no EMFILE anywhere in the logs')
  t.equal((await send(`${s.proxy}/after`)).status, 200, 'the app is still served')
  t.equal(s.child.exitCode, null, 'the process is alive')
})

interface Held { readonly url: string, readonly res: ServerResponse }

t.test('at COS_MAX_CONNECTIONS, idle keep-alive connections make room for a new client, and a request in progress is never displaced', async t => {
  // /hold/… waits until released; anything else is answered at once.
  const held: Held[] = []
  const up = await startUpstream((req, res) => {
    if (req.url?.startsWith('/hold/') === true) held.push({ url: req.url, res })
    else res.end('ok')
  })
  const proxy = await startProxy({ COS_API_URL: up.url, COS_MAX_CONNECTIONS: '8', COS_KEEPALIVE_TIMEOUT_MS: '60000' })
  const peers: Peer[] = []
  const release = (): void => { for (const h of held.splice(0)) h.res.end(`done ${h.url}`) }
  t.teardown(async () => { release(); for (const p of peers) p.socket.destroy(); await proxy.close(); await up.close() })
  const connectAs = async (data?: string): Promise<Peer> => { const p = await open(proxy.port, APP, data); peers.push(p); return p }
  const get = (path: string): string => `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`
  const answered = (p: Peer): number => parseResponses(p.received(), false).responses.length
  const waitFor = async (what: string, cond: () => boolean): Promise<void> => {
    const deadline = Date.now() + scaled(3000)
    while (!cond()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
      await sleep(5)
    }
  }

  // In progress: two requests the upstream holds, and an upload whose body is still arriving.
  const inProgress = [await connectAs(get('/hold/a')), await connectAs(get('/hold/b'))]
  await waitFor('the upstream to hold two requests', () => held.length === 2)
  const upload = await connectAs('POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nhello')
  // Five keep-alive connections, each answered once and then idle, one after the other.
  const idle: Peer[] = []
  for (let i = 0; i < 5; i++) {
    const p = await connectAs(get(`/ok/${i}`))
    await waitFor(`idle connection ${i} to be answered`, () => answered(p) === 1)
    idle.push(p)
  }

  const newcomer = await connectAs(get('/new'))
  await waitFor('the newcomer to be answered', () => answered(newcomer) === 1 || newcomer.closed)
  t.match(newcomer.received().toString('latin1'), /^HTTP\/1\.1 200 /, 'a new client over the cap is answered')
  await waitFor('an idle connection to close', () => idle.some(p => p.closed))
  t.equal(idle.filter(p => p.closed).length, 1, 'one idle keep-alive connection was closed to make room')

  // Requests in progress fill the cap: every idle one (the newcomer's too, now idle) makes room in turn.
  const more: Peer[] = []
  for (let i = 0; i < 5; i++) {
    more.push(await connectAs(get(`/hold/more-${i}`)))
    await waitFor(`held request ${i}`, () => held.length === 3 + i)
  }
  t.same(idle.map(p => p.closed), [true, true, true, true, true], 'every idle connection made room')
  await waitFor('the idle newcomer to close', () => newcomer.closed)
  const late = await connectAs(get('/hold/late'))
  await waitFor('the late client to be closed', () => late.closed)
  t.equal(late.received().length, 0, 'with every connection in progress, a client over the cap is closed without an answer')
  t.same([...inProgress, upload, ...more].map(p => p.closed), Array.from({ length: 8 }, () => false), 'no request in progress was displaced: held, uploading, or new')

  upload.socket.write('world')
  release()
  await waitFor('every request in progress to be answered', () => [...inProgress, upload, ...more].every(p => answered(p) === 1))
  t.same([...inProgress, upload, ...more].map(p => parseResponses(p.received(), false).responses[0]?.status), Array.from({ length: 8 }, () => 200), 'and each was answered 200')
  t.ok(up.received.some(r => r.url === '/upload' && r.bodyBytes === 10), 'the upload arrived whole')
})
