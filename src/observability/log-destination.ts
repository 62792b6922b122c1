// Where log lines go: stdout, in batches of a few milliseconds.
//
// Measured (bench/results, issue 6): with pino's default destination (an
// async sonic-boom: one fs.write through the libuv thread pool per few lines,
// plus a Buffer.byteLength over its growing buffer on every line), the one
// line per request cost about a fifth of the proxy's CPU. Lines are joined
// here and written with one writeSync: no thread-pool hop, one syscall for
// many lines. A batch is written `maxDelayMs` after its first line (default
// 5 ms), or at once when it reaches BATCH_BYTES: no line waits longer. (One
// write per turn of the event loop, as before issue 21, meant a write every
// few requests under load, and a wake-up of the reader each time.) What is
// pending goes out on exit (logger.ts); a SIGKILL can cost the last few
// milliseconds of lines.
//
// writeSync blocks while a full pipe drains, as Node's own process.stdout
// does for pipes and files on Linux; if stdout is non-blocking and full
// (EAGAIN), the batch is kept and retried. What is pending is bounded: past
// `maxPendingBytes` new lines are dropped and counted, never buffered without
// limit. If the reader is gone (EPIPE), lines are dropped and counted.
import { writeSync } from 'node:fs'

export interface BatchedStdoutOptions {
  /** Default 1 (stdout). */
  readonly fd?: number
  /** Characters held while the fd cannot take them; default 2 MiB (of a 64 MiB old space in the image). */
  readonly maxPendingBytes?: number
  /** How soon to try again after EAGAIN; default 10 ms. */
  readonly retryMs?: number
  /** The longest a line waits to be written; default 5 ms. */
  readonly maxDelayMs?: number
}

/** A batch this large is written at once, whatever its age. */
const BATCH_BYTES = 64 * 1024

/** A pino DestinationStream (write/flush/flushSync). */
export class BatchedStdout {
  readonly #fd: number
  readonly #maxPending: number
  readonly #retryMs: number
  readonly #maxDelayMs: number
  #lines: string[] = []
  #pending = 0
  /** The unwritten tail of a batch the fd refused (EAGAIN); written before anything newer. */
  #stalled: Buffer | undefined
  #scheduled = false
  #dropped = 0
  readonly #flushLater = (): void => { this.#scheduled = false; this.flushSync() }

  constructor (opts: BatchedStdoutOptions = {}) {
    this.#fd = opts.fd ?? 1
    this.#maxPending = opts.maxPendingBytes ?? 2 * 1024 * 1024
    this.#retryMs = opts.retryMs ?? 10
    this.#maxDelayMs = opts.maxDelayMs ?? 5
  }

  /** Lines dropped so far (pending limit reached, or the reader went away). */
  get dropped (): number {
    return this.#dropped
  }

  write (line: string): void {
    if (this.#pending + line.length + (this.#stalled?.length ?? 0) > this.#maxPending) {
      this.#dropped++
      return
    }
    this.#lines.push(line)
    this.#pending += line.length
    if (this.#pending >= BATCH_BYTES && this.#stalled === undefined) {
      this.flushSync()
    } else if (!this.#scheduled) {
      this.#scheduled = true
      setTimeout(this.#flushLater, this.#maxDelayMs).unref()
    }
  }

  /** Writes everything pending now, unless the fd refuses it (then it is retried shortly). */
  flushSync (): void {
    if (this.#stalled === undefined) {
      if (this.#lines.length === 0) return
      const text = this.#lines.length === 1 ? this.#lines[0] as string : this.#lines.join('')
      this.#lines.length = 0
      this.#pending = 0
      const taken = this.#writeText(text)
      if (taken === undefined) return
      this.#stalled = Buffer.from(text, 'utf8').subarray(taken)
    }
    // Lines that arrived while a stalled batch was retried follow it.
    if (this.#writeStalled() && this.#lines.length > 0) this.flushSync()
  }

  /** pino's logger.flush(cb) lands here. */
  flush (cb?: (err?: Error) => void): void {
    this.flushSync()
    cb?.()
  }

  /**
   * One writeSync of the string itself: Node encodes it into memory of its
   * own and frees it at once, where a Buffer per batch would be external
   * memory for V8 to account and collect. Undefined when the fd took it all
   * (or it was given up); otherwise the bytes it took, the rest to be retried.
   */
  #writeText (text: string): number | undefined {
    let taken = 0
    try {
      taken = writeSync(this.#fd, text)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') {
        this.#dropped += countLines(Buffer.from(text, 'utf8'))
        return undefined
      }
    }
    return taken === Buffer.byteLength(text, 'utf8') ? undefined : taken
  }

  /** True when the fd took it all (or it was given up); false when it is to be retried. */
  #writeStalled (): boolean {
    let buf = this.#stalled as Buffer
    while (buf.length > 0) {
      try {
        buf = buf.subarray(writeSync(this.#fd, buf))
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EAGAIN') {
          this.#stalled = buf
          this.#retry()
          return false
        }
        // EPIPE (nobody reads stdout any more) or worse: nowhere to report it.
        this.#dropped += countLines(buf)
        break
      }
    }
    this.#stalled = undefined
    return true
  }

  #retry (): void {
    if (this.#scheduled) return
    this.#scheduled = true
    setTimeout(this.#flushLater, this.#retryMs).unref()
  }
}

function countLines (buf: Buffer): number {
  let n = 0
  for (let i = buf.indexOf(10); i !== -1; i = buf.indexOf(10, i + 1)) n++
  return Math.max(n, 1)
}
