// docs/operations.md names every metric the proxy and the injection webhook
// export, and nothing else: its tables against the registries, both ways.
import t from 'tap'
import { injectFamilies, METRIC_NAME, proxyFamilies, proxyLabels, read, seriesNames } from './exported.js'
import { metricRows, sectionText, tableMetricNames } from './markdown.js'

const DOC = read('docs/operations.md')
const metrics = sectionText(DOC, 'Metrics')
const webhook = sectionText(DOC, 'Injection webhook metrics')
const webhookNames = new Set(tableMetricNames(webhook))
const proxyNames = tableMetricNames(metrics).filter(n => !webhookNames.has(n))

const sorted = (names: Iterable<string>): string[] => [...names].sort()

t.test('the metrics tables of docs/operations.md list exactly what a running proxy exports', async t => {
  const families = await proxyFamilies(t)
  t.ok(families.size > 30, `${families.size} families scraped`)
  const documented = new Set(proxyNames)
  t.equal(documented.size, proxyNames.length, 'each metric is documented once')
  t.same(sorted([...families.keys()].filter(n => !documented.has(n))), [], 'exported but not documented')
  t.same(sorted(proxyNames.filter(n => !families.has(n))), [], 'documented but not exported')
})

t.test('the webhook table lists exactly the injection webhook\'s own metrics', async t => {
  const families = await injectFamilies()
  t.ok(families.size >= 5)
  t.same(sorted(webhookNames), sorted(families.keys()))
})

t.test('every metric name docs/operations.md mentions anywhere is one that is exported (a family, or one of its series)', async t => {
  const families = [await proxyFamilies(t), await injectFamilies()]
  const exported = new Set(families.flatMap(f => [...f.keys(), ...seriesNames(f)]))
  const mentioned = new Set([...DOC.matchAll(METRIC_NAME)].map(m => m[0]))
  t.ok(mentioned.size > 40, `${mentioned.size} names mentioned`)
  t.same(sorted([...mentioned].filter(n => !exported.has(n))), [], 'mentioned but not exported')
})

t.test('the type and labels docs/operations.md gives each metric are the registry\'s', async t => {
  const families = await proxyFamilies(t)
  const labels = await proxyLabels()
  const rows = metricRows(metrics).filter(r => !webhookNames.has(r.name))
  t.equal(rows.length, proxyNames.length, 'every row has a type and a labels column')
  for (const row of rows) {
    t.equal(row.type, families.get(row.name), `${row.name}: type`)
    // Labels a fresh process has not shown yet (nodejs_gc_duration_seconds' kind before a GC) cannot be compared.
    const seen = labels.get(row.name) ?? new Set<string>()
    if (row.name.startsWith('cos_auth_proxy_') || seen.size > 0) t.same([...seen].sort(), [...row.labels].sort(), `${row.name}: labels`)
  }
})
