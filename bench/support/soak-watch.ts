// What `bench:soak` watches in the proxy while the load runs: its memory
// sampled once a second (RSS, anonymous RSS, the cgroup's usage and working
// set: usage less inactive file pages, the kubelet's figure), reported every
// 30 s, and whether the process is still there; and V8's heap limit as Node
// computes it under the proxy's flags, environment and cgroup.
import { execFileSync } from 'node:child_process'
import type { Cgroup } from '../cgroup.js'
import { fixed } from '../format.js'
import type { Build } from '../image.js'
import { vmMB } from './machine.js'
import { nodeUnderTest } from './node.js'

const MiB = 1024 * 1024

export type Phase = 'soak' | 'burst' | 'attacks'
export interface Sample { readonly s: number, readonly phase: Phase, readonly usageMB: number, readonly workingSetMB: number, readonly rssMB: number, readonly anonMB: number }

export interface Watch {
  readonly samples: Sample[]
  /** The phase the next samples belong to. */
  phase: Phase
  /** False once /proc/<pid> could not be read: the proxy died. */
  readonly alive: boolean
  stop: () => void
}

export function watchMemory (pid: number, cgroup: Cgroup | undefined, progress: (s: string) => void): Watch {
  const t0 = performance.now()
  let lastReport = 0
  const w = { samples: [] as Sample[], phase: 'soak' as Phase, alive: true, stop: () => { clearInterval(timer) } }
  const timer = setInterval(() => {
    const s = (performance.now() - t0) / 1000
    try {
      const usage = cgroup?.usage() ?? Number.NaN
      const sample = { s, phase: w.phase, usageMB: usage / 1e6, workingSetMB: (usage - (cgroup?.inactiveFile() ?? 0)) / 1e6, rssMB: vmMB(pid, 'VmRSS'), anonMB: vmMB(pid, 'RssAnon') }
      w.samples.push(sample)
      if (s - lastReport >= 30) {
        lastReport = s
        progress(`  ${fixed(s, 0).padStart(4)} s: RSS ${fixed(sample.rssMB, 1)} MB (anon ${fixed(sample.anonMB, 1)})${cgroup === undefined ? '' : `, cgroup usage ${fixed(sample.usageMB, 1)} MB, working set ${fixed(sample.workingSetMB, 1)} MB, failcnt ${cgroup.failcnt()}, OOM kills ${cgroup.oomKills()}`}`)
      }
    } catch {
      w.alive = false // /proc/<pid> is gone: the proxy died
    }
  }, 1000)
  return w
}

/** V8's heap limit in MiB, read by a Node with the proxy's own flags and environment in the same cgroup (NaN if that fails). */
export function heapLimitMiB (build: Build, nodeArgs: readonly string[], env: Readonly<Record<string, string>>, cgroupDir: string | undefined): number {
  try {
    const probeEnv = { PATH: process.env.PATH, ...build.env, ...env }
    const args = [...build.nodeArgs, ...nodeArgs, '-p', 'require("v8").getHeapStatistics().heap_size_limit']
    const node = nodeUnderTest().path
    const [cmd, argv] = cgroupDir === undefined ? [node, args] : ['sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroupDir, node, ...args]]
    return Number(execFileSync(cmd, argv, { env: probeEnv, encoding: 'utf8' }).trim()) / MiB
  } catch { return Number.NaN }
}
