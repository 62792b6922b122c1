// The per-request loggers of the proxied routes. Fastify logs a stream cut
// after its head (at warn, the same for a client that hung up): the proxy
// writes one line of its own per outcome instead (`request failed` in forward-response.ts
// and request-log.ts, the request line). So these loggers pass only `error`
// and above, and the request line goes through the server's logger.
//
// Fastify asks for a child logger per request (bindings: the request id),
// though on these routes almost none logs anything: building a pino child
// serialises its bindings and copies its settings every time. Each request
// gets a one-field object instead, whose error/fatal/child build that child
// on first use; everything else (levels, the no-op info/debug/…) comes from
// the shared parent through the prototype. The child's bindings get the
// request's trace context then too (trace-context.ts): parsed only for a
// request that logs something.
import type { IncomingMessage } from 'node:http'
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { pino, type Bindings, type ChildLoggerOptions } from 'pino'
import { addTraceFields } from '../client/trace-context.js'

const CHILD = Symbol('cos.requestLogger.child')
const BINDINGS = Symbol('cos.requestLogger.bindings')
const OPTIONS = Symbol('cos.requestLogger.options')
const PARENT = Symbol('cos.requestLogger.parent')
const RAW = Symbol('cos.requestLogger.raw')

interface LazyChild extends FastifyBaseLogger {
  [CHILD]: FastifyBaseLogger | undefined
  [BINDINGS]: Bindings
  [OPTIONS]: ChildLoggerOptions | undefined
  [PARENT]: FastifyBaseLogger
  [RAW]: IncomingMessage
}

function real (logger: LazyChild): FastifyBaseLogger {
  // Fastify's bindings are a fresh object per request: the trace fields go into it.
  return logger[CHILD] ??= logger[PARENT].child(addTraceFields(logger[BINDINGS], logger[RAW].headers.traceparent), logger[OPTIONS])
}

export function quietRequestLogs (fastify: FastifyInstance): void {
  const { log } = fastify
  const { values } = pino.levels
  const quiet = log.child({}, { level: (values[log.level] ?? 0) >= (values.error ?? 50) ? log.level : 'error' })
  const proto = Object.create(quiet) as LazyChild
  proto[PARENT] = quiet
  // Methods, not arrow functions: `this` is the request's object.
  Object.assign(proto, {
    error (this: LazyChild, ...args: Parameters<FastifyBaseLogger['error']>) { real(this).error(...args) },
    fatal (this: LazyChild, ...args: Parameters<FastifyBaseLogger['fatal']>) { real(this).fatal(...args) },
    child (this: LazyChild, bindings: Bindings, options?: ChildLoggerOptions) { return real(this).child(bindings, options) },
  })
  fastify.setChildLoggerFactory((_logger, bindings, options, raw) => {
    const logger = Object.create(proto) as LazyChild
    logger[BINDINGS] = bindings
    logger[OPTIONS] = options
    logger[RAW] = raw
    return logger
  })
}
