// Whether a test can have a real Linux memory cgroup (bench/cgroup.ts) here:
// the tests that run the proxy inside one skip, saying why, where it cannot.
import { createCgroup } from '../../bench/cgroup.js'

/** Why no cgroup of `limitBytes` can be made here, or undefined when one can (made and removed again to find out). */
export function cgroupUnavailable (limitBytes: number): string | undefined {
  if (process.platform !== 'linux') return `memory cgroups are Linux's (this is ${process.platform})`
  try {
    createCgroup(limitBytes, 'probe').remove()
    return undefined
  } catch (err) {
    return `no memory cgroup can be made here (${(err as Error).message}): run as root on Linux with the memory controller`
  }
}
