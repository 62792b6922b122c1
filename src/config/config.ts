// Environment → one validated, typed, frozen Config. Every error names the
// variable; a secret's value is never echoed.
// The table of variables: config-variables.ts; single values: config-values.ts.
import { readFileSync } from 'node:fs'
import { parseEnv } from 'node:util'
import envSchema from 'env-schema'
import { ConfigError, VARIABLES, checkIntegers, jsonSchema, schemaError, type AccessLog, type LogFormat, type LogLevel, type Raw, type RawOf, type Table } from './config-variables.js'
import { allowedHost, allowedOrigin, cidrList, credentialSource, egress, hostname, list, methodsNeedTheirRoute, overlaps, requiredHeader, route, tlsFiles, withMethods, type CredentialSource, type Egress, type Needs, type TlsFiles } from './config-values.js'
import { ROUTE_TABLE, oneRouteUrl, type Route } from './route.js'
import type { TokenEncoding } from '../token/token.js'

export { ACCESS_LOGS, ConfigError, EXIT_CONFIG, INJECT_VARIABLES, LOG_FORMATS, LOG_LEVELS, PROXY_METHODS, VARIABLES, type AccessLog, type LogFormat, type LogLevel, type VariableName } from './config-variables.js'
export type { CredentialSource } from './config-values.js'
export { ROUTE_TABLE, oneRouteUrl, routeUrlList, type Route, type RouteName } from './route.js'

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
  /** Which requests get a request line (COS_ACCESS_LOG, _SLOW_MS, _SAMPLE). */
  readonly accessLog: AccessLogSettings
  /** Where `mock-api` listens. */
  readonly mockHost: string
  /** Fallback re-read period of the credential files (they are also watched). */
  readonly credentialsReloadMs: number
  readonly admin: {
    readonly host: string
    readonly port: number
    /** Connections the admin listener holds at once (it serves probes and scrapers). */
    readonly maxConnections: number
    /** Whether POST /quitquitquit may start the drain (COS_QUITQUITQUIT). */
    readonly quitquitquit: boolean
  }
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  /** Longest silence allowed while a body streams, either way. */
  readonly bodyIdleTimeoutMs: number
  readonly tls: TlsFiles
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
  /** The largest skew the correction follows, either way; a Date further off is refused (COS_CLOCK_SKEW_MAX_SECONDS). */
  readonly clockSkewMaxSeconds: number
}

export interface AccessLogSettings {
  readonly mode: AccessLog
  /** In `errors` mode, a request at least this long gets a line too. */
  readonly slowMs: number
  /** In `errors` mode, this share of the other requests gets a line too (0–1). */
  readonly sample: number
}

export interface LoadOptions {
  /** Variables to read (cli.ts hands in process.env: nothing below it reads the environment). */
  readonly env: NodeJS.ProcessEnv
  /** Read ./.env too (real env wins). Default true. */
  readonly dotenv?: boolean
  /** What the command needs (see Needs); default all. */
  readonly needs?: Needs
}

/**
 * Reads the environment (and ./.env) into a Config. Throws ConfigError for the
 * first problem found. Empty values count as unset, as they do for most
 * sidecars configured through Kubernetes or compose (`FOO=`).
 */
export function loadConfig (opts: LoadOptions): Config {
  // .env is read here rather than by env-schema's `dotenv` option (same parser,
  // node:util parseEnv) so that its empty values are dropped like the real
  // environment's: env-schema would coerce `COS_LISTEN_PORT=` to port 0.
  const raw = parseVariables(VARIABLES, [opts.dotenv === false ? {} : readDotenv(), opts.env])
  return Object.freeze(build(raw, opts.needs ?? 'all'))
}

/**
 * A table's variables (config-variables.ts) from the sources, a later one
 * winning, through env-schema: types, defaults and ranges from the table, its
 * error line for the first problem. Empty values count as unset.
 */
export function parseVariables<T extends Table> (table: T, sources: readonly Readonly<Record<string, string | undefined>>[]): RawOf<T> {
  const data: Record<string, string> = {}
  for (const source of sources) {
    for (const name of Object.keys(table)) {
      const v = source[name]
      if (v !== undefined && v !== '') data[name] = v
    }
  }
  let raw: RawOf<T>
  try {
    raw = envSchema<RawOf<T>>({ schema: jsonSchema(table), data, env: false, dotenv: false })
  } catch (err) {
    throw schemaError(err, data, table)
  }
  checkIntegers(raw, data, table)
  return raw
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


/** The routes of ROUTE_TABLE that have a URL, in its order; no two prefixes may overlap. */
function configuredRoutes (raw: Raw): Route[] {
  const routes: Route[] = []
  for (const r of ROUTE_TABLE) {
    const found = withMethods(route(r.name, r.url, raw[r.url], r.prefix, r.prefix === undefined ? '' : raw[r.prefix]), r.methods, raw[r.methods])
    if (found === undefined) continue
    const other = found.prefix === '' ? undefined : routes.find(o => o.prefix !== '' && overlaps(o.prefix, found.prefix))
    if (other !== undefined) {
      const otherVariable = ROUTE_TABLE.find(o => o.name === other.name)?.prefix
      throw new ConfigError(r.prefix ?? r.url, `must not overlap ${otherVariable ?? other.name}, also ignoring case, ";params" and trailing dots (both claim ${JSON.stringify(found.prefix)})`)
    }
    routes.push(found)
  }
  return routes
}

function build (raw: Raw, needs: Needs): Config {
  const host = hostname('COS_LISTEN_HOST', raw.COS_LISTEN_HOST ?? '127.0.0.1')
  const routes = configuredRoutes(raw)
  const admin = { host: hostname('COS_ADMIN_HOST', raw.COS_ADMIN_HOST ?? '127.0.0.1'), port: raw.COS_ADMIN_PORT, maxConnections: raw.COS_ADMIN_MAX_CONNECTIONS, quitquitquit: raw.COS_QUITQUITQUIT }
  if (admin.port !== 0 && admin.port === raw.COS_LISTEN_PORT && (admin.host === host || [admin.host, host].some(h => h === '0.0.0.0' || h === '::'))) {
    throw new ConfigError('COS_ADMIN_PORT', `must differ from COS_LISTEN_PORT (${admin.port}): health and metrics never share the proxy port`)
  }
  if (routes.length === 0 && needs === 'all') {
    const [variable, rest] = oneRouteUrl()
    throw new ConfigError(variable, `${rest} is required: nothing to forward to`)
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
    accessLog: { mode: raw.COS_ACCESS_LOG as AccessLog, slowMs: raw.COS_ACCESS_LOG_SLOW_MS, sample: raw.COS_ACCESS_LOG_SAMPLE },
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
    clockSkewMaxSeconds: raw.COS_CLOCK_SKEW_MAX_SECONDS,
  }
}

/** The effective configuration for `cos-auth-proxy config`; secrets print as "[redacted]". */
export function describeConfig (config: Config): string {
  const { accessKey } = config.credentials
  // The access key is an identifier and may be shown; the secret is a Secret and prints as "[redacted]".
  const shown = accessKey.value === undefined ? accessKey : { value: accessKey.value.reveal() }
  return JSON.stringify({ ...config, credentials: { ...config.credentials, accessKey: shown } }, null, 2)
}
