// COS_LOG_FORMAT=pretty: each JSON line pino has written (redaction already
// applied: the censor runs before the line is serialised) turned into one
// line a person reads in a terminal. Loaded only when asked for, so the JSON
// path (serve's default) pays nothing for it.
import type { DestinationStream } from 'pino'

type Fields = Record<string, unknown>

// Fields every line has, or that only say which program wrote it.
const SHOWN_APART = new Set(['time', 'level', 'msg', 'name', 'pid', 'hostname'])
const LEVEL_WIDTH = 5

const COLOURS: Readonly<Record<string, string>> = { fatal: '35', error: '31', warn: '33', info: '32', debug: '36', trace: '90' }

// C0 and C1 controls: a message or value carrying ESC or CSI (an upstream's
// error text, say) must not move the cursor or rewrite the terminal; JSON
// escapes C0 only.
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const CONTROLS = /[\u0000-\u001f\u007f-\u009f]/g

function escaped (text: string): string {
  return text.replace(CONTROLS, c => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
}

/** A value as `key=value` shows it: bare when it is one plain word, quoted JSON otherwise. */
function shown (value: unknown): string {
  if (typeof value === 'string') return /^[\w./:@+-]+$/.test(value) ? value : escaped(JSON.stringify(value))
  if (isError(value)) return escaped(JSON.stringify(`${value.type ?? 'Error'}: ${value.message}`))
  // Parsed from JSON: never undefined, a function or a symbol.
  return escaped(JSON.stringify(value))
}

function isError (value: unknown): value is { type?: string, message: string } {
  return typeof value === 'object' && value !== null && typeof (value as { message?: unknown }).message === 'string' && 'stack' in value
}

/** `hh:mm:ss.mmm` of pino's ISO time. */
function clock (time: unknown): string {
  if (typeof time !== 'string') return ''
  return time.length >= 23 ? time.slice(11, 23) : time
}

/** One event, one line: time, level, message, then the other fields as key=value. */
export function prettyLine (json: string, colour = false): string {
  let fields: Fields
  try {
    fields = JSON.parse(json) as Fields
  } catch {
    return json.endsWith('\n') ? json : json + '\n'
  }
  const level = typeof fields.level === 'string' ? fields.level : 'info'
  const label = level.toUpperCase().padEnd(LEVEL_WIDTH)
  const levelText = colour && COLOURS[level] !== undefined ? `\x1b[${COLOURS[level]}m${label}\x1b[0m` : label
  let line = `${clock(fields.time)} ${levelText} ${typeof fields.msg === 'string' ? escaped(fields.msg) : ''}`
  for (const key in fields) {
    if (!SHOWN_APART.has(key)) line += ` ${key}=${shown(fields[key])}`
  }
  return line + '\n'
}

/** Where the pretty lines go: stdout's BatchedStdout, or a test's capture. */
export type LineSink = DestinationStream & { flush?: (cb?: (err?: Error) => void) => void, flushSync?: () => void }

/** The lines' destination, turning each one pretty on its way. */
export class PrettyLines implements DestinationStream {
  readonly #out: LineSink
  readonly #colour: boolean

  constructor (out: LineSink, colour = false) {
    this.#out = out
    this.#colour = colour
  }

  write (line: string): void {
    this.#out.write(prettyLine(line, this.#colour))
  }

  flush (cb?: (err?: Error) => void): void {
    if (this.#out.flush === undefined) cb?.()
    else this.#out.flush(cb)
  }

  flushSync (): void {
    this.#out.flushSync?.()
  }
}
