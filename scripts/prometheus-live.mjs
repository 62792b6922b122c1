#!/usr/bin/env node
// prometheus-live.mjs RULES.yaml [DASHBOARD.json] — the chart's alert rules
// and the Grafana dashboard's queries against a real Prometheus scraping
// real proxies (the bundle, dist/cos-auth-proxy.mjs `serve`), one per
// condition, under steady load:
//
//   healthy           an upstream answering 200             → no alert
//   no-credentials    empty credential files (503s)          → NotReady, CredentialReloadFailing, TokenMintingFailing
//   upstream-500      an upstream answering 500              → UpstreamErrors
//   upstream-refused  nothing listening at the upstream      → UpstreamErrors
//   throttled         an upstream answering 429 and 503, both with Retry-After
//                                                            → UpstreamThrottled (not UpstreamErrors)
//   reload-failing    files emptied after a good first read  → CredentialReloadFailing (the pair in force signs on)
//   slow-upstream     an upstream answering after 3 s        → UpstreamLatencyHigh
//   skewed-clock      an upstream whose Date is 2 min behind → ClockSkew
//   draining          SIGTERM with a long COS_SHUTDOWN_DELAY_MS: readiness 503,
//                     requests still served                  → NotReady only (with the
//                     chart's `for:`, a drain that ends in time raises nothing)
//   certificate-expiring  an upstream client certificate that expires in 3 days
//                     (its CA bundle valid a year)           → CertificateExpiringSoon
//   injector-expiring `inject` serving a certificate that expires in 3 days
//                                                            → CertificateExpiringSoon
// (healthy's client certificate and CA bundle are valid a year: no alert.)
//
// RULES.yaml is the PrometheusRule's spec.groups as scripts/ci-packaging.sh
// renders them from ci/alerts-values.yaml (selector namespace="shop": the
// targets carry that label). In the copy Prometheus loads, every `for:` is 0s,
// so an alert whose expression holds fires at the next evaluation: the check
// is that each condition has exactly its alerts firing (none pending, no
// other). Then every dashboard panel's query is run per condition through
// /api/v1/query: no error, no negative value (but the clock skew's, signed
// by definition); on the healthy proxy every
// panel has data and the 5xx share is 0. Everything listens on 127.0.0.1 in
// a temporary directory, removed at the end; the run stops itself after
// 100 s. Used by scripts/ci-packaging.sh (check prometheus-live).
import { execFileSync, spawn } from 'node:child_process'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, get, Agent } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { clearInterval, clearTimeout, setInterval, setTimeout } from 'node:timers'
import { setTimeout as sleep } from 'node:timers/promises'
import YAML from 'yaml'

const [rulesFile, dashboardFile = 'helm/cos-auth-proxy/dashboards/cos-auth-proxy.json'] = process.argv.slice(2)
if (rulesFile === undefined) { console.error('usage: prometheus-live.mjs RULES.yaml [DASHBOARD.json]'); process.exit(2) }
const PROMETHEUS = process.env.PROMETHEUS ?? 'prometheus'
const EXPECTED = {
  healthy: [],
  'no-credentials': ['CosAuthProxyCredentialReloadFailing', 'CosAuthProxyNotReady', 'CosAuthProxyTokenMintingFailing'],
  'upstream-500': ['CosAuthProxyUpstreamErrors'],
  'upstream-refused': ['CosAuthProxyUpstreamErrors'],
  throttled: ['CosAuthProxyUpstreamThrottled'],
  'reload-failing': ['CosAuthProxyCredentialReloadFailing'],
  'slow-upstream': ['CosAuthProxyUpstreamLatencyHigh'],
  'skewed-clock': ['CosAuthProxyClockSkew'],
  draining: ['CosAuthProxyNotReady'],
  'certificate-expiring': ['CosAuthProxyCertificateExpiringSoon'],
  'injector-expiring': ['CosAuthProxyCertificateExpiringSoon'],
}

const SIGNED = /^cos_auth_proxy_upstream_clock_skew_seconds\{[^}]*\}$/

const dir = mkdtempSync(join(tmpdir(), 'prometheus-live-'))
const children = []
const servers = []
let failures = 0
const fail = (what) => { failures++; console.log(`   FAIL: ${what}`) }

async function cleanup () {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL')
  for (const s of servers) s.closeAllConnections?.()
  await Promise.all(servers.map(s => new Promise(resolve => s.close(resolve))))
  rmSync(dir, { recursive: true, force: true })
}
const overall = setTimeout(() => {
  console.log('prometheus-live: FAIL: not done after 100 s')
  cleanup().finally(() => process.exit(1))
}, 100_000)

/** An upstream on 127.0.0.1 answering every request with `status`, after `delayMs`, its Date header `dateOffsetS` off; `throttle`: 429 and 503 in turn, with Retry-After. */
async function upstream (status, { delayMs = 0, dateOffsetS = 0, throttle = false } = {}) {
  let n = 0
  const server = createServer((req, res) => {
    req.resume()
    const answer = () => {
      const headers = { 'content-type': 'application/json' }
      if (dateOffsetS !== 0) headers.date = new Date(Date.now() + dateOffsetS * 1000).toUTCString()
      if (throttle) { headers['retry-after'] = '1'; status = n++ % 2 === 0 ? 429 : 503 }
      res.writeHead(status, headers).end('{"ok":' + (status < 400) + '}')
    }
    if (delayMs > 0) setTimeout(answer, delayMs)
    else answer()
  })
  servers.push(server)
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve))
  return `http://127.0.0.1:${server.address().port}`
}

/** A port nothing listens on (taken, then given back). */
async function closedPort () {
  const server = createServer()
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address()
  await new Promise(resolve => server.close(resolve))
  return port
}

/** A self-signed certificate for 127.0.0.1 valid `days` days: its files. */
function certificate (name, days) {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', String(days), '-subj', `/CN=${name}`,
    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', join(dir, `${name}.key`), '-out', join(dir, `${name}.pem`)], { stdio: 'ignore' })
  return { cert: join(dir, `${name}.pem`), key: join(dir, `${name}.key`) }
}
const upstreamTls = (client, ca) => ({ COS_CLIENT_CERT_FILE: client.cert, COS_CLIENT_KEY_FILE: client.key, COS_CA_FILE: ca.cert })

/** The bundle's `serve` (or `command`) on ports of its choosing; resolves with them once it listens. */
function startProxy (name, env, command = 'serve') {
  const child = spawn(process.execPath, ['dist/cos-auth-proxy.mjs', command], {
    env: { PATH: process.env.PATH, COS_LISTEN_PORT: '0', COS_ADMIN_PORT: '0', COS_CONNECT_TIMEOUT_MS: '500', COS_UPSTREAM_TIMEOUT_MS: '2000', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  children.push(child)
  return new Promise((resolve, reject) => {
    let out = ''
    let listening = false
    // Read until the listening line; the pipe is drained after it all the same.
    child.stdout.on('data', chunk => {
      if (listening) return
      out += chunk
      const m = /^.*"msg":"cos-auth-proxy (?:injection webhook )?listening".*$/m.exec(out)
      if (m === null) return
      listening = true
      const line = JSON.parse(m[0])
      resolve({ name, port: line.port, admin: line.admin.port, child, command })
    })
    child.once('exit', code => reject(new Error(`${name}: the proxy exited (${code}) before listening`)))
  })
}

function httpGet (url, agent) {
  return new Promise((resolve, reject) => {
    get(url, { agent }, res => {
      let body = ''
      res.setEncoding('utf8').on('data', d => { body += d }).on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject)
  })
}

async function prometheusApi (base, path) {
  const res = await httpGet(`${base}${path}`)
  const body = JSON.parse(res.body)
  if (body.status !== 'success') throw new Error(`${path}: ${body.errorType}: ${body.error}`)
  return body.data
}

async function main () {
  console.log(`-- ${(await run([PROMETHEUS, '--version'])).split('\n')[0]}`)
  const creds = join(dir, 'creds'), empty = join(dir, 'empty')
  mkdirSync(creds); mkdirSync(empty)
  writeFileSync(join(creds, 'access-key'), 'AKIDLIVE'); writeFileSync(join(creds, 'secret'), 'live-secret-0123456789')
  writeFileSync(join(empty, 'access-key'), ''); writeFileSync(join(empty, 'secret'), '')
  const breaking = join(dir, 'breaking')
  mkdirSync(breaking)
  writeFileSync(join(breaking, 'access-key'), 'AKIDLIVE'); writeFileSync(join(breaking, 'secret'), 'live-secret-0123456789')
  const files = (d) => ({ COS_ACCESS_KEY_FILE: join(d, 'access-key'), COS_ACCESS_KEY_SECRET_FILE: join(d, 'secret') })
  const ok = await upstream(200)
  const [year, threeDays, serving] = [certificate('year', 365), certificate('three-days', 3), certificate('serving', 3)]
  const proxies = await Promise.all([
    startProxy('healthy', { COS_API_URL: ok, ...files(creds), ...upstreamTls(year, year) }),
    startProxy('no-credentials', { COS_API_URL: ok, ...files(empty) }),
    startProxy('upstream-500', { COS_API_URL: await upstream(500), ...files(creds) }),
    startProxy('upstream-refused', { COS_API_URL: `http://127.0.0.1:${await closedPort()}`, ...files(creds) }),
    startProxy('throttled', { COS_API_URL: await upstream(429, { throttle: true }), ...files(creds) }),
    startProxy('reload-failing', { COS_API_URL: ok, ...files(breaking) }),
    startProxy('slow-upstream', { COS_API_URL: await upstream(200, { delayMs: 3000 }), COS_UPSTREAM_TIMEOUT_MS: '10000', ...files(creds) }),
    startProxy('skewed-clock', { COS_API_URL: await upstream(200, { dateOffsetS: -120 }), ...files(creds) }),
    // Its drain outlasts the check: readiness stays 503 while it keeps serving and exporting.
    startProxy('draining', { COS_API_URL: ok, COS_SHUTDOWN_DELAY_MS: '120000', ...files(creds) }),
    startProxy('certificate-expiring', { COS_API_URL: ok, ...files(creds), ...upstreamTls(threeDays, year) }),
    startProxy('injector-expiring', { COS_INJECT_HOST: '127.0.0.1', COS_INJECT_PORT: '0', COS_INJECT_SIDECAR_FILE: 'examples/injector/sidecar.json',
      COS_INJECT_DEFAULT_SECRET: 'cos-credentials', COS_INJECT_TLS_CERT_FILE: serving.cert, COS_INJECT_TLS_KEY_FILE: serving.key }, 'inject'),
  ])
  proxies.find(p => p.name === 'draining')?.child.kill('SIGTERM')
  // Emptied before the first scrape: every read Prometheus sees is rejected, the pair read at start stays in force.
  writeFileSync(join(breaking, 'access-key'), ''); writeFileSync(join(breaking, 'secret'), '')

  // The rules as rendered, every `for:` made 0s (see the header).
  const rules = YAML.parse(readFileSync(rulesFile, 'utf8'))
  for (const g of rules.groups) for (const r of g.rules) if (r.for !== undefined) r.for = '0s'
  writeFileSync(join(dir, 'rules.yaml'), YAML.stringify(rules))
  writeFileSync(join(dir, 'prometheus.yaml'), YAML.stringify({
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: [join(dir, 'rules.yaml')],
    scrape_configs: [{
      job_name: 'cos-auth-proxy',
      static_configs: proxies.map(p => ({ targets: [`127.0.0.1:${p.admin}`], labels: { namespace: 'shop', condition: p.name } })),
    }],
  }))
  const promPort = await closedPort()
  const base = `http://127.0.0.1:${promPort}`
  const prom = spawn(PROMETHEUS, ['--config.file', join(dir, 'prometheus.yaml'), '--storage.tsdb.path', join(dir, 'data'),
    '--web.listen-address', `127.0.0.1:${promPort}`, '--log.level', 'warn'], { stdio: ['ignore', 'inherit', 'inherit'] })
  children.push(prom)
  while (!(await httpGet(`${base}/-/ready`).then(r => r.status === 200, () => false))) {
    if (prom.exitCode !== null) throw new Error(`prometheus exited (${prom.exitCode})`)
    await sleep(200)
  }
  // The port was free a moment ago; make sure the Prometheus answering on it is this one.
  const flags = await prometheusApi(base, '/api/v1/status/flags')
  if (flags['storage.tsdb.path'] !== join(dir, 'data')) throw new Error(`another Prometheus answers on 127.0.0.1:${promPort}`)
  await targetsUp(base, proxies.length)

  // Steady load: 20 requests/s on each proxy, for as long as the check runs.
  // (The slow upstream holds 60 requests at a time.)
  const agent = new Agent({ keepAlive: true, maxSockets: 100 })
  const load = setInterval(() => { for (const p of proxies) if (p.command === 'serve') httpGet(`http://127.0.0.1:${p.port}/v1/clusters`, agent).catch(() => undefined) }, 50)
  try {
    await checkAlerts(base)
    await checkDashboard(base, proxies)
  } finally {
    clearInterval(load)
    agent.destroy()
  }
}

/** Waits (up to 20 s) until every proxy has been scraped; says which were not. */
async function targetsUp (base, count) {
  const until = Date.now() + 20_000
  let targets = []
  while (Date.now() < until) {
    targets = (await prometheusApi(base, '/api/v1/targets')).activeTargets
    if (targets.length === count && targets.every(t => t.health === 'up')) return
    await sleep(500)
  }
  throw new Error(`not every proxy is scraped: ${targets.map(t => `${t.labels.condition} ${t.health} ${t.lastError}`).join('; ') || 'no targets'}`)
}

/** Alert name sets by condition label: firing, and pending or firing. */
async function alertsByCondition (base) {
  const out = Object.fromEntries(Object.keys(EXPECTED).map(c => [c, { firing: new Set(), any: new Set() }]))
  for (const a of (await prometheusApi(base, '/api/v1/alerts')).alerts) {
    const c = out[a.labels.condition] ?? (out[a.labels.condition] = { firing: new Set(), any: new Set() })
    c.any.add(a.labels.alertname)
    if (a.state === 'firing') c.firing.add(a.labels.alertname)
  }
  return out
}

const sorted = (s) => [...s].sort().join(', ') || '(none)'

async function checkAlerts (base) {
  console.log('-- alerts: each condition fires its own alerts and no other (rules with for: 0s)')
  const start = Date.now()
  let seen
  // At least 15 s of scrapes (rates over a few samples), at most 60 s for every expected alert to fire.
  while (true) {
    seen = await alertsByCondition(base)
    const complete = Object.entries(EXPECTED).every(([c, want]) => want.every(a => seen[c].firing.has(a)))
    if ((complete && Date.now() - start > 15_000) || Date.now() - start > 60_000) break
    await sleep(1000)
  }
  // Three more evaluations: nothing else may have turned up meanwhile.
  await sleep(3000)
  seen = await alertsByCondition(base)
  for (const [c, { firing, any }] of Object.entries(seen)) {
    const want = EXPECTED[c] ?? []
    const line = `${c}: firing ${sorted(firing)}`
    if (sorted(any) !== sorted(want) || sorted(firing) !== sorted(want)) fail(`${line}; want ${sorted(want)}${any.size > firing.size ? `; pending ${sorted([...any].filter(a => !firing.has(a)))}` : ''}`)
    else console.log(`   ok: ${line}`)
  }
}

/** Every panel's query per condition: no error, nothing negative; on the healthy proxy, data in every panel. */
async function checkDashboard (base, proxies) {
  const dashboard = JSON.parse(readFileSync(dashboardFile, 'utf8'))
  const panels = dashboard.panels.filter(p => p.type !== 'row' && (p.targets ?? []).length > 0)
  console.log(`-- dashboard: ${panels.length} panels' queries, per condition`)
  for (const p of proxies) {
    const empty = []
    let queries = 0
    for (const panel of panels) {
      let data = false
      for (const { expr } of panel.targets) {
        const q = expr.replaceAll('$__rate_interval', '15s').replaceAll('$namespace', 'shop').replaceAll('$instance', `127.0.0.1:${p.admin}`)
        queries++
        let result
        try {
          result = (await prometheusApi(base, `/api/v1/query?query=${encodeURIComponent(q)}`)).result
        } catch (err) {
          fail(`${p.name}: panel "${panel.title}": ${err.message}`)
          continue
        }
        const values = result.map(r => Number(r.value[1]))
        // The clock skew is signed by definition (which clock is ahead); everything else is a rate, a duration, a share or a size.
        if (!SIGNED.test(expr) && values.some(v => v < 0)) fail(`${p.name}: panel "${panel.title}" is negative: ${values.join(', ')} (${expr})`)
        if (p.name === 'healthy' && values.some(Number.isNaN)) fail(`${p.name}: panel "${panel.title}" is NaN (${expr})`)
        if (values.length > 0) data = true
        if (p.name === 'healthy' && panel.title === '5xx share' && !(values.length === 1 && values[0] === 0)) fail(`healthy: 5xx share is ${values.join(', ') || 'empty'}, want 0`)
      }
      if (!data) empty.push(panel.title)
    }
    if (p.name === 'healthy' && empty.length > 0) fail(`healthy: no data in ${empty.map(t => `"${t}"`).join(', ')}`)
    console.log(`   ${p.name}: ${queries} queries${empty.length > 0 ? `; no data (allowed here): ${empty.join(', ')}` : ''}`)
  }
}

function run (argv) {
  return new Promise((resolve, reject) => {
    const c = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    c.stdout.on('data', d => { out += d }); c.stderr.on('data', d => { out += d })
    c.on('error', reject).on('exit', () => resolve(out))
  })
}

try {
  await main()
} catch (err) {
  fail(err.stack ?? String(err))
}
clearTimeout(overall)
await cleanup()
console.log(failures === 0 ? 'prometheus-live: ok' : `prometheus-live: ${failures} failure(s)`)
process.exit(failures === 0 ? 0 : 1)
