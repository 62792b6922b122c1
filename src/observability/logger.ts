import { pino, type DestinationStream, type Logger } from 'pino'
import type { LogFormat, LogLevel } from '../config/config.js'
import { BatchedStdout } from './log-destination.js'
import type { LineSink } from './pretty-log.js'

// Defence in depth: the proxy never logs headers, but if anything ever does,
// these paths are censored. Tokens and the secret have no other way out.
export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'headers.authorization',
  'headers["proxy-authorization"]',
  'authorization',
  'token',
  'secret',
]

let stampMs = -1
let stamp = ''

/**
 * pino's isoTime builds a Date and an ISO string per line; at thousands of
 * lines a second most lines share their millisecond with the previous one.
 */
export function isoTimeCached (): string {
  const now = Date.now()
  if (now !== stampMs) {
    stampMs = now
    stamp = `,"time":"${new Date(now).toISOString()}"`
  }
  return stamp
}

/** stdout for the process's logger; lines still pending go out on process.exit(). */
export function stdoutDestination (): BatchedStdout {
  const stdout = new BatchedStdout()
  process.once('exit', () => { stdout.flushSync() })
  return stdout
}

/** The logger of the process: JSON lines on stdout, or on `destination`. */
export function createLogger (level: LogLevel, destination: DestinationStream = stdoutDestination()): Logger {
  const options = {
    level,
    base: { name: 'cos-auth-proxy' },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    timestamp: isoTimeCached,
    formatters: { level: (label: string) => ({ level: label }) },
  }
  return pino(options, destination)
}

/**
 * `out` as COS_LOG_FORMAT asks: as it is for json; for pretty, behind the
 * formatter, imported only then (and coloured only on a terminal that has
 * not asked for NO_COLOR).
 */
export async function inLogFormat (format: LogFormat, out: LineSink): Promise<DestinationStream> {
  if (format === 'json') return out
  const { PrettyLines } = await import('./pretty-log.js')
  return new PrettyLines(out, process.stdout.isTTY && process.env.NO_COLOR === undefined)
}
