// What the proxy exports, read from a real process: the bundle (what the
// image runs) started with `serve`, one request sent through it, /metrics
// scraped from its admin port. Names come from the `# TYPE` lines, so a
// metric with no series yet (no upstream error so far) still counts; a
// histogram family also exports its _bucket, _sum and _count series.
import { readFileSync } from 'node:fs'
import type { Test } from 'tap'
import { InjectMetrics } from '../../src/inject/metrics.js'
import { ProxyMetrics } from '../../src/observability/metrics.js'
import { CREDS, start } from '../support/cli-process.js'
import { send, startUpstream } from '../support/helpers.js'

/** Metric family name → type. */
export type Families = ReadonlyMap<string, string>

export function familiesOf (exposition: string): Families {
  const families = new Map<string, string>()
  for (const line of exposition.split('\n')) {
    const m = /^# TYPE (\S+) (\S+)$/.exec(line)
    if (m !== null) families.set(m[1] ?? '', m[2] ?? '')
  }
  return families
}

/** Every series name a family exports: what PromQL can select. */
export function seriesNames (families: Families): Set<string> {
  const names = new Set<string>()
  for (const [name, type] of families) {
    if (type === 'histogram' || type === 'summary') for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix)
    if (type !== 'histogram') names.add(name)
  }
  return names
}

/** The families of a running proxy (the bundle, `serve`), stopped at the end of the test. */
export async function proxyFamilies (t: Test): Promise<Families> {
  const upstream = await startUpstream()
  t.teardown(() => upstream.close())
  const { daemon, match } = await start(['serve'], { ...CREDS, COS_API_URL: upstream.url, COS_LISTEN_PORT: '0' }, /[^\n]*cos-auth-proxy listening[^\n]*/)
  t.teardown(() => daemon.child.kill('SIGKILL'))
  const listening = JSON.parse(match[0]) as { port: number, admin: { port: number } }
  const through = await send(`http://127.0.0.1:${listening.port}/x`)
  t.equal(through.status, 200, 'a request went through the proxy')
  const scraped = await send(`http://127.0.0.1:${listening.admin.port}/metrics`)
  t.equal(scraped.status, 200, '/metrics answered')
  t.match(scraped.body.toString(), /^cos_auth_proxy_ready 1$/m, 'the ready gauge of a serving proxy is 1 (serve() wires it to /readyz)')
  return familiesOf(scraped.body.toString())
}

/** The injection webhook's own families (without the process metrics, which the proxy's list holds). */
export async function injectFamilies (): Promise<Families> {
  return familiesOf(await new InjectMetrics({ defaultMetrics: false }).text())
}

export const REPO = new URL('../../', import.meta.url)
export const read = (path: string): string => readFileSync(new URL(path, REPO), 'utf8')

/** Names that look like the metrics this project exports or queries. */
export const METRIC_NAME = /\b(?:cos_auth_proxy_|process_|nodejs_)[a-z0-9_]*[a-z0-9]\b/g

/** Family name → the label names its series carry (`le` left out). */
export type LabelSets = ReadonlyMap<string, ReadonlySet<string>>

async function labelSets (registry: { getMetricsAsJSON: () => Promise<{ name: string, values: { labels: object }[] }[]> }): Promise<LabelSets> {
  const out = new Map<string, Set<string>>()
  for (const metric of await registry.getMetricsAsJSON()) {
    out.set(metric.name, new Set(metric.values.flatMap(v => Object.keys(v.labels)).filter(l => l !== 'le')))
  }
  return out
}

/**
 * The labels of every metric of the proxy, from a registry built as
 * serve() builds it and moved by each of its methods once, so that every
 * labelled series exists; process metrics as a fresh process has them.
 */
export async function proxyLabels (): Promise<LabelSets> {
  const m = new ProxyMetrics({ logLinesDropped: () => 0 })
  m.requestStarted()
  m.requestFinished('management', 'GET', 200, 0.01, 0.005, true)
  m.upstreamError('management', 'reset')
  m.upstreamResponse('management', 200)
  m.retried('management', 'connect')
  m.responseFailed('management')
  m.tokenMinted()
  m.credentialReload('rejected', 'too_large')
  m.upstreamClockSkew(1)
  m.observeCertificates(() => ({ client: 1, ca: 1 }))
  return labelSets(m.registry)
}
