// Token minting (bench/mint.ts), in its own process on the measured core.
import { join } from 'node:path'
import type { MintResult } from '../mint.js'
import { spawnNode } from '../support/children.js'
import { noiseProbe } from '../support/machine.js'
import { BENCH_DIR } from '../support/node.js'
import type { Context } from './context.js'

export type Minted = MintResult & { readonly otherLoad: number }

export async function mint (ctx: Context): Promise<Minted> {
  await ctx.noise.settle()
  const child = spawnNode('mint', join(BENCH_DIR, 'mint.ts'), ctx.quick ? ['--json', '--quick'] : ['--json'], {
    nodeArgs: ['--import', 'tsx'],
    ...(ctx.pin.sut === undefined ? {} : { core: ctx.pin.sut }),
  })
  const others = noiseProbe([child.pid], ctx.machine.clockTicks)
  let out = ''
  child.proc.stdout?.setEncoding('utf8')
  child.proc.stdout?.on('data', (s: string) => { out += s })
  // Read before it exits: /proc/<pid> goes with the process.
  let otherLoad = 0
  const timer = setInterval(() => { try { otherLoad = others() } catch { /* exited */ } }, 100)
  await child.exited
  clearInterval(timer)
  if (child.exitCode !== 0) throw new Error('the minting micro-benchmark failed')
  return { ...(JSON.parse(out) as MintResult), otherLoad }
}
