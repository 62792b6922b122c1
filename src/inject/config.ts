// Settings of `cos-auth-proxy inject`, parsed once from the environment
// cli.ts hands in: its own COS_INJECT_* (INJECT_VARIABLES, beside the proxy's
// table in src/config/config-variables.ts, through the same env-schema parse
// and error lines) plus the proxy's for the admin port, logs and drain. The
// sidecar it injects is the chart-rendered definition in
// COS_INJECT_SIDECAR_FILE (template.ts); the webhook adds only what
// SidecarChoices hold. Errors are ConfigError: exit 78 with one line naming
// the variable.
import { readFileSync } from 'node:fs'
import { ConfigError, INJECT_VARIABLES, loadConfig, parseVariables, type LogFormat, type LogLevel } from '../config/config.js'
import type { InjectSettings } from './patch.js'
import { injectSettings, parseSidecarFile } from './template.js'

export { INJECT_VARIABLES }

type InjectVariable = keyof typeof INJECT_VARIABLES

/** What the webhook's own settings add to every reading of the sidecar file: parsed once, at start. */
export interface SidecarChoices {
  /** initContainers with restartPolicy: Always (COS_INJECT_NATIVE_SIDECAR). */
  readonly nativeSidecar: boolean
  /** The Secret of pods that name none (COS_INJECT_DEFAULT_SECRET). */
  readonly defaultSecret?: string
  /** No runAsUser/runAsGroup in what is injected (COS_INJECT_OPENSHIFT); absent when false. */
  readonly openshift?: true
}

export interface InjectConfig {
  readonly listen: { readonly host: string, readonly port: number }
  /** Absent for --print, which serves nothing. */
  readonly tls?: { readonly certFile: string, readonly keyFile: string }
  /** COS_INJECT_SIDECAR_FILE, watched for changes. */
  readonly sidecarFile: string
  /** Handed to every re-reading of sidecarFile. */
  readonly sidecar: SidecarChoices
  readonly admin: { readonly host: string, readonly port: number, readonly maxConnections: number }
  readonly logLevel: LogLevel
  /** The webhook's own lines (COS_LOG_FORMAT); injected sidecars log JSON. */
  readonly logFormat: LogFormat
  /** Colour the pretty lines (a terminal that has not asked for NO_COLOR: cli.ts decides). */
  readonly logColour: boolean
  readonly shutdownDelayMs: number
  readonly shutdownTimeoutMs: number
  readonly settings: InjectSettings
  /** The text of sidecarFile `settings` were read from: the value in force when it is watched (not read and parsed twice). */
  readonly sidecarText: string
}

/**
 * Removed with the environment-built sidecar (0.x): refused rather than
 * ignored, so a deployment written for it stops naming what replaces it.
 */
const REMOVED: Readonly<Record<string, string>> = {
  COS_INJECT_IMAGE: 'must not be set with COS_INJECT_SIDECAR_FILE: the file names the image (the sidecar built from the webhook\'s environment was removed; docs/kubernetes.md#without-the-chart)',
}

const WITHOUT_CHART = 'the chart renders it into a ConfigMap; without the chart, mount examples/injector/sidecar-configmap.yaml (docs/kubernetes.md#without-the-chart)'

function readable (name: InjectVariable, file: string): string {
  try {
    readFileSync(file)
  } catch (err) {
    throw new ConfigError(name, `${INJECT_VARIABLES[name].expect}: ${JSON.stringify(file)} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  return file
}

function required (name: InjectVariable, value: string | undefined, hint?: string): string {
  if (value === undefined) throw new ConfigError(name, `is required: it ${INJECT_VARIABLES[name].expect.replace(/^must be/, 'is')}${hint === undefined ? '' : ` (${hint})`}`)
  return readable(name, value)
}

export interface LoadInjectOptions {
  /** The program's version, part of the injected-version annotation. */
  readonly programVersion: string
  /** false for --print: no serving certificate needed. Default true. */
  readonly serving?: boolean
  /** See InjectConfig.logColour; default false. */
  readonly logColour?: boolean
}

/** The sidecar file's text. Throws ConfigError naming COS_INJECT_SIDECAR_FILE. */
export function readSidecarFile (file: string): string {
  try {
    return readFileSync(file, 'utf8')
  } catch (err) {
    throw new ConfigError('COS_INJECT_SIDECAR_FILE', `${INJECT_VARIABLES.COS_INJECT_SIDECAR_FILE.expect}: ${JSON.stringify(file)} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
  }
}

/** The sidecar definition from its file (or its text, read already), with the webhook's choices. Throws ConfigError naming COS_INJECT_SIDECAR_FILE. */
export function readSidecarSettings (file: string, choices: SidecarChoices, programVersion: string, text = readSidecarFile(file)): InjectSettings {
  return injectSettings(parseSidecarFile(text), choices.nativeSidecar, choices.defaultSecret, programVersion, choices.openshift === true)
}

/** Throws ConfigError for the first problem. `env` is the environment only (no .env: the webhook runs in a pod). */
export function loadInjectConfig (env: NodeJS.ProcessEnv, opts: LoadInjectOptions): InjectConfig {
  const proxy = loadConfig({ env, dotenv: false, needs: 'nothing' })
  const own = parseVariables(INJECT_VARIABLES, [env])
  const tls = opts.serving === false
    ? undefined
    : { certFile: required('COS_INJECT_TLS_CERT_FILE', own.COS_INJECT_TLS_CERT_FILE), keyFile: required('COS_INJECT_TLS_KEY_FILE', own.COS_INJECT_TLS_KEY_FILE) }
  const sidecarFile = required('COS_INJECT_SIDECAR_FILE', own.COS_INJECT_SIDECAR_FILE, WITHOUT_CHART)
  for (const [name, problem] of Object.entries(REMOVED)) {
    if (env[name] !== undefined && env[name] !== '') throw new ConfigError(name, problem)
  }
  const sidecar: SidecarChoices = Object.freeze({
    nativeSidecar: own.COS_INJECT_NATIVE_SIDECAR,
    ...(own.COS_INJECT_DEFAULT_SECRET === undefined ? {} : { defaultSecret: own.COS_INJECT_DEFAULT_SECRET }),
    ...(own.COS_INJECT_OPENSHIFT ? { openshift: true as const } : {}),
  })
  const sidecarText = readSidecarFile(sidecarFile)
  return Object.freeze({
    listen: { host: own.COS_INJECT_HOST ?? INJECT_VARIABLES.COS_INJECT_HOST.default, port: own.COS_INJECT_PORT },
    ...(tls === undefined ? {} : { tls }),
    sidecarFile,
    sidecar,
    admin: proxy.admin,
    logLevel: proxy.logLevel,
    logFormat: proxy.logFormat,
    logColour: opts.logColour ?? false,
    shutdownDelayMs: proxy.shutdownDelayMs,
    shutdownTimeoutMs: proxy.shutdownTimeoutMs,
    settings: readSidecarSettings(sidecarFile, sidecar, opts.programVersion, sidecarText),
    sidecarText,
  })
}
