// A user's 1 GiB upload and 1 GiB download, each through `serve` run as the
// image runs it (the bundle, the image's Node flags and environment) inside a
// real Linux memory cgroup at the chart's limit (issue 47): streamed, not
// buffered. The bytes are made on the fly on both ends (no 1 GiB buffer here
// either), counted and hashed (sha256) where they are made and where they
// arrive, and compared; the far end's first bytes must arrive before the
// sender has sent the pod's limit's worth; no OOM kill, the proxy alive. The
// cgroup's peak and each pass's time are printed. Beside memory-cgroup.test.ts
// (the same cgroup, the same skip where none can be made), as it crosses every
// stage of the path through the shipped CLI.
import { createHash, randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import t, { type Test } from 'tap'
import { chartLimitMiB, createCgroup, type Cgroup } from '../../bench/cgroup.js'
import { alive, statusOf } from '../support/attacks.js'
import { cgroupUnavailable } from '../support/cgroup.js'
import { startSidecar, writeKeyPair, type Sidecar } from '../support/sidecar.js'
import { scaled } from '../support/time-scale.js'

const CWD = mkdtempSync(join(tmpdir(), 'cos-gigabyte-bodies-'))
t.teardown(() => rmSync(CWD, { recursive: true, force: true }))

const MiB = 1024 * 1024
const GiB = 1024 * MiB
const LIMIT_MIB = chartLimitMiB()
const LIMIT = LIMIT_MIB * MiB
const CHUNK = 64 * 1024
// 1 GiB each way takes seconds on a quiet machine; the file's bound leaves room for a busy one.
const PASS_MS = scaled(150_000)
t.setTimeout(2 * PASS_MS + scaled(60_000))

const unavailable = cgroupUnavailable(LIMIT)

/** `total` bytes made 64 KiB at a time as the reader asks for them, each chunk numbered, counted and hashed as it goes. */
interface Source { readonly stream: Readable, sent: () => number, sha256: () => string }
function source (total: number): Source {
  const base = randomBytes(CHUNK)
  const hash = createHash('sha256')
  let sent = 0
  let digest: string | undefined
  const stream = new Readable({
    highWaterMark: CHUNK,
    read () {
      if (sent === total) { digest = hash.digest('hex'); this.push(null); return }
      const n = Math.min(CHUNK, total - sent)
      const chunk = Buffer.allocUnsafe(n)
      base.copy(chunk, 0, 0, n)
      chunk.writeUInt32BE((sent / CHUNK) >>> 0, 0)
      hash.update(chunk)
      sent += n
      this.push(chunk)
    },
  })
  return { stream, sent: () => sent, sha256: () => digest ?? 'not finished' }
}

/** Counts and hashes a body as it arrives; `first` is called with nothing at its first bytes. */
async function sink (body: IncomingMessage, first: () => void): Promise<{ bytes: number, sha256: string }> {
  const hash = createHash('sha256')
  let bytes = 0
  for await (const chunk of body as AsyncIterable<Buffer>) {
    if (bytes === 0) first()
    hash.update(chunk)
    bytes += chunk.length
  }
  return { bytes, sha256: hash.digest('hex') }
}

interface Pod { readonly cgroup: Cgroup, readonly sidecar: Sidecar }

/** The proxy in a fresh cgroup at the chart's limit, forwarding to `upstream`; killed and removed after the test. */
async function podFor (t: Test, purpose: string, upstream: Server): Promise<Pod> {
  let kill = async (): Promise<void> => { upstream.closeAllConnections(); await new Promise(resolve => upstream.close(resolve)) }
  const cgroup = createCgroup(LIMIT, purpose)
  t.teardown(async () => { await kill(); cgroup.remove() })
  // v1 charges the kernel's socket buffers only once they have a limit of their own (v2 always): the pod's.
  const tcp = join(cgroup.dir, 'memory.kmem.tcp.limit_in_bytes')
  if (cgroup.version === 1 && existsSync(tcp)) writeFileSync(tcp, String(LIMIT))
  const port = (upstream.address() as AddressInfo).port
  const sidecar = await startSidecar({ COS_API_URL: `http://127.0.0.1:${port}`, ...writeKeyPair(CWD, 'AKIDBODIES', 'bodies-SeCrEt') }, { cwd: CWD, asImage: true, cgroupDir: cgroup.dir })
  const closeUpstream = kill
  kill = async () => { sidecar.child.kill('SIGKILL'); await sidecar.exited; await closeUpstream() }
  return { cgroup, sidecar }
}

async function listen (server: Server): Promise<Server> {
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  return server
}

function report (t: Test, what: string, pod: Pod, ms: number): void {
  const { cgroup } = pod
  const tcpPeak = join(cgroup.dir, 'memory.kmem.tcp.max_usage_in_bytes')
  const tcp = existsSync(tcpPeak) ? `, of it the kernel's socket buffers at most ${(Number(readFileSync(tcpPeak, 'utf8')) / 1e6).toFixed(1)} MB` : ''
  t.comment(`${what}: ${(ms / 1000).toFixed(1)} s (${(GiB / MiB / (ms / 1000)).toFixed(0)} MiB/s) in a ${LIMIT_MIB}Mi memory cgroup (v${cgroup.version}): peak ${(cgroup.peak() / 1e6).toFixed(1)} MB${tcp}, failcnt ${cgroup.failcnt()}, OOM kills ${cgroup.oomKills()}`)
}

t.test('a 1 GiB upload is streamed through inside the pod\'s memory limit, not buffered', { skip: unavailable ?? false }, async t => {
  const body = source(GiB)
  let sentAtUpstreamsFirstByte = -1
  const upstream = await listen(createServer((req, res) => {
    void sink(req, () => { sentAtUpstreamsFirstByte = body.sent() }).then(got => {
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify(got))
    }, () => { res.destroy() })
  }))
  const pod = await podFor(t, 'test-upload', upstream)
  const t0 = performance.now()
  const answer = await new Promise<{ status: number, text: string }>((resolve, reject) => {
    const req = httpRequest(`${pod.sidecar.proxy}/v1/objects/upload`, { method: 'POST', agent: false, headers: { 'content-type': 'application/octet-stream', 'content-length': String(GiB) } }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (s: string) => { text += s })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, text }) })
      res.on('error', reject)
    })
    req.on('error', reject)
    req.setTimeout(PASS_MS, () => { req.destroy(new Error(`no answer within ${PASS_MS} ms`)) })
    pipeline(body.stream, req).catch(reject)
  })
  const ms = performance.now() - t0
  report(t, '1 GiB upload', pod, ms)
  t.equal(answer.status, 200, 'the upload is answered 200')
  const got = JSON.parse(answer.text) as { bytes: number, sha256: string }
  t.equal(got.bytes, GiB, 'the upstream received every byte sent')
  t.equal(got.sha256, body.sha256(), 'the same bytes, in order (sha256)')
  t.ok(sentAtUpstreamsFirstByte >= 0 && sentAtUpstreamsFirstByte < LIMIT, `the upstream had its first bytes when ${(sentAtUpstreamsFirstByte / MiB).toFixed(1)} MiB had been sent, less than the pod's ${LIMIT_MIB} MiB: streamed, not collected first`)
  t.equal(pod.cgroup.oomKills(), 0, 'no OOM kill')
  t.ok(alive(pod.sidecar.child), 'the proxy is alive')
  t.equal(await statusOf(`${pod.sidecar.proxy}/after`), 200, 'and forwards')
})

t.test('a 1 GiB download is streamed through inside the pod\'s memory limit, not buffered', { skip: unavailable ?? false }, async t => {
  const body = source(GiB)
  const upstream = await listen(createServer((req, res) => {
    req.resume()
    if (req.url !== '/v1/objects/download') { res.end('{}'); return }
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(GiB) })
    pipeline(body.stream, res).catch(() => { res.destroy() })
  }))
  const pod = await podFor(t, 'test-download', upstream)
  let sentAtClientsFirstByte = -1
  const t0 = performance.now()
  const got = await new Promise<{ status: number, bytes: number, sha256: string }>((resolve, reject) => {
    const req = httpRequest(`${pod.sidecar.proxy}/v1/objects/download`, { agent: false }, res => {
      sink(res, () => { sentAtClientsFirstByte = body.sent() }).then(r => { resolve({ status: res.statusCode ?? 0, ...r }) }, reject)
    })
    req.on('error', reject)
    req.setTimeout(PASS_MS, () => { req.destroy(new Error(`no answer within ${PASS_MS} ms`)) })
    req.end()
  })
  const ms = performance.now() - t0
  report(t, '1 GiB download', pod, ms)
  t.equal(got.status, 200, 'the download is answered 200')
  t.equal(got.bytes, GiB, 'the client received every byte the upstream sent')
  t.equal(got.sha256, body.sha256(), 'the same bytes, in order (sha256)')
  t.ok(sentAtClientsFirstByte >= 0 && sentAtClientsFirstByte < LIMIT, `the client had its first bytes when the upstream had sent ${(sentAtClientsFirstByte / MiB).toFixed(1)} MiB, less than the pod's ${LIMIT_MIB} MiB: streamed, not collected first`)
  t.equal(pod.cgroup.oomKills(), 0, 'no OOM kill')
  t.ok(alive(pod.sidecar.child), 'the proxy is alive')
  t.equal(await statusOf(`${pod.sidecar.proxy}/after`), 200, 'and forwards')
})
