// npm run bench:ab -- [--ref <git ref>] [--workload small|get-1mib|post-1mib] [--connections 32] [--rounds 10] [--seconds 2] [--level info]
//                      [--header "name: value"] (sent with every request of the load, e.g. a traceparent)
//                      [--node <path>] [--node-args="<flags>"] [--env NAME=value] [--ref-node-args="<flags>"] [--ref-env NAME=value]
//
// Before/after for one change: this checkout's proxy (dist/) against the
// proxy built from another commit (default HEAD, i.e. the working tree
// against the last commit) and the framework floor, on a shared VM whose
// speed drifts by up to 2× within seconds. So the servers are not measured
// one after the other: all of them share the one pinned core and are loaded
// at the same moment, each by its own autocannon, round after round. Each
// round gives every server's CPU per 1,000 requests (from /proc) under the
// same conditions; the table gives the median of its per-round ratio to this
// checkout's proxy, with the range. (Loaded together, each server runs at a
// fraction of its own maximum, so the absolute figures are not those of
// `npm run bench`; the ratios are what this is for.)
//
// Calibrate first: `--ref HEAD` on a clean tree compares two identical
// builds and shows the noise (small responses, here: 0.96–1.06 over 6
// rounds). 1 MiB bodies saturate the load generator's core when three
// servers are driven at once and spread far wider (0.6–1.05 for identical
// builds): use `npm run bench` for those.
//
// The other commit is checked out in a temporary git worktree and built
// there with this checkout's node_modules (a change to the dependencies
// needs `npm run bench` instead): its bundle too when it has
// scripts/bundle.mjs. Each side runs as its own image runs it (its
// Dockerfile's file, Node flags, environment and compile cache, see
// bench/image.ts); a commit from before the bundle runs dist/cli.js, and the
// output says which ran.
//
// --node-args/--env apply to this checkout's proxy, --ref-node-args/--ref-env
// to the other's: with `--ref HEAD`, that compares Node flags or environment
// variables (e.g. --max-semi-space-size, MALLOC_ARENA_MAX) on one build.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { fixed, table } from './format.js'
import { installCleanup, scratchDir, stopAll } from './support/children.js'
import { parseWorkload, runLoad, workloadLoad } from './support/load.js'
import { choosePinning, cpuTicks, machine, pinProcess } from './support/machine.js'
import { median } from './support/measure.js'
import { parseEnv, ROOT, splitArgs, useNode } from './support/node.js'
import { startFloor, startProxy, startUpstream, thisBuild, type Server } from './support/servers.js'
import { imageBuild, type Build } from './image.js'

const { values } = parseArgs({
  options: {
    ref: { type: 'string', default: 'HEAD' },
    connections: { type: 'string', default: '32' },
    rounds: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '2' },
    level: { type: 'string', default: 'info' },
    workload: { type: 'string', default: 'small' },
    node: { type: 'string' },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    'ref-node-args': { type: 'string' },
    'ref-env': { type: 'string', multiple: true },
    header: { type: 'string', multiple: true },
  },
})
useNode(values.node)
const connections = Number(values.connections)
const rounds = Number(values.rounds)
const seconds = Number(values.seconds)
/** --header "name: value": added to every request of the workload. */
const extraHeaders = Object.fromEntries((values.header ?? []).map(h => [h.slice(0, h.indexOf(':')).trim(), h.slice(h.indexOf(':') + 1).trim()]))
const load = (workload: ReturnType<typeof parseWorkload>, url: string, duration: number): ReturnType<typeof workloadLoad> => {
  const l = workloadLoad(workload, url, connections, duration)
  return values.header === undefined ? l : { ...l, headers: { ...l.headers, ...extraHeaders } }
}
const progress = (s: string): void => { process.stderr.write(s + '\n') }

/** Builds `ref` in a temporary worktree (tsc, and its bundle when it has one); returns how its image runs it and a cleanup. */
function buildRef (ref: string): { build: Build, commit: string, remove: () => void } {
  const commit = execFileSync('git', ['rev-parse', '--short', ref], { cwd: ROOT, encoding: 'utf8' }).trim()
  const dir = mkdtempSync(join(tmpdir(), 'cos-ab-'))
  const remove = (): void => {
    try { execFileSync('git', ['worktree', 'remove', '--force', dir], { cwd: ROOT, stdio: 'ignore' }) } catch { /* already gone */ }
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    execFileSync('git', ['worktree', 'add', '--detach', dir, commit], { cwd: ROOT, stdio: 'ignore' })
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'))
    execFileSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.build.json'], { cwd: dir, stdio: 'inherit' })
    const bundler = join(dir, 'scripts', 'bundle.mjs')
    if (existsSync(bundler)) execFileSync(process.execPath, [bundler], { cwd: dir, stdio: 'inherit' })
  } catch (err) {
    remove()
    throw err
  }
  return { build: imageBuild(dir), commit, remove }
}

async function main (): Promise<void> {
  const workload = parseWorkload(values.workload)
  installCleanup()
  const m = machine()
  const pin = choosePinning(m.cores, true)
  pinProcess(process.pid, pin.loadgen)
  const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8' }).trim()
  const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: ROOT, encoding: 'utf8' }).trim() !== ''
  progress(`building ${values.ref} in a temporary worktree…`)
  const other = buildRef(values.ref)
  const scratch = scratchDir()
  try {
    const upstream = await startUpstream(pin.upstream)
    const proxy = (nodeArgs: string | undefined, env: string[] | undefined, build: Build): Promise<Server> => startProxy({
      upstreamUrl: upstream.url, logLevel: values.level, logFile: join(scratch.path, `${String(Math.random()).slice(2)}.log`), cwd: scratch.path, core: pin.sut, build,
      nodeArgs: splitArgs(nodeArgs), env: parseEnv(env),
    })
    const extras = (nodeArgs: string | undefined, env: string[] | undefined): string => [nodeArgs ?? '', ...(env ?? [])].join(' ').trim()
    const label = (name: string, nodeArgs: string | undefined, env: string[] | undefined): string => extras(nodeArgs, env) === '' ? name : `${name} ${extras(nodeArgs, env)}`
    const servers: [string, Server][] = [
      [label(`this checkout (${head}${dirty ? '+dirty' : ''})`, values['node-args'], values.env), await proxy(values['node-args'], values.env, thisBuild())],
      [label(`${values.ref} (${other.commit})`, values['ref-node-args'], values['ref-env']), await proxy(values['ref-node-args'], values['ref-env'], other.build)],
      ['floor (bare http-proxy)', await startFloor(upstream.url, pin.sut)],
    ]
    await Promise.all(servers.map(([, s]) => runLoad(load(workload, s.url, 1.5)))) // warm-up
    const ratios = servers.map(() => [] as number[])
    const cpu = servers.map(() => [] as number[])
    for (let r = 0; r < rounds; r++) {
      const before = servers.map(([, s]) => cpuTicks(s.child.pid))
      const loads = await Promise.all(servers.map(([, s]) => runLoad(load(workload, s.url, seconds))))
      const perK = servers.map(([, s], i) => (cpuTicks(s.child.pid) - (before[i] ?? 0)) * 1000 / m.clockTicks / (loads[i]?.requests ?? 1) * 1000)
      perK.forEach((v, i) => { cpu[i]?.push(v); ratios[i]?.push(v / (perK[0] ?? 1)) })
      progress(`round ${r + 1}/${rounds}: ${perK.map(v => fixed(v, 1)).join(' / ')} CPU ms per 1k requests`)
    }
    process.stdout.write([
      `# bench:ab: ${workload}, ${connections} connections per server, ${rounds} rounds × ${seconds} s, all servers loaded at once on core ${pin.sut ?? '-'}, log level ${values.level}${values.header === undefined ? '' : `, with ${values.header.join('; ')}`}`,
      `machine: ${m.cpuModel}, ${m.cores} cores, Node ${m.node}`,
      `this checkout runs ${thisBuild().description}`,
      `${values.ref} (${other.commit}) runs ${other.build.description}`,
      '',
      table(['server', 'CPU ms / 1k req (median)', 'vs this checkout (median)', 'range over rounds'],
        servers.map(([name], i) => [name, fixed(median(cpu[i] ?? []), 1), fixed(median(ratios[i] ?? []), 3) + '×',
          `${fixed(Math.min(...(ratios[i] ?? [])), 2)}–${fixed(Math.max(...(ratios[i] ?? [])), 2)}`])),
      'Below 1× costs less CPU per request than this checkout; above, more.',
    ].join('\n') + '\n')
  } finally {
    await stopAll()
    scratch.remove()
    other.remove()
  }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench:ab: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
