// A Linux memory cgroup made for one run, as the kubelet makes one for a
// container: v1 (/sys/fs/cgroup/memory, `memory.limit_in_bytes`) or v2
// (/sys/fs/cgroup with cgroup.controllers, `memory.max`), no swap. Used by
// `npm run bench:soak` and by the memory test of the security suite
// (test/security/memory-cgroup.test.ts). Needs root or a writable cgroup tree.
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

const read = (file: string): string => readFileSync(file, 'utf8')
const field = (text: string, name: string): number => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(text)?.[1] ?? Number.NaN)

/** The chart's resources.limits.memory, in MiB. */
export function chartLimitMiB (): number {
  const text = readFileSync(join(ROOT, 'helm', 'cos-auth-proxy', 'values.yaml'), 'utf8')
  const m = /^resources:\n(?:[ #].*\n)*?\s+limits:\n(?:\s+\w+:.*\n)*?\s+memory:\s*"?(\d+)Mi"?/m.exec(text)
  if (m?.[1] === undefined) throw new Error('no resources.limits.memory in helm/cos-auth-proxy/values.yaml')
  return Number(m[1])
}

export interface Cgroup {
  readonly version: 1 | 2
  readonly dir: string
  /** Bytes charged now. */
  usage: () => number
  /** Peak bytes charged since creation. */
  peak: () => number
  /** v1 memory.failcnt; v2 memory.events `max`. */
  failcnt: () => number
  oomKills: () => number
  /** Bytes of inactive file pages (usage less this is the kubelet's working set). */
  inactiveFile: () => number
  /** Anonymous bytes charged. */
  anon: () => number
  remove: () => void
}

export function createCgroup (limitBytes: number, purpose = 'soak'): Cgroup {
  const name = `cos-auth-proxy-${purpose}-${process.pid}`
  const remover = (dir: string) => (): void => {
    // The processes are gone (stopAll awaited them); an emptied cgroup may take a moment to be released.
    for (let i = 0; i < 50 && existsSync(dir); i++) {
      try { rmdirSync(dir) } catch { Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100) }
    }
    if (existsSync(dir)) process.stderr.write(`${purpose}: could not remove ${dir}: remove it with rmdir once its processes are gone\n`)
  }
  /** Makes the group and writes its limit files (the optional ones where the kernel has them); removed again if a write fails. */
  const made = (dir: string, limit: string, optional: readonly [file: string, value: string]): () => void => {
    mkdirSync(dir)
    const remove = remover(dir)
    try {
      writeFileSync(join(dir, limit), String(limitBytes))
      if (existsSync(join(dir, optional[0]))) writeFileSync(join(dir, optional[0]), optional[1])
    } catch (err) {
      remove()
      throw err
    }
    return remove
  }
  if (existsSync('/sys/fs/cgroup/memory/memory.limit_in_bytes')) {
    const dir = join('/sys/fs/cgroup/memory', name)
    // No swap for a container (the kubelet's default): memory+swap at the same limit.
    const remove = made(dir, 'memory.limit_in_bytes', ['memory.memsw.limit_in_bytes', String(limitBytes)])
    return {
      version: 1,
      dir,
      usage: () => Number(read(join(dir, 'memory.usage_in_bytes'))),
      peak: () => Number(read(join(dir, 'memory.max_usage_in_bytes'))),
      failcnt: () => Number(read(join(dir, 'memory.failcnt'))),
      oomKills: () => field(read(join(dir, 'memory.oom_control')), 'oom_kill'),
      inactiveFile: () => field(read(join(dir, 'memory.stat')), 'total_inactive_file'),
      anon: () => field(read(join(dir, 'memory.stat')), 'total_rss'),
      remove,
    }
  }
  if (existsSync('/sys/fs/cgroup/cgroup.controllers')) {
    const dir = join('/sys/fs/cgroup', name)
    const remove = made(dir, 'memory.max', ['memory.swap.max', '0'])
    return {
      version: 2,
      dir,
      usage: () => Number(read(join(dir, 'memory.current'))),
      peak: () => existsSync(join(dir, 'memory.peak')) ? Number(read(join(dir, 'memory.peak'))) : Number.NaN,
      failcnt: () => field(read(join(dir, 'memory.events')), 'max'),
      oomKills: () => field(read(join(dir, 'memory.events')), 'oom_kill'),
      inactiveFile: () => field(read(join(dir, 'memory.stat')), 'inactive_file'),
      anon: () => field(read(join(dir, 'memory.stat')), 'anon'),
      remove,
    }
  }
  throw new Error('no memory cgroup controller found under /sys/fs/cgroup (cgroup v1 memory or v2 with memory enabled)')
}

