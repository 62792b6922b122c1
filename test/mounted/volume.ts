// A mounted volume as the test drives it, in the ways files are replaced in
// the field: Kubernetes' atomic writer (a new `..<timestamp>` directory, a
// `..data` symlink renamed over the old one, the visible files symlinks
// through it), a rename over the file, a truncate then a write, one file of a
// pair at a time, a file deleted and back, and files reached through
// symlinks into a directory nobody watches (no event where the watcher looks).
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

export type Contents = Readonly<Record<string, string>>

export class Volume {
  #generation = 0

  /** `dir` holds the files a consumer is pointed at. */
  constructor (readonly dir: string) {
    mkdirSync(dir, { recursive: true })
  }

  path (name: string): string {
    return join(this.dir, name)
  }

  /** In place, one file after the other (docker, a local edit). */
  writeInPlace (files: Contents): void {
    for (const [name, text] of Object.entries(files)) writeFileSync(this.path(name), text)
  }

  /** Kubernetes' atomic writer: every file changes at once, by one rename of `..data`. */
  swapData (files: Contents): void {
    const stamp = `..2026_11_29_${String(++this.#generation).padStart(4, '0')}`
    mkdirSync(join(this.dir, stamp))
    for (const [name, text] of Object.entries(files)) writeFileSync(join(this.dir, stamp, name), text)
    const old = readdirSync(this.dir).filter(e => e.startsWith('..2026') && e !== stamp)
    symlinkSync(stamp, join(this.dir, '..data_tmp'))
    renameSync(join(this.dir, '..data_tmp'), join(this.dir, '..data'))
    for (const name of Object.keys(files)) {
      if (!existsSync(this.path(name))) symlinkSync(join('..data', name), this.path(name))
    }
    for (const dir of old) rmSync(join(this.dir, dir), { recursive: true, force: true })
  }

  /** Each file written beside it and renamed over it. */
  renameOver (files: Contents): void {
    for (const [name, text] of Object.entries(files)) {
      const tmp = this.path(`.${name}.tmp`)
      writeFileSync(tmp, text)
      renameSync(tmp, this.path(name))
    }
  }

  /** Every file emptied first, then written (a tool that opens with O_TRUNC). */
  truncate (names: readonly string[]): void {
    for (const name of names) truncateSync(this.path(name), 0)
  }

  remove (names: readonly string[]): void {
    for (const name of names) rmSync(this.path(name), { force: true })
  }

  chmod (names: readonly string[], mode: number): void {
    for (const name of names) chmodSync(this.path(name), mode)
  }

  /** The directory and its files handed to `uid` (the permission case, run as root). */
  chown (names: readonly string[], uid: number): void {
    chownSync(this.dir, uid, uid)
    for (const name of names) chownSync(this.path(name), uid, uid)
  }

  /** The files as symlinks into `real` (a directory nobody watches): writing there makes no event in `dir`. */
  linkTo (real: Volume, names: readonly string[]): void {
    for (const name of names) symlinkSync(real.path(name), this.path(name))
  }
}
