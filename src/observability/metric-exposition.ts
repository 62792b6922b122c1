// The metrics' storage kept outside prom-client (histogram cells bumped on
// the hot path) and the scrape-time metrics that read it.
import type { Histogram, Registry } from 'prom-client'

/** Seconds. The proxy adds well under a millisecond; the APIs answer in ms to seconds; 30 s is the default upstream timeout. */
export const LATENCY_BUCKETS: readonly number[] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

/** Bucket counts (not cumulative; the last slot is +Inf), sum and count of one histogram series. */
export class HistogramCell {
  readonly counts = new Float64Array(LATENCY_BUCKETS.length + 1)
  sum = 0
  count = 0

  observe (seconds: number): void {
    // A NaN or infinite value would poison the sum forever.
    if (!Number.isFinite(seconds)) return
    let i = 0
    while (i < LATENCY_BUCKETS.length && seconds > (LATENCY_BUCKETS[i] as number)) i++
    this.counts[i] = (this.counts[i] as number) + 1
    this.sum += seconds
    this.count++
  }
}

/**
 * A gauge with no series until its first value (prom-client's label-less
 * Gauge always shows one, 0 before anything is set: for a clock skew, a
 * claim that the clocks agree).
 */
export function registerSampledGauge (registry: Registry, name: string, help: string, read: () => number): void {
  registerMetric(registry, name, help, 'gauge', () => {
    const value = read()
    return Number.isNaN(value) ? [] : [{ metricName: name, labels: {}, value }]
  })
}

type Sample = { readonly metricName: string, readonly labels: Readonly<Record<string, string | number>>, readonly value: number }

/**
 * A metric whose samples are computed at scrape time from state kept
 * elsewhere, registered as a plain object with the `get()` shape the Registry
 * reads (the same one prom-client's own metrics return).
 */
export function registerMetric (registry: Registry, name: string, help: string, type: 'gauge' | 'histogram', samples: () => Sample[]): void {
  const metric = {
    name,
    help,
    type,
    aggregator: 'sum',
    // The state lives elsewhere; Registry.resetMetrics() leaves it alone.
    reset (): void { /* nothing to reset here */ },
    get (): Promise<{ name: string, help: string, type: string, aggregator: string, values: Sample[] }> {
      return Promise.resolve({ name, help, type, aggregator: 'sum', values: samples() })
    },
  }
  // registerMetric is typed for prom-client's own classes only; the Registry
  // itself reads name, get() and reset() (lib/registry.js).
  registry.registerMetric(metric as unknown as Histogram)
}

/** prom-client's Histogram has no way to load bucket counts kept elsewhere. */
export function registerHistogram<Cells extends { readonly route: string }> (registry: Registry, name: string, help: string, cells: readonly Cells[], pick: (c: Cells) => HistogramCell): void {
  registerMetric(registry, name, help, 'histogram', () => {
    const values: Sample[] = []
    for (const c of cells) {
      const h = pick(c)
      if (h.count === 0) continue
      let cumulative = 0
      LATENCY_BUCKETS.forEach((le, i) => {
        cumulative += h.counts[i] as number
        values.push({ metricName: `${name}_bucket`, labels: { route: c.route, le }, value: cumulative })
      })
      values.push(
        { metricName: `${name}_bucket`, labels: { route: c.route, le: '+Inf' }, value: h.count },
        { metricName: `${name}_sum`, labels: { route: c.route }, value: h.sum },
        { metricName: `${name}_count`, labels: { route: c.route }, value: h.count },
      )
    }
    return values
  })
}

/**
 * The registry's text, built once for every scrape that arrives while it is
 * being built: each build is a fresh string of some 10 KiB and the objects
 * behind it, and a client that pipelines scrapes on the admin port (or many
 * scrapers at once) would otherwise have that many built side by side.
 */
export function sharedScrape (registry: Registry): () => Promise<string> {
  let pending: Promise<string> | undefined
  return () => {
    pending ??= registry.metrics().finally(() => { pending = undefined })
    return pending
  }
}
