import { pino, type DestinationStream, type Logger } from 'pino'
import type { LogLevel } from './config.js'

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

export function createLogger (level: LogLevel, destination?: DestinationStream): Logger {
  const options = {
    level,
    base: { name: 'cos-auth-proxy' },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
  }
  return destination === undefined ? pino(options) : pino(options, destination)
}
