// A mounted volume as the test drives it, in the ways files are replaced in
// the field: Kubernetes' atomic writer (a new `..<timestamp>` directory, a
// `..data` symlink renamed over the old one, the visible files symlinks
// through it), a rename over the file, a truncate then a write, one file of a
// pair at a time, a file deleted and back, and files reached through
// symlinks into a directory nobody watches (no event where the watcher looks).
// The secret stores' own writers, step for step from their sources: the
// Secrets Store CSI driver's copy of the atomic writer and consul-template's
// AtomicWrite (Vault Agent's templates).
import { randomInt } from 'node:crypto'
import { chmodSync, chownSync, closeSync, constants, existsSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readdirSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, truncateSync, writeFileSync, writeSync } from 'node:fs'
import { basename } from 'node:path'
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

  /**
   * The Secrets Store CSI driver (v0.0.22 on, pkg/util/fileutil/atomic_writer.go,
   * the kubelet's writer of v1.20.6): a `..YYYY_MM_DD_HH_MM_SS.<random>`
   * directory (MkdirTemp, then 0755), each file written with the provider's
   * mode, the visible symlinks made *before* `..data` is renamed, then the old
   * directory removed.
   */
  csiDriverSwap (files: Contents, mode = 0o644): void {
    const oldTs = existsSync(join(this.dir, '..data')) ? readlinkSync(join(this.dir, '..data')) : undefined
    const ts = mkdtempSync(join(this.dir, `..2026_11_29_08_${String(++this.#generation).padStart(2, '0')}_00.`))
    chmodSync(ts, 0o755)
    for (const [name, text] of Object.entries(files)) {
      writeFileSync(join(ts, name), text, { mode })
      chmodSync(join(ts, name), mode)
    }
    for (const name of Object.keys(files)) {
      if (!existsSync(this.path(name))) symlinkSync(join('..data', name), this.path(name))
    }
    symlinkSync(basename(ts), join(this.dir, '..data_tmp'))
    renameSync(join(this.dir, '..data_tmp'), join(this.dir, '..data'))
    if (oldTs !== undefined) rmSync(join(this.dir, oldTs), { recursive: true, force: true })
  }

  /**
   * consul-template's AtomicWrite (renderer/renderer.go), one template: a temp
   * file beside the target (os.CreateTemp(dir, ""): a random decimal name,
   * O_EXCL, mode 0600), written, fsync'd, closed, chmod'ed to the template's
   * perms (else the target's mode, else 0644), then renamed over the target.
   */
  renderTemplate (name: string, text: string, perms?: number): void {
    let tmp: string
    let fd: number
    for (;;) {
      tmp = this.path(String(randomInt(2 ** 32)))
      try {
        fd = openSync(tmp, constants.O_RDWR | constants.O_CREAT | constants.O_EXCL, 0o600)
        break
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
      }
    }
    writeSync(fd, text)
    fsyncSync(fd)
    closeSync(fd)
    const existing = existsSync(this.path(name)) ? statSync(this.path(name)).mode & 0o7777 : 0o644
    chmodSync(tmp, perms ?? existing)
    renameSync(tmp, this.path(name))
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
