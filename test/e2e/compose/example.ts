// examples/compose.yaml brought up as a user would (`docker-compose up -d`, no --build: the
// image is there), with the demo credentials copied to a temporary COS_CREDENTIALS_DIR, and
// test/e2e/compose/outsider.yaml beside it (clients the proxy must refuse). Proofs 1-4 and 6: the app
// is started only once the proxy is healthy; the app gets 200 from the verifying mock API through
// the proxy; the proxy answers nobody but the app (issue 43): a client on another network, the
// Docker host itself (a request from the bridge's gateway), another container on the app's own
// network all get 403 forbidden_source, and the app asking under a rebound name gets 403
// forbidden_host, none of them forwarded; the admin port answers on 127.0.0.1:9090; `down` stops
// the proxy with exit 0 and leaves nothing.
import { chmodSync, cpSync, mkdirSync, readFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { equal, ok, section } from '../harness/checks.js'
import { ROOT, seconds, type Run } from '../harness/processes.js'
import { metric } from '../kubelet/node.js'
import {
  clean, compose, composeArgs, containers, curl, died, EXAMPLE, healthTicker, indent, inEngine, inEngineAsync, inspect, networks, OUTSIDER,
  podmanExec, say, secret, serviceLog, volumes, waitFor, type Compose, type Engine, type Inspect,
} from './engine.js'

const PROXY_URL = 'http://cos-auth-proxy:8080'
const ADMIN = 'http://127.0.0.1:9090'
/** The app's fixed address in the example, the one COS_ALLOW_FROM names; the network's subnet. */
const APP_ADDRESS = '172.28.0.10'
const SUBNET = '172.28.0.0/24'
const CURL = ['curl', '-sS', '-m', '10', '-w', '\n%{http_code}'] as const

/** The app's request lines (" -> HTTP <code>", what its curl loop prints). */
export const appStatuses = (log: string): string[] => [...log.matchAll(/ -> HTTP (\d{3})/g)].map(m => m[1] ?? '')

/** The time the proxy's first passing health check ended (ms), if it has passed. */
const firstHealthy = (i: Inspect): number | undefined => {
  const pass = (i.State.Health?.Log ?? []).find(l => l.ExitCode === 0)
  return pass === undefined ? undefined : Date.parse(pass.End)
}

/** `up -d` in the background, watched every half second; returns its result and what was seen meanwhile. */
async function upWatched (e: Engine, c: Compose, args: readonly string[]): Promise<{ code: number, output: string, waiting: number[] }> {
  const up = inEngineAsync(e, composeArgs(e, c, ['up', '-d', ...args]), { env: c.env, timeoutMs: 300_000 })
  const state = { ended: false }
  const result = up.done.finally(() => { state.ended = true })
  // Samples in which the proxy ran and was still "starting" while no app container existed.
  const waiting: number[] = []
  while (!state.ended) {
    const list = await containers(e).catch(() => new Map<string, never>())
    const proxy = list.get('cos-auth-proxy')
    if (proxy?.State === 'running' && !list.has('app') && (await inspect(e, proxy.Id)).State.Health?.Status === 'starting') waiting.push(Date.now())
    await Promise.race([result, new Promise(resolve => setTimeout(resolve, 500))])
  }
  const r = await result
  return { code: r.code, output: clean(`${r.stdout}${r.stderr}`.trim(), 'docker-compose up'), waiting }
}

/** Proof 1: up, and the order it kept. Shared with the rotation's `up -d app`. */
export async function upInOrder (e: Engine, c: Compose, args: readonly string[], what: string): Promise<void> {
  const ticker = healthTicker(e)
  try {
    const t0 = Date.now()
    const up = await upWatched(e, c, args)
    say(indent(up.output))
    ok(up.code === 0, `${what}: docker-compose up -d exit 0 (${seconds(t0)})`)
    const list = await containers(e)
    const [proxyId, appId] = [list.get('cos-auth-proxy')?.Id, list.get('app')?.Id]
    if (proxyId === undefined || appId === undefined) throw new Error(`no proxy or no app container: ${[...list.keys()].join(', ')}`)
    const [proxy, app] = [await inspect(e, proxyId), await inspect(e, appId)]
    const healthy = firstHealthy(proxy)
    const [started, created] = [Date.parse(proxy.State.StartedAt), Date.parse(app.Created)]
    ok(healthy !== undefined && created >= healthy,
      `the app container was created ${healthy === undefined ? '?' : ((created - healthy) / 1000).toFixed(2)} s after the proxy's first passing healthcheck ended, ` +
      `${((created - started) / 1000).toFixed(1)} s after the proxy started (depends_on: service_healthy)`, { proxyHealth: proxy.State.Health, appCreated: app.Created })
    const [first, last] = [up.waiting[0], up.waiting.at(-1)]
    ok(first !== undefined && last !== undefined && last - first >= 2000,
      `meanwhile, for ${first === undefined || last === undefined ? 0 : ((last - first) / 1000).toFixed(1)} s (${up.waiting.length} looks), the proxy ran, "starting", and no app container existed`)
    ok(up.output.indexOf('_app_1') > up.output.lastIndexOf('_cos-auth-proxy_1 ... done'), 'docker-compose created app after the proxy was done')
  } finally {
    ticker.stop()
  }
}

/** Proof 6: `down` stops the proxy with exit 0 (drained, before its 30 s grace) and leaves nothing. */
export async function downClean (e: Engine, c: Compose, what: string): Promise<void> {
  const since = new Date(Date.now() - 1000)
  const t0 = Date.now()
  const r = compose(e, c, ['down'], 300_000)
  say(indent(clean(`${r.stdout}${r.stderr}`, 'docker-compose down')))
  ok(r.code === 0, `${what}: docker-compose down exit 0 (${seconds(t0)})`)
  // compose stops the app first (it depends on the proxy), then the proxy: SIGTERM, then
  // SIGKILL after its stop_grace_period (30 s). The app's sh ignores SIGTERM: 10 s, then 137.
  const ends = died(e, since)
  const [proxy, app] = [ends.find(d => d.name.includes('_cos-auth-proxy_')), ends.find(d => d.name.includes('_app_'))]
  const after = proxy === undefined || app === undefined ? NaN : (proxy.time - app.time) / 1000
  ok(proxy?.exitCode === 0 && after > 0 && after < 30, `the proxy exited ${proxy?.exitCode ?? '?'}, ${after.toFixed(1)} s after the app had (its drain: COS_SHUTDOWN_DELAY_MS 2 s; SIGKILL only at 30 s)`, ends)
  equal([...(await containers(e)).keys()], [], 'no container of the project left')
  equal(await networks(e), [], 'no network of the project left')
  equal(await volumes(e), [], 'no volume left')
  const links = inEngine(e, ['ip', '-o', 'link']).stdout.trim().split('\n').map(l => l.split(': ')[1])
  equal(links, ['lo'], 'the namespace has its loopback only again (the bridges and veths are gone)')
}

/**
 * One request (`send`, given a fresh path) the proxy must refuse: 403 with its JSON error `code`,
 * no token minted for it, and the mock API never saw the path. Returns the path.
 */
async function refusedByProxy (e: Engine, c: Compose, who: string, code: string, send: (path: string) => Run): Promise<string> {
  const path = `/management/v1/refused-${randomBytes(4).toString('hex')}`
  const before = curl(e, `${ADMIN}/metrics`).body
  const r = send(path)
  const after = curl(e, `${ADMIN}/metrics`).body
  const [body = '', status = ''] = r.stdout.split('\n')
  ok(status === '403', `${who}: 403`, clean(`${r.stdout}${r.stderr}`, who))
  let got: unknown
  try { got = (JSON.parse(body) as { error?: { code?: string } }).error?.code } catch { got = body }
  equal(got, code, `${who}: the proxy's JSON error ${code}`)
  const delta = (name: string, labels: Record<string, string> = {}): number => metric(after, name, labels) - metric(before, name, labels)
  ok(delta('cos_auth_proxy_tokens_minted_total') === delta('cos_auth_proxy_requests_total', { status_class: '2xx' }) &&
    delta('cos_auth_proxy_requests_total', { status_class: '4xx' }) === 1,
  `${who}: no token minted for it (tokens +${delta('cos_auth_proxy_tokens_minted_total')}, as many as the app's 2xx meanwhile; 4xx +1)`)
  ok(!serviceLog(e, c, 'mock-api').includes(path), `${who}: the mock API never saw ${path}`)
  return path
}

export async function example (e: Engine, work: string): Promise<void> {
  const creds = join(work, 'demo-credentials')
  mkdirSync(creds)
  for (const f of ['access-key', 'access-key-secret']) {
    cpSync(join(ROOT, 'examples/demo-credentials', f), join(creds, f))
    chmodSync(join(creds, f), 0o444) // readable by the proxy's uid 65532, as the example's comment says
  }
  const demoSecret = secret(readFileSync(join(creds, 'access-key-secret'), 'utf8').trim())
  const c: Compose = { files: [EXAMPLE, OUTSIDER], env: { COS_CREDENTIALS_DIR: creds } }

  await section('up: the app only once the proxy is healthy (proof 1)', async () => {
    await upInOrder(e, c, [], 'examples/compose.yaml + test/e2e/compose/outsider.yaml')
  })

  await section('the app through the proxy: 200 from the verifying mock API (proof 2)', async () => {
    const statuses = await waitFor('two requests in the app\'s log', 60, () => {
      const s = appStatuses(serviceLog(e, c, 'app'))
      return s.length >= 2 ? s : undefined
    })
    ok(statuses.every(s => s === '200'), `the app's log: ${statuses.map(s => `-> HTTP ${s}`).join(', ')} (/management and /optimize)`)
    const mock = serviceLog(e, c, 'mock-api')
    const rejected = [...mock.matchAll(/"authError":"(\w+)".*"request rejected"/g)].map(m => m[1])
    ok(mock.includes('mock COS API listening') && rejected.every(r => r === 'missing_token'),
      `the mock API refused no token the proxy signed (${rejected.length} refusals, all missing_token: its own healthcheck sends none)`, rejected)
  })

  await section('outside the example\'s network: refused by the proxy, nothing forwarded (proof 3)', async () => {
    const list = await containers(e)
    const outsider = await inspect(e, list.get('outsider')?.Id ?? '?')
    const app = await inspect(e, list.get('app')?.Id ?? '?')
    const from = outsider.NetworkSettings.Networks[`${e.project}_outside`]?.IPAddress ?? ''
    ok(/^172\.28\.1\.\d+$/.test(from), `the outsider's address ${from} is in 172.28.1.0/24, outside COS_ALLOW_FROM`)
    const path = await refusedByProxy(e, c, 'its request to the proxy\'s service name and port', 'forbidden_source', p => podmanExec(e, outsider.Id, [...CURL, `${PROXY_URL}${p}`]))
    const control = podmanExec(e, app.Id, [...CURL, `${PROXY_URL}${path}`]).stdout
    ok(control.endsWith('\n404') && control.includes('not_found') && serviceLog(e, c, 'mock-api').includes(path),
      'the same request from the app is forwarded (the mock API\'s 404 not_found, and the path in its log)', control)
  })

  await section('nobody but the app: the Docker host (the bridge\'s gateway) and a neighbour on the app\'s network get 403 (proof 3, issue 43)', async () => {
    const list = await containers(e)
    const [app, proxy, neighbour] = await Promise.all(['app', 'cos-auth-proxy', 'neighbour'].map(async s => await inspect(e, list.get(s)?.Id ?? '?')))
    const on = (i: Inspect | undefined): string => i?.NetworkSettings.Networks[`${e.project}_cos`]?.IPAddress ?? ''
    equal(on(app), APP_ADDRESS, `the app has the example's fixed address ${APP_ADDRESS}, the one COS_ALLOW_FROM names`)
    const proxyAt = on(proxy)
    // The host's side of the bridge: the address the namespace (the Docker host here) has in the subnet.
    const gateway = /inet (\S+)\//.exec(inEngine(e, ['ip', '-o', '-4', 'addr', 'show', 'to', SUBNET]).stdout)?.[1] ?? ''
    ok(gateway === '172.28.0.1', `the bridge's gateway, the host's address on the network: ${gateway}`)
    await refusedByProxy(e, c, `the host, from ${gateway} to ${proxyAt}:8080`, 'forbidden_source', p => inEngine(e, [...CURL, '--interface', gateway, `http://${proxyAt}:8080${p}`]))
    const next = on(neighbour)
    ok(next === '172.28.0.20', `the neighbour's address ${next}: in the app's subnet, not the app's`)
    await refusedByProxy(e, c, `the neighbour (${next}) on the app's network`, 'forbidden_source', p => podmanExec(e, neighbour?.Id ?? '?', [...CURL, `${PROXY_URL}${p}`]))
  })

  await section('a rebound name: the app\'s own request under another Host gets 403 forbidden_host (issue 43)', async () => {
    const list = await containers(e)
    const proxyAt = (await inspect(e, list.get('cos-auth-proxy')?.Id ?? '?')).NetworkSettings.Networks[`${e.project}_cos`]?.IPAddress ?? ''
    // What a page in the host's browser sends once its DNS name resolves to the proxy: that name.
    await refusedByProxy(e, c, `from the app (allowed), some.rebound.example resolved to ${proxyAt}`, 'forbidden_host',
      p => podmanExec(e, list.get('app')?.Id ?? '?', [...CURL, '--resolve', `some.rebound.example:8080:${proxyAt}`, `http://some.rebound.example:8080${p}`]))
  })

  await section('the admin port on the mapped 127.0.0.1:9090 (proof 4)', async () => {
    const proxy = await inspect(e, (await containers(e)).get('cos-auth-proxy')?.Id ?? '?')
    equal(proxy.NetworkSettings.Ports?.['9090/tcp'], [{ HostIp: '127.0.0.1', HostPort: '9090' }], 'published as 127.0.0.1:9090 (the namespace\'s loopback)')
    const healthz = curl(e, `${ADMIN}/healthz`)
    ok(healthz.status === '200' && healthz.body.includes('"ok"'), `GET ${ADMIN}/healthz: ${healthz.status} ${healthz.body}`)
    equal(curl(e, `${ADMIN}/readyz`).status, '200', `GET ${ADMIN}/readyz: 200`)
    const metrics = curl(e, `${ADMIN}/metrics`)
    const served = metric(metrics.body, 'cos_auth_proxy_requests_total', { route: 'management', status_class: '2xx' })
    ok(metrics.status === '200' && served >= 1 && metric(metrics.body, 'cos_auth_proxy_ready') === 1,
      `GET ${ADMIN}/metrics: ${metrics.status}, ready 1, ${served} management requests answered 2xx`)
  })

  await section('the secret never in a log', async () => {
    const logs = compose(e, c, ['logs', '--no-color'], 60_000).stdout
    ok(logs.length > 1000 && !logs.includes(demoSecret), `the services' logs (${logs.length} bytes) do not contain the access key secret`)
  })

  await section('down (proof 6)', async () => {
    await downClean(e, c, 'the example')
  })
}
