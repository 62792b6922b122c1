#!/usr/bin/env node
// cos-auth-proxy [serve|token|verify|config|mock-api|demo|inject] | --version
import { randomBytes } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseArgs } from 'node:util'
import { ConfigError, EXIT_CONFIG, ROUTE_TABLE, describeConfig, loadConfig, type Config } from './config/config.js'
import type { readPair } from './credentials/credentials.js'

// Each command import()s what it runs, so none pays for another's modules:
// `token` starts no fastify, undici or prom-client, `serve` no mock-api. The
// bundle (scripts/bundle.mjs) keeps these imports lazy inside its one file.

const EXIT_USAGE = 64 // EX_USAGE

const USAGE = `usage: cos-auth-proxy [command] [options]

commands:
  serve                       run the proxy (default)
  wait [--timeout S]          exit 0 once the admin /readyz answers 200 (default 30 s)
  token [--timestamp NS] [--nonce HEX] [--raw]
                              print one token, encoded per COS_TOKEN_ENCODING (or raw)
  verify TOKEN [--max-age S]  check a token (encoded or raw) against the configured pair
  config                      print the effective configuration, secrets redacted
  mock-api [--port N]         run a local stand-in for the COS APIs that verifies tokens
  demo                        run mock-api and the proxy with a throwaway key pair
  inject                      run the Kubernetes admission webhook that injects the sidecar (COS_INJECT_*)
  inject --print              read a Pod, a workload or a List as JSON on stdin, print it as the webhook would inject it

  --version, -v               print "cos-auth-proxy <version>"

Configuration comes from COS_* environment variables and ./.env; see docs/configuration.md.`

class UsageError extends Error {}

function fail (code: number, message: string): never {
  process.stderr.write(`cos-auth-proxy: ${message}\n`)
  process.exit(code)
}

function parse<T extends Record<string, { type: 'string' | 'boolean' }>> (args: string[], options: T, positionals = 0): ReturnType<typeof parseArgs<{ args: string[], options: T, allowPositionals: true, strict: true }>> {
  let parsed
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true })
  } catch (err) {
    throw new UsageError((err as Error).message)
  }
  if (parsed.positionals.length > positionals) throw new UsageError(`unexpected argument ${JSON.stringify(parsed.positionals[positionals])}`)
  return parsed
}

async function credentialsOrExit (config: Config): Promise<Extract<Awaited<ReturnType<typeof readPair>>, { ok: true }>> {
  const { readPair } = await import('./credentials/credentials.js')
  const pair = await readPair(config.credentials, config.tokenEncoding)
  if (!pair.ok) fail(EXIT_CONFIG, `config: ${pair.variable} ${pair.problem}`)
  return pair
}

const commands: Record<string, (args: string[]) => Promise<void>> = {
  async serve (args) {
    parse(args, {})
    const config = loadConfig({ env: process.env })
    // Credential files that are missing or empty do not stop it: it starts
    // unready and picks them up when they appear (a Secret mounted late).
    const [{ createLogger, inLogFormat, stdoutDestination }, { serve }] = await Promise.all([import('./observability/logger.js'), import('./server.js')])
    const stdout = stdoutDestination()
    const logger = createLogger(config.logLevel, await inLogFormat(config.logFormat, stdout, colour()))
    await serve({ config, logger, logLinesDropped: () => stdout.dropped })
  },

  async wait (args) {
    const { values } = parse(args, { timeout: { type: 'string' } })
    const timeoutS = values.timeout === undefined ? 30 : Number(values.timeout)
    if (!Number.isFinite(timeoutS) || timeoutS <= 0) throw new UsageError('--timeout must be a number of seconds > 0')
    const { admin } = loadConfig({ env: process.env, needs: 'nothing' })
    const host = admin.host === '0.0.0.0' ? '127.0.0.1' : admin.host === '::' ? '::1' : admin.host
    const url = `http://${host.includes(':') ? `[${host}]` : host}:${admin.port}/readyz`
    const deadline = Date.now() + timeoutS * 1000
    let last: string
    for (;;) {
      try {
        const res = await fetch(url, { signal: AbortSignal.timeout(1000) })
        if (res.status === 200) return
        last = `${res.status} ${await res.text()}`
      } catch (err) {
        last = (err as Error).cause instanceof Error ? ((err as Error).cause as Error).message : (err as Error).message
      }
      if (Date.now() >= deadline) fail(1, `not ready after ${timeoutS} s (${url}: ${last})`)
      await sleep(250)
    }
  },

  async token (args) {
    const { values } = parse(args, { timestamp: { type: 'string' }, nonce: { type: 'string' }, raw: { type: 'boolean' } })
    if (values.timestamp !== undefined && !/^(0|[1-9][0-9]{0,19})$/.test(values.timestamp)) throw new UsageError('--timestamp must be a decimal number of nanoseconds (0 = now)')
    if (values.nonce !== undefined && !/^[0-9a-f]{1,128}$/.test(values.nonce)) throw new UsageError('--nonce must be lowercase hex')
    const config = loadConfig({ env: process.env, needs: 'credentials' })
    const pair = await credentialsOrExit(config)
    const { encodeToken, formatToken, mintFields } = await import('./token/token.js')
    const fields = mintFields({ accessKey: pair.accessKey, key: pair.key, timestamp: values.timestamp, nonce: values.nonce })
    const raw = formatToken(fields)
    process.stdout.write((values.raw === true ? raw : encodeToken(raw, config.tokenEncoding)) + '\n')
  },

  async verify (args) {
    const { values, positionals } = parse(args, { 'max-age': { type: 'string' } }, 1)
    const token = positionals[0]
    if (token === undefined) throw new UsageError('verify needs a TOKEN')
    const maxAge = values['max-age']
    if (maxAge !== undefined && !/^[0-9]+$/.test(maxAge)) throw new UsageError('--max-age must be a whole number of seconds')
    const config = loadConfig({ env: process.env, needs: 'credentials' })
    const pair = await credentialsOrExit(config)
    const { verifyToken } = await import('./token/token.js')
    const result = verifyToken(token, {
      accessKey: pair.accessKey,
      key: pair.key,
      ...(maxAge === undefined ? {} : { maxSkewNs: BigInt(maxAge) * 1_000_000_000n }),
    })
    if (!result.ok) {
      process.stderr.write(`invalid: ${result.code}: ${result.reason}\n`)
      process.exitCode = 1
      return
    }
    const ageS = (Number(BigInt(Date.now()) * 1_000_000n - BigInt(result.fields.timestamp)) / 1e9).toFixed(3)
    process.stdout.write(`valid: access key ${result.fields.accessKey}, timestamp ${result.fields.timestamp} (${ageS} s ago), nonce ${result.fields.nonce}\n`)
  },

  async config (args) {
    parse(args, {})
    try {
      process.stdout.write(describeConfig(loadConfig({ env: process.env })) + '\n')
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err
      // Not enough to serve (no URL, no credentials): the defaults and what
      // is set are shown all the same, then the line saying what is missing
      // (exit 78, as serve would). A bad value stops here too, named.
      process.stdout.write(describeConfig(loadConfig({ env: process.env, needs: 'nothing' })) + '\n')
      throw err
    }
    return Promise.resolve()
  },

  async 'mock-api' (args) {
    const { values } = parse(args, { port: { type: 'string' } })
    const port = values.port === undefined ? 8081 : Number(values.port)
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new UsageError('--port must be 0-65535')
    const config = loadConfig({ env: process.env, needs: 'credentials' })
    const pair = await credentialsOrExit(config)
    const [{ createLogger, inLogFormat, stdoutDestination }, { buildMockApi }] = await Promise.all([import('./observability/logger.js'), import('./mock-api/mock-api.js')])
    const logger = createLogger(config.logLevel, await inLogFormat(config.logFormat, stdoutDestination(), colour()))
    const app = buildMockApi({ accessKey: pair.accessKey, key: pair.key, logger })
    await app.listen({ host: config.mockHost, port })
    const { address, port: bound } = app.server.address() as AddressInfo
    logger.info({ address, port: bound, accessKey: pair.accessKey }, 'mock COS API listening')
    stopOnSignal(async () => { await app.close() })
  },

  async inject (args) {
    const { values } = parse(args, { print: { type: 'boolean' } })
    // Loaded on demand: `serve` never loads the webhook.
    const { loadInjectConfig } = await import('./inject/config.js')
    if (values.print !== true) {
      const config = loadInjectConfig(process.env, { programVersion: await version(), logColour: colour() })
      return await (await import('./inject/server.js')).runInject(config, await version())
    }
    const { preview } = await import('./inject/preview.js')
    const { settings } = loadInjectConfig(process.env, { programVersion: await version(), serving: false })
    let input = ''
    for await (const chunk of process.stdin) input += String(chunk)
    const result = preview(input, settings)
    process.stdout.write(result.stdout)
    process.stderr.write(`cos-auth-proxy: ${result.note}\n`)
    process.exitCode = result.code
  },

  async demo (args) {
    parse(args, {})
    const accessKey = `demo-${randomBytes(4).toString('hex')}`
    const secret = randomBytes(24).toString('base64')
    // Only where to listen and how to log come from the environment; credentials never do.
    const ambient = loadConfig({
      needs: 'credentials',
      // A person watches the demo: readable lines (and, below, one for every request) unless the environment says otherwise.
      env: { COS_LOG_FORMAT: 'pretty', ...pick(process.env, DEMO_AMBIENT), COS_ACCESS_KEY: accessKey, COS_ACCESS_KEY_SECRET: secret },
    })
    const [{ createLogger, inLogFormat, stdoutDestination }, { buildMockApi }, { serve }, { secretKey }] = await Promise.all([import('./observability/logger.js'), import('./mock-api/mock-api.js'), import('./server.js'), import('./token/token.js')])
    const stdout = stdoutDestination()
    const logger = createLogger(ambient.logLevel, await inLogFormat(ambient.logFormat, stdout, colour()))
    const mock = buildMockApi({ accessKey, key: secretKey(secret), logger: logger.child({ component: 'mock-api' }) })
    await mock.listen({ host: ambient.mockHost, port: 0 })
    const mockUrl = `http://${hostPort(mock.server.address() as AddressInfo)}`
    const config = loadConfig({
      dotenv: false,
      env: {
        COS_ACCESS_LOG: 'all',
        ...pick(process.env, DEMO_AMBIENT),
        // Every route of the table at the mock: /<name> for a prefixed one, the root for the catch-all.
        ...Object.fromEntries(ROUTE_TABLE.map(r => [r.url, r.prefix === undefined ? mockUrl : `${mockUrl}/${r.name}`])),
        COS_ACCESS_KEY: accessKey,
        COS_ACCESS_KEY_SECRET: secret,
      },
    })
    await serve({
      config,
      logger,
      logLinesDropped: () => stdout.dropped,
      onListening: (address) => {
        const p = `http://${hostPort(address)}`
        process.stderr.write(`
cos-auth-proxy demo
  mock COS API  ${mockUrl}   (verifies every token; throwaway access key ${accessKey})
  proxy         ${p}

Try:
  curl -s ${p}/management/v1/clusters
  curl -s ${p}/management/v1/notification-rules
  curl -s ${p}/optimize/v1/workloads/recommendations
  curl -s -X POST -H 'content-type: application/json' -d '{"hello":"world"}' ${p}/echo
  curl -s ${mockUrl}/management/v1/clusters     # straight to the API, no token: 401

Ctrl-C to stop.
`)
      },
      onClose: async () => { await mock.close() },
    })
  },
}

// What the demo takes from the environment: where to listen, how to log. Never credentials or upstreams.
const DEMO_AMBIENT = ['COS_LISTEN_HOST', 'COS_LISTEN_PORT', 'COS_ADMIN_HOST', 'COS_ADMIN_PORT', 'COS_LOG_LEVEL', 'COS_LOG_FORMAT', 'COS_ACCESS_LOG', 'COS_TOKEN_ENCODING', 'COS_MOCK_HOST']

function pick (env: NodeJS.ProcessEnv, names: string[]): Record<string, string> {
  const out: Record<string, string> = {}
  for (const n of names) {
    const v = env[n]
    if (v !== undefined) out[n] = v
  }
  return out
}

/** Pretty log lines in colour: on a terminal that has not asked for NO_COLOR (https://no-color.org). */
function colour (): boolean {
  return process.stdout.isTTY && process.env.NO_COLOR === undefined
}

function hostPort (a: AddressInfo): string {
  return a.family === 'IPv6' ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`
}

function stopOnSignal (stop: () => Promise<void>): void {
  const handler = (): void => {
    process.removeListener('SIGTERM', handler)
    process.removeListener('SIGINT', handler)
    process.once('SIGTERM', () => process.exit(0))
    process.once('SIGINT', () => process.exit(0))
    stop().then(() => process.exit(0), () => process.exit(1))
  }
  process.on('SIGTERM', handler)
  process.on('SIGINT', handler)
}

/** package.json's version: the bundle carries it (esbuild inlines the JSON), dist/cli.js reads it beside dist/. */
async function version (): Promise<string> {
  const pkg = await import('../package.json', { with: { type: 'json' } })
  return pkg.default.version
}

export async function main (argv: string[]): Promise<void> {
  const [first, ...rest] = argv
  if (first === '--version' || first === '-v') {
    process.stdout.write(`cos-auth-proxy ${await version()}\n`)
    return
  }
  const name = first === undefined || first.startsWith('-') ? 'serve' : first
  const args = first === undefined || first.startsWith('-') ? argv : rest
  if (name === 'help' || args.includes('--help') || args.includes('-h')) {
    process.stdout.write(USAGE + '\n')
    return
  }
  const command = commands[name]
  if (command === undefined) fail(EXIT_USAGE, `unknown command ${JSON.stringify(name)}\n${USAGE}`)
  try {
    await command(args)
  } catch (err) {
    if (err instanceof ConfigError) fail(EXIT_CONFIG, `config: ${err.message}`)
    if (err instanceof UsageError) fail(EXIT_USAGE, `${err.message}\n${USAGE}`)
    throw err
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  // Our own errors never hold secrets; a stack from a dependency might hold
  // anything, so only its name, code and message are printed.
  const e = err as { name?: string, code?: string, message?: string }
  fail(1, `${e.name ?? 'Error'}${e.code === undefined ? '' : ` (${e.code})`}: ${e.message ?? String(err)}`)
})
