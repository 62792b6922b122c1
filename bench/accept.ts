// Where the tail at 256 connections came from (issue 21).
//
//   npm run bench:accept -- [--node <path>] [--targets proxy,floor,go] [--connections 256] [--seconds 6]
//
// Each server (fresh, pinned as in `npm run bench`) is warmed up on one set of
// connections, then loaded on a new set opened all at once, as `npm run
// bench` used to measure. Every 100 ms during the first 3 s the listening
// socket's accept queue (Recv-Q of `ss`) is sampled; at the end, how many of
// the requests at or over p99 were the first on their connection, how long
// first requests waited, and the p99 of all the others. libuv accepts one
// connection per event-loop turn, so a saturated Node server leaves new
// connections queued in the kernel for hundreds of turns; a Go server does not.
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import autocannon from 'autocannon'
import { fixed, table } from './format.js'
import { buildGoSigner, startGoSigner } from './go-signer.js'
import { installCleanup, scratchDir, stopAll, stopChild } from './support/children.js'
import { runLoad, SMALL_PATH } from './support/load.js'
import { choosePinning, machine, pinProcess } from './support/machine.js'
import { useNode } from './support/node.js'
import { startFloor, startProxy, startUpstream, type Server } from './support/servers.js'

const { values } = parseArgs({
  options: {
    node: { type: 'string' },
    targets: { type: 'string', default: 'proxy,floor,go' },
    connections: { type: 'string', default: '256' },
    seconds: { type: 'string', default: '6' },
  },
})
useNode(values.node)
const connections = Number(values.connections)

/** Connections waiting in the listening socket's accept queue. */
function acceptQueue (port: string): number {
  const line = execFileSync('ss', ['-ltnH', `( sport = :${port} )`], { encoding: 'utf8' }).trim().split('\n')[0] ?? ''
  return Number(line.trim().split(/\s+/)[1] ?? Number.NaN)
}

const pct = (sorted: readonly number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? Number.NaN

async function main (): Promise<void> {
  installCleanup()
  const pin = choosePinning(machine().cores, true)
  pinProcess(process.pid, pin.loadgen)
  const scratch = scratchDir()
  const rows: (string | number)[][] = []
  try {
    const targets = values.targets.split(',')
    const go = targets.includes('go') ? buildGoSigner(scratch.path) : undefined
    const upstream = await startUpstream(pin.upstream)
    for (const target of targets) {
      if (target === 'go' && (go === undefined || !('binary' in go))) continue
      const server: Server = target === 'floor'
        ? await startFloor(upstream.url, pin.sut)
        : target === 'go' && go !== undefined && 'binary' in go
          ? await startGoSigner({ binary: go.binary, upstreamUrl: upstream.url, core: pin.sut })
          : await startProxy({ upstreamUrl: upstream.url, logLevel: 'info', logFile: join(scratch.path, 'proxy.log'), cwd: scratch.path, core: pin.sut })
      await runLoad({ url: server.url + SMALL_PATH, connections, duration: 1.5 })
      const port = new URL(server.url).port
      const queue: number[] = []
      const sampler = setInterval(() => { queue.push(acceptQueue(port)) }, 100)
      setTimeout(() => { clearInterval(sampler) }, 3000)
      const seen = new Set<unknown>()
      const firsts: number[] = []
      const all: { ms: number, first: boolean }[] = []
      const run = autocannon({ url: server.url + SMALL_PATH, connections, duration: Number(values.seconds), pipelining: 1, timeout: 30 })
      run.on('response', (client: unknown, _status: number, _bytes: number, ms: number) => {
        const first = !seen.has(client)
        seen.add(client)
        if (first) firsts.push(ms)
        all.push({ ms, first })
      })
      await run
      clearInterval(sampler)
      await stopChild(server.child)
      const sorted = all.map(x => x.ms).sort((a, b) => a - b)
      const p99 = pct(sorted, 0.99)
      const others = all.filter(x => !x.first).map(x => x.ms).sort((a, b) => a - b)
      firsts.sort((a, b) => a - b)
      rows.push([target, all.length, fixed(pct(sorted, 0.5)), fixed(p99), `${all.filter(x => x.ms >= p99 && x.first).length} / ${all.filter(x => x.ms >= p99).length}`,
        `${fixed(pct(firsts, 0.5))} / ${fixed(firsts.at(-1) ?? Number.NaN)}`, fixed(pct(others, 0.99)), Math.max(...queue), queue.join(' ')])
      process.stderr.write(`${target}: done\n`)
    }
  } finally {
    await stopAll()
    scratch.remove()
  }
  process.stdout.write(`# ${connections} new connections opened at once against a warmed-up server, ${values.seconds} s\n\n` +
    table(['server', 'responses', 'p50 ms', 'p99 ms', 'first on their connection, of those ≥ p99', 'first requests p50 / max ms', 'p99 of the others ms', 'accept queue max', 'accept queue every 100 ms'], rows) + '\n')
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench:accept: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
