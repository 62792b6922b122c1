// The injected sidecar against the chart's own, rendered from the same values
// (helm/cos-auth-proxy/ci/injector-values.yaml: a private CA and client
// certificate, an egress proxy, a required header, log level, resources):
// test/fixtures/chart/injector.yaml holds the example parent chart's
// Deployment and the injector's ConfigMap from one `helm template`, kept
// current by scripts/ci-packaging.sh. The webhook's code runs on the pod with
// the ConfigMap's definition; the two containers must be equal field by field.
import { readdirSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { parse } from 'yaml'
import { ConfigError, loadConfig, ROUTE_TABLE, VARIABLES } from '../../src/config/config.js'
import { answerReview } from '../../src/inject/patch.js'
import { CONFIGMAP_TUNABLE, IMAGE_NODE_OPTIONS, pinnedEnv } from '../../src/inject/sidecar.js'
import { parseSidecarFile } from '../../src/inject/template.js'
import { applyResponsePatch, fixtureAppPod, fixturePod, fixtureSettings, fixtureSidecarFile, podReview } from './pods.js'

type Json = Record<string, unknown>
type Env = { name: string, value?: string }[]

function injectFixture (annotations: Record<string, string> = {}, settings = fixtureSettings()): ReturnType<typeof applyResponsePatch> {
  const pod = fixtureAppPod(annotations)
  const { review, outcome } = answerReview(podReview(pod), settings)
  if (outcome.kind !== 'injected') throw new Error(`not injected: ${JSON.stringify(outcome)}`)
  return applyResponsePatch(pod, review.response)
}

const chartSpec = (): { initContainers: Json[], volumes: Json[] } => fixturePod().spec as { initContainers: Json[], volumes: Json[] }
const value = (env: unknown, name: string): string | undefined => (env as Env).find(e => e.name === name)?.value

t.test('the injected sidecar is the chart\'s own, field by field, and so are its volumes', async t => {
  const { spec } = injectFixture()
  const injected = spec.initContainers?.[0] as Json
  const chart = chartSpec().initContainers[0] as Json
  const fields = new Set([...Object.keys(chart), ...Object.keys(injected)])
  for (const field of ['env', 'volumeMounts', 'startupProbe', 'readinessProbe', 'livenessProbe', 'resources', 'securityContext', 'image', 'ports', 'restartPolicy']) {
    t.ok(fields.has(field), `${field} is compared`)
  }
  for (const field of fields) t.same(injected[field], chart[field], field)
  t.same(spec.volumes, chartSpec().volumes, 'volumes: the credentials and the TLS Secret')
})

t.test('with injector.nativeSidecar=false the same container goes last in containers, without restartPolicy', async t => {
  const pod = fixtureAppPod()
  const { review } = answerReview(podReview(pod), fixtureSettings(false))
  const { spec } = applyResponsePatch(pod, review.response)
  t.equal(spec.initContainers, undefined)
  const { restartPolicy, ...chart } = chartSpec().initContainers[0] as Json
  t.equal(restartPolicy, 'Always')
  t.same(spec.containers.at(-1), chart)
})

t.test('what the chart\'s values set reaches the injected sidecar: CA, client certificate, egress proxy, required header, log level', async t => {
  const { spec } = injectFixture()
  const sidecar = spec.initContainers?.[0] as Json
  const expected: Record<string, string> = {
    COS_CA_FILE: '/var/run/secrets/cos-tls/ca.crt',
    COS_CLIENT_CERT_FILE: '/var/run/secrets/cos-tls/tls.crt',
    COS_CLIENT_KEY_FILE: '/var/run/secrets/cos-tls/tls.key',
    HTTPS_PROXY: 'http://egress.example.com:3128',
    NO_PROXY: '.cluster.local,10.0.0.0/8',
    COS_REQUIRE_HEADER: 'X-Cos-Client',
    COS_LOG_LEVEL: 'debug',
  }
  for (const [name, v] of Object.entries(expected)) t.equal(value(sidecar.env, name), v, name)
  const mount = (sidecar.volumeMounts as Json[]).find(m => m.mountPath === '/var/run/secrets/cos-tls')
  t.same(mount, { name: 'cos-auth-proxy-tls', mountPath: '/var/run/secrets/cos-tls', readOnly: true }, 'read-only, a directory (no subPath)')
  const volume = spec.volumes?.find(v => v.name === 'cos-auth-proxy-tls') as { secret: { secretName: string } }
  t.equal(volume.secret.secretName, 'cos-upstream-tls', 'the same Secret name, in the pod\'s namespace')
})

t.test('per pod only what the annotations choose differs', async t => {
  const { spec } = injectFixture({ 'cos-auth-proxy.io/log-level': 'warn', 'cos-auth-proxy.io/secret': 'team-a-cos', 'cos-auth-proxy.io/cpu': '200m' })
  const injected = spec.initContainers?.[0] as Json
  const chart = chartSpec().initContainers[0] as Json
  t.equal(value(injected.env, 'COS_LOG_LEVEL'), 'warn')
  t.same((injected.env as Env).filter(e => e.name !== 'COS_LOG_LEVEL'), (chart.env as Env).filter(e => e.name !== 'COS_LOG_LEVEL'), 'the rest of env as the chart sets it')
  t.same(injected.resources, { limits: { cpu: '1', memory: '320Mi' }, requests: { cpu: '200m', memory: '200Mi' } })
  const volumes = spec.volumes as { name: string, secret: { secretName: string } }[]
  t.equal(volumes.find(v => v.name === 'cos-auth-proxy-credentials')?.secret.secretName, 'team-a-cos')
  t.equal(volumes.find(v => v.name === 'cos-auth-proxy-tls')?.secret.secretName, 'cos-upstream-tls', 'the TLS Secret is cluster-wide')
  for (const field of ['volumeMounts', 'startupProbe', 'securityContext', 'image', 'ports']) t.same(injected[field], chart[field], field)
})

t.test('cos-auth-proxy.io/access-log sets COS_ACCESS_LOG for that pod\'s sidecar, and nothing else changes', async t => {
  const { spec } = injectFixture({ 'cos-auth-proxy.io/access-log': 'all' })
  const injected = spec.initContainers?.[0] as Json
  const chart = chartSpec().initContainers[0] as Json
  t.equal(value(chart.env, 'COS_ACCESS_LOG'), undefined, 'the chart leaves it to the proxy\'s default (errors)')
  t.equal(value(injected.env, 'COS_ACCESS_LOG'), 'all')
  t.same((injected.env as Env).filter(e => e.name !== 'COS_ACCESS_LOG'), chart.env, 'the rest of env as the chart sets it')
})

/** What the kubelet does: envFrom first, then env, a later entry of the same name winning. */
function resolvedEnv (container: Json, configMap: Record<string, string>): Record<string, string> {
  return { ...configMap, ...Object.fromEntries((container.env as Env).map(e => [e.name, e.value ?? ''])) }
}

t.test('a pod\'s own ConfigMap tunes the sidecar but cannot redirect it: every other variable is pinned in env', async t => {
  const { spec } = injectFixture({ 'cos-auth-proxy.io/env-from-configmap': 'team-a-proxy-env' })
  const sidecar = spec.initContainers?.[0] as Json
  t.same(sidecar.envFrom, [{ configMapRef: { name: 'team-a-proxy-env' } }])
  const hostile: Record<string, string> = {
    COS_MANAGEMENT_API_URL: 'https://evil.example.net', COS_API_URL: 'https://evil.example.net', COS_OPTIMIZE_PATH_PREFIX: '/x',
    HTTPS_PROXY: 'http://evil.example.net:3128', https_proxy: 'http://evil.example.net:3128', HTTP_PROXY: 'http://evil.example.net:3128', NO_PROXY: '*',
    COS_CA_FILE: '/etc/hostname', NODE_EXTRA_CA_CERTS: '/etc/hostname', NODE_TLS_REJECT_UNAUTHORIZED: '0', NODE_OPTIONS: '--inspect=0.0.0.0:9229',
    COS_ALLOW_FROM: '0.0.0.0/0', COS_LISTEN_HOST: '0.0.0.0', COS_REQUIRE_HEADER: '', COS_ACCESS_KEY: 'x', COS_MANAGEMENT_ALLOWED_METHODS: 'DELETE',
    COS_CONNECT_TIMEOUT_MS: '1234',
  }
  const env = resolvedEnv(sidecar, hostile)
  const chart = resolvedEnv(chartSpec().initContainers[0] as Json, {})
  for (const name of Object.keys(hostile)) {
    if (name === 'COS_CONNECT_TIMEOUT_MS') t.equal(env[name], '1234', 'a tuning variable comes through')
    else t.equal(env[name], chart[name] ?? (name === 'NODE_OPTIONS' ? IMAGE_NODE_OPTIONS : ''), `${name}: the chart's value, or pinned empty (unset for the proxy)`)
  }
  const config = loadConfig({ env, dotenv: false, needs: 'nothing' })
  t.same(config.routes.map(r => r.url), ['https://management.cos.example.com/api', 'https://optimize.cos.example.com/api'])
  t.same(config.tls, loadConfig({ env: chart, dotenv: false, needs: 'nothing' }).tls)
  t.equal(config.requireHeader?.name.toLowerCase(), 'x-cos-client')
})

t.test('every variable the proxy reads is either tunable by a pod\'s ConfigMap or pinned', async t => {
  const pinned = new Set(pinnedEnv().map(e => e.name))
  for (const name of Object.keys(VARIABLES)) t.ok(pinned.has(name) !== CONFIGMAP_TUNABLE.includes(name), name)
  const dockerfile = readFileSync(fileURLToPath(new URL('../../Dockerfile', import.meta.url)), 'utf8')
  t.match(dockerfile, `NODE_OPTIONS=${IMAGE_NODE_OPTIONS} `, 'NODE_OPTIONS is pinned to the image\'s own value')
})

t.test('the injected-version annotation changes with the definition and only then', async t => {
  const first = fixtureSettings()
  t.equal(fixtureSettings().version, first.version, 'the same file, the same version')
  t.not(fixtureSettings(false).version, first.version, 'native or not shapes the patch')
  const other = JSON.parse(fixtureSidecarFile()) as { container: Json }
  other.container.image = 'registry.example.com/cos-auth-proxy:0.2.0'
  const { injectSettings } = await import('../../src/inject/template.js')
  t.not(injectSettings(parseSidecarFile(JSON.stringify(other)), true, 'cos-credentials', '0.1.0').version, first.version, 'a new image')
  t.equal(injectFixture().annotations['cos-auth-proxy.io/injected-version'], first.version)
})

t.test('a definition that would not work is a ConfigError naming COS_INJECT_SIDECAR_FILE', async t => {
  const good = JSON.parse(fixtureSidecarFile()) as { container: Json, volumes: Json[] }
  const tlsMount = (d: { container: Json }): Json => (d.container.volumeMounts as Json[]).find(m => m.name === 'cos-auth-proxy-tls') as Json
  const variant = (change: (d: { container: Json, volumes: Json[] }) => void): string => {
    const d = structuredClone(good)
    change(d)
    return JSON.stringify(d)
  }
  const cases: [string, RegExp][] = [
    ['{"container":', /must hold JSON/],
    ['[]', /"container"/],
    [variant(d => { tlsMount(d).subPath = 'ca.crt' }), /cos-auth-proxy-tls must be a directory \(no subPath\)/],
    [variant(d => { tlsMount(d).readOnly = false }), /must be readOnly/],
    [variant(d => { d.volumes = d.volumes.filter(v => v.name !== 'cos-auth-proxy-tls') }), /cos-auth-proxy-tls has no volume/],
    [variant(d => { d.container.env = (d.container.env as Env).filter(e => !e.name.endsWith('_API_URL')) }), /needs? an upstream/],
    [variant(d => { d.container.envFrom = [{ configMapRef: { name: 'x' } }] }), /envFrom is per pod/],
  ]
  for (const [text, problem] of cases) {
    t.throws(() => parseSidecarFile(text), { name: 'ConfigError', variable: 'COS_INJECT_SIDECAR_FILE' }, text.slice(0, 60))
    try { parseSidecarFile(text) } catch (err) { t.match((err as ConfigError).message, problem) }
  }
  t.throws(() => parseSidecarFile(variant(d => { (d.container.env as Env).push({ name: 'COS_LOG_LEVEL', value: 'loud' }) })),
    { variable: 'COS_INJECT_SIDECAR_FILE', message: /container\.env: COS_LOG_LEVEL/ }, 'the proxy\'s own check, inside the file')
})

t.test('the chart\'s routes are the route table\'s: its upstream.* values, their env, the "at least one URL" list', async t => {
  const chart = fileURLToPath(new URL('../../helm/cos-auth-proxy/', import.meta.url))
  // The partials (templates/_*.tpl): the routes and the environment are _env.tpl's.
  const helpers = readdirSync(`${chart}templates`).filter(f => /^_.*\.tpl$/.test(f)).sort().map(f => readFileSync(`${chart}templates/${f}`, 'utf8')).join('\n')
  const values = parse(readFileSync(`${chart}values.yaml`, 'utf8')) as { upstream: Record<string, unknown> }
  const listed = /define "cos-auth-proxy\.routeUrlValues" -\}\}([^{]*)\{\{/.exec(helpers)?.[1]?.trim().split(' ')
  t.same(listed, ROUTE_TABLE.map(r => r.chart.url), 'cos-auth-proxy.routeUrlValues lists the table\'s URL values, in its order')
  for (const r of ROUTE_TABLE) {
    for (const [value, variable] of [[r.chart.url, r.url], [r.chart.prefix, r.prefix]] as const) {
      if (value === undefined || variable === undefined) continue
      t.ok(value in values.upstream, `values.yaml has upstream.${value}`)
      t.match(helpers, new RegExp(`\\{\\{- with \\$v\\.upstream\\.${value} \\}\\}\\n- name: ${variable}\\n`), `upstream.${value} becomes ${variable}`)
    }
  }
})
