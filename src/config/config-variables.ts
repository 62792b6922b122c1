// The one table of settings (VARIABLES): each variable's type, default,
// range and the text its error line gives; the JSON schema env-schema checks
// the environment against is built from it, and so are its error lines.
import { TOKEN_ENCODINGS } from '../token/token.js'

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
/** Which requests get a line: errors (≥ 400, unanswered, slow; the default), all, or off. */
export const ACCESS_LOGS = ['errors', 'all', 'off'] as const
export type AccessLog = typeof ACCESS_LOGS[number]

/** Methods the proxy forwards at all; CONNECT and TRACE are never forwarded. */
export const PROXY_METHODS = ['DELETE', 'GET', 'HEAD', 'PATCH', 'POST', 'PUT', 'OPTIONS'] as const

interface VarSpec {
  readonly type: 'string' | 'integer' | 'number' | 'boolean'
  readonly default?: string | number | boolean
  readonly enum?: readonly string[]
  readonly minimum?: number
  readonly maximum?: number
  /** A string's form (JSON Schema's pattern) and length bound. */
  readonly pattern?: string
  readonly maxLength?: number
  /** What a valid value looks like, for the error line. */
  readonly expect: string
  /** Never echo the value. */
  readonly secret?: boolean
}

export const PROXY_URL = { type: 'string', expect: 'must be a proxy URL like http://user:password@proxy.example.com:3128', secret: true } as const
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
  // Twice the ±5 min window the mock API (and Kerberos) accept: the correction
  // matters only beyond the upstream's window, and a correction of 10 min that
  // ends leaves tokens at most 10 min ahead, refused for at most 5 (operations.md).
  // Under 5 s nothing is ever corrected (2 s is the Date header's noise); a
  // day is more than any clock to correct rather than to fix.
  COS_CLOCK_SKEW_MAX_SECONDS: { type: 'integer', default: 600, minimum: 5, maximum: 86_400, expect: 'must be a whole number of seconds 5-86400' },
  COS_UPSTREAM_TIMEOUT_MS: { ...TIMEOUT, default: 30_000 },
  COS_CONNECT_TIMEOUT_MS: { ...TIMEOUT, default: 5_000 },
  // Unbounded, undici opens one socket per concurrent request, up to
  // COS_MAX_CONNECTIONS of them. Fewer queue requests inside the proxy: 32
  // cost 9 % more CPU per request at 32 clients, 256 nothing measurable at 256
  // (docs/performance.md); and a pool of N over a link of RTT t carries at
  // most about N / t requests a second.
  COS_UPSTREAM_MAX_CONNECTIONS: { type: 'integer', default: 256, minimum: 1, maximum: 65_536, expect: 'must be a whole number of connections 1-65536' },
  COS_LOG_LEVEL: { type: 'string', default: 'info', enum: LOG_LEVELS, expect: `must be one of ${LOG_LEVELS.join(', ')}` },
  COS_LOG_FORMAT: { type: 'string', default: 'json', enum: LOG_FORMATS, expect: `must be one of ${LOG_FORMATS.join(', ')}` },
  // A sidecar logs what needs a look, not every success (docs/operations.md#request-lines).
  COS_ACCESS_LOG: { type: 'string', default: 'errors', enum: ACCESS_LOGS, expect: `must be one of ${ACCESS_LOGS.join(', ')}` },
  // An order of magnitude over the API's usual answer, well under COS_UPSTREAM_TIMEOUT_MS's 30 s:
  // a request drifting toward the timeout is seen before it fails.
  COS_ACCESS_LOG_SLOW_MS: { type: 'integer', default: 5_000, minimum: 0, maximum: 2_147_483_647, expect: 'must be a whole number of milliseconds ≥ 0 (0 = every request is slow)' },
  COS_ACCESS_LOG_SAMPLE: { type: 'number', default: 0, minimum: 0, maximum: 1, expect: 'must be a share of requests from 0 to 1, like 0.001' },
  COS_MOCK_HOST: { type: 'string', default: '127.0.0.1', expect: 'must be an IP address or host name' },
  COS_CREDENTIALS_RELOAD_MS: { ...TIMEOUT, default: 1_000 },
  COS_ADMIN_HOST: { type: 'string', default: '127.0.0.1', expect: 'must be an IP address or host name' },
  COS_ADMIN_PORT: { type: 'integer', default: 9090, minimum: 0, maximum: 65535, expect: 'must be a port number 0-65535' },
  COS_ADMIN_MAX_CONNECTIONS: { type: 'integer', default: 64, minimum: 1, maximum: 1_000_000, expect: 'must be a whole number of connections ≥ 1' },
  // On, as documented since the first release: a connection from localhost to localhost only (admin.ts).
  COS_QUITQUITQUIT: { type: 'boolean', default: true, expect: 'must be true or false' },
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

/**
 * The settings of `cos-auth-proxy inject` beside the proxy's (which it reads
 * too, for its admin port, logs and drain): the same rows, schema and error
 * lines. Whether a file can be read is checked after parsing (src/inject/config.ts).
 */
export const INJECT_VARIABLES = {
  COS_INJECT_HOST: { type: 'string', default: '0.0.0.0', pattern: '^[A-Za-z0-9:.[\\]-]{1,253}$', expect: 'must be an IP address or host name' },
  COS_INJECT_PORT: { type: 'integer', default: 8443, minimum: 0, maximum: 65535, expect: 'must be a port number 0-65535' },
  COS_INJECT_TLS_CERT_FILE: { type: 'string', expect: 'must be a readable PEM certificate (chain) file' },
  COS_INJECT_TLS_KEY_FILE: { type: 'string', expect: 'must be a readable PEM private key file' },
  COS_INJECT_SIDECAR_FILE: { type: 'string', expect: 'must be a readable JSON file with the sidecar definition ({"container": ..., "volumes": [...]}, the chart renders it)' },
  COS_INJECT_DEFAULT_SECRET: { type: 'string', maxLength: 253, pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$', expect: 'must be a Secret name (lower-case DNS subdomain)' },
  COS_INJECT_NATIVE_SIDECAR: { type: 'boolean', default: true, expect: 'must be true (Kubernetes >= 1.29: initContainers with restartPolicy: Always) or false (a plain container)' },
  COS_INJECT_OPENSHIFT: { type: 'boolean', default: false, expect: 'must be true (no runAsUser/runAsGroup in the injected sidecar: OpenShift\'s SCC assigns them) or false (the definition\'s)' },
} as const satisfies Record<string, VarSpec>

export type Table = Readonly<Record<string, VarSpec>>
export type VariableName = keyof typeof VARIABLES
type RawValue<T> = T extends 'integer' | 'number' ? number : T extends 'boolean' ? boolean : string | undefined
export type RawOf<T extends Table> = { -readonly [K in keyof T]: RawValue<T[K]['type']> }
export type Raw = RawOf<typeof VARIABLES>

export function jsonSchema (table: Table = VARIABLES): object {
  const properties: Record<string, object> = {}
  for (const [name, spec] of Object.entries(table)) {
    const { type, default: def, enum: values, minimum, maximum, pattern, maxLength } = spec
    properties[name] = Object.fromEntries(Object.entries({ type, default: def, enum: values, minimum, maximum, pattern, maxLength }).filter(([, v]) => v !== undefined))
  }
  return { type: 'object', properties }
}

/**
 * What the schema lets through but no integer setting means: ajv coerces
 * "Infinity" to a number and passes it (COS_LISTEN_PORT=Infinity loaded).
 */
export function checkIntegers (raw: Record<string, unknown>, data: Record<string, string>, table: Table = VARIABLES): void {
  for (const [name, spec] of Object.entries(table)) {
    if ((spec.type === 'integer' && !Number.isSafeInteger(raw[name])) || (spec.type === 'number' && !Number.isFinite(raw[name]))) {
      throw new ConfigError(name, `${spec.expect}${spec.secret === true || data[name] === undefined ? '' : ` (got ${JSON.stringify(data[name])})`}`)
    }
  }
}

interface AjvError { instancePath?: string, params?: { missingProperty?: string } }

export function schemaError (err: unknown, data: Record<string, string>, table: Table = VARIABLES): Error {
  const first = (err as { errors?: AjvError[] }).errors?.[0]
  const name = first?.instancePath?.slice(1) ?? first?.params?.missingProperty
  const spec = name === undefined || !Object.hasOwn(table, name) ? undefined : table[name]
  if (name !== undefined && spec !== undefined) {
    const got = spec.secret === true || data[name] === undefined ? '' : ` (got ${JSON.stringify(data[name])})`
    return new ConfigError(name, spec.expect + got)
  }
  return err instanceof Error ? err : new Error(String(err))
}
