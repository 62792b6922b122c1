// A TLS server's certificate and key, followed on disk (cert-manager renews
// them in place; a Kubernetes Secret volume swaps them through `..data`): the
// webhook's serving certificate, and any HTTPS listener's after it. A
// consumer of the mounted-file watcher (mounted-files.ts: the directory
// watched, a pair written one file at a time settled, a poll as well,
// unchanged bytes not parsed again); this module says what a usable pair is
// (one Node can build a TLS context from) and logs a change. A pair that does
// not make a TLS context keeps the one served, with one warning and one
// count per bad content.
import type { Server as HttpsServer } from 'node:https'
import { createSecureContext } from 'node:tls'
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { ConfigError } from '../config/config.js'
import { earliestNotAfter } from './certificate-expiry.js'
import { MountedFiles } from './mounted-files.js'
import { parsed, reportOnce, type MountedOutcome } from './outcomes.js'

export interface CertificateFiles { readonly certFile: string, readonly keyFile: string }

export interface ServingCertificateOptions {
  readonly files: CertificateFiles
  /** The settings naming the two files, for errors: [certificate, key]. */
  readonly variables: readonly [string, string]
  /** The poll: how often the files are read besides their directory's events. */
  readonly pollMs: number
  readonly logger: FastifyBaseLogger
  /** Told of each reload after the first read (metrics): a new pair served, or a bad one refused. */
  readonly onReload: (result: 'applied' | 'rejected') => void
}

export interface CertificatePair { readonly cert: string, readonly key: string }

/** A certificate chain is a few KiB; past this the file is refused unread. */
const CERTIFICATE_FILE_MAX_BYTES = 1024 * 1024

export class ServingCertificate {
  #pair: CertificatePair | undefined
  #notAfter: number | undefined
  #server: HttpsServer | undefined
  readonly #files: MountedFiles<CertificatePair, MountedOutcome<CertificatePair> | undefined>

  private constructor (opts: ServingCertificateOptions) {
    const { logger, variables: [certVariable, keyVariable] } = opts
    const report = reportOnce<CertificatePair>({
      applied: () => {
        opts.onReload('applied')
        logger.info('serving certificate reloaded')
      },
      rejected: o => {
        opts.onReload('rejected')
        logger.warn({ problem: o.problem }, 'serving certificate on disk is not usable: still serving the previous one')
      },
      // Mid-swap, or gone: the next event or poll reads it again.
      unreadable: o => { logger.debug({ variable: o.variable, problem: o.problem }, 'serving certificate files not readable') },
    })
    this.#files = new MountedFiles({
      files: [
        { path: opts.files.certFile, variable: certVariable, maxBytes: CERTIFICATE_FILE_MAX_BYTES },
        { path: opts.files.keyFile, variable: keyVariable, maxBytes: CERTIFICATE_FILE_MAX_BYTES },
      ],
      what: 'serving certificate',
      // Built here first so a mismatched pair is refused while the old one stays; OpenSSL's reason ("key values mismatch"), never the PEM.
      parse: ([cert = '', key = '']) => parsed(() => { createSecureContext({ cert, key }); return { cert, key } }, `${certVariable} and ${keyVariable}`),
      apply: pair => {
        this.#server?.setSecureContext({ ...pair, minVersion: 'TLSv1.2' })
        this.#pair = pair
        this.#notAfter = earliestNotAfter(pair.cert)
      },
      // The first read is not a reload.
      report: o => this.#server === undefined ? o : report(o),
      closed: undefined,
      pollMs: opts.pollMs,
      logger,
    })
  }

  /** Reads the pair a server starts with: ConfigError, naming the file, if it cannot be served. */
  static async read (opts: ServingCertificateOptions): Promise<ServingCertificate> {
    const certificate = new ServingCertificate(opts)
    const first = await certificate.#files.reload()
    if (first?.result === 'rejected' || first?.result === 'unreadable') throw new ConfigError(first.variable, first.problem)
    return certificate
  }

  /** The pair in force: what a server built now starts with. */
  get pair (): CertificatePair {
    if (this.#pair === undefined) throw new Error('ServingCertificate.read() has not succeeded')
    return this.#pair
  }

  /** When the certificate served expires: the earliest notAfter of its chain, Unix seconds (undefined: none parses). Set when a pair is put in force. */
  get notAfter (): number | undefined {
    return this.#notAfter
  }

  /** Follows the files for `app` from now on: a changed, usable pair is the context of its next TLS handshake. Stops when it closes. */
  follow (app: FastifyInstance<HttpsServer>): void {
    this.#server = app.server
    app.addHook('onClose', (_instance, done) => { this.#files.close(); done() })
    this.#files.start().catch((err: unknown) => { app.log.error({ err }, 'serving certificate: reading it again failed; still serving the previous one') })
  }
}
