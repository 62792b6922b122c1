// npm run bench:connections -- [--connections 1024] [--pipelined 16] [--answer 16000] [--limit <MiB>] [--node <path>] [--node-args="<flags>"] [--metrics]
//
// What connections cost at their bounds (docs/security.md, "What one
// connection may cost"): the proxy, run as the image runs it inside a memory
// cgroup at the chart's limit (bench/cgroup.ts), gets `--connections`
// connections that each pipeline `--pipelined` GETs in one write and never
// read, against an upstream that answers each with `--answer` bytes. Every
// answer is then held in the proxy until its client reads, which none does:
// the worst a local client can make the proxy hold. Prints the cgroup's peak
// and its use once the requests have settled, per connection, OOM kills
// and whether the proxy still answers. Needs root on Linux. `--node-args` adds Node flags
// after the image's (e.g. another --max-old-space-size); `--metrics` prints the proxy's heap,
// external memory and handle figures from /metrics once the requests have settled.
import { spawn } from 'node:child_process'
import { createServer } from 'node:http'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseArgs } from 'node:util'
import { chartLimitMiB, createCgroup } from './cgroup.js'
import { nodeUnderTest, ROOT, splitArgs, useNode } from './support/node.js'
import { imageBuild } from './image.js'

const { values } = parseArgs({
  options: {
    connections: { type: 'string', default: '1024' },
    pipelined: { type: 'string', default: '16' },
    answer: { type: 'string', default: '16000' },
    limit: { type: 'string' },
    node: { type: 'string' },
    'node-args': { type: 'string' },
    metrics: { type: 'boolean', default: false },
  },
})
useNode(values.node)
const connections = Number(values.connections)
const pipelined = Number(values.pipelined)
const answer = Buffer.alloc(Number(values.answer), 'x')
const limitMiB = values.limit === undefined ? chartLimitMiB() : Number(values.limit)

async function main (): Promise<void> {
  let forwarded = 0
  const upstream = createServer((_req, res) => { forwarded++; res.end(answer) })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`
  const keys = mkdtempSync(join(tmpdir(), 'cos-connection-cost-'))
  writeFileSync(join(keys, 'access-key'), 'AKIDBENCH\n')
  writeFileSync(join(keys, 'access-key-secret'), 'bench-secret\n')
  const cgroup = createCgroup(limitMiB * 1024 * 1024, 'connections')
  const build = imageBuild(ROOT)
  const { NODE_OPTIONS: options = '', ...env } = build.env
  const node = nodeUnderTest()
  const args = [...build.nodeArgs, ...options.split(/\s+/).filter(o => o !== ''), ...splitArgs(values['node-args']), build.script, 'serve']
  const child = spawn('sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup.dir, node.path, ...args], {
    env: { PATH: process.env.PATH, ...env, COS_API_URL: upstreamUrl, COS_LISTEN_PORT: '0', COS_ADMIN_PORT: '0', COS_LOG_LEVEL: 'info', COS_MAX_CONNECTIONS: String(connections + 16), COS_ACCESS_KEY_FILE: join(keys, 'access-key'), COS_ACCESS_KEY_SECRET_FILE: join(keys, 'access-key-secret') },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const sockets: Socket[] = []
  try {
    const ports = await new Promise<{ port: number, admin: number }>((resolve, reject) => {
      let out = ''
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString()
        const m = /"port":(\d+),"admin":\{"address":"[^"]*","port":(\d+)/.exec(out)
        if (m !== null) resolve({ port: Number(m[1]), admin: Number(m[2]) })
      })
      child.once('exit', code => { reject(new Error(`the proxy exited (${String(code)})`)) })
    })
    const idle = cgroup.usage()
    const request = `GET /item HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`.repeat(pipelined)
    for (let i = 0; i < connections; i++) {
      const socket = connect({ host: '127.0.0.1', port: ports.port })
      socket.on('error', () => { /* counted below */ })
      socket.once('connect', () => { socket.pause(); socket.write(request) })
      sockets.push(socket)
      if (i % 64 === 63) await sleep(10)
    }
    for (let last = -1; forwarded !== last;) { last = forwarded; await sleep(1000) }
    const settled = cgroup.usage()
    const settledAnon = cgroup.anon()
    const kmemFile = join(cgroup.dir, 'memory.kmem.usage_in_bytes')
    const kmem = existsSync(kmemFile) ? Number(readFileSync(kmemFile, 'utf8')) : Number.NaN
    const health = await fetch(`http://127.0.0.1:${ports.admin}/healthz`).then(r => r.status, () => 0)
    if (values.metrics) {
      const text = await fetch(`http://127.0.0.1:${ports.admin}/metrics`).then(r => r.text(), () => '')
      process.stdout.write(text.split('\n').filter(l => /^(nodejs_heap_size_used_bytes|nodejs_external_memory_bytes|nodejs_active_handles_total|nodejs_heap_space_size_used_bytes|cos_auth_proxy_in_flight|process_resident)/.test(l)).join('\n') + '\n')
    }
    const alive = child.exitCode === null && child.signalCode === null
    const perConnection = (settled - idle) / connections / 1024
    process.stdout.write([
      `connection cost: ${connections} connections × ${pipelined} pipelined GETs never read, ${answer.length}-byte answers; proxy ${build.description}, Node ${node.version}, in a ${limitMiB}Mi memory cgroup (v${cgroup.version})`,
      `  forwarded to the upstream: ${forwarded} (bound: ${connections} × ${pipelined})`,
      `  cgroup: idle ${(idle / 1e6).toFixed(1)} MB, settled ${(settled / 1e6).toFixed(1)} MB (${perConnection.toFixed(1)} KiB a connection), of which anonymous ${(settledAnon / 1e6).toFixed(1)} MB and kernel ${(kmem / 1e6).toFixed(1)} MB; peak ${(cgroup.peak() / 1e6).toFixed(1)} MB, failcnt ${cgroup.failcnt()}, OOM kills ${cgroup.oomKills()}`,
      `  proxy alive: ${String(alive)}, /healthz: ${health}`,
      '',
    ].join('\n'))
  } finally {
    for (const socket of sockets) socket.destroy()
    child.kill('SIGKILL')
    await new Promise(resolve => { if (child.exitCode !== null || child.signalCode !== null) resolve(undefined); else child.once('exit', resolve) })
    cgroup.remove()
    upstream.close()
    rmSync(keys, { recursive: true, force: true })
  }
}

await main()
