// The lifecycle both long-running commands share (serve: the proxy; inject:
// the webhook): the admin listener with readiness and POST /quitquitquit,
// both listeners bound (admin first), the drain run once whatever asks for
// it (drain.ts), SIGTERM / SIGINT, and the exit.
import type { FastifyInstance, RawServerBase } from 'fastify'
import type { Logger } from 'pino'
import { buildAdminServer, type AdminOptions, type Readiness } from './admin.js'
import { listenWithAdmin, type BoundListeners, type ListenAt } from './listeners.js'

/**
 * pino writes stdout asynchronously; exiting straight after flush() lets the
 * exit hook write the buffer ahead of a write still in flight, reordering or
 * losing the last lines. Wait for the flush, but not forever.
 */
export function exitAfterFlush (logger: Logger, code: number): void {
  setTimeout(() => process.exit(code), 1000).unref()
  logger.flush(() => process.exit(code))
}

export interface LifecycleOptions<S extends RawServerBase> {
  /** The main listener (the proxy, the webhook), built, not listening. */
  readonly app: FastifyInstance<S>
  /** Named by readiness until it is bound: `proxy listener`, `webhook listener`. */
  readonly listener: string
  /** What else readiness waits for once the listener is bound (the credentials); undefined: nothing. */
  readonly notReady?: () => string | undefined
  /** The drain (drain.ts), run once: by the first signal or POST /quitquitquit. `admin` is closed last, by it. */
  readonly drain: (cause: string, admin: FastifyInstance) => Promise<void>
  /** The admin listener's options but readiness and quitquitquit's action, which are the lifecycle's. */
  readonly admin: Omit<AdminOptions, 'readiness' | 'onQuit'>
  readonly listen: ListenAt
  readonly adminListen: ListenAt
  /** The variables that set the two ports, named when one cannot be had. */
  readonly variables: { readonly listen: string, readonly admin: string }
  readonly logger: Logger
}

export interface Running {
  readonly bound: BoundListeners
  readonly admin: FastifyInstance
  /** Drains and closes both listeners, once (later calls get the same drain); no exit. */
  readonly stop: (cause: string) => Promise<void>
  /** SIGTERM and SIGINT drain, then exit (stopAndExit). */
  readonly exitOnSignals: () => void
}

/**
 * Binds both listeners. Readiness: 503 `<listener> not started` until the
 * main one is bound, then what `notReady` says, `draining` once a stop
 * began. The first stop (a signal, or POST /quitquitquit) drains, then the
 * process exits 0 (1 when the drain failed); a signal after that exits at
 * once, unfinished (a second quitquitquit changes nothing).
 */
export async function startListeners<S extends RawServerBase> (opts: LifecycleOptions<S>): Promise<Running> {
  const { logger } = opts
  let listening = false
  let draining = false
  const readiness = (): Readiness => {
    if (draining) return { ready: false, reason: 'draining' }
    if (!listening) return { ready: false, reason: `${opts.listener} not started` }
    const reason = opts.notReady?.()
    return reason === undefined ? { ready: true } : { ready: false, reason }
  }
  let stopping: Promise<void> | undefined
  const stop = (cause: string): Promise<void> => {
    draining = true
    stopping ??= opts.drain(cause, admin)
    return stopping
  }
  const stopAndExit = (cause: string): void => {
    if (stopping !== undefined) {
      if (cause !== 'quitquitquit') {
        logger.warn({ signal: cause }, 'second signal: exiting without finishing the drain')
        exitAfterFlush(logger, 1)
      }
      return
    }
    stop(cause).then(
      () => { exitAfterFlush(logger, 0) },
      (err: unknown) => { logger.error({ err }, 'shutdown failed'); exitAfterFlush(logger, 1) })
  }
  const admin = buildAdminServer({ ...opts.admin, readiness, onQuit: () => { stopAndExit('quitquitquit') } })
  const app = opts.app as unknown as FastifyInstance
  const bound = await listenWithAdmin(app, opts.listen, admin, opts.adminListen, opts.variables)
  listening = true
  const exitOnSignals = (): void => {
    process.on('SIGTERM', () => { stopAndExit('SIGTERM') })
    process.on('SIGINT', () => { stopAndExit('SIGINT') })
  }
  return { bound, admin, stop, exitOnSignals }
}
