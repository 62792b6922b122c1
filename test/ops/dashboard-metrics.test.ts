// The Grafana dashboard and the alert rules the chart ships query only
// metrics a running proxy exports (a renamed metric would leave an empty
// panel or an alert that can never fire), and every alert's runbook_url
// points at a section of docs/operations.md that exists.
import t from 'tap'
import { injectFamilies, METRIC_NAME, proxyFamilies, proxyLabels, read, seriesNames, type LabelSets } from './exported.js'
import { anchors } from './markdown.js'

const CHART = 'helm/cos-auth-proxy/'
const RULES = read(`${CHART}templates/prometheusrule.yaml`)
const DOC = read('docs/operations.md')

interface Panel { readonly title?: string, readonly targets?: readonly { readonly expr?: string }[], readonly panels?: readonly Panel[] }
interface Dashboard { readonly panels: readonly Panel[], readonly templating: { readonly list: readonly { readonly name: string, readonly query?: unknown }[] } }

/** Every PromQL expression of the dashboard: panel targets and variable queries. */
function dashboardQueries (d: Dashboard): { readonly where: string, readonly expr: string }[] {
  const out: { where: string, expr: string }[] = []
  const walk = (panels: readonly Panel[]): void => {
    for (const p of panels) {
      for (const target of p.targets ?? []) if (target.expr !== undefined) out.push({ where: `panel "${p.title ?? ''}"`, expr: target.expr })
      walk(p.panels ?? [])
    }
  }
  walk(d.panels)
  for (const v of d.templating.list) {
    const q = v.query as { query?: unknown } | string | undefined
    const expr = typeof q === 'string' ? q : q?.query
    if (typeof expr === 'string' && v.name !== 'datasource') out.push({ where: `variable ${v.name}`, expr })
  }
  return out
}

/** The rules' PromQL with Helm's actions taken out (they only add thresholds and the selector). */
function ruleExpressions (template: string): string[] {
  const plain = template.replace(/\{\{-?[\s\S]*?-?\}\}/g, '')
  return [...plain.matchAll(/expr: (?:\|-\n((?: {12}.*\n)+)|(.*))/g)].map(m => m[1] ?? m[2] ?? '')
}

// What a scrape adds (kube-prometheus-stack's ServiceMonitor/PodMonitor relabelling, or a static config).
const TARGET_LABELS = ['namespace', 'pod', 'instance', 'job', 'container', 'service', 'endpoint']

/** The family a series name belongs to (`x_bucket` → `x` when `x` is a histogram). */
function familyOf (name: string, labels: LabelSets): string {
  const base = name.replace(/_(?:bucket|sum|count)$/, '')
  return labels.has(name) ? name : base
}

/**
 * Label names the expression uses that no metric in it has: in a selector's
 * matchers (checked against that metric), and in by/without clauses (against
 * the metrics of the expression).
 */
function unknownLabels (expr: string, labels: LabelSets): string[] {
  const known = (name: string): Set<string> => new Set([...(labels.get(familyOf(name, labels)) ?? []), ...TARGET_LABELS, ...(name.endsWith('_bucket') ? ['le'] : [])])
  const bad: string[] = []
  const everyLabel = new Set<string>()
  for (const m of expr.matchAll(new RegExp(`(${METRIC_NAME.source})(?:\\{([^}]*)\\})?`, 'g'))) {
    const name = m[1] ?? ''
    const own = known(name)
    for (const l of own) everyLabel.add(l)
    for (const [, label] of (m[2] ?? '').matchAll(/([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)/g)) if (!own.has(label ?? '')) bad.push(`${name}{${label ?? ''}}`)
  }
  for (const m of expr.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g)) {
    for (const label of (m[1] ?? '').split(',').map(l => l.trim()).filter(l => l !== '')) if (!everyLabel.has(label)) bad.push(`by/without ${label}`)
  }
  return bad
}

const unknownNames = (expr: string, exported: Set<string>): string[] => [...expr.matchAll(METRIC_NAME)].map(m => m[0]).filter(n => !exported.has(n))

t.test('every metric and label the Grafana dashboard queries is one a running proxy exports', async t => {
  const exported = seriesNames(await proxyFamilies(t))
  const labels = await proxyLabels()
  const queries = dashboardQueries(JSON.parse(read(`${CHART}dashboards/cos-auth-proxy.json`)) as Dashboard)
  t.ok(queries.length >= 20, `${queries.length} queries`)
  const used = new Set<string>()
  for (const { where, expr } of queries) {
    for (const m of expr.matchAll(METRIC_NAME)) used.add(m[0])
    t.same(unknownNames(expr, exported), [], where)
    t.same(unknownLabels(expr, labels), [], `${where}: labels`)
  }
  for (const name of ['cos_auth_proxy_requests_total', 'cos_auth_proxy_request_duration_seconds_bucket', 'cos_auth_proxy_upstream_duration_seconds_bucket',
    'cos_auth_proxy_tokens_minted_total', 'cos_auth_proxy_credential_last_reload_timestamp_seconds', 'cos_auth_proxy_credential_reloads_total',
    'nodejs_active_resources', 'cos_auth_proxy_in_flight_requests', 'process_resident_memory_bytes']) {
    t.ok(used.has(name), `the dashboard shows ${name}`)
  }
})

t.test('every metric and label the alert rules query is one a running proxy exports', async t => {
  // The proxy's, and the injector's own (its serving certificate's expiry).
  const exported = new Set([...seriesNames(await proxyFamilies(t)), ...seriesNames(await injectFamilies())])
  const labels = await proxyLabels()
  const all = ruleExpressions(RULES)
  // The injector's alert reads the API server's own series (its test is below).
  const exprs = all.filter(e => !e.includes('apiserver_'))
  t.equal(exprs.length, 8, 'eight alerts on the proxy\'s and the injector\'s metrics')
  t.equal(all.length, 9, 'and one on the API server\'s')
  for (const expr of exprs) {
    t.ok([...expr.matchAll(METRIC_NAME)].length > 0, `names a metric: ${expr.split('\n')[0] ?? ''}`)
    t.same(unknownNames(expr, exported), [], expr)
    t.same(unknownLabels(expr, labels), [], `${expr}: labels`)
  }
})

t.test('the injector\'s alert counts the fail-opens of the webhook the chart renders, by the API server\'s own labels', async t => {
  const expr = ruleExpressions(RULES).find(e => e.includes('apiserver_')) ?? ''
  const webhook = /^ {2}- name: (\S+)$/m.exec(read(`${CHART}templates/injector-webhook.yaml`))?.[1]
  t.ok(webhook !== undefined, 'the chart names its webhook')
  // kube-apiserver: apiserver_admission_webhook_fail_open_count{name, type}
  t.match(expr, `apiserver_admission_webhook_fail_open_count{name="${webhook ?? ''}"}`, 'the webhook\'s name as the chart renders it')
  t.match(expr, /sum by \(name\)/, 'summed over the API servers, kept by webhook')
})

t.test('each alert\'s runbook_url points at its own section of docs/operations.md', async t => {
  const headings = anchors(DOC)
  const alerts = [...RULES.matchAll(/- alert: (\w+)[\s\S]*?runbook_url: \{\{ \$runbook \}\}#([\w-]+)/g)].map(m => ({ alert: m[1] ?? '', anchor: m[2] ?? '' }))
  t.same(alerts.map(a => a.alert), ['CosAuthProxyNotReady', 'CosAuthProxyUpstreamErrors', 'CosAuthProxyUpstreamThrottled', 'CosAuthProxyCredentialReloadFailing',
    'CosAuthProxyTokenMintingFailing', 'CosAuthProxyUpstreamLatencyHigh', 'CosAuthProxyClockSkew', 'CosAuthProxyCertificateExpiringSoon', 'CosAuthProxyInjectorFailOpen'])
  for (const { alert, anchor } of alerts) {
    t.equal(anchor, alert.toLowerCase(), `${alert}: the anchor of its heading`)
    t.ok(headings.has(anchor), `docs/operations.md has a "${alert}" section (#${anchor})`)
  }
})

t.test('the links inside docs/operations.md land on its headings', async t => {
  const headings = anchors(DOC)
  const links = [...DOC.matchAll(/\]\(#([^)]+)\)/g)].map(m => m[1] ?? '')
  t.ok(links.length > 5)
  t.same(links.filter(a => !headings.has(a)), [])
})

t.test('the dashboard is one Grafana lays out: unique panel ids, panels within 24 columns, every query on the data source variable', async t => {
  interface Laid { readonly id: number, readonly type: string, readonly gridPos: { readonly x: number, readonly y: number, readonly w: number, readonly h: number }, readonly datasource?: { readonly uid: string }, readonly targets?: readonly { readonly datasource?: { readonly uid: string } }[] }
  const d = JSON.parse(read(`${CHART}dashboards/cos-auth-proxy.json`)) as { uid: string, panels: Laid[], templating: { list: { name: string, type: string }[] } }
  t.equal(d.uid, 'cos-auth-proxy')
  t.ok(d.templating.list.some(v => v.name === 'datasource' && v.type === 'datasource'), 'a data source variable')
  const ids = d.panels.map(p => p.id)
  t.equal(new Set(ids).size, ids.length, 'unique ids')
  for (const p of d.panels) {
    t.ok(p.gridPos.x >= 0 && p.gridPos.w > 0 && p.gridPos.x + p.gridPos.w <= 24, `panel ${p.id}: within 24 columns`)
    if (p.type === 'row') continue
    t.equal(p.datasource?.uid, '${datasource}', `panel ${p.id}: on the variable`)
    for (const target of p.targets ?? []) t.equal(target.datasource?.uid, '${datasource}')
  }
  // No two panels on the same cells.
  const cells = new Set<string>()
  let overlaps = 0
  for (const p of d.panels) {
    for (let x = p.gridPos.x; x < p.gridPos.x + p.gridPos.w; x++) {
      for (let y = p.gridPos.y; y < p.gridPos.y + p.gridPos.h; y++) {
        const cell = `${x},${y}`
        if (cells.has(cell)) overlaps++
        cells.add(cell)
      }
    }
  }
  t.equal(overlaps, 0, 'no overlapping panels')
})
