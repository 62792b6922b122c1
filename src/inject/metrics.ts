// The webhook's metrics, in a Registry of their own. Admission reviews come a
// few a second at most: prom-client's labelled counters are cheap enough here.
import { collectDefaultMetrics, Counter, Registry } from 'prom-client'
import type { Outcome } from './patch.js'

const PREFIX = 'cos_auth_proxy_inject_'

export type ErrorKind = 'malformed' | 'internal'
export type CertificateReload = 'applied' | 'rejected'

export class InjectMetrics {
  readonly registry = new Registry()
  readonly contentType = this.registry.contentType
  private readonly injected: Counter
  private readonly skipped: Counter<'reason'>
  private readonly refused: Counter<'annotation'>
  private readonly errors: Counter<'kind'>
  private readonly reloads: Counter<'result'>

  constructor (opts: { readonly defaultMetrics?: boolean } = {}) {
    const registers = [this.registry]
    this.injected = new Counter({ name: `${PREFIX}injected_total`, help: 'Pods the sidecar was injected into (dry runs included).', registers })
    this.skipped = new Counter({ name: `${PREFIX}skipped_total`, help: 'Reviews allowed without a patch, by reason: not_a_pod, not_create, not_annotated, already_injected.', labelNames: ['reason'], registers })
    this.refused = new Counter({ name: `${PREFIX}refused_total`, help: 'Pods denied for a bad annotation value, by annotation.', labelNames: ['annotation'], registers })
    this.errors = new Counter({ name: `${PREFIX}errors_total`, help: 'Requests to /mutate answered with an error: malformed (400) or internal (500).', labelNames: ['kind'], registers })
    this.reloads = new Counter({ name: `${PREFIX}certificate_reloads_total`, help: 'Serving certificate changes on disk: applied, or rejected (unreadable or not a matching pair; the previous one stays).', labelNames: ['result'], registers })
    for (const result of ['applied', 'rejected']) this.reloads.inc({ result }, 0)
    this.injected.inc(0)
    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry })
  }

  outcome (o: Outcome): void {
    if (o.kind === 'injected') this.injected.inc()
    else if (o.kind === 'skipped') this.skipped.inc({ reason: o.reason })
    else this.refused.inc({ annotation: o.annotation })
  }

  error (kind: ErrorKind): void {
    this.errors.inc({ kind })
  }

  certificateReload (result: CertificateReload): void {
    this.reloads.inc({ result })
  }

  text (): Promise<string> {
    return this.registry.metrics()
  }
}
