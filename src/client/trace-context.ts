// The client's W3C trace context (Trace Context level 1), read only for the
// log. The proxy forwards `traceparent` and `tracestate` as it received them
// (upstream-headers.ts drops neither) and starts no trace of its own: a line
// that belongs to a request carries the request's trace id and the caller's
// span id, so the line leads to its trace. Nothing here runs for a request
// that writes no line: the header is parsed when a line is written, by one
// pass over its characters (no regular expression, no split), and a line
// of a request without one costs a property read.

/** The fields a line carries, named as OpenTelemetry's logs in non-OTLP formats and its pino instrumentation name them. */
export interface TraceFields {
  trace_id?: string
  span_id?: string
  trace_flags?: string
}

/** `traceparent`'s length in version 00, and the least a later version may have. */
const LENGTH = 55
const DASH = 0x2d

/** By character code: 0 not lowercase hex, 1 the digit 0, 2 any other lowercase hex digit (a table: fewer branches than ranges). */
const HEX = new Uint8Array(128)
for (let c = 0x30; c <= 0x39; c++) HEX[c] = c === 0x30 ? 1 : 2
for (let c = 0x61; c <= 0x66; c++) HEX[c] = 2

/** Whether `s[from, to)` is lowercase hex and not all zeros (`zeroOk`: zeros allowed). */
function lowerHex (s: string, from: number, to: number, zeroOk: boolean): boolean {
  let seen = zeroOk ? 2 : 0
  for (let i = from; i < to; i++) {
    const kind = HEX[s.charCodeAt(i)] ?? 0
    if (kind === 0) return false
    seen |= kind
  }
  return seen >= 2
}

/**
 * Whether `value` is a valid `traceparent` (W3C Trace Context level 1,
 * §3.2): version 00 exactly `00-<32 hex>-<16 hex>-<2 hex>`, lowercase; a
 * later version (not `ff`, which is invalid) read by the same prefix, which
 * is followed by the end or a dash (§3.2.4, "Versioning of traceparent"). An
 * all-zero trace id or parent id is invalid. Two `traceparent` headers
 * reach here joined by Node into one value, which is invalid: so does the
 * spec want them treated.
 */
export function validTraceparent (value: string | string[] | undefined): value is string {
  if (typeof value !== 'string' || value.length < LENGTH) return false
  if (!lowerHex(value, 0, 2, true) || value.startsWith('ff')) return false
  const v00 = value.charCodeAt(0) === 0x30 && value.charCodeAt(1) === 0x30
  if (v00 ? value.length !== LENGTH : value.length > LENGTH && value.charCodeAt(LENGTH) !== DASH) return false
  return value.charCodeAt(2) === DASH && value.charCodeAt(35) === DASH && value.charCodeAt(52) === DASH &&
    lowerHex(value, 3, 35, false) && lowerHex(value, 36, 52, false) && lowerHex(value, 53, 55, true)
}

/**
 * Adds `trace_id`, `span_id` (the caller's span: the proxy has none of its
 * own) and `trace_flags` to `line`, in place, when `traceparent` is valid;
 * leaves it as it is otherwise. A later version's flags are read for their
 * sampled bit alone, as the spec says.
 */
export function addTraceFields<L extends object> (line: L, traceparent: string | string[] | undefined): L & TraceFields {
  const out = line as L & TraceFields
  if (traceparent === undefined || !validTraceparent(traceparent)) return out
  out.trace_id = traceparent.slice(3, 35)
  out.span_id = traceparent.slice(36, 52)
  const flags = traceparent.slice(53, 55)
  out.trace_flags = traceparent.startsWith('00') ? flags : (Number.parseInt(flags, 16) & 1) === 1 ? '01' : '00'
  return out
}
