// The request guard: everything refused before routing, checked on the raw
// request in order (who is asking, how, for what). Pure checks live in
// guard.ts; this composes them into one per-request function.
import type { IncomingMessage } from 'node:http'
import { browserPolicy, hostProblem, originProblem } from './browser-checks.js'
import { PROXY_METHODS, type Config } from '../config/config.js'
import { allowList, hasRequiredHeader, peerAllowed, targetProblem } from './guard.js'

export type Refusal = readonly [status: number, code: string, message: string]

// Node lets one header name repeated many times past its maxHeaderSize (seen:
// 3000 × "a: 1", 18 KiB, accepted), so the total is counted here too.
const MAX_HEADER_BYTES = 16 * 1024
// Node keeps ~1000 header lines (rawHeaders entries capped near 2000) and drops
// the rest without a word: a request that reaches the cap is refused whole.
const MAX_RAW_HEADER_ENTRIES = 2000
const FORWARDED_METHODS = new Set<string>(PROXY_METHODS)
/** The Allow header of a 405: the methods the proxy forwards at all. */
export const ALLOW = PROXY_METHODS.join(', ')

// Any other Upgrade (h2c from Java's HttpClient and `curl --http2`) is ignored,
// as RFC 9110 §7.8 allows: the request is served as HTTP/1.1 and the header is
// not forwarded. A WebSocket client would wait for a socket it will not get.
// (Node joins a repeated Upgrade into one comma-separated value.)
const WEBSOCKET_UPGRADE = /(?:^|,)[ \t]*websocket[ \t]*(?:\/[^,]*)?(?:,|$)/i

/**
 * A peer outside COS_ALLOW_FROM. On the proxy port such a connection is
 * answered and closed when it is accepted (proxy-server.ts); the check per
 * request stays, so a guard used without that refusal still refuses.
 */
export const FORBIDDEN_SOURCE: Refusal = [403, 'forbidden_source', 'this source address may not use the proxy (COS_ALLOW_FROM)']

/** Why `method` is refused before routing, naming it. */
export function notForwarded (method: string): string {
  if (method === 'TRACE' || method === 'TRACK') return `${method} is never forwarded: the upstream would echo the request back, signed token included`
  const caseHint = FORWARDED_METHODS.has(method.toUpperCase()) ? ' (methods are case-sensitive)' : ''
  return `${method} is not forwarded: the proxy forwards only the methods of the COS APIs (${ALLOW})${caseHint}`
}

/**
 * Everything refused before routing, in order: who is asking, how, for what.
 * Returns the refusal, or undefined to let the request through.
 */
export function requestGuard (config: Config): (raw: IncomingMessage) => Refusal | undefined {
  const allowed = allowList(config.allowFrom)
  const checkedPeers = new WeakMap<object, boolean>()
  const required = config.requireHeader
  const maxBody = config.maxBodyBytes
  const browsers = browserPolicy(config)
  // The Host last let through: a client repeats its own, so most requests cost one comparison.
  let hostPassed: string | undefined
  return (raw) => {
    // Checked once per connection: the peer of a socket does not change.
    let peerOk = checkedPeers.get(raw.socket)
    if (peerOk === undefined) {
      peerOk = peerAllowed(allowed, raw.socket.remoteAddress)
      checkedPeers.set(raw.socket, peerOk)
    }
    if (!peerOk) return FORBIDDEN_SOURCE
    const rawHeaders = raw.rawHeaders
    let headerBytes = 0
    let requiredSeen = 0
    for (let i = 0; i < rawHeaders.length; i += 2) {
      const name = rawHeaders[i] as string
      headerBytes += name.length + (rawHeaders[i + 1] as string).length + 4
      if (required !== undefined && name.length === required.name.length && name.toLowerCase() === required.name) requiredSeen++
    }
    if (headerBytes > MAX_HEADER_BYTES || rawHeaders.length >= MAX_RAW_HEADER_ENTRIES) {
      return [431, 'request_header_fields_too_large', 'the request headers exceed 16 KiB']
    }
    if (!FORWARDED_METHODS.has(raw.method ?? '')) return [405, 'method_not_allowed', notForwarded(raw.method ?? '')]
    if (raw.headers.upgrade !== undefined && WEBSOCKET_UPGRADE.test(raw.headers.upgrade)) return [405, 'method_not_allowed', 'WebSocket upgrades are not supported']
    const problem = targetProblem(raw.url ?? '', config.routes)
    if (problem !== undefined) return [400, 'bad_request', problem]
    const headers = raw.headers
    const fetchSite = headers['sec-fetch-site']
    if (headers.origin !== undefined || fetchSite !== undefined) {
      const fromPage = originProblem(browsers, headers.origin, fetchSite)
      if (fromPage !== undefined) return [403, 'forbidden_origin', fromPage]
    }
    if (headers.host !== hostPassed) {
      const rebound = hostProblem(browsers, headers.host)
      if (rebound !== undefined) return [403, 'forbidden_host', rebound]
      hostPassed = headers.host
    }
    // Node joins a repeated header into one value, so "sent twice" is counted on the raw lines.
    if (required !== undefined && (requiredSeen !== 1 || !hasRequiredHeader(required, raw.headers[required.name]))) {
      return [403, 'missing_required_header', `requests must carry the ${required.name} header once (COS_REQUIRE_HEADER)`]
    }
    if (maxBody > 0 && Number(raw.headers['content-length'] ?? 0) > maxBody) {
      return [413, 'payload_too_large', `request bodies are limited to ${maxBody} bytes (COS_MAX_BODY_BYTES)`]
    }
    return undefined
  }
}
