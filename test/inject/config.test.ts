// loadInjectConfig: the webhook's own settings, parsed once through the
// variable table, and the sidecar definition it hands the sidecars (the
// chart-rendered file; no sidecar is built from the webhook's environment).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { parse } from 'yaml'
import { ConfigError, INJECT_VARIABLES } from '../../src/config/config.js'
import { loadInjectConfig as load, readSidecarSettings } from '../../src/inject/config.js'
import { envOf } from '../../src/inject/template.js'
import { EXAMPLE_SETTINGS, EXAMPLE_SIDECAR_FILE } from './pods.js'

const loadInjectConfig = (env: NodeJS.ProcessEnv): ReturnType<typeof load> => load(env, { programVersion: '0.1.0' })
const sidecarEnv = (c: ReturnType<typeof load>): { name: string, value: string }[] => envOf(c.settings.template.container)
const definitionEnv = (): { name: string, value: string }[] => envOf((JSON.parse(readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8')) as { container: Record<string, unknown> }).container)

const dir = mkdtempSync(join(tmpdir(), 'cos-inject-config-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
writeFileSync(join(dir, 'tls.crt'), 'cert')
writeFileSync(join(dir, 'tls.key'), 'key')
const BASE = {
  COS_INJECT_TLS_CERT_FILE: join(dir, 'tls.crt'),
  COS_INJECT_TLS_KEY_FILE: join(dir, 'tls.key'),
  COS_INJECT_SIDECAR_FILE: EXAMPLE_SIDECAR_FILE,
}

t.test('defaults: 0.0.0.0:8443, native sidecars, no default Secret', async t => {
  const c = loadInjectConfig(BASE)
  t.same(c.listen, { host: '0.0.0.0', port: 8443 })
  t.equal(c.settings.nativeSidecar, true)
  t.equal(c.settings.defaultSecret, undefined)
  t.same(sidecarEnv(c).filter(e => e.name.endsWith('_URL')), [
    { name: 'COS_MANAGEMENT_API_URL', value: 'https://management.cos.example.com/api' },
    { name: 'COS_OPTIMIZE_API_URL', value: 'https://optimize.cos.example.com/api' },
  ], 'the upstreams are the definition\'s')
  t.equal(c.sidecarFile, EXAMPLE_SIDECAR_FILE, 'the definition comes from the file')
})

t.test('COS_LOG_FORMAT sets the webhook\'s own lines (JSON by default) and is not handed to the sidecars, whose lines a collector reads', async t => {
  t.equal(loadInjectConfig(BASE).logFormat, 'json')
  const c = loadInjectConfig({ ...BASE, COS_LOG_FORMAT: 'pretty' })
  t.equal(c.logFormat, 'pretty')
  t.notOk(sidecarEnv(c).some(e => e.name === 'COS_LOG_FORMAT'), 'not passed through')
  t.throws(() => loadInjectConfig({ ...BASE, COS_LOG_FORMAT: 'text' }), { name: 'ConfigError', variable: 'COS_LOG_FORMAT' })
})

// Replaces 'the upstream settings are handed to the sidecars; ...' of the environment-built sidecar (removed):
// every field it passed (upstream URLs and prefixes, timeouts, method lists, the drain) now comes from the definition.
t.test('the sidecars get the rendered definition\'s settings, never the webhook\'s own: upstreams, timeouts, methods, egress proxy, drain', async t => {
  const c = loadInjectConfig({
    ...BASE,
    COS_INJECT_NATIVE_SIDECAR: 'false',
    COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
    COS_MANAGEMENT_API_URL: 'https://m.example.com/api',
    COS_MANAGEMENT_PATH_PREFIX: '/mgmt',
    COS_UPSTREAM_TIMEOUT_MS: '20000',
    COS_MANAGEMENT_ALLOWED_METHODS: 'GET',
    HTTPS_PROXY: 'http://proxy.example.com:3128',
    COS_SHUTDOWN_DELAY_MS: '7000',
  })
  t.equal(c.settings.nativeSidecar, false)
  t.equal(c.settings.defaultSecret, 'cos-credentials')
  t.same(sidecarEnv(c), definitionEnv(), 'the env is the definition\'s, entry by entry')
  const names = sidecarEnv(c).map(e => e.name)
  t.same(names.filter(n => /_URL$|_PREFIX$/.test(n)), ['COS_MANAGEMENT_API_URL', 'COS_OPTIMIZE_API_URL'])
  t.notOk(names.includes('HTTPS_PROXY'))
  t.notOk(names.includes('COS_MANAGEMENT_ALLOWED_METHODS'))
  t.equal(sidecarEnv(c).find(e => e.name === 'COS_SHUTDOWN_DELAY_MS')?.value, '5000', 'the chart\'s shutdown.delaySeconds, not the webhook\'s drain')
  t.equal(c.shutdownDelayMs, 7000, 'the webhook drains by its own')
})

t.test('a method list for a route the webhook does not configure is a ConfigError naming it, as for serve', async t => {
  t.throws(() => loadInjectConfig({ ...BASE, COS_OPTIMIZE_ALLOWED_METHODS: 'GET' }), new ConfigError('COS_OPTIMIZE_ALLOWED_METHODS', 'is set but COS_OPTIMIZE_API_URL is not: the list would restrict no route'))
})

t.test('without COS_INJECT_SIDECAR_FILE the webhook does not start: a ConfigError naming it and where a definition comes from', async t => {
  const { COS_INJECT_SIDECAR_FILE: _file, ...noFile } = BASE
  t.throws(() => loadInjectConfig({ ...noFile, COS_MANAGEMENT_API_URL: 'https://m.example.com/api' }), {
    name: 'ConfigError',
    variable: 'COS_INJECT_SIDECAR_FILE',
    message: /^COS_INJECT_SIDECAR_FILE is required: .*examples\/injector\/sidecar-configmap\.yaml/,
  })
  t.throws(() => load(noFile, { programVersion: '0.1.0', serving: false }), { name: 'ConfigError', variable: 'COS_INJECT_SIDECAR_FILE' }, '--print too')
})

t.test('COS_INJECT_IMAGE, removed with the environment-built sidecar, is refused naming what replaces it', async t => {
  t.throws(() => loadInjectConfig({ ...BASE, COS_INJECT_IMAGE: 'registry.example.com/cos-auth-proxy:0.1.0' }), {
    name: 'ConfigError',
    variable: 'COS_INJECT_IMAGE',
    message: /^COS_INJECT_IMAGE must not be set with COS_INJECT_SIDECAR_FILE: the file names the image/,
  })
  t.doesNotThrow(() => loadInjectConfig({ ...BASE, COS_INJECT_IMAGE: '' }), 'empty is unset, as for every variable')
})

t.test('the webhook\'s variables are parsed by the variable table: its defaults, ranges and error lines', async t => {
  const cases: [string, string][] = [['COS_INJECT_PORT', '84430'], ['COS_INJECT_PORT', 'Infinity'], ['COS_INJECT_HOST', 'a b'], ['COS_INJECT_NATIVE_SIDECAR', 'yes'], ['COS_INJECT_DEFAULT_SECRET', 'Cos_Credentials'], ['COS_INJECT_DEFAULT_SECRET', `a${'.b'.repeat(127)}`]]
  for (const [name, value] of cases) {
    t.throws(() => loadInjectConfig({ ...BASE, [name]: value }), new ConfigError(name, `${INJECT_VARIABLES[name as keyof typeof INJECT_VARIABLES].expect} (got ${JSON.stringify(value)})`), `${name}=${value.slice(0, 20)}`)
  }
  const c = loadInjectConfig({ ...BASE, COS_INJECT_HOST: '::', COS_INJECT_PORT: '0', COS_INJECT_DEFAULT_SECRET: 'team-a.cos' })
  t.same(c.listen, { host: '::', port: 0 })
  t.equal(c.settings.defaultSecret, 'team-a.cos')
})

t.test('a reload of the sidecar file takes the settings parsed at start: the same definition gives the same settings, without the environment', async t => {
  const c = loadInjectConfig({ ...BASE, COS_INJECT_NATIVE_SIDECAR: 'false', COS_INJECT_DEFAULT_SECRET: 'team-b' })
  t.ok(Object.isFrozen(c.sidecar))
  t.same(c.sidecar, { nativeSidecar: false, defaultSecret: 'team-b' })
  t.same(readSidecarSettings(c.sidecarFile, c.sidecar, '0.1.0'), c.settings, 'what SidecarSource applies on a change')
})

t.test('the shipped example ConfigMap holds the shipped sidecar.json, and the webhook reads it as the example chart\'s sidecar', async t => {
  const map = parse(readFileSync(EXAMPLE_SIDECAR_FILE.replace(/sidecar\.json$/, 'sidecar-configmap.yaml'), 'utf8')) as { kind: string, data: { 'sidecar.json': string } }
  t.equal(map.kind, 'ConfigMap')
  t.equal(map.data['sidecar.json'], readFileSync(EXAMPLE_SIDECAR_FILE, 'utf8'))
  t.same(loadInjectConfig({ ...BASE, COS_INJECT_DEFAULT_SECRET: 'cos-credentials' }).settings, EXAMPLE_SETTINGS)
})
