// A copy of the Node binary that is not in the page cache, so that the pages a process started
// from it reads are read, and charged, inside its memory cgroup, as for the first sidecar on a
// node. A plain copy leaves the copy's pages cached (and charged to whoever wrote them); here
// the copy is flushed (conv=fdatasync) and its cached pages dropped with
// posix_fadvise(POSIX_FADV_DONTNEED), which GNU dd's `iflag=nocache count=0` issues for the
// whole file. `fincore` (util-linux), where present, says how much of it is still cached.
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'

export interface FreshBinary {
  readonly path: string
  /** MB of the copy still in the page cache after the drop (NaN without fincore). */
  readonly cachedMB: number
}

/** Bytes of `file` in the page cache, from fincore; NaN where fincore is missing. */
export function cachedBytes (file: string): number {
  try {
    const out = execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file], { encoding: 'utf8' })
    return Number(out.trim())
  } catch {
    return Number.NaN
  }
}

/** Copies `node` (or any program) into `dir` as `name` and drops the copy's pages from the page cache. */
export function freshBinary (node: string, dir: string, name = 'node-fresh'): FreshBinary {
  const path = join(dir, name)
  execFileSync('dd', [`if=${node}`, `of=${path}`, 'bs=1M', 'conv=fdatasync', 'status=none'])
  execFileSync('chmod', ['755', path])
  dropCache(path)
  return { path, cachedMB: cachedBytes(path) / 1e6 }
}

/** Drops `file`'s pages from the page cache (they must be clean: the copy was fdatasync'd). */
export function dropCache (file: string): void {
  execFileSync('dd', [`if=${file}`, 'iflag=nocache', 'count=0', 'status=none'])
}
