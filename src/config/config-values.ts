// The values of single settings, parsed and checked: routes and their
// methods, hosts, CIDRs, origins, the required header, TLS files, egress
// proxies, credential sources. Each error names its variable.
import { isIP, isIPv6 } from 'node:net'
import { ConfigError, PROXY_METHODS, PROXY_URL, VARIABLES, type Raw, type VariableName } from './config-variables.js'
import { foldedPrefix, foldSegment, hostName } from './names.js'
import { ROUTE_TABLE, type Route, type RouteName } from './route.js'
import { Secret } from './secret.js'

/** The egress proxies from HTTPS_PROXY / HTTP_PROXY / NO_PROXY; src/upstream/egress.ts decides per origin. */
export interface EgressProxy {
  /** The variable it was read from: https_proxy, HTTPS_PROXY, http_proxy or HTTP_PROXY. */
  readonly variable: string
  /** scheme://host:port, what logs and error messages name: never credentials. */
  readonly address: string
  /** For display: the URL with its password replaced by "[redacted]". */
  readonly url: string
  /** `Basic …` from the URL's user:password, sent to the proxy as Proxy-Authorization. */
  readonly authorization?: Secret
}

export interface Egress {
  /** For http:// upstreams. */
  readonly http?: EgressProxy
  /** For https:// upstreams. */
  readonly https?: EgressProxy
  /** NO_PROXY entries, lowercased. */
  readonly noProxy: readonly string[]
}

export interface CredentialSource {
  readonly file?: string
  readonly value?: Secret
}

export interface TlsFiles { readonly caFile?: string, readonly clientCertFile?: string, readonly clientKeyFile?: string }

/**
 * What the command needs: `serve` everything; `token`, `verify` and
 * `mock-api` only the credentials; `wait` neither upstream nor credentials.
 */
export type Needs = 'all' | 'credentials' | 'nothing'

export function withMethods (r: Route | undefined, variable: VariableName, list: string | undefined): Route | undefined {
  if (r === undefined || list === undefined) return r
  const methods = list.split(',').map(m => m.trim().toUpperCase()).filter(m => m !== '')
  const unknown = methods.find(m => !(PROXY_METHODS as readonly string[]).includes(m))
  if (methods.length === 0 || unknown !== undefined) {
    throw new ConfigError(variable, `must be a comma-separated list of ${PROXY_METHODS.join(', ')}${unknown === undefined ? '' : ` (got ${JSON.stringify(unknown)})`}`)
  }
  return { ...r, allowedMethods: [...new Set(methods)] }
}

export function list (value: string | undefined): string[] {
  return value === undefined ? [] : value.split(',').map(v => v.trim()).filter(v => v !== '')
}

// scheme://host[:port], and a trailing "/" as copied from an address bar.
const ORIGIN = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/[^/?#@\s]+\/?$/

/** An origin as a browser's Origin header spells it: lower case; for http(s) without the default port, an IDN as punycode. */
export function allowedOrigin (entry: string): string {
  if (entry.toLowerCase() === 'null') {
    throw new ConfigError('COS_ALLOWED_ORIGINS', 'must not list "null": sandboxed frames, file: pages and redirected requests all send it, so it names no page')
  }
  const scheme = ORIGIN.exec(entry)?.[1]?.toLowerCase()
  if (scheme === undefined) throw new ConfigError('COS_ALLOWED_ORIGINS', `${VARIABLES.COS_ALLOWED_ORIGINS.expect} (got ${JSON.stringify(entry)})`)
  if (scheme !== 'http' && scheme !== 'https') return entry.replace(/\/$/, '').toLowerCase() // e.g. chrome-extension://<id>
  try {
    return new URL(entry).origin
  } catch {
    throw new ConfigError('COS_ALLOWED_ORIGINS', `${VARIABLES.COS_ALLOWED_ORIGINS.expect} (got ${JSON.stringify(entry)})`)
  }
}

export function allowedHost (entry: string): string {
  const value = isIPv6(entry) ? `[${entry}]` : entry
  const withPort = value.startsWith('[') ? value.includes(']:') : value.includes(':')
  const name = hostName(value)
  if (name === undefined || name === '' || withPort) {
    throw new ConfigError('COS_ALLOWED_HOSTS', `${VARIABLES.COS_ALLOWED_HOSTS.expect} (got ${JSON.stringify(entry)})`)
  }
  return name
}

/** A method list for a route that is not configured restricts nothing: its paths go to the catch-all with every method. */
export function methodsNeedTheirRoute (raw: Raw): void {
  for (const { methods, url } of ROUTE_TABLE) {
    if (raw[methods] !== undefined && raw[url] === undefined) {
      throw new ConfigError(methods, `is set but ${url} is not: the list would restrict no route`)
    }
  }
}

export function cidrList (list: string): string[] {
  const cidrs = list.split(',').map(c => c.trim()).filter(c => c !== '')
  if (cidrs.length === 0) throw new ConfigError('COS_ALLOW_FROM', 'must list at least one CIDR')
  for (const cidr of cidrs) {
    const [address = '', bits, extra] = cidr.split('/')
    const family = isIP(address)
    const max = family === 6 ? 128 : 32
    const prefix = Number(bits)
    if (family === 0 || extra !== undefined || bits === undefined || !/^[0-9]{1,3}$/.test(bits) || prefix > max) {
      throw new ConfigError('COS_ALLOW_FROM', `${VARIABLES.COS_ALLOW_FROM.expect} (got ${JSON.stringify(cidr)})`)
    }
  }
  return cidrs
}

// RFC 9110 token characters.
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/

function hasControlChar (s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x20 || c === 0x7f) return true
  }
  return false
}

export function requiredHeader (spec: string): { name: string, value?: string } {
  const colon = spec.indexOf(':')
  const name = (colon < 0 ? spec : spec.slice(0, colon)).trim()
  const value = colon < 0 ? undefined : spec.slice(colon + 1).trim()
  if (!HEADER_NAME.test(name) || value === '' || (value !== undefined && hasControlChar(value))) {
    throw new ConfigError('COS_REQUIRE_HEADER', `${VARIABLES.COS_REQUIRE_HEADER.expect} (got ${JSON.stringify(spec)})`)
  }
  return value === undefined ? { name: name.toLowerCase() } : { name: name.toLowerCase(), value }
}

export function tlsFiles (caFile: string | undefined, clientCertFile: string | undefined, clientKeyFile: string | undefined): TlsFiles {
  if ((clientCertFile === undefined) !== (clientKeyFile === undefined)) {
    const missing = clientCertFile === undefined ? 'COS_CLIENT_CERT_FILE' : 'COS_CLIENT_KEY_FILE'
    throw new ConfigError(missing, 'is required when the other half of the client certificate is set')
  }
  return {
    ...(caFile === undefined ? {} : { caFile }),
    ...(clientCertFile === undefined ? {} : { clientCertFile }),
    ...(clientKeyFile === undefined ? {} : { clientKeyFile }),
  }
}

export function hostname (name: 'COS_LISTEN_HOST' | 'COS_MOCK_HOST' | 'COS_ADMIN_HOST', host: string): string {
  if (isIP(host) === 0 && !/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/.test(host)) {
    throw new ConfigError(name, `${VARIABLES[name].expect} (got ${JSON.stringify(host)})`)
  }
  return host
}

/** A URL as it may be echoed: with an '@' anywhere it may hold a password (even malformed), so it is not shown. */
function withoutUserinfo (url: string): string {
  return url.includes('@') ? '<not shown: contains "@">' : url
}

export function egress (raw: Raw): Egress {
  const http = egressProxy(raw, 'http_proxy', 'HTTP_PROXY')
  const https = egressProxy(raw, 'https_proxy', 'HTTPS_PROXY')
  return {
    ...(http === undefined ? {} : { http }),
    ...(https === undefined ? {} : { https }),
    noProxy: (raw.no_proxy ?? raw.NO_PROXY ?? '').split(/[\s,]+/).map(e => e.toLowerCase()).filter(e => e !== ''),
  }
}

/**
 * A proxy URL as curl and Go read it: without a scheme it is http://, and
 * without a port it is the scheme's (80 or 443, as Go; curl would say 1080).
 * Errors never echo a value that may hold a password.
 */
function egressProxy (raw: Raw, lower: 'http_proxy' | 'https_proxy', upper: 'HTTP_PROXY' | 'HTTPS_PROXY'): EgressProxy | undefined {
  const variable = raw[lower] === undefined ? upper : lower
  const value = raw[variable]
  if (value === undefined) return undefined
  let url: URL
  try {
    url = new URL(/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value) ? value : `http://${value}`)
  } catch {
    throw new ConfigError(variable, `${PROXY_URL.expect} (got ${JSON.stringify(withoutUserinfo(value))})`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ConfigError(variable, `must be an http:// or https:// proxy URL (got ${JSON.stringify(url.protocol.slice(0, -1))})`)
  }
  if (url.hostname === '' || url.pathname !== '/' || url.search !== '' || url.hash !== '' || value.includes('?') || value.includes('#')) {
    throw new ConfigError(variable, `${PROXY_URL.expect}, without path, query or fragment`)
  }
  const port = url.port === '' ? (url.protocol === 'https:' ? '443' : '80') : url.port
  const address = `${url.protocol}//${url.hostname}:${port}`
  if (url.username === '' && url.password === '') return { variable, address, url: address }
  let credentials: string
  try {
    credentials = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`
  } catch {
    throw new ConfigError(variable, 'has malformed percent-encoding in its user:password')
  }
  return {
    variable,
    address,
    url: `${url.protocol}//${url.username}${url.password === '' ? '' : `:${Secret.REDACTED}`}@${url.hostname}:${port}`,
    authorization: new Secret(`Basic ${Buffer.from(credentials).toString('base64')}`),
  }
}

/** One prefix's segments start the other's, compared as the lookalike check folds them (guard.ts prefixLookalike relies on it). */
export function overlaps (a: string, b: string): boolean {
  const [x, y] = [foldedPrefix(a), foldedPrefix(b)]
  return x.every((s, i) => i >= y.length || s === y[i])
}

export function route (name: RouteName, urlVar: VariableName, url: string | undefined, prefixVar: VariableName | undefined, prefix: string | undefined): Route | undefined {
  if (url === undefined) return undefined
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    throw new ConfigError(urlVar, `must be an absolute http(s) URL (got ${JSON.stringify(withoutUserinfo(url))})`)
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new ConfigError(urlVar, `must use http or https (got ${JSON.stringify(parsed.protocol.slice(0, -1))})`)
  }
  if (parsed.search !== '' || url.includes('?')) throw new ConfigError(urlVar, 'must not have a query string')
  if (parsed.hash !== '' || url.includes('#')) throw new ConfigError(urlVar, 'must not have a fragment')
  if (parsed.username !== '' || parsed.password !== '') {
    // Never echo it: userinfo is a credential.
    throw new ConfigError(urlVar, 'must not contain user:password; the proxy signs requests itself')
  }
  let p = prefix ?? ''
  if (prefixVar !== undefined) {
    if (!/^(\/[A-Za-z0-9\-._~!$&'()+,;=@]+)+\/?$/.test(p)) {
      throw new ConfigError(prefixVar, `must be a path like /${name}: segments of URL-safe characters, no wildcards, not "/" (got ${JSON.stringify(p)})`)
    }
    if (p.endsWith('/')) p = p.slice(0, -1)
    if (p.split('/').slice(1).some(segment => foldSegment(segment) === '')) {
      throw new ConfigError(prefixVar, `must not have a segment of only dots or ";params" (got ${JSON.stringify(prefix)})`)
    }
  }
  return {
    name,
    prefix: p,
    origin: parsed.origin,
    basePath: parsed.pathname.replace(/\/+$/, ''),
    url: parsed.href,
  }
}

export function credentialSource (name: 'COS_ACCESS_KEY' | 'COS_ACCESS_KEY_SECRET', file: string | undefined, literal: string | undefined, needs: Needs): CredentialSource {
  if (file !== undefined && literal !== undefined) {
    throw new ConfigError(`${name}_FILE`, `and ${name} are both set; set only one`)
  }
  if (file !== undefined) return { file }
  if (literal !== undefined) return { value: new Secret(literal) }
  if (needs === 'nothing') return {}
  throw new ConfigError(`${name}_FILE`, `(or ${name}) is required`)
}

