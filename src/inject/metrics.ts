// The webhook's metrics, in a Registry of their own. Admission reviews come a
// few a second at most: prom-client's labelled counters are cheap enough here.
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client'
import { sharedScrape } from '../observability/metric-exposition.js'
import type { Outcome } from './patch.js'

const PREFIX = 'cos_auth_proxy_inject_'

export type ErrorKind = 'malformed' | 'internal' | 'busy'
export type Reload = 'applied' | 'rejected'

export class InjectMetrics {
  readonly registry = new Registry()
  readonly contentType = this.registry.contentType
  private readonly injected: Counter
  private readonly skipped: Counter<'reason'>
  private readonly refused: Counter<'annotation'>
  private readonly warnings: Counter<'reason'>
  private readonly errors: Counter<'kind'>
  private readonly tooLarge: Counter
  private readonly cut: Counter
  private readonly reloads: Counter<'result'>
  private readonly sidecarReloads: Counter<'result'>
  private readonly definition: Gauge<'version'>
  #notAfter: (() => number | undefined) | undefined

  constructor (opts: { readonly defaultMetrics?: boolean } = {}) {
    const registers = [this.registry]
    this.injected = new Counter({ name: `${PREFIX}injected_total`, help: 'Pods the sidecar was injected into (dry runs included).', registers })
    this.skipped = new Counter({ name: `${PREFIX}skipped_total`, help: 'Reviews allowed without the sidecar, by reason: not_a_pod, not_create, not_annotated, already_injected, host_network, windows (those two: the pod gets cos-auth-proxy.io/not-injected saying why).', labelNames: ['reason'], registers })
    this.refused = new Counter({ name: `${PREFIX}refused_total`, help: 'Pods denied for a bad annotation value, by annotation; cos-auth-proxy.io/inject: the pod cannot take the sidecar (a volume of one of its names).', labelNames: ['annotation'], registers })
    this.warnings = new Counter({ name: `${PREFIX}warnings_total`, help: 'Warnings returned with a review (kubectl shows them), by reason: host_network, windows, has_sidecar, share_process_namespace, host_pid.', labelNames: ['reason'], registers })
    this.errors = new Counter({ name: `${PREFIX}errors_total`, help: 'Requests to /mutate answered with an error: malformed (400, 413), internal (500) or busy (503: the bodies in flight are at their bound).', labelNames: ['kind'], registers })
    this.tooLarge = new Counter({ name: `${PREFIX}patch_too_large_total`, help: 'Pods denied because their patch would pass the bound of one answer (128 KiB: hundreds of containers, or a very long env annotation).', registers })
    this.cut = new Counter({ name: `${PREFIX}unread_answers_cut_total`, help: 'Connections closed to make room for a new answer: the answers written and not read by their clients were at their bound (4 MiB).', registers })
    this.reloads = new Counter({ name: `${PREFIX}certificate_reloads_total`, help: 'Serving certificate changes on disk: applied, or rejected (unreadable or not a matching pair; the previous one stays).', labelNames: ['result'], registers })
    this.sidecarReloads = new Counter({ name: `${PREFIX}sidecar_reloads_total`, help: 'Sidecar definition (COS_INJECT_SIDECAR_FILE) changes on disk: applied, or rejected (not valid JSON or fails the checks; the previous one stays).', labelNames: ['result'], registers })
    this.definition = new Gauge({ name: `${PREFIX}sidecar_definition_info`, help: 'The definition injected now: version is the value new pods get in the cos-auth-proxy.io/injected-version annotation; running pods with another value have an out-of-date sidecar.', labelNames: ['version'], registers })
    const notAfter = (): number | undefined => this.#notAfter?.()
    new Gauge({
      name: `${PREFIX}certificate_expiration_timestamp_seconds`,
      help: 'Unix time the serving certificate in use expires (notAfter), the earliest of its chain (certificate="serving"). Absent while it holds no certificate that parses; a pair refused on reload keeps the value of the one served.',
      labelNames: ['certificate'],
      registers,
      collect () {
        this.reset()
        const seconds = notAfter()
        if (seconds !== undefined) this.set({ certificate: 'serving' }, seconds)
      },
    })
    for (const result of ['applied', 'rejected']) {
      this.reloads.inc({ result }, 0)
      this.sidecarReloads.inc({ result }, 0)
    }
    this.injected.inc(0)
    this.tooLarge.inc(0)
    this.cut.inc(0)
    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry })
  }

  outcome (o: Outcome): void {
    if (o.kind === 'injected') this.injected.inc()
    else if (o.kind === 'skipped') this.skipped.inc({ reason: o.reason })
    else this.refused.inc({ annotation: o.annotation })
    if (o.kind !== 'refused') for (const w of o.warnings ?? []) this.warnings.inc({ reason: w.reason })
  }

  error (kind: ErrorKind): void {
    this.errors.inc({ kind })
  }

  patchTooLarge (): void {
    this.tooLarge.inc()
  }

  unreadAnswersCut (): void {
    this.cut.inc()
  }

  certificateReload (result: Reload): void {
    this.reloads.inc({ result })
  }

  sidecarReload (result: Reload): void {
    this.sidecarReloads.inc({ result })
  }

  /** Where the serving certificate's expiry gauge reads from at scrape time (ServingCertificate.notAfter). */
  observeCertificate (notAfter: () => number | undefined): void {
    this.#notAfter = notAfter
  }

  /** One series only: the definition served now. */
  sidecarVersion (version: string): void {
    this.definition.reset()
    this.definition.set({ version }, 1)
  }

  /** The exposition text; scrapes that arrive together share one (sharedScrape). */
  text (): Promise<string> {
    this.#scrape ??= sharedScrape(this.registry)
    return this.#scrape()
  }

  #scrape: (() => Promise<string>) | undefined
}
