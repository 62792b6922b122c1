// Reading a small file an operator mounts (the key pair, TLS material) without
// trusting what is at the path. A FIFO, a device or a huge file there is a
// mistake to report, not something to wait on or load into memory:
//  - opened non-blocking, so a FIFO with no writer cannot hang the open;
//  - the opened descriptor is fstat'ed (no stat-then-open race) and anything
//    but a regular file is refused, as is one larger than the bound;
//  - at most bound + 1 bytes are ever read, however large the file is or grows.
// The sync and async readers differ only in their system calls; the checks
// and the buffer are shared.
import { closeSync, constants, fstatSync, openSync, readSync, statSync, type Stats } from 'node:fs'
import { open } from 'node:fs/promises'

/** Why a file was refused unread; a fixed set, fit for a metric label. */
export type FileRefusal = 'not_a_regular_file' | 'too_large'

export type FileRead =
  | { readonly ok: true, readonly text: string }
  | { readonly ok: false, readonly problem: string, readonly refusal?: FileRefusal }

// O_NOCTTY: a terminal at the path never becomes the controlling terminal.
// (Windows has neither flag; `| undefined` is `| 0` there.)
const OPEN_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY

function kindOf (s: Stats): string {
  if (s.isDirectory()) return 'a directory'
  if (s.isFIFO()) return 'a FIFO'
  if (s.isCharacterDevice() || s.isBlockDevice()) return 'a device'
  if (s.isSocket()) return 'a socket'
  return 'something else'
}

/** The refusal for what fstat says is at the path, if any. Problems name the path, never contents. */
function refusalOf (path: string, s: Stats, maxBytes: number): FileRead | undefined {
  if (!s.isFile()) return { ok: false, refusal: 'not_a_regular_file', problem: `${JSON.stringify(path)} is ${kindOf(s)}, not a regular file` }
  if (s.size > maxBytes) return tooLarge(path, maxBytes)
  return undefined
}

function tooLarge (path: string, maxBytes: number): FileRead {
  return { ok: false, refusal: 'too_large', problem: `${JSON.stringify(path)} is larger than ${maxBytes} bytes` }
}

function unreadable (path: string, err: unknown): FileRead {
  // The error code only: a message could quote file contents in odd cases.
  const code = (err as NodeJS.ErrnoException).code ?? 'error'
  return { ok: false, problem: `cannot read ${JSON.stringify(path)} (${code})${code === 'EACCES' ? permissionHint(path) : ''}` }
}

/**
 * Who may not read what, and the fix: the file's owner and mode against the
 * user this process runs as (65532 in the image, which is not root). Read
 * only on a refusal; stat follows the symlinks a Secret volume is made of.
 */
export function permissionHint (path: string): string {
  let file = ''
  try {
    const s = statSync(path)
    file = ` is owned by uid ${String(s.uid)} gid ${String(s.gid)} with mode ${(s.mode & 0o777).toString(8).padStart(4, '0')}, and`
  } catch {
    // A directory on the way is closed to us: the process's identity still helps.
  }
  const gids = process.getgroups?.() ?? []
  const user = process.getuid === undefined ? 'this user' : `uid ${String(process.getuid())} gid ${String(process.getgid?.())}${gids.length > 0 ? ` (groups ${gids.join(',')})` : ''}`
  return `: the file${file} this process runs as ${user}; make it readable to that user or group (Kubernetes: the Secret volume's defaultMode, e.g. 0440, with the pod's securityContext.fsGroup; elsewhere chmod/chown)`
}

/**
 * Collects at most maxBytes + 1 bytes: one byte past the bound says "too
 * large" without reading on. Sized from fstat so a small file gets a small
 * buffer; a file that grew since gets room up to the bound.
 */
class BoundedBuffer {
  buffer: Buffer
  filled = 0
  #ended = false

  constructor (readonly path: string, readonly maxBytes: number, size: number) {
    this.buffer = Buffer.alloc(Math.min(size, maxBytes) + 1)
  }

  /** How many bytes to ask for next, at offset `filled`; 0 when done. */
  wanted (): number {
    if (this.#ended || this.filled > this.maxBytes) return 0
    if (this.filled === this.buffer.length) {
      const bigger = Buffer.alloc(this.maxBytes + 1)
      this.buffer.copy(bigger, 0, 0, this.filled)
      this.buffer = bigger
    }
    return this.buffer.length - this.filled
  }

  got (bytes: number): void {
    if (bytes === 0) this.#ended = true
    this.filled += bytes
  }

  result (): FileRead {
    if (this.filled > this.maxBytes) return tooLarge(this.path, this.maxBytes)
    return { ok: true, text: this.buffer.toString('utf8', 0, this.filled) }
  }
}

/** Reads a regular file of at most `maxBytes` without blocking on what else may be at the path. Never throws. */
export async function readBoundedFile (path: string, maxBytes: number): Promise<FileRead> {
  let handle
  try {
    handle = await open(path, OPEN_FLAGS)
  } catch (err) {
    return unreadable(path, err)
  }
  try {
    const stats = await handle.stat()
    const refused = refusalOf(path, stats, maxBytes)
    if (refused !== undefined) return refused
    const b = new BoundedBuffer(path, maxBytes, stats.size)
    for (let n = b.wanted(); n > 0; n = b.wanted()) b.got((await handle.read(b.buffer, b.filled, n, b.filled)).bytesRead)
    return b.result()
  } catch (err) {
    return unreadable(path, err)
  } finally {
    await handle.close().catch(() => undefined)
  }
}

/** readBoundedFile for start-up and other places that cannot wait. Same checks, same results. */
export function readBoundedFileSync (path: string, maxBytes: number): FileRead {
  let fd
  try {
    fd = openSync(path, OPEN_FLAGS)
  } catch (err) {
    return unreadable(path, err)
  }
  try {
    const stats = fstatSync(fd)
    const refused = refusalOf(path, stats, maxBytes)
    if (refused !== undefined) return refused
    const b = new BoundedBuffer(path, maxBytes, stats.size)
    for (let n = b.wanted(); n > 0; n = b.wanted()) b.got(readSync(fd, b.buffer, b.filled, n, b.filled))
    return b.result()
  } catch (err) {
    return unreadable(path, err)
  } finally {
    try { closeSync(fd) } catch { /* nothing left to do with it */ }
  }
}
