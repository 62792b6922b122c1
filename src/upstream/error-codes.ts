// The one reader of an upstream failure's codes, for the status the client
// gets (forward-response.ts, retry.ts) and the kind the metrics count (upstream-error-kinds.ts).

/**
 * The `code`s along an error's cause chain, outside in (a wrapping error
 * names what it wraps as its cause), and an AggregateError
 * (happy eyeballs over several addresses) read through its first error.
 * At most five deep.
 */
export function * errorCodes (err: unknown): Generator<string, void, undefined> {
  let e = err
  for (let depth = 0; depth < 5 && e instanceof Error; depth++) {
    const code = (e as { code?: unknown }).code
    if (typeof code === 'string') yield code
    e = e instanceof AggregateError && e.cause === undefined ? (e.errors as unknown[])[0] : e.cause
  }
}

/** Whether `code` is anywhere on the chain. */
export function hasErrorCode (err: unknown, code: string): boolean {
  for (const c of errorCodes(err)) if (c === code) return true
  return false
}
