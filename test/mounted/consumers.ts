// The four consumers of the mounted-file watcher, each started as the
// product starts it and asked what is in force the way its users find out:
// the key pair the store signs with, the image the webhook injects, the
// certificate a TLS client is served, the CA an upstream request is verified
// with. Versions 0..2 are valid contents; `bad` is read fine and refused by
// the consumer's checks; `reportedAs` matches the log line of a refusal (or
// of files that cannot be read), so "reported once" is countable.
import { X509Certificate } from 'node:crypto'
import { readFileSync } from 'node:fs'
import type { Server as HttpsServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { connect } from 'node:tls'
import Fastify from 'fastify'
import type { Test } from 'tap'
import { loadConfig } from '../../src/config/config.js'
import { CredentialWatcher } from '../../src/credentials/credential-watcher.js'
import { CredentialStore } from '../../src/credentials/credentials.js'
import { ServingCertificate } from '../../src/mounted/serving-certificate.js'
import { readSidecarSettings } from '../../src/inject/config.js'
import { InjectMetrics } from '../../src/inject/metrics.js'
import { SidecarSource } from '../../src/inject/sidecar-source.js'
import { createLogger } from '../../src/observability/logger.js'
import { HeaderMinter, secretKey } from '../../src/token/token.js'
import { Upstreams } from '../../src/upstream/upstream.js'
import type { LogCapture } from '../support/helpers.js'
import { httpsUpstream, makePki, type Pki } from '../support/tls-fixtures.js'
import { EXAMPLE_SIDECAR_FILE } from '../inject/pods.js'
import type { Contents } from './volume.js'

export const VERSIONS = 3

/** What is in force: a version, `other` (something no version is: a mixed pair), or nothing yet. */
export type InForce = number | 'other' | undefined

export interface Running {
  readonly inForce: () => Promise<InForce>
}

export interface Consumer {
  readonly name: string
  /** The file names in the volume, in the order a pair is written. */
  readonly names: readonly string[]
  readonly version: (n: number) => Contents
  readonly bad: Contents
  readonly reportedAs: RegExp
  /** Started on `dir` (version 0 there), polling every `pollMs`, logging at debug into `logs`; stopped at t's teardown. */
  readonly start: (t: Test, dir: string, pollMs: number, logs: LogCapture) => Promise<Running>
}

/** A secret that must never be logged, whatever happens to its file. */
export const SECRET_MARK = 'Mounted-Secret-Marker-5f2b'

const key = (n: number): string => `AKIDMOUNTED${n}00000000`
const secret = (n: number): string => `${SECRET_MARK}-${n}`

const credentials: Consumer = {
  name: 'the credential files',
  names: ['access-key', 'access-key-secret'],
  version: n => ({ 'access-key': `${key(n)}\n`, 'access-key-secret': `${secret(n)}\n` }),
  bad: { 'access-key': 'has a space\n', 'access-key-secret': `${SECRET_MARK}-bad\n` },
  reportedAs: /^credentials: (no valid key pair|new key pair refused)/,
  start: async (t, dir, pollMs, logs) => {
    const config = loadConfig({ env: { COS_API_URL: 'http://127.0.0.1:1', COS_ACCESS_KEY_FILE: `${dir}/access-key`, COS_ACCESS_KEY_SECRET_FILE: `${dir}/access-key-secret`, COS_LISTEN_PORT: '0' }, dotenv: false })
    const store = new CredentialStore()
    const watcher = new CredentialWatcher({ credentials: config.credentials, encoding: config.tokenEncoding, store, reloadMs: pollMs, logger: createLogger('debug', logs) })
    t.teardown(() => { watcher.close() })
    await watcher.start()
    const pairs = Array.from({ length: VERSIONS }, (_, n) => new HeaderMinter(key(n), secretKey(secret(n)), config.tokenEncoding))
    return {
      inForce: async () => {
        const current = store.current
        if (current === undefined) return undefined
        const n = pairs.findIndex(p => current.samePair(p))
        return n < 0 ? 'other' : n
      },
    }
  },
}

const definition = JSON.parse(readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8')) as { container: Record<string, unknown> }
const image = (n: number): string => `registry.example.com/cos-auth-proxy:0.${n}.0`

const sidecar: Consumer = {
  name: 'the sidecar definition',
  names: ['sidecar.json'],
  version: n => ({ 'sidecar.json': JSON.stringify({ ...definition, container: { ...definition.container, image: image(n) } }) }),
  bad: { 'sidecar.json': '{"container": ' },
  reportedAs: /^sidecar definition (on disk is not usable|file not readable)/,
  start: async (t, dir, pollMs, logs) => {
    const file = `${dir}/sidecar.json`
    const choices = { nativeSidecar: true, defaultSecret: 'cos-credentials' }
    const text = readFileSync(file, 'utf8')
    const source = new SidecarSource(readSidecarSettings(file, choices, '0.1.0', text), { file, readAtStart: text, sidecar: choices, programVersion: '0.1.0', metrics: new InjectMetrics({ defaultMetrics: false }), logger: createLogger('debug', logs), pollMs })
    t.teardown(() => { source.close() })
    source.start()
    return {
      inForce: async () => {
        const n = Array.from({ length: VERSIONS }, (_, i) => image(i)).indexOf(String(source.current().template.container.image))
        return n < 0 ? 'other' : n
      },
    }
  },
}

let pkis: Pki[] | undefined
/** One private CA and server certificate per version, made once per test file. */
export function versionPkis (t: Test): Pki[] {
  if (pkis === undefined) {
    const made = Array.from({ length: VERSIONS }, () => makePki())
    t.teardown(() => { for (const p of made) p.cleanup() })
    pkis = made
  }
  return pkis
}

/** The certificate a TLS client is served on `port`, DER. */
function servedCertificate (port: number): Promise<Buffer | undefined> {
  return new Promise(resolve => {
    const socket = connect({ host: '127.0.0.1', port, rejectUnauthorized: false }, () => {
      const raw = socket.getPeerCertificate().raw as Buffer | undefined
      socket.destroy()
      resolve(raw)
    })
    socket.on('error', () => { resolve(undefined) })
  })
}

const certificate = (t: Test): Consumer => ({
  name: 'the webhook\'s serving certificate',
  names: ['tls.crt', 'tls.key'],
  version: n => ({ 'tls.crt': versionPkis(t)[n]?.serverCert ?? '', 'tls.key': versionPkis(t)[n]?.serverKey ?? '' }),
  bad: { 'tls.crt': 'not a certificate\n', 'tls.key': `${SECRET_MARK}: not a key\n` },
  reportedAs: /^serving certificate (on disk is not usable|files not readable)/,
  start: async (t, dir, pollMs, logs) => {
    const logger = createLogger('debug', logs)
    const served = await ServingCertificate.read({ files: { certFile: `${dir}/tls.crt`, keyFile: `${dir}/tls.key` }, variables: ['COS_INJECT_TLS_CERT_FILE', 'COS_INJECT_TLS_KEY_FILE'], pollMs, logger, onReload: () => undefined })
    const app = Fastify<HttpsServer>({ https: { ...served.pair }, loggerInstance: logger })
    served.follow(app)
    await app.listen({ host: '127.0.0.1', port: 0 })
    t.teardown(() => app.close())
    const ders = versionPkis(t).map(p => new X509Certificate(p.serverCert).raw)
    const port = (app.server.address() as AddressInfo).port
    return {
      inForce: async () => {
        const raw = await servedCertificate(port)
        if (raw === undefined) return undefined
        const n = ders.findIndex(d => d.equals(raw))
        return n < 0 ? 'other' : n
      },
    }
  },
})

const upstreamCa = (t: Test): Consumer => ({
  name: 'the upstream TLS files',
  names: ['ca.crt'],
  version: n => ({ 'ca.crt': versionPkis(t)[n]?.ca ?? '' }),
  bad: { 'ca.crt': 'no certificate here\n' },
  reportedAs: /^TLS files changed but cannot be used/,
  start: async (t, dir, pollMs, logs) => {
    const servers = await Promise.all(versionPkis(t).map(p => httpsUpstream(p, false)))
    const upstreams = new Upstreams({ connectTimeoutMs: 2000, headersTimeoutMs: 2000, bodyIdleTimeoutMs: 2000, maxConnections: 4, tls: { caFile: `${dir}/ca.crt` }, tlsReloadMs: pollMs, logger: createLogger('debug', logs) })
    upstreams.watch()
    t.teardown(async () => { await upstreams.destroy(); await Promise.all(servers.map(s => s.close())) })
    return {
      // The version whose server an upstream request verifies: its CA is the one in force.
      inForce: async () => {
        for (const [n, server] of servers.entries()) {
          const ok = await upstreams.dispatcherFor(server.url).request({ origin: server.url, path: '/', method: 'GET' })
            .then(async r => { await r.body.dump(); return true }, () => false)
          if (ok) return n
        }
        return 'other'
      },
    }
  },
})

export function consumers (t: Test): Consumer[] {
  return [credentials, sidecar, certificate(t), upstreamCa(t)]
}
