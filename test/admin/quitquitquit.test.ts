// POST /quitquitquit stops the sidecar. It is for the pod's own containers
// (a Job's main container when the sidecar is a plain container), never for
// anyone outside the pod, whatever sits in front of it (issue 43): in an
// Istio sidecar mesh, Envoy forwards a remote pod's connection from
// 127.0.0.6 to the pod's IP, and a remote POST refused directly got 202
// through that hop. A stop is taken only on a connection from 127.0.0.1 (or
// ::1) to 127.0.0.1 (or ::1): what a container calling localhost has.
import { execFile, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { buildAdminServer, fromInsidePod } from '../../src/admin/admin.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { spawnNodeConfined } from '../support/node-child.js'
import { startSidecar, until, writeKeyPair } from '../support/sidecar.js'
import { scaled } from '../support/time-scale.js'

const run = promisify(execFile)

t.test('fromInsidePod: a connection from localhost to localhost, nothing else', async t => {
  const cases: [remote: string | undefined, local: string | undefined, inside: boolean, what: string][] = [
    ['127.0.0.1', '127.0.0.1', true, 'a container calling 127.0.0.1'],
    ['::1', '::1', true, 'a container calling [::1]'],
    ['::ffff:127.0.0.1', '::ffff:127.0.0.1', true, 'a container calling 127.0.0.1 on a dual-stack listener'],
    ['127.0.0.6', '10.244.1.7', false, 'Istio (1.10 on) and Kuma: the inbound hop from 127.0.0.6 to the pod IP'],
    ['127.0.0.6', '127.0.0.1', false, 'from 127.0.0.6 even to localhost'],
    ['10.244.1.7', '10.244.1.7', false, 'Linkerd (2.11 on): the inbound hop from the pod IP to the pod IP'],
    ['10.244.2.9', '10.244.1.7', false, 'another pod, directly (or through a mesh that keeps its address: TPROXY, ambient)'],
    ['127.0.0.1', '10.244.1.7', false, 'from localhost to the pod IP: not what a container calling localhost has'],
    ['127.0.0.2', '127.0.0.1', false, 'another loopback address'],
    [undefined, '127.0.0.1', false, 'a socket already closed'],
  ]
  for (const [remoteAddress, localAddress, inside, what] of cases) t.equal(fromInsidePod({ remoteAddress, localAddress }), inside, what)
})

async function adminWith (t: Test, quitquitquit?: boolean): Promise<{ port: number, quits: () => number }> {
  let quits = 0
  const admin = buildAdminServer({ metrics: new ProxyMetrics({ defaultMetrics: false }), readiness: () => ({ ready: true }), onQuit: () => { quits++ }, ...(quitquitquit === undefined ? {} : { quitquitquit }) })
  await admin.listen({ host: '0.0.0.0', port: 0 })
  t.teardown(() => admin.close())
  return { port: (admin.server.address() as AddressInfo).port, quits: () => quits }
}

async function post (port: number, localAddress: string): Promise<{ status: number, body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path: '/quitquitquit', method: 'POST', localAddress, agent: false }, res => {
      let body = ''
      res.setEncoding('utf8').on('data', (d: string) => { body += d }).on('end', () => { resolve({ status: res.statusCode ?? 0, body }) })
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('a stop from a loopback address other than 127.0.0.1 is refused: a mesh hop from 127.0.0.6 cannot stop the sidecar', async t => {
  const admin = await adminWith(t)
  for (const from of ['127.0.0.6', '127.0.0.2']) {
    const res = await post(admin.port, from)
    t.equal(res.status, 403, `from ${from}: 403`)
    t.match(res.body, /"code":"forbidden_source"/, 'in the JSON error shape')
  }
  t.equal(admin.quits(), 0, 'no drain started')
  t.equal((await post(admin.port, '127.0.0.1')).status, 202, 'from 127.0.0.1 to 127.0.0.1: 202')
  t.equal(admin.quits(), 1, 'the drain started once')
})

t.test('COS_QUITQUITQUIT=false: no stop at all, even from localhost', async t => {
  const admin = await adminWith(t, false)
  const res = await post(admin.port, '127.0.0.1')
  t.equal(res.status, 403)
  t.match(res.body, /"code":"quitquitquit_disabled"/)
  t.equal(admin.quits(), 0, 'no drain started')
})

// --- The reproduction: a pod's network namespace with a mesh's inbound hops,
// and a remote pod in another namespace over a veth pair. Both namespaces are
// the test's own (no address is added to the machine's interfaces).

const POD_IP = '10.250.43.5'
const REMOTE_IP = '10.250.43.9'
const ADMIN_PORT = 9090

/** Why no network namespace can be made here, or undefined when one can. */
function netnsUnavailable (): string | undefined {
  if (process.platform !== 'linux') return `network namespaces are Linux's (this is ${process.platform})`
  const name = `cos-q-probe-${String(process.pid)}`
  const added = spawnSync('ip', ['netns', 'add', name], { encoding: 'utf8' })
  if (added.status !== 0) return `no network namespace can be made here (ip netns add: ${(added.stderr || added.error?.message || '').trim()}): run as root with iproute2`
  spawnSync('ip', ['netns', 'del', name])
  if (spawnSync('curl', ['--version']).status !== 0) return 'no curl here'
  return undefined
}

function ip (...args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' })
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')}: ${r.stderr.trim()}`)
}

/** The pod's namespace and a remote pod's, joined by a veth pair; removed after the test. */
function pods (t: Test): { pod: string, remote: string } {
  const pod = `cos-q-pod-${String(process.pid)}`
  const remote = `cos-q-remote-${String(process.pid)}`
  t.teardown(() => {
    spawnSync('ip', ['netns', 'del', pod])
    spawnSync('ip', ['netns', 'del', remote])
  })
  ip('netns', 'add', pod)
  ip('netns', 'add', remote)
  ip('-n', pod, 'link', 'set', 'lo', 'up')
  ip('-n', remote, 'link', 'set', 'lo', 'up')
  ip('-n', pod, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', remote)
  ip('-n', pod, 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0')
  ip('-n', remote, 'addr', 'add', `${REMOTE_IP}/24`, 'dev', 'eth0')
  ip('-n', pod, 'link', 'set', 'eth0', 'up')
  ip('-n', remote, 'link', 'set', 'eth0', 'up')
  return { pod, remote }
}

// A mesh's inbound hop: accepts on `listen`, connects to the admin port on the
// pod's IP from `from`, and relays both ways. (The mesh's iptables REDIRECT
// only brings the remote connection to this port; the admin listener sees
// the hop's own connection, which this makes exactly as the mesh does.)
const RELAY = `
const net = require('node:net')
const [listenPort, from] = process.argv.slice(1)
net.createServer(inbound => {
  const out = net.connect({ host: '${POD_IP}', port: ${String(ADMIN_PORT)}, localAddress: from })
  inbound.pipe(out).pipe(inbound)
  inbound.on('error', () => out.destroy()); out.on('error', () => inbound.destroy())
}).listen(Number(listenPort), '${POD_IP}', () => console.log('relay ready'))
`

async function relay (t: Test, netns: string, port: number, from: string): Promise<void> {
  const child = spawnNodeConfined(['-e', RELAY, String(port), from], {}, { netns })
  t.teardown(() => { child.kill('SIGKILL') })
  await new Promise<void>((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => { reject(new Error(`relay did not start: ${out}`)) }, scaled(10_000))
    child.stdout.on('data', (d: Buffer) => { out += d.toString(); if (out.includes('relay ready')) { clearTimeout(timer); resolve() } })
    child.stderr.on('data', (d: Buffer) => { out += d.toString() })
  })
}

/** curl inside a namespace: status and body. */
async function curlIn (netns: string, url: string): Promise<{ status: number, body: string }> {
  const { stdout } = await run('nsenter', [`--net=/run/netns/${netns}`, 'curl', '-sS', '--max-time', String(Math.ceil(scaled(10))), '-X', 'POST', '-w', '\n%{http_code}', url])
  const at = stdout.lastIndexOf('\n')
  return { status: Number(stdout.slice(at + 1)), body: stdout.slice(0, at) }
}

const unavailable = netnsUnavailable()

t.test('no stop from outside the pod through a mesh\'s inbound hop (Istio/Kuma from 127.0.0.6, Linkerd from the pod IP); the app in the pod still stops it', { skip: unavailable ?? false }, async t => {
  const { pod, remote } = pods(t)
  const cwd = mkdtempSync(join(tmpdir(), 'cos-quit-mesh-'))
  t.teardown(() => { rmSync(cwd, { recursive: true, force: true }) })
  const s = await startSidecar({
    COS_API_URL: 'http://127.0.0.1:9', COS_ADMIN_HOST: '0.0.0.0', COS_ADMIN_PORT: String(ADMIN_PORT),
    ...writeKeyPair(cwd, 'AKIDMESH', 'mesh-SeCrEt'),
  }, { cwd, asImage: true, netns: pod })
  t.teardown(async () => { s.child.kill('SIGKILL'); await s.exited })
  await relay(t, pod, 15006, '127.0.0.6') // Istio 1.10 on, Kuma: InboundPassthroughClusterIpv4
  await relay(t, pod, 4143, POD_IP) // Linkerd 2.11 on: to the original destination, from the pod's IP

  for (const [what, url] of [
    ['directly', `http://${POD_IP}:${String(ADMIN_PORT)}/quitquitquit`],
    ['through an Istio/Kuma inbound hop (from 127.0.0.6)', `http://${POD_IP}:15006/quitquitquit`],
    ['through a Linkerd inbound hop (from the pod IP)', `http://${POD_IP}:4143/quitquitquit`],
  ] as const) {
    const res = await curlIn(remote, url)
    t.equal(res.status, 403, `a remote pod's POST ${what}: 403`)
    t.match(res.body, /"code":"forbidden_source"/, 'forbidden_source')
  }
  t.notOk(s.lines().some(l => typeof l.msg === 'string' && l.msg.includes('draining')), 'the sidecar never started draining')
  t.equal(s.child.exitCode, null, 'and is still running')

  const own = await curlIn(pod, `http://127.0.0.1:${String(ADMIN_PORT)}/quitquitquit`)
  t.equal(own.status, 202, 'the app in the pod (localhost): 202')
  await until('the sidecar exits', () => Promise.resolve(s.child.exitCode !== null), 30_000)
  t.equal(s.child.exitCode, 0, 'and the sidecar drained and exited 0')
})
