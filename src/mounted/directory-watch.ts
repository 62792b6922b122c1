// The directories that hold some mounted files, watched for anything that
// may have changed them. Kubernetes updates a Secret or ConfigMap volume by
// writing a new timestamped directory and renaming a `..data` symlink over
// the old one; the visible files are symlinks through `..data`, replaced,
// never written. So the directories are watched, not the files, and only
// events for the files' names or `..`-entries count (the directory may be a
// busy one such as /tmp). A directory deleted and created again is a new
// directory (dev:ino): `refresh()` watches it again. Events only say "look
// again", after a short debounce: a `..data` swap alone makes several.
import { statSync, watch, type FSWatcher } from 'node:fs'
import { basename, dirname } from 'node:path'
import type { FastifyBaseLogger } from 'fastify'

/** One look for a burst of events. */
export const DEBOUNCE_MS = 20

interface WatchedDir {
  readonly watcher: FSWatcher
  /** dev:ino when the watch began. */
  readonly identity: string
}

export class DirectoryWatch {
  readonly #dirs: readonly string[]
  readonly #names: ReadonlySet<string>
  readonly #watched = new Map<string, WatchedDir>()
  #debounce: NodeJS.Timeout | undefined
  #closed = false

  /** `what` names the files in debug lines ("credentials"); `onChange` is called after DEBOUNCE_MS. */
  constructor (paths: readonly string[], private readonly what: string, private readonly logger: FastifyBaseLogger, private readonly onChange: () => void) {
    this.#dirs = [...new Set(paths.map(p => dirname(p)))]
    this.#names = new Set(paths.map(p => basename(p)))
  }

  /** Watches each directory that exists and is not watched yet (or was replaced). Cheap: one stat each. */
  refresh (): void {
    if (this.#closed) return
    for (const dir of this.#dirs) {
      const identity = dirIdentity(dir)
      const held = this.#watched.get(dir)
      if (held?.identity === identity) continue
      held?.watcher.close()
      this.#watched.delete(dir)
      // Not there yet: the poll covers it, and watches it once it appears.
      if (identity === undefined) continue
      try {
        const watcher = watch(dir, { persistent: false }, (_event, filename) => { this.#onEvent(filename) })
        watcher.on('error', (err: unknown) => {
          this.logger.debug({ err, dir }, `${this.what}: directory watch failed; re-reading periodically`)
          watcher.close()
          if (this.#watched.get(dir)?.watcher === watcher) this.#watched.delete(dir)
        })
        this.#watched.set(dir, { watcher, identity })
      } catch (err) {
        // e.g. no inotify watches left on the node (ENOSPC): the poll carries on alone.
        this.logger.debug({ err, dir }, `${this.what}: cannot watch directory; re-reading periodically`)
      }
    }
  }

  close (): void {
    this.#closed = true
    clearTimeout(this.#debounce)
    for (const { watcher } of this.#watched.values()) watcher.close()
    this.#watched.clear()
  }

  #onEvent (filename: string | null): void {
    if (filename !== null && !this.#names.has(filename) && !filename.startsWith('..')) return
    if (this.#closed || this.#debounce !== undefined) return
    this.#debounce = setTimeout(() => {
      this.#debounce = undefined
      this.onChange()
    }, DEBOUNCE_MS).unref()
  }
}

function dirIdentity (dir: string): string | undefined {
  try {
    const s = statSync(dir)
    return s.isDirectory() ? `${s.dev}:${s.ino}` : undefined
  } catch {
    return undefined
  }
}
