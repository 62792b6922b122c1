// Upstream failures sorted into a few kinds (refused, reset, timeout, tls,
// dns, other) by the codes on their error chain: the `kind` label of
// upstream_errors_total, and the words the egress-proxy errors use.
import { errorCodes } from './error-codes.js'

export type UpstreamErrorKind = 'refused' | 'reset' | 'timeout' | 'tls' | 'dns' | 'other'

const CODE_KINDS: ReadonlyMap<string, UpstreamErrorKind> = new Map<string, UpstreamErrorKind>([
  ['ECONNREFUSED', 'refused'],
  ['ECONNRESET', 'reset'],
  ['EPIPE', 'reset'],
  ['ECONNABORTED', 'reset'],
  ['UND_ERR_SOCKET', 'reset'],
  ['UND_ERR_CLOSED', 'reset'],
  ['ETIMEDOUT', 'timeout'],
  ['UND_ERR_CONNECT_TIMEOUT', 'timeout'],
  ['UND_ERR_HEADERS_TIMEOUT', 'timeout'],
  ['UND_ERR_BODY_TIMEOUT', 'timeout'],
  ['ENOTFOUND', 'dns'],
  ['EAI_AGAIN', 'dns'],
  ['EAI_FAIL', 'dns'],
  ['EAI_NONAME', 'dns'],
  // OpenSSL's certificate-verification codes that have no common prefix below.
  ['DEPTH_ZERO_SELF_SIGNED_CERT', 'tls'],
  ['SELF_SIGNED_CERT_IN_CHAIN', 'tls'],
  ['HOSTNAME_MISMATCH', 'tls'],
  ['INVALID_CA', 'tls'],
  ['INVALID_PURPOSE', 'tls'],
  ['PATH_LENGTH_EXCEEDED', 'tls'],
  // Handshake failures (e.g. TLS to a plain-HTTP port) surface as EPROTO.
  ['EPROTO', 'tls'],
])
const TLS_PREFIXES = ['ERR_TLS_', 'ERR_SSL_', 'CERT_', 'CRL_', 'UNABLE_TO_', 'ERROR_IN_CERT_', 'ERROR_IN_CRL_']

function kindOfCode (code: string): UpstreamErrorKind | undefined {
  return CODE_KINDS.get(code) ?? (TLS_PREFIXES.some(p => code.startsWith(p)) ? 'tls' : undefined)
}

/** Classify an upstream failure: the first code on its chain that means something wins. */
export function classifyUpstreamError (err: Error): UpstreamErrorKind {
  for (const code of errorCodes(err)) {
    const kind = kindOfCode(code)
    if (kind !== undefined) return kind
  }
  return 'other'
}
