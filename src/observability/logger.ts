import { pino, stdSerializers, type DestinationStream, type Logger } from 'pino'
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

/**
 * How much of a logged value reaches a line. Values can come from outside (a
 * review's namespace, the bytes an upstream sent that undici's parser refused
 * in `err.data`): strings are cut, with how much was left out said at the end;
 * plain objects and arrays are copied with at most `entries` entries, `depth`
 * levels down. The caller's objects are never changed. Lines still longer
 * than `lineChars` (a message, a binding, a string inside a class instance)
 * are read back and cut the same way.
 */
export const LOG_LIMITS = {
  /** Characters of a string value. */
  stringChars: 2048,
  /** Of an error's stack (pino appends its causes' stacks). */
  stackChars: 8192,
  /** Of an error's `data`: undici's HTTPParserError puts the raw bytes it refused there. */
  dataChars: 256,
  /** Of a key. */
  keyChars: 128,
  /** Entries of an array or object. */
  entries: 64,
  /** Levels of plain objects and arrays below a field. */
  depth: 6,
  /** A whole line, the backstop. */
  lineChars: 64 * 1024,
} as const

/** `s` cut to `max` characters (never half a surrogate pair), saying how many were left out. */
export function capString (s: string, max: number = LOG_LIMITS.stringChars): string {
  if (s.length <= max) return s
  const code = s.charCodeAt(max - 1)
  const end = code >= 0xd800 && code <= 0xdbff ? max - 1 : max
  return `${s.slice(0, end)}…[${s.length - end} more characters]`
}

type Fields = Record<string, unknown>

/** Data, not behaviour: copied and capped. Class instances (a Secret, a Buffer, a Date) go to pino as they are. */
function isPlain (v: object): boolean {
  const proto: unknown = Object.getPrototypeOf(v)
  return proto === null || proto === Object.prototype || (v as { constructor?: unknown }).constructor === Object
}

function isErrorLike (v: object): v is Error {
  return v instanceof Error
}

function capEntries (object: Fields, depth: number): Fields {
  const out: Fields = {}
  let n = 0
  for (const key of Object.keys(object)) {
    if (n === LOG_LIMITS.entries) {
      out['…'] = `${Object.keys(object).length - n} more keys`
      break
    }
    out[capString(key, LOG_LIMITS.keyChars)] = capValue(object[key], depth + 1, key)
    n++
  }
  return out
}

function capValue (v: unknown, depth: number, key?: string): unknown {
  if (typeof v === 'string') return capString(v, key === 'stack' ? LOG_LIMITS.stackChars : key === 'data' ? LOG_LIMITS.dataChars : LOG_LIMITS.stringChars)
  if (typeof v !== 'object' || v === null) return v
  if (isErrorLike(v)) return capError(v)
  const array = Array.isArray(v)
  if (!array && !isPlain(v)) return v
  if (depth >= LOG_LIMITS.depth) return array ? `[array of ${(v as unknown[]).length}]` : '[object]'
  if (!array) return capEntries(v as Fields, depth)
  const list = v as unknown[]
  const out = list.slice(0, LOG_LIMITS.entries).map(item => capValue(item, depth + 1))
  if (list.length > LOG_LIMITS.entries) out.push(`…${list.length - LOG_LIMITS.entries} more`)
  return out
}

/** pino's error serializer (type, message and stack with causes, own fields), each field capped. */
function capError (err: unknown): unknown {
  const serialized: unknown = stdSerializers.err(err as Error)
  if (serialized === err || typeof serialized !== 'object' || serialized === null) return capValue(err, 0)
  // A fresh object of pino's: capped in place (its `raw` is a symbol, never written).
  const fields = serialized as Fields
  for (const key of Object.keys(fields)) fields[key] = capValue(fields[key], 1, key)
  return fields
}

function needsCap (key: string, v: unknown): boolean {
  return key.length > LOG_LIMITS.keyChars || (typeof v === 'string' ? v.length > LOG_LIMITS.stringChars : typeof v === 'object' && v !== null)
}

/**
 * formatters.log: the fields of one line, capped. A line of numbers and short
 * strings (the request line) is passed on as it is, nothing allocated.
 */
export function capFields (fields: Fields): Fields {
  let work = false
  for (const key in fields) {
    if (needsCap(key, fields[key])) {
      work = true
      break
    }
  }
  if (!work) return fields
  const out: Fields = {}
  let n = 0
  for (const key in fields) {
    const v = fields[key]
    // `err` goes through the serializer below; as its own key, never counted out.
    if (key === 'err') {
      out[key] = v
      continue
    }
    if (n++ === LOG_LIMITS.entries) {
      out['…'] = 'more fields left out'
      break
    }
    out[capString(key, LOG_LIMITS.keyChars)] = capValue(v, 0, key)
  }
  return out
}

/** hooks.streamWrite: the backstop for a line still too long (see LOG_LIMITS). */
function capLine (line: string): string {
  if (line.length <= LOG_LIMITS.lineChars) return line
  let parsed: Fields
  try {
    parsed = JSON.parse(line) as Fields
  } catch {
    return line
  }
  return `${JSON.stringify(capEntries(parsed, 0))}\n`
}

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
    formatters: { level: (label: string) => ({ level: label }), log: capFields, bindings: capFields },
    serializers: { err: capError },
    hooks: { streamWrite: capLine },
  }
  return pino(options, destination)
}

/**
 * `out` as COS_LOG_FORMAT asks: as it is for json; for pretty, behind the
 * formatter, imported only then; coloured when `colour` says so (cli.ts:
 * a terminal that has not asked for NO_COLOR).
 */
export async function inLogFormat (format: LogFormat, out: LineSink, colour = false): Promise<DestinationStream> {
  if (format === 'json') return out
  const { PrettyLines } = await import('./pretty-log.js')
  return new PrettyLines(out, colour)
}
