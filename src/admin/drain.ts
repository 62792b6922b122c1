// The drain both long-running commands share (serve: the proxy; inject: the
// webhook), after readiness has turned 503: keep answering for the shutdown
// delay (endpoints still route here), stop accepting, give what is in flight
// up to the shutdown timeout.
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'

/** A Fastify instance: `close()` stops accepting, then waits for the requests in flight. */
export interface Drainable { readonly server: { closeIdleConnections: () => void }, close: () => PromiseLike<unknown> }

/** COS_SHUTDOWN_DELAY_MS and COS_SHUTDOWN_TIMEOUT_MS, as both configs have them. */
export interface ShutdownTiming { readonly shutdownDelayMs: number, readonly shutdownTimeoutMs: number }

export interface DrainSteps {
  readonly cause: string
  /** Runs when the shutdown timeout runs out, whatever step the drain is in: cut what is left. */
  readonly onTimeout: () => void
  /** Runs once the listener is closed and its requests are done (admin listener, watchers). */
  readonly afterClose: () => Promise<void>
}

export async function drain (app: Drainable, timing: ShutdownTiming, logger: FastifyBaseLogger, steps: DrainSteps): Promise<void> {
  logger.info({ cause: steps.cause, delayMs: timing.shutdownDelayMs, timeoutMs: timing.shutdownTimeoutMs }, 'draining: readiness is now 503')
  if (timing.shutdownDelayMs > 0) await sleep(timing.shutdownDelayMs)
  // Armed until the very end: whatever step the drain is in when the
  // timeout runs out, it is not waited for beyond it.
  const cut = setTimeout(steps.onTimeout, timing.shutdownTimeoutMs)
  // server.close() closes the connections idle at that moment only; a
  // keep-alive connection whose last request finishes during the drain
  // would otherwise hold the exit until the timeout.
  const reap = setInterval(() => { app.server.closeIdleConnections() }, 50)
  await app.close()
  clearInterval(reap)
  await steps.afterClose()
  clearTimeout(cut)
  logger.info('stopped')
}
