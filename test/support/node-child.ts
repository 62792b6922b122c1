// Node child processes of the tests (the bundle, as users run it), started so
// that they cost what they cost users and never outlive the test:
//  - without tap's process-info hook: tap puts it in NODE_OPTIONS of every
//    child (for coverage, which this suite does not collect), and it adds
//    ~0.1 s to each start on a quiet machine, ~0.7 s on a busy one;
//  - killed when the test process exits, whatever the reason, and on Linux
//    (setpriv --pdeathsig) killed by the kernel when the test process dies
//    without running anything, as when tap's timeout kills a test file.
import { spawn, type ChildProcessWithoutNullStreams, type SpawnOptionsWithoutStdio } from 'node:child_process'
import { existsSync } from 'node:fs'

const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find(path => existsSync(path))
const ENV = ['/usr/bin/env', '/bin/env'].find(path => existsSync(path)) ?? 'env'

const live = new Set<ChildProcessWithoutNullStreams>()
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL')
})

/** The argv that runs `node args` as spawnNode does: a shell's `exec "$@"` can take it. */
export function nodeArgv (args: readonly string[], setpriv: readonly string[] = []): string[] {
  if (SETPRIV === undefined && setpriv.length > 0) throw new Error(`setpriv ${setpriv.join(' ')}: no setpriv on this machine`)
  return [...(SETPRIV === undefined ? [] : [SETPRIV, '--pdeathsig', 'KILL', ...setpriv, '--']), ENV, '-u', 'NODE_OPTIONS', process.execPath, ...args]
}

/** `node args` as a child of this test; its pid is node's (each wrapper execs the next); `setpriv`: more of its options (Linux). */
export function spawnNode (args: readonly string[], options: SpawnOptionsWithoutStdio = {}, setpriv: readonly string[] = []): ChildProcessWithoutNullStreams {
  const [command = ENV, ...rest] = nodeArgv(args, setpriv)
  return track(spawn(command, rest, options))
}

/** A child started some other way (a shell that execs node), killed with the test process all the same. */
export function track (child: ChildProcessWithoutNullStreams): ChildProcessWithoutNullStreams {
  live.add(child)
  child.once('exit', () => { live.delete(child) })
  return child
}

/** Limits a child takes on before node starts, as a container's are. */
export interface Confinement {
  /** Soft limit on open descriptors (`ulimit -n`). */
  readonly fdLimit?: number | undefined
  /** A cgroup directory (bench/cgroup.ts) joined before node starts, so that everything it allocates is charged there. */
  readonly cgroupDir?: string | undefined
  /** A network namespace (`ip netns add NAME`) to run in, entered with nsenter as a pod's containers share one. */
  readonly netns?: string | undefined
}

/** spawnNode, through a shell that applies `confine` and then execs node: signals and /proc/<pid> are node's. */
export function spawnNodeConfined (args: readonly string[], options: SpawnOptionsWithoutStdio, confine: Confinement): ChildProcessWithoutNullStreams {
  if (confine.fdLimit === undefined && confine.cgroupDir === undefined && confine.netns === undefined) return spawnNode(args, options)
  const steps = [
    ...(confine.fdLimit === undefined ? [] : [`ulimit -n ${String(confine.fdLimit)}`]),
    ...(confine.cgroupDir === undefined ? [] : ['echo $$ > "$0/cgroup.procs"']),
    confine.netns === undefined ? 'exec "$@"' : `exec nsenter --net=/run/netns/${confine.netns} "$@"`,
  ]
  return track(spawn('/bin/sh', ['-c', steps.join(' && '), confine.cgroupDir ?? 'sh', ...nodeArgv(args)], options))
}
