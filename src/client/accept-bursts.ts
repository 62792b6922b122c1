// A burst of new connections accepted ahead of the established ones.
//
// libuv accepts one connection per turn of the event loop (libuv/libuv#3696),
// and a turn first reads every established connection that has a request
// waiting. With ~750 busy keep-alive connections a turn took 5–30 ms, so the
// last of 1,024 connections opened at once waited 3–10 s in the kernel's
// accept queue before its first request was read (issue 43;
// docs/performance.md, "A burst of new connections"). Here, once connections
// are accepted on two turns in a row, the listener stops reading its
// established connections and those it accepts meanwhile: each turn is then
// one accept plus the work already in flight, and the queue drains in tens
// of milliseconds. Reading resumes at the first turn that accepts nothing
// (the queue is empty) or after `maxPauseMs`, whichever comes first; after a
// pause cut short by `maxPauseMs`, no new one starts for as long again, so a
// flood of new connections takes at most half of the established
// connections' time, never all of it.
//
// Only the libuv stream is stopped and started again. `_handle.reading` is
// whether Node wants the connection read (its own pause and resume set it):
// a connection Node paused meanwhile (a body it cannot take yet, pipelined
// answers unread) is left paused.
import type { Server } from 'node:http'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'

/** Node's libuv stream under a socket: `reading` is whether Node wants it read. */
interface StreamHandle { reading?: boolean, readStart: () => number, readStop: () => number }
type HandledSocket = Socket & { _handle?: StreamHandle | null }

/** How long established connections may wait while a burst is accepted. */
export const MAX_ACCEPT_PAUSE_MS = 200

export function acceptBurstsFirst (server: Server, maxPauseMs = MAX_ACCEPT_PAUSE_MS): void {
  const open = new Set<HandledSocket>()
  const stopped: HandledSocket[] = []
  let acceptedThisTurn = 0
  let turnsInARow = 0
  let checking = false
  let pausedAt = -1
  let noPauseBefore = 0

  const stop = (socket: HandledSocket): void => {
    const handle = socket._handle
    if (handle?.reading === true && !socket.destroyed) {
      handle.readStop()
      stopped.push(socket)
    }
  }
  const resume = (): void => {
    for (const socket of stopped) {
      const handle = socket._handle
      if (handle?.reading === true && !socket.destroyed) handle.readStart()
    }
    stopped.length = 0
    pausedAt = -1
  }
  /** Once per turn (setImmediate runs after the turn's I/O) while connections arrive. */
  const check = (): void => {
    checking = false
    if (acceptedThisTurn === 0) {
      turnsInARow = 0
      if (pausedAt >= 0) resume()
      return
    }
    acceptedThisTurn = 0
    turnsInARow++
    const now = performance.now()
    if (pausedAt >= 0 && now - pausedAt >= maxPauseMs) {
      resume()
      noPauseBefore = now + maxPauseMs
    } else if (pausedAt < 0 && turnsInARow >= 2 && now >= noPauseBefore) {
      pausedAt = now
      for (const socket of open) stop(socket)
    }
    checking = true
    setImmediate(check)
  }

  server.on('connection', (socket: HandledSocket) => {
    acceptedThisTurn++
    if (!checking) {
      checking = true
      setImmediate(check)
    }
    if (socket.destroyed) return // refused by the connection cap
    open.add(socket)
    socket.once('close', () => open.delete(socket))
    if (pausedAt >= 0) stop(socket)
  })
}
