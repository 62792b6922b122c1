// The webhook's serving certificate, re-read from disk when it changes
// (cert-manager renews it in place; a Kubernetes Secret volume swaps the
// files through `..data`). The watching is the mounted-file watcher's
// (src/mounted/mounted-files.ts: the directory watched, a pair written one
// file at a time settled, a poll every second as well, unchanged bytes not
// parsed again); this module says what a usable pair is and what a change is
// logged and counted as. A pair that does not make a TLS context keeps the
// one served, with one warning and one count per bad content.
import type { Server as HttpsServer } from 'node:https'
import { createSecureContext } from 'node:tls'
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import { ConfigError } from '../config/config.js'
import { MountedFiles, type MountedOutcome, type Parsed } from '../mounted/mounted-files.js'
import type { InjectMetrics } from './metrics.js'

export interface CertificateFiles { readonly certFile: string, readonly keyFile: string }

export interface ServingCertificateOptions {
  readonly tls: CertificateFiles
  readonly metrics: InjectMetrics
  readonly logger: FastifyBaseLogger
  /** The poll: how often the files are read besides the directory's events. Default 1 s. */
  readonly certificateCheckMs?: number
}

export interface CertificatePair { readonly cert: string, readonly key: string }

/** A certificate chain is a few KiB; past this the file is refused unread. */
const CERTIFICATE_FILE_MAX_BYTES = 1024 * 1024

export class ServingCertificate {
  #pair: CertificatePair | undefined
  #server: HttpsServer | undefined
  readonly #files: MountedFiles<CertificatePair, MountedOutcome<CertificatePair> | undefined>

  private constructor (opts: ServingCertificateOptions) {
    const { metrics, logger } = opts
    this.#files = new MountedFiles({
      files: [
        { path: opts.tls.certFile, variable: 'COS_INJECT_TLS_CERT_FILE', maxBytes: CERTIFICATE_FILE_MAX_BYTES },
        { path: opts.tls.keyFile, variable: 'COS_INJECT_TLS_KEY_FILE', maxBytes: CERTIFICATE_FILE_MAX_BYTES },
      ],
      what: 'serving certificate',
      parse: ([cert = '', key = '']): Parsed<CertificatePair> => {
        try {
          // Built here first so a mismatched pair is refused while the old one stays.
          createSecureContext({ cert, key })
          return { ok: true, value: { cert, key } }
        } catch (err) {
          // OpenSSL's reason ("key values mismatch"), never the PEM.
          return { ok: false, variable: 'COS_INJECT_TLS_CERT_FILE and COS_INJECT_TLS_KEY_FILE', problem: (err as Error).message }
        }
      },
      apply: pair => {
        this.#server?.setSecureContext({ ...pair, minVersion: 'TLSv1.2' })
        this.#pair = pair
      },
      report: o => {
        // The first read is not a reload.
        if (this.#server === undefined) return o
        if (o.result === 'applied') {
          metrics.certificateReload('applied')
          logger.info('serving certificate reloaded')
        } else if (o.result === 'rejected' && !o.repeated) {
          metrics.certificateReload('rejected')
          logger.warn({ problem: o.problem }, 'serving certificate on disk is not usable: still serving the previous one')
        } else if (o.result === 'unreadable' && !o.repeated) {
          // Mid-swap, or gone: the next event or poll reads it again.
          logger.debug({ variable: o.variable, problem: o.problem }, 'serving certificate files not readable')
        }
        return o
      },
      closed: undefined,
      pollMs: opts.certificateCheckMs ?? 1000,
      logger,
    })
  }

  /** Reads the pair the webhook starts with: ConfigError, naming the file, if it cannot be served. */
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

  /** Follows the files for `app` from now on: a changed, usable pair is the context of its next TLS handshake. Stops when it closes. */
  follow (app: FastifyInstance<HttpsServer>): void {
    this.#server = app.server
    app.addHook('onClose', (_instance, done) => { this.#files.close(); done() })
    this.#files.start().catch((err: unknown) => { app.log.error({ err }, 'serving certificate: reading it again failed; still serving the previous one') })
  }
}
