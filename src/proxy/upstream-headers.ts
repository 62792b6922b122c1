// Step three and five: the request's headers on the way up (hop-by-hop and
// the client's own credentials out, a freshly minted token in) and the
// response's on the way down (hop-by-hop out, the upstream's clock read).
import type { IncomingHttpHeaders } from 'node:http'
import { performance } from 'node:perf_hooks'
import type { FastifyReplyFromHooks } from '@fastify/reply-from'
import type { CredentialStore } from '../credentials/credentials.js'
import type { UpstreamClock } from '../upstream/upstream-clock.js'
import { abortWhenClientGone } from '../upstream/client-gone.js'

// Hop-by-hop (RFC 9110 §7.6.1; HTTP2-Settings of an h2c upgrade, RFC 7540
// §3.2.1, even when Connection does not name it) plus the client's own
// credentials. `expect` is answered by Node's server itself (100-continue)
// and undici refuses it. Forwarding headers are whatever the client chose to
// write: an upstream that audits or filters on them would take them as the
// truth, and it sees the proxy's own address anyway. Nothing sets them
// instead (neither reply-from nor http-proxy adds any). Those present are set
// to undefined rather than deleted (undici skips undefined values and the
// object keeps its fast shape); absent ones are not touched, so the object
// does not grow keys that reply-from then copies.
const DROP_REQUEST = [
  'authorization', 'proxy-authorization', 'proxy-connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'http2-settings', 'expect',
  'forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-proto', 'x-forwarded-port', 'x-forwarded-prefix', 'x-real-ip',
] as const
// `trailer` and `te` as well: trailers are never forwarded, and Node refuses
// to write a head that declares them on a response that cannot carry them
// (HEAD, HTTP/1.0, a Content-Length, a 204).
const DROP_RESPONSE: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'trailer', 'te'])

function connectionTokens (value: string | string[]): string[] {
  return (Array.isArray(value) ? value.join(',') : value).split(',').map(s => s.trim().toLowerCase()).filter(s => s !== '')
}

/** Whether a Connection value names a header to drop beyond DROP_RESPONSE: not for the usual one-word values. */
function namesOtherHeaders (value: string | string[]): boolean {
  if (typeof value !== 'string') return true
  const v = value.length === 10 || value.length === 5 ? value.toLowerCase() : ''
  return v !== 'keep-alive' && v !== 'close'
}

export interface SigningOptions {
  readonly credentials: CredentialStore
  readonly observer?: { readonly tokenMinted: () => void } | undefined
  /** A header only for the proxy (COS_REQUIRE_HEADER): never forwarded. */
  readonly dropHeader?: string | undefined
}

/** reply-from's rewriteRequestHeaders: the request leaves signed, and its departure is timed. */
export function signedRequestHeaders ({ credentials, observer, dropHeader }: SigningOptions): NonNullable<FastifyReplyFromHooks['rewriteRequestHeaders']> {
  return (request, headers) => {
    const h = headers as IncomingHttpHeaders // HTTP/1 only: the proxy listens on plain HTTP/1.1
    // `Connection` and the headers it names are already gone: reply-from strips
    // them before calling this hook.
    for (const name of DROP_REQUEST) if (h[name] !== undefined) h[name] = undefined
    if (dropHeader !== undefined && h[dropHeader] !== undefined) h[dropHeader] = undefined
    // admitToRoute (onRequest) saw a pair; read it again so a swap in between is honoured.
    h.authorization = credentials.current?.next()
    observer?.tokenMinted()
    h['x-request-id'] = request.id
    abortWhenClientGone(h, request.raw.socket)
    request.upstreamStart = performance.now()
    return h
  }
}

/** reply-from's rewriteHeaders: the upstream's answer, timed, its clock read, hop-by-hop headers dropped. */
export function forwardedResponseHeaders (clock: UpstreamClock | undefined): NonNullable<FastifyReplyFromHooks['rewriteHeaders']> {
  return (headers, request) => {
    const now = performance.now()
    if (request !== undefined) request.upstreamMs = now - request.upstreamStart
    const h = headers as IncomingHttpHeaders
    clock?.observe(h, now)
    // A new object rather than deletes: reply-from copies every key it finds
    // (so undefined will not do), and a delete drops the object to a slow
    // dictionary shape (measured: a copy of the usual five headers is ~5×
    // cheaper than deleting two of them).
    const connection = h.connection
    const named = connection !== undefined && namesOtherHeaders(connection) ? connectionTokens(connection) : undefined
    const kept: IncomingHttpHeaders = {}
    for (const name in h) {
      if (!DROP_RESPONSE.has(name) && named?.includes(name) !== true) kept[name] = h[name]
    }
    return kept
  }
}
