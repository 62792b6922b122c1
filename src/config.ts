// Environment → one validated, typed, frozen Config. Every error names the
// variable; a secret's value is never echoed.
import { readFileSync } from 'node:fs'
import { isIP, isIPv6 } from 'node:net'
import { parseEnv } from 'node:util'
import envSchema from 'env-schema'
import { foldedPrefix, foldSegment, hostName } from './guard.js'
import type { Egress, EgressProxy } from './egress.js'
import { Secret } from './secret.js'
import { TOKEN_ENCODINGS, type TokenEncoding } from './token.js'

export const EXIT_CONFIG = 78 // EX_CONFIG from sysexits.h

export class ConfigError extends Error {
  readonly variable: string
  constructor (variable: string, problem: string) {
    super(`${variable} ${problem}`)
    this.name = 'ConfigError'
    this.variable = variable
  }
}

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const
export type LogLevel = typeof LOG_LEVELS[number]
/** json: one JSON object a line, for collectors; pretty: one readable line an event, for a terminal. */
export const LOG_FORMATS = ['json', 'pretty'] as const
export type LogFormat = typeof LOG_FORMATS[number]

export type RouteName = 'management' | 'optimize' | 'api'

export interface Route {
  readonly name: RouteName
  /** Path prefix claimed on the proxy ('' for the catch-all api route). */
  readonly prefix: string
  /** Upstream origin, e.g. https://h:8443 */
  readonly origin: string
  /** Upstream path prepended to the forwarded path, '' or '/api/v1' (never a trailing '/'). */
  readonly basePath: string
  /** The URL as configured, for display. */
  readonly url: string
  /** Methods this route forwards; undefined = all the proxy supports. */
  readonly allowedMethods?: readonly string[]
}

export interface CredentialSource {
  readonly file?: string
  readonly value?: Secret
}

export interface Config {
  readonly listen: { readonly host: string, readonly port: number }
  readonly routes: readonly Route[]
  readonly credentials: { readonly accessKey: CredentialSource, readonly secret: CredentialSource }
  readonly tokenEncoding: TokenEncoding
  readonly upstreamTimeoutMs: number
  readonly connectTimeoutMs: number
  /** Sockets per upstream origin (undici Pool `connections`); requests beyond them queue. */
  readonly upstreamMaxConnections: number
  readonly logLevel: LogLevel
  readonly logFormat: LogFormat
  /** Where `mock-api` listens. */
  readonly mockHost: string
  /** Fallback re-read period of the credential files (they are also watched). */
  readonly credentialsReloadMs: number
  readonly admin: {
    readonly host: string
    readonly port: number
    /** Connections the admin listener holds at once (it serves probes and scrapers). */
    readonly maxConnections: number
  }
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  /** Longest silence allowed while a body streams, either way. */
  readonly bodyIdleTimeoutMs: number
  readonly tls: { readonly caFile?: string, readonly clientCertFile?: string, readonly clientKeyFile?: string }
  /** Source CIDRs allowed to use the proxy listener (checked on the socket's peer address). */
  readonly allowFrom: readonly string[]
  /** Whether allowFrom is the loopback-only default. */
  readonly allowFromIsDefault: boolean
  /** A header every client request must carry; it is not forwarded. */
  readonly requireHeader?: { readonly name: string, readonly value?: string }
  /** 0 = unlimited. */
  readonly maxBodyBytes: number
  /** Origins (lower case, as browsers send them) whose pages may use the proxy; any other Origin is refused. */
  readonly allowedOrigins: readonly string[]
  /** Names besides loopback the Host header may carry (as guard.hostName reads them, no port). */
  readonly allowedHosts: readonly string[]
  readonly client: {
    readonly headersTimeoutMs: number
    readonly requestTimeoutMs: number
    readonly keepAliveTimeoutMs: number
    readonly maxConnections: number
  }
  /** The forward proxies upstream connections go through (HTTPS_PROXY, HTTP_PROXY, NO_PROXY). */
  readonly egress: Egress
  /** Shift minted timestamps by the upstream clock's measured offset (COS_CLOCK_SKEW_CORRECTION). */
  readonly clockSkewCorrection: boolean
}

interface VarSpec {
  readonly type: 'string' | 'integer' | 'boolean'
  readonly default?: string | number | boolean
  readonly enum?: readonly string[]
  readonly minimum?: number
  readonly maximum?: number
  /** What a valid value looks like, for the error line. */
  readonly expect: string
  /** Never echo the value. */
  readonly secret?: boolean
}

const PROXY_URL = { type: 'string', expect: 'must be a proxy URL like http://user:password@proxy.example.com:3128', secret: true } as const
const NO_PROXY = { type: 'string', expect: 'must be a comma-separated list of hosts, .domains, IP addresses, CIDRs, host:port or *' } as const

const TIMEOUT = { type: 'integer', minimum: 1, maximum: 2_147_483_647, expect: 'must be a whole number of milliseconds ≥ 1' } as const

/** The one table of settings: schema, defaults and error texts all come from here. */
export const VARIABLES = {
  COS_LISTEN_HOST: { type: 'string', default: '127.0.0.1', expect: 'must be an IP address or host name' },
  COS_LISTEN_PORT: { type: 'integer', default: 8080, minimum: 0, maximum: 65535, expect: 'must be a port number 0-65535' },
  COS_API_URL: { type: 'string', expect: 'must be an absolute http(s) URL without query' },
  COS_MANAGEMENT_API_URL: { type: 'string', expect: 'must be an absolute http(s) URL without query' },
  COS_MANAGEMENT_PATH_PREFIX: { type: 'string', default: '/management', expect: 'must be a path like /management' },
  COS_OPTIMIZE_API_URL: { type: 'string', expect: 'must be an absolute http(s) URL without query' },
  COS_OPTIMIZE_PATH_PREFIX: { type: 'string', default: '/optimize', expect: 'must be a path like /optimize' },
  COS_ACCESS_KEY_FILE: { type: 'string', expect: 'must be a file path' },
  COS_ACCESS_KEY_SECRET_FILE: { type: 'string', expect: 'must be a file path' },
  COS_ACCESS_KEY: { type: 'string', expect: 'must be the access key' },
  COS_ACCESS_KEY_SECRET: { type: 'string', expect: 'must be the access key secret', secret: true },
  COS_TOKEN_ENCODING: { type: 'string', default: 'url', enum: TOKEN_ENCODINGS, expect: `must be one of ${TOKEN_ENCODINGS.join(', ')}` },
  // JSON Schema's boolean, as env-schema coerces it: exactly "true" or "false".
  COS_CLOCK_SKEW_CORRECTION: { type: 'boolean', default: false, expect: 'must be true or false' },
  COS_UPSTREAM_TIMEOUT_MS: { ...TIMEOUT, default: 30_000 },
  COS_CONNECT_TIMEOUT_MS: { ...TIMEOUT, default: 5_000 },
  // Unbounded, undici opens one socket per concurrent request, up to
  // COS_MAX_CONNECTIONS of them. Fewer queue requests inside the proxy: 32
  // cost 9 % more CPU per request at 32 clients, 256 nothing measurable at 256
  // (README, Performance); and a pool of N over a link of RTT t carries at
  // most about N / t requests a second.
  COS_UPSTREAM_MAX_CONNECTIONS: { type: 'integer', default: 256, minimum: 1, maximum: 65_536, expect: 'must be a whole number of connections 1-65536' },
  COS_LOG_LEVEL: { type: 'string', default: 'info', enum: LOG_LEVELS, expect: `must be one of ${LOG_LEVELS.join(', ')}` },
  COS_LOG_FORMAT: { type: 'string', default: 'json', enum: LOG_FORMATS, expect: `must be one of ${LOG_FORMATS.join(', ')}` },
  COS_MOCK_HOST: { type: 'string', default: '127.0.0.1', expect: 'must be an IP address or host name' },
  COS_CREDENTIALS_RELOAD_MS: { ...TIMEOUT, default: 1_000 },
  COS_ADMIN_HOST: { type: 'string', default: '127.0.0.1', expect: 'must be an IP address or host name' },
  COS_ADMIN_PORT: { type: 'integer', default: 9090, minimum: 0, maximum: 65535, expect: 'must be a port number 0-65535' },
  COS_ADMIN_MAX_CONNECTIONS: { type: 'integer', default: 64, minimum: 1, maximum: 1_000_000, expect: 'must be a whole number of connections ≥ 1' },
  COS_SHUTDOWN_DELAY_MS: { type: 'integer', default: 0, minimum: 0, maximum: 2_147_483_647, expect: 'must be a whole number of milliseconds ≥ 0' },
  COS_SHUTDOWN_TIMEOUT_MS: { ...TIMEOUT, default: 25_000 },
  COS_BODY_IDLE_TIMEOUT_MS: { ...TIMEOUT, default: 60_000 },
  COS_CA_FILE: { type: 'string', expect: 'must be a file path' },
  COS_CLIENT_CERT_FILE: { type: 'string', expect: 'must be a file path' },
  COS_CLIENT_KEY_FILE: { type: 'string', expect: 'must be a file path' },
  COS_ALLOW_FROM: { type: 'string', default: '127.0.0.0/8,::1/128', expect: 'must be a comma-separated list of CIDRs like 10.0.0.0/8,fd00::/8' },
  COS_REQUIRE_HEADER: { type: 'string', expect: 'must be "Header-Name: value" or "Header-Name"' },
  COS_ALLOWED_ORIGINS: { type: 'string', expect: 'must be a comma-separated list of origins like https://app.example:3000' },
  COS_ALLOWED_HOSTS: { type: 'string', expect: 'must be a comma-separated list of host names or IP addresses without a port, like proxy.internal,10.0.0.5,[fd00::1]' },
  COS_MANAGEMENT_ALLOWED_METHODS: { type: 'string', expect: 'must be a comma-separated list of HTTP methods like GET,HEAD' },
  COS_OPTIMIZE_ALLOWED_METHODS: { type: 'string', expect: 'must be a comma-separated list of HTTP methods like GET,HEAD' },
  COS_API_ALLOWED_METHODS: { type: 'string', expect: 'must be a comma-separated list of HTTP methods like GET,HEAD' },
  COS_MAX_BODY_BYTES: { type: 'integer', default: 0, minimum: 0, maximum: Number.MAX_SAFE_INTEGER, expect: 'must be a whole number of bytes (0 = unlimited)' },
  COS_HEADERS_TIMEOUT_MS: { ...TIMEOUT, default: 10_000 },
  COS_REQUEST_TIMEOUT_MS: { type: 'integer', default: 300_000, minimum: 0, maximum: 2_147_483_647, expect: 'must be a whole number of milliseconds (0 = none)' },
  // Node arms the idle socket's timer 1000 ms later than this, and a timer must fit in 32 bits.
  COS_KEEPALIVE_TIMEOUT_MS: { ...TIMEOUT, default: 5_000, maximum: 2_147_482_647, expect: 'must be a whole number of milliseconds 1-2147482647' },
  COS_MAX_CONNECTIONS: { type: 'integer', default: 1024, minimum: 1, maximum: 1_000_000, expect: 'must be a whole number of connections ≥ 1' },
  // The usual names, read from the same environment as the rest; the
  // lowercase one wins when both are set (curl, undici, Python, wget).
  https_proxy: PROXY_URL,
  HTTPS_PROXY: PROXY_URL,
  http_proxy: PROXY_URL,
  HTTP_PROXY: PROXY_URL,
  no_proxy: NO_PROXY,
  NO_PROXY,
} as const satisfies Record<string, VarSpec>

export type VariableName = keyof typeof VARIABLES
type RawValue<T> = T extends 'integer' ? number : T extends 'boolean' ? boolean : string | undefined
type Raw = { -readonly [K in VariableName]: RawValue<(typeof VARIABLES)[K]['type']> }

function jsonSchema (): object {
  const properties: Record<string, object> = {}
  for (const [name, spec] of Object.entries(VARIABLES) as [string, VarSpec][]) {
    const { type, default: def, enum: values, minimum, maximum } = spec
    properties[name] = Object.fromEntries(Object.entries({ type, default: def, enum: values, minimum, maximum }).filter(([, v]) => v !== undefined))
  }
  return { type: 'object', properties }
}

interface AjvError { instancePath?: string, params?: { missingProperty?: string } }

export interface LoadOptions {
  /** Variables to read; default process.env. */
  readonly env?: NodeJS.ProcessEnv
  /** Read ./.env too (real env wins). Default true. */
  readonly dotenv?: boolean
  /**
   * What the command needs: `serve` everything; `token`, `verify` and
   * `mock-api` only the credentials; `wait` neither upstream nor credentials.
   */
  readonly needs?: 'all' | 'credentials' | 'nothing'
}

/**
 * Reads the environment (and ./.env) into a Config. Throws ConfigError for the
 * first problem found. Empty values count as unset, as they do for most
 * sidecars configured through Kubernetes or compose (`FOO=`).
 */
export function loadConfig (opts: LoadOptions = {}): Config {
  // .env is read here rather than by env-schema's `dotenv` option (same parser,
  // node:util parseEnv) so that its empty values are dropped like the real
  // environment's: env-schema would coerce `COS_LISTEN_PORT=` to port 0.
  const sources = [opts.dotenv === false ? {} : readDotenv(), opts.env ?? process.env]
  const data: Record<string, string> = {}
  for (const source of sources) {
    for (const name of Object.keys(VARIABLES)) {
      const v = source[name]
      if (v !== undefined && v !== '') data[name] = v
    }
  }
  let raw: Raw
  try {
    raw = envSchema<Raw>({ schema: jsonSchema(), data, env: false, dotenv: false })
  } catch (err) {
    throw schemaError(err, data)
  }
  return Object.freeze(build(raw, opts.needs ?? 'all'))
}

function readDotenv (): Record<string, string | undefined> {
  let text: string
  try {
    text = readFileSync('.env', 'utf8')
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {}
    throw new ConfigError('.env', `cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  return parseEnv(text)
}

function schemaError (err: unknown, data: Record<string, string>): Error {
  const first = (err as { errors?: AjvError[] }).errors?.[0]
  const name = first?.instancePath?.slice(1) ?? first?.params?.missingProperty
  if (name !== undefined && name in VARIABLES) {
    const spec: VarSpec = VARIABLES[name as VariableName]
    const got = spec.secret === true || data[name] === undefined ? '' : ` (got ${JSON.stringify(data[name])})`
    return new ConfigError(name, spec.expect + got)
  }
  return err instanceof Error ? err : new Error(String(err))
}

function build (raw: Raw, needs: NonNullable<LoadOptions['needs']>): Config {
  const host = hostname('COS_LISTEN_HOST', raw.COS_LISTEN_HOST ?? '127.0.0.1')
  const routes: Route[] = []
  const management = withMethods(route('management', 'COS_MANAGEMENT_API_URL', raw.COS_MANAGEMENT_API_URL, 'COS_MANAGEMENT_PATH_PREFIX', raw.COS_MANAGEMENT_PATH_PREFIX), 'COS_MANAGEMENT_ALLOWED_METHODS', raw.COS_MANAGEMENT_ALLOWED_METHODS)
  const optimize = withMethods(route('optimize', 'COS_OPTIMIZE_API_URL', raw.COS_OPTIMIZE_API_URL, 'COS_OPTIMIZE_PATH_PREFIX', raw.COS_OPTIMIZE_PATH_PREFIX), 'COS_OPTIMIZE_ALLOWED_METHODS', raw.COS_OPTIMIZE_ALLOWED_METHODS)
  const api = withMethods(route('api', 'COS_API_URL', raw.COS_API_URL, undefined, ''), 'COS_API_ALLOWED_METHODS', raw.COS_API_ALLOWED_METHODS)
  if (management) routes.push(management)
  if (optimize) routes.push(optimize)
  if (management && optimize && overlaps(management.prefix, optimize.prefix)) {
    throw new ConfigError('COS_OPTIMIZE_PATH_PREFIX', `must not overlap COS_MANAGEMENT_PATH_PREFIX, also ignoring case, ";params" and trailing dots (both claim ${JSON.stringify(optimize.prefix)})`)
  }
  if (api) routes.push(api)
  const admin = { host: hostname('COS_ADMIN_HOST', raw.COS_ADMIN_HOST ?? '127.0.0.1'), port: raw.COS_ADMIN_PORT, maxConnections: raw.COS_ADMIN_MAX_CONNECTIONS }
  if (admin.port !== 0 && admin.port === raw.COS_LISTEN_PORT && (admin.host === host || [admin.host, host].some(h => h === '0.0.0.0' || h === '::'))) {
    throw new ConfigError('COS_ADMIN_PORT', `must differ from COS_LISTEN_PORT (${admin.port}): health and metrics never share the proxy port`)
  }
  if (routes.length === 0 && needs === 'all') {
    throw new ConfigError('COS_API_URL', 'or COS_MANAGEMENT_API_URL or COS_OPTIMIZE_API_URL is required: nothing to forward to')
  }
  methodsNeedTheirRoute(raw)
  if (raw.COS_REQUEST_TIMEOUT_MS !== 0 && raw.COS_REQUEST_TIMEOUT_MS < raw.COS_HEADERS_TIMEOUT_MS) {
    // Node's HTTP server throws a RangeError for it at start-up.
    throw new ConfigError('COS_REQUEST_TIMEOUT_MS', `must be 0 (no limit) or at least COS_HEADERS_TIMEOUT_MS (${raw.COS_HEADERS_TIMEOUT_MS}): the whole request cannot take less time than its headers (got ${raw.COS_REQUEST_TIMEOUT_MS})`)
  }
  return {
    listen: { host, port: raw.COS_LISTEN_PORT },
    routes,
    credentials: {
      accessKey: credentialSource('COS_ACCESS_KEY', raw.COS_ACCESS_KEY_FILE, raw.COS_ACCESS_KEY, needs),
      secret: credentialSource('COS_ACCESS_KEY_SECRET', raw.COS_ACCESS_KEY_SECRET_FILE, raw.COS_ACCESS_KEY_SECRET, needs),
    },
    tokenEncoding: raw.COS_TOKEN_ENCODING as TokenEncoding,
    upstreamTimeoutMs: raw.COS_UPSTREAM_TIMEOUT_MS,
    connectTimeoutMs: raw.COS_CONNECT_TIMEOUT_MS,
    upstreamMaxConnections: raw.COS_UPSTREAM_MAX_CONNECTIONS,
    logLevel: raw.COS_LOG_LEVEL as LogLevel,
    logFormat: raw.COS_LOG_FORMAT as LogFormat,
    mockHost: hostname('COS_MOCK_HOST', raw.COS_MOCK_HOST ?? '127.0.0.1'),
    credentialsReloadMs: raw.COS_CREDENTIALS_RELOAD_MS,
    admin,
    shutdownDelayMs: raw.COS_SHUTDOWN_DELAY_MS,
    shutdownTimeoutMs: raw.COS_SHUTDOWN_TIMEOUT_MS,
    bodyIdleTimeoutMs: raw.COS_BODY_IDLE_TIMEOUT_MS,
    tls: tlsFiles(raw.COS_CA_FILE, raw.COS_CLIENT_CERT_FILE, raw.COS_CLIENT_KEY_FILE),
    allowFrom: cidrList(raw.COS_ALLOW_FROM ?? VARIABLES.COS_ALLOW_FROM.default),
    allowFromIsDefault: raw.COS_ALLOW_FROM === undefined || raw.COS_ALLOW_FROM === VARIABLES.COS_ALLOW_FROM.default,
    ...(raw.COS_REQUIRE_HEADER === undefined ? {} : { requireHeader: requiredHeader(raw.COS_REQUIRE_HEADER) }),
    maxBodyBytes: raw.COS_MAX_BODY_BYTES,
    allowedOrigins: list(raw.COS_ALLOWED_ORIGINS).map(allowedOrigin),
    allowedHosts: list(raw.COS_ALLOWED_HOSTS).map(allowedHost),
    client: {
      headersTimeoutMs: raw.COS_HEADERS_TIMEOUT_MS,
      requestTimeoutMs: raw.COS_REQUEST_TIMEOUT_MS,
      keepAliveTimeoutMs: raw.COS_KEEPALIVE_TIMEOUT_MS,
      maxConnections: raw.COS_MAX_CONNECTIONS,
    },
    // Only serving connects upstream: a stray proxy variable must not stop `token` or `verify`.
    egress: needs === 'all' ? egress(raw) : { noProxy: [] },
    clockSkewCorrection: raw.COS_CLOCK_SKEW_CORRECTION,
  }
}

/** Methods the proxy forwards at all; CONNECT and TRACE are never forwarded. */
export const PROXY_METHODS = ['DELETE', 'GET', 'HEAD', 'PATCH', 'POST', 'PUT', 'OPTIONS'] as const

function withMethods (r: Route | undefined, variable: VariableName, list: string | undefined): Route | undefined {
  if (r === undefined || list === undefined) return r
  const methods = list.split(',').map(m => m.trim().toUpperCase()).filter(m => m !== '')
  const unknown = methods.find(m => !(PROXY_METHODS as readonly string[]).includes(m))
  if (methods.length === 0 || unknown !== undefined) {
    throw new ConfigError(variable, `must be a comma-separated list of ${PROXY_METHODS.join(', ')}${unknown === undefined ? '' : ` (got ${JSON.stringify(unknown)})`}`)
  }
  return { ...r, allowedMethods: [...new Set(methods)] }
}

function list (value: string | undefined): string[] {
  return value === undefined ? [] : value.split(',').map(v => v.trim()).filter(v => v !== '')
}

// scheme://host[:port], and a trailing "/" as copied from an address bar.
const ORIGIN = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/[^/?#@\s]+\/?$/

/** An origin as a browser's Origin header spells it: lower case; for http(s) without the default port, an IDN as punycode. */
function allowedOrigin (entry: string): string {
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

function allowedHost (entry: string): string {
  const value = isIPv6(entry) ? `[${entry}]` : entry
  const withPort = value.startsWith('[') ? value.includes(']:') : value.includes(':')
  const name = hostName(value)
  if (name === undefined || name === '' || withPort) {
    throw new ConfigError('COS_ALLOWED_HOSTS', `${VARIABLES.COS_ALLOWED_HOSTS.expect} (got ${JSON.stringify(entry)})`)
  }
  return name
}

const ROUTE_URLS = [
  ['COS_MANAGEMENT_ALLOWED_METHODS', 'COS_MANAGEMENT_API_URL'],
  ['COS_OPTIMIZE_ALLOWED_METHODS', 'COS_OPTIMIZE_API_URL'],
  ['COS_API_ALLOWED_METHODS', 'COS_API_URL'],
] as const

/** A method list for a route that is not configured restricts nothing: its paths go to the catch-all with every method. */
function methodsNeedTheirRoute (raw: Raw): void {
  for (const [methods, url] of ROUTE_URLS) {
    if (raw[methods] !== undefined && raw[url] === undefined) {
      throw new ConfigError(methods, `is set but ${url} is not: the list would restrict no route`)
    }
  }
}

function cidrList (list: string): string[] {
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

function requiredHeader (spec: string): { name: string, value?: string } {
  const colon = spec.indexOf(':')
  const name = (colon < 0 ? spec : spec.slice(0, colon)).trim()
  const value = colon < 0 ? undefined : spec.slice(colon + 1).trim()
  if (!HEADER_NAME.test(name) || value === '' || (value !== undefined && hasControlChar(value))) {
    throw new ConfigError('COS_REQUIRE_HEADER', `${VARIABLES.COS_REQUIRE_HEADER.expect} (got ${JSON.stringify(spec)})`)
  }
  return value === undefined ? { name: name.toLowerCase() } : { name: name.toLowerCase(), value }
}

function tlsFiles (caFile: string | undefined, clientCertFile: string | undefined, clientKeyFile: string | undefined): Config['tls'] {
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

function hostname (name: 'COS_LISTEN_HOST' | 'COS_MOCK_HOST' | 'COS_ADMIN_HOST', host: string): string {
  if (isIP(host) === 0 && !/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/.test(host)) {
    throw new ConfigError(name, `${VARIABLES[name].expect} (got ${JSON.stringify(host)})`)
  }
  return host
}

/** A URL as it may be echoed: with an '@' anywhere it may hold a password (even malformed), so it is not shown. */
function withoutUserinfo (url: string): string {
  return url.includes('@') ? '<not shown: contains "@">' : url
}

function egress (raw: Raw): Egress {
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
function overlaps (a: string, b: string): boolean {
  const [x, y] = [foldedPrefix(a), foldedPrefix(b)]
  return x.every((s, i) => i >= y.length || s === y[i])
}

function route (name: RouteName, urlVar: VariableName, url: string | undefined, prefixVar: VariableName | undefined, prefix: string | undefined): Route | undefined {
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

function credentialSource (name: 'COS_ACCESS_KEY' | 'COS_ACCESS_KEY_SECRET', file: string | undefined, literal: string | undefined, needs: NonNullable<LoadOptions['needs']>): CredentialSource {
  if (file !== undefined && literal !== undefined) {
    throw new ConfigError(`${name}_FILE`, `and ${name} are both set; set only one`)
  }
  if (file !== undefined) return { file }
  if (literal !== undefined) return { value: new Secret(literal) }
  if (needs === 'nothing') return {}
  throw new ConfigError(`${name}_FILE`, `(or ${name}) is required`)
}

/** The effective configuration for `cos-auth-proxy config`; secrets print as "[redacted]". */
export function describeConfig (config: Config): string {
  const { accessKey } = config.credentials
  // The access key is an identifier and may be shown; the secret is a Secret and prints as "[redacted]".
  const shown = accessKey.value === undefined ? accessKey : { value: accessKey.value.reveal() }
  return JSON.stringify({ ...config, credentials: { ...config.credentials, accessKey: shown } }, null, 2)
}
