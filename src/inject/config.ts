// Settings of `cos-auth-proxy inject`: its own COS_INJECT_* variables (this
// table), plus the proxy's (src/config/config.ts) for the admin port, logs, drain,
// and, without COS_INJECT_SIDECAR_FILE, the upstream settings handed to every
// sidecar it injects. Errors are ConfigError: exit 78 with one line naming
// the variable.
import { readFileSync } from 'node:fs'
import { ConfigError, loadConfig, oneRouteUrl, ROUTE_TABLE, type LogFormat, type LogLevel, type VariableName } from '../config/config.js'
import type { InjectSettings } from './patch.js'
import type { EnvVar } from './sidecar.js'
import { injectSettings, parseSidecarFile, templateFromEnv } from './template.js'

interface InjectVarSpec {
  readonly kind: 'string' | 'port' | 'boolean' | 'file' | 'name'
  readonly default?: string
  readonly required?: boolean
  readonly expect: string
}

/** The webhook's own settings: defaults and error texts come from here. */
export const INJECT_VARIABLES = {
  COS_INJECT_HOST: { kind: 'string', default: '0.0.0.0', expect: 'must be an IP address or host name' },
  COS_INJECT_PORT: { kind: 'port', default: '8443', expect: 'must be a port number 0-65535' },
  COS_INJECT_TLS_CERT_FILE: { kind: 'file', required: true, expect: 'must be a readable PEM certificate (chain) file' },
  COS_INJECT_TLS_KEY_FILE: { kind: 'file', required: true, expect: 'must be a readable PEM private key file' },
  COS_INJECT_SIDECAR_FILE: { kind: 'file', expect: 'must be a readable JSON file with the sidecar definition ({"container": ..., "volumes": [...]}, the chart renders it)' },
  COS_INJECT_IMAGE: { kind: 'string', expect: 'must be the image of the injected sidecar, like registry.example.com/cos-auth-proxy:0.1.0' },
  COS_INJECT_DEFAULT_SECRET: { kind: 'name', expect: 'must be a Secret name (lower-case DNS subdomain)' },
  COS_INJECT_NATIVE_SIDECAR: { kind: 'boolean', default: 'true', expect: 'must be true (Kubernetes >= 1.29: initContainers with restartPolicy: Always) or false (a plain container)' },
} as const satisfies Record<string, InjectVarSpec>

type InjectVariable = keyof typeof INJECT_VARIABLES

/** Without a sidecar file: upstream settings the sidecars get, in the order the chart writes them. */
const UPSTREAM_PASSTHROUGH: readonly VariableName[] = [...ROUTE_TABLE.map(r => r.url), ...ROUTE_TABLE.flatMap(r => r.prefix === undefined ? [] : [r.prefix])]
/** Further proxy settings passed through as they are (the chart's extraEnv place). */
const EXTRA_PASSTHROUGH = [
  'COS_TOKEN_ENCODING', 'COS_UPSTREAM_TIMEOUT_MS', 'COS_CONNECT_TIMEOUT_MS', 'COS_CLOCK_SKEW_CORRECTION', 'COS_CLOCK_SKEW_MAX_SECONDS',
  'COS_ACCESS_LOG', 'COS_ACCESS_LOG_SLOW_MS', 'COS_ACCESS_LOG_SAMPLE',
  'COS_MANAGEMENT_ALLOWED_METHODS', 'COS_OPTIMIZE_ALLOWED_METHODS', 'COS_API_ALLOWED_METHODS',
] as const

export interface InjectConfig {
  readonly listen: { readonly host: string, readonly port: number }
  /** Absent for --print, which serves nothing. */
  readonly tls?: { readonly certFile: string, readonly keyFile: string }
  /** COS_INJECT_SIDECAR_FILE, watched for changes; absent: the definition comes from the environment. */
  readonly sidecarFile?: string
  readonly admin: { readonly host: string, readonly port: number, readonly maxConnections: number }
  readonly logLevel: LogLevel
  /** The webhook's own lines (COS_LOG_FORMAT); injected sidecars log JSON. */
  readonly logFormat: LogFormat
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  readonly settings: InjectSettings
}

const HOST = /^[A-Za-z0-9:.[\]-]{1,253}$/
const NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/

function read (env: NodeJS.ProcessEnv, name: InjectVariable): string | undefined {
  const spec: InjectVarSpec = INJECT_VARIABLES[name]
  const value = env[name] === '' ? undefined : env[name]
  if (value === undefined) {
    if (spec.required === true) throw new ConfigError(name, `is required: it ${spec.expect.replace(/^must be/, 'is')}`)
    return spec.default
  }
  const got = ` (got ${JSON.stringify(value)})`
  switch (spec.kind) {
    case 'port':
      if (!/^[0-9]{1,5}$/.test(value) || Number(value) > 65535) throw new ConfigError(name, spec.expect + got)
      break
    case 'boolean':
      if (value !== 'true' && value !== 'false') throw new ConfigError(name, spec.expect + got)
      break
    case 'name':
      if (value.length > 253 || !NAME.test(value)) throw new ConfigError(name, spec.expect + got)
      break
    case 'file':
      try {
        readFileSync(value)
      } catch (err) {
        throw new ConfigError(name, `${spec.expect}: ${JSON.stringify(value)} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
      }
      break
    case 'string':
      if (name === 'COS_INJECT_HOST' && !HOST.test(value)) throw new ConfigError(name, spec.expect + got)
      if (/\s/.test(value)) throw new ConfigError(name, spec.expect + got)
      break
  }
  return value
}

function passthrough (env: NodeJS.ProcessEnv, names: readonly string[]): EnvVar[] {
  return names.flatMap(name => {
    const value = env[name]
    return value === undefined || value === '' ? [] : [{ name, value }]
  })
}

export interface LoadInjectOptions {
  /** The program's version, part of the injected-version annotation. */
  readonly programVersion: string
  /** false for --print: no serving certificate needed. Default true. */
  readonly serving?: boolean
}

/** The sidecar definition from its file. Throws ConfigError naming COS_INJECT_SIDECAR_FILE. */
export function readSidecarSettings (file: string, env: NodeJS.ProcessEnv, programVersion: string, content?: string): InjectSettings {
  let text
  try {
    text = content ?? readFileSync(file, 'utf8')
  } catch (err) {
    throw new ConfigError('COS_INJECT_SIDECAR_FILE', `${INJECT_VARIABLES.COS_INJECT_SIDECAR_FILE.expect}: ${JSON.stringify(file)} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  const defaultSecret = read(env, 'COS_INJECT_DEFAULT_SECRET')
  return injectSettings(parseSidecarFile(text), read(env, 'COS_INJECT_NATIVE_SIDECAR') === 'true', defaultSecret, programVersion)
}

/** Throws ConfigError for the first problem. Reads the environment only (no .env: the webhook runs in a pod). */
export function loadInjectConfig (env: NodeJS.ProcessEnv = process.env, opts: LoadInjectOptions = { programVersion: '0.0.0' }): InjectConfig {
  const proxy = loadConfig({ env, dotenv: false, needs: 'nothing' })
  const sidecarFile = read(env, 'COS_INJECT_SIDECAR_FILE')
  const tls = opts.serving === false ? undefined : { certFile: read(env, 'COS_INJECT_TLS_CERT_FILE') as string, keyFile: read(env, 'COS_INJECT_TLS_KEY_FILE') as string }
  let settings: InjectSettings
  if (sidecarFile !== undefined) {
    // One source of truth: the file names the image and carries every setting of the sidecar.
    if (read(env, 'COS_INJECT_IMAGE') !== undefined) throw new ConfigError('COS_INJECT_IMAGE', 'must not be set with COS_INJECT_SIDECAR_FILE: the file names the image')
    settings = readSidecarSettings(sidecarFile, env, opts.programVersion)
  } else {
    // The proxy's own checks on the settings handed down: a sidecar must not exit 78 on them.
    if (proxy.routes.length === 0) {
      const [variable, rest] = oneRouteUrl()
      throw new ConfigError(variable, `${rest} is required: the injected sidecars need an upstream (or set COS_INJECT_SIDECAR_FILE)`)
    }
    const image = read(env, 'COS_INJECT_IMAGE')
    if (image === undefined) throw new ConfigError('COS_INJECT_IMAGE', `is required without COS_INJECT_SIDECAR_FILE: it ${INJECT_VARIABLES.COS_INJECT_IMAGE.expect.replace(/^must be/, 'is')}`)
    const defaultSecret = read(env, 'COS_INJECT_DEFAULT_SECRET')
    const template = templateFromEnv({
      image,
      upstreamEnv: passthrough(env, UPSTREAM_PASSTHROUGH),
      extraEnv: passthrough(env, EXTRA_PASSTHROUGH),
      shutdownDelayMs: proxy.shutdownDelayMs,
      shutdownTimeoutMs: proxy.shutdownTimeoutMs,
      logLevel: proxy.logLevel,
    }, defaultSecret ?? 'cos-credentials')
    settings = injectSettings(template, read(env, 'COS_INJECT_NATIVE_SIDECAR') === 'true', defaultSecret, opts.programVersion)
  }
  return Object.freeze({
    listen: { host: read(env, 'COS_INJECT_HOST') as string, port: Number(read(env, 'COS_INJECT_PORT')) },
    ...(tls === undefined ? {} : { tls }),
    ...(sidecarFile === undefined ? {} : { sidecarFile }),
    admin: proxy.admin,
    logLevel: proxy.logLevel,
    logFormat: proxy.logFormat,
    shutdownDelayMs: proxy.shutdownDelayMs,
    shutdownTimeoutMs: proxy.shutdownTimeoutMs,
    settings,
  })
}
