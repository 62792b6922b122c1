// npm run bench [-- --quick] [-- --no-pin]
//
// The benchmark of issue 6: the real proxy (as a child process, run as the
// image runs it: the bundle with the Dockerfile's Node flags, environment
// and warm compile cache, see bench/image.ts) against the framework floor (a bare @fastify/http-proxy, bench/floor.mjs)
// and against the upstream itself, all on 127.0.0.1, driven by autocannon.
// Tables go to stdout, progress to stderr, everything to
// bench/results/<timestamp>.json and bench/results/latest.json (a --quick
// run: <timestamp>-quick.json and latest-quick.json).
//
// Each throughput figure is a fresh server process (so VmHWM is that
// scenario's peak RSS), warmed up, then measured; targets are interleaved
// (proxy, floor, direct, proxy with every request line) and the whole round repeated; the
// tables give medians over the rounds. On a shared machine, the CPU other
// processes use during each measurement is recorded; a full run waits for a
// quiet moment before each measurement and repeats one that was disturbed.
//
// This file reads the flags and runs the sections in order; each section is
// a file of bench/sections/ (see bench/README.md).
import { existsSync } from 'node:fs'
import { resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { imageBuild, type Build } from './image.js'
import { SECTIONS, FULL, QUICK, Noise, progress, type Context, type Section } from './sections/context.js'
import { idleFootprint } from './sections/idle.js'
import { mint } from './sections/mint.js'
import { fixedRate } from './sections/rate.js'
import { report } from './sections/report.js'
import { goYardstick } from './sections/servers.js'
import { rssSoak } from './sections/soak.js'
import { bigBodies, smallResponses } from './sections/throughput.js'
import { installCleanup, scratchDir, stopAll } from './support/children.js'
import { choosePinning, machine, pinProcess } from './support/machine.js'
import { gitCommit, parseEnv, splitArgs, useNode } from './support/node.js'
import { bare, startUpstream, thisBuild } from './support/servers.js'

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    'no-pin': { type: 'boolean', default: false },
    node: { type: 'string' },
    cli: { type: 'string' },
    checkout: { type: 'string' },
    bare: { type: 'boolean', default: false },
    'node-args': { type: 'string' },
    env: { type: 'string', multiple: true },
    sections: { type: 'string', default: SECTIONS.join(',') },
    warmup: { type: 'string' },
    help: { type: 'boolean', default: false },
  },
})
if (flags.help) {
  process.stdout.write([
    'usage: npm run bench [-- --quick] [-- --no-pin] [-- --node <path>] [-- --node-args "<flags>"] [-- --env NAME=value …] [-- --sections idle,small,…]',
    '  --quick       1 round, short runs: a few minutes',
    '  --no-pin      do not pin processes to cores with taskset',
    '  --node        the Node binary every server runs on (default: BENCH_NODE, else the one running the bench)',
    '  --checkout    another built checkout to measure as the proxy, run as its own image runs it (e.g. a worktree of the commit before a change)',
    '  --cli         this file as the proxy instead of the bundle, with the image\'s flags and environment (e.g. dist/cli.js)',
    '  --bare        without the image\'s Node flags and environment',
    '  --node-args   Node flags for the proxy only, after the image\'s, with "=": --node-args="--max-semi-space-size=8"',
    '  --env         added to the proxy\'s environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)',
    `  --sections    which parts to run (default all: ${SECTIONS.join(',')})`,
    '  --warmup      seconds of warm-up before each small-response run (default 1.5): on a slower machine the JIT needs longer',
    '',
  ].join('\n'))
  process.exit(0)
}
useNode(flags.node)
const proxyNodeArgs = splitArgs(flags['node-args'])
const proxyExtraEnv = parseEnv(flags.env)
const proxyBuild = ((): Build => {
  const image = flags.checkout === undefined ? thisBuild() : imageBuild(resolve(flags.checkout))
  const chosen = flags.cli === undefined ? image : { ...image, script: resolve(flags.cli), description: `${resolve(flags.cli)} with the flags and environment of ${image.description}` }
  return flags.bare ? bare(chosen) : chosen
})()
const sections = new Set(flags.sections.split(',').map(x => x.trim()).filter(x => x !== ''))
for (const x of sections) if (!SECTIONS.includes(x as Section)) throw new Error(`--sections: unknown ${JSON.stringify(x)} (choices: ${SECTIONS.join(', ')})`)
const runs = (x: Section): boolean => sections.has(x)

const settings = { ...(flags.quick ? QUICK : FULL), ...(flags.warmup === undefined ? {} : { warmupSeconds: Number(flags.warmup) }) }
if (!(settings.warmupSeconds >= 0)) throw new Error('--warmup takes a number of seconds')

async function main (): Promise<void> {
  installCleanup()
  if (!existsSync(proxyBuild.script)) throw new Error(`${proxyBuild.script} is missing: run \`npm run build\` first (npm run bench does)`)
  const started = new Date()
  const m = machine()
  const pin = choosePinning(m.cores, !flags['no-pin'])
  pinProcess(process.pid, pin.loadgen)
  const commit = gitCommit()
  const mode = flags.quick ? `quick: ${settings.rounds} round, ${settings.seconds} s runs (indicative only)` : `full: ${settings.rounds} rounds, ${settings.seconds} s runs after ${settings.warmupSeconds} s warm-up`
  progress(`cos-auth-proxy benchmark (${mode})\n  ${m.cpuModel}, ${m.cores} cores, Node ${m.node}\n  ${pin.description}`)

  const scratch = scratchDir()
  const timings: Record<string, number> = {}
  const timed = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
    const t = performance.now()
    progress(`${name}…`)
    try { return await fn() } finally { timings[name] = (performance.now() - t) / 1000 }
  }
  try {
    const goSigner = !(['idle', 'small', 'big', 'rate'] as const).some(runs) ? { skipped: 'not in these sections' } : await timed('Go signer: build and check', () => goYardstick(scratch.path))
    const upstream = await startUpstream(pin.upstream)
    const noise = new Noise(settings.noiseBudgetSeconds * 1000, m.clockTicks)
    const ctx: Context = {
      machine: m, pin, upstream, scratch: scratch.path, noise, goSigner, settings, quick: flags.quick,
      proxy: { build: proxyBuild, nodeArgs: proxyNodeArgs, extraEnv: proxyExtraEnv },
    }
    // The peers measured beside the proxy: the floor, and the Go signer when it could be built.
    const peers = 'binary' in goSigner ? ['floor', 'go'] as const : ['floor'] as const

    const idleRuns = !runs('idle') ? [] : await timed('idle footprint and start-up', () => idleFootprint(ctx, peers))
    const smallRuns = !runs('small') ? [] : await timed('small responses', () => smallResponses(ctx, peers))
    const bigRuns = !runs('big') ? [] : await timed('1 MiB bodies', () => bigBodies(ctx, peers))
    const rateRuns = !runs('rate') ? [] : await timed('fixed rate', () => fixedRate(ctx, peers))
    const soaks = !runs('soak') ? [] : await timed('RSS soak', () => rssSoak(ctx))
    const minted = !runs('mint') ? undefined : await timed('token minting', () => mint(ctx))
    await stopAll()

    // Only a run of every section, with this checkout's proxy as its image runs it, may become latest.json.
    const complete = sections.size === SECTIONS.length && flags.cli === undefined && flags.checkout === undefined && !flags.bare && proxyNodeArgs.length === 0 && Object.keys(proxyExtraEnv).length === 0
    report(ctx, { started, commit, mode, timings, runs, complete }, { idleRuns, smallRuns, bigRuns, rateRuns, soaks, minted })
  } finally {
    await stopAll()
    scratch.remove()
  }
}

main().catch(async (err: unknown) => {
  process.stderr.write(`bench: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  await stopAll()
  process.exit(1)
})
