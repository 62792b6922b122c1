// An upstream's TLS material (COS_CA_FILE, the client certificate) and the
// undici Pool options every upstream connection shares, direct or through
// an egress proxy.
import { rootCertificates } from 'node:tls'
import { Pool } from 'undici'
import { readBoundedFileSync } from '../mounted/bounded-file.js'
import { earliestNotAfter } from '../mounted/certificate-expiry.js'
import type { MountedFile } from '../mounted/mounted-files.js'
import { ConfigError, type Config } from '../config/config.js'

export interface TlsMaterial {
  readonly ca?: readonly string[]
  readonly cert?: string
  readonly key?: string
}

/** Room for a large CA bundle (the Mozilla one is ~220 KB); a file past it is refused unread. */
export const TLS_FILE_MAX_BYTES = 1024 * 1024

/** The TLS files that are set, as the mounted-file watcher reads them. */
export function tlsFiles (files: Config['tls']): MountedFile[] {
  const all: [string, string | undefined][] = [['COS_CA_FILE', files.caFile], ['COS_CLIENT_CERT_FILE', files.clientCertFile], ['COS_CLIENT_KEY_FILE', files.clientKeyFile]]
  return all.flatMap(([variable, path]) => path === undefined ? [] : [{ path, variable, maxBytes: TLS_FILE_MAX_BYTES }])
}

/**
 * Reads COS_CA_FILE / COS_CLIENT_CERT_FILE / COS_CLIENT_KEY_FILE, or takes
 * their texts as read already (`texts`, by path: the watcher's read). Throws
 * ConfigError naming the file's variable. Synchronous (start-up), but a FIFO,
 * device or huge file at a path is refused without waiting on it or reading
 * it whole.
 */
export function readTlsMaterial (files: Config['tls'], texts?: ReadonlyMap<string, string>): TlsMaterial {
  const read = (variable: string, path: string | undefined, marker: RegExp): string | undefined => {
    if (path === undefined) return undefined
    const given = texts?.get(path)
    const file = given === undefined ? readBoundedFileSync(path, TLS_FILE_MAX_BYTES) : { ok: true as const, text: given }
    if (!file.ok) throw new ConfigError(variable, file.problem)
    // Contents are never echoed: a key file is a secret.
    if (!marker.test(file.text)) throw new ConfigError(variable, `${JSON.stringify(path)} holds no PEM block of the expected kind`)
    return file.text
  }
  const ca = read('COS_CA_FILE', files.caFile, /-----BEGIN CERTIFICATE-----/)
  const cert = read('COS_CLIENT_CERT_FILE', files.clientCertFile, /-----BEGIN CERTIFICATE-----/)
  const key = read('COS_CLIENT_KEY_FILE', files.clientKeyFile, /-----BEGIN [A-Z ]*PRIVATE KEY-----/)
  return {
    // "Adds" a bundle: Node's `ca` option replaces the default roots, so keep them.
    ...(ca === undefined ? {} : { ca: [...rootCertificates, ca] }),
    ...(cert === undefined ? {} : { cert }),
    ...(key === undefined ? {} : { key }),
  }
}

/** The files' texts `m` was read from, in `tlsFiles` order: what start-up read, the watcher's value in force. */
export function tlsTexts (m: TlsMaterial): string[] {
  // The CA file's text is the last entry, after Node's own roots (readTlsMaterial).
  return [m.ca?.at(-1), m.cert, m.key].filter(text => text !== undefined)
}

/** When the TLS files' certificates expire (Unix seconds, the earliest of each file); a file not set, or holding no certificate that parses: absent. */
export interface TlsExpiry { readonly client?: number, readonly ca?: number }

export function tlsExpiry (m: TlsMaterial): TlsExpiry {
  const client = m.cert === undefined ? undefined : earliestNotAfter(m.cert)
  // The file's text is the last entry, after Node's own roots (readTlsMaterial), which are not the operator's to renew.
  const bundle = m.ca?.at(-1)
  const ca = bundle === undefined ? undefined : earliestNotAfter(bundle)
  return { ...(client === undefined ? {} : { client }), ...(ca === undefined ? {} : { ca }) }
}

export interface UpstreamOptions {
  readonly connectTimeoutMs: number
  /** Time to response headers. */
  readonly headersTimeoutMs: number
  /** Longest silence while a body streams. */
  readonly bodyIdleTimeoutMs: number
  /** Sockets per upstream origin; requests beyond them wait in the pool's queue. */
  readonly maxConnections: number
}

/** The same for every upstream connection, direct or through an egress proxy. */
export function poolOptions (opts: UpstreamOptions): Pool.Options {
  return {
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: opts.bodyIdleTimeoutMs,
    // Keep idle sockets a little under the common 5 s server default, so the
    // proxy closes them first instead of writing into a socket being closed.
    keepAliveTimeout: 4_000,
    connections: opts.maxConnections,
  }
}

export function createPool (origin: string, opts: UpstreamOptions, tls: TlsMaterial): Pool {
  return new Pool(origin, { connect: { timeout: opts.connectTimeoutMs, ...tls }, ...poolOptions(opts) })
}
