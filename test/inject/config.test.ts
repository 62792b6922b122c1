// loadInjectConfig: the webhook's own settings and what it hands the sidecars.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { ConfigError } from '../../src/config/config.js'
import { loadInjectConfig as load } from '../../src/inject/config.js'
import { envOf } from '../../src/inject/template.js'

const loadInjectConfig = (env: NodeJS.ProcessEnv): ReturnType<typeof load> => load(env, { programVersion: '0.1.0' })
const sidecarEnv = (c: ReturnType<typeof load>): { name: string, value: string }[] => envOf(c.settings.template.container)

const dir = mkdtempSync(join(tmpdir(), 'cos-inject-config-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
writeFileSync(join(dir, 'tls.crt'), 'cert')
writeFileSync(join(dir, 'tls.key'), 'key')
const BASE = {
  COS_INJECT_TLS_CERT_FILE: join(dir, 'tls.crt'),
  COS_INJECT_TLS_KEY_FILE: join(dir, 'tls.key'),
  COS_INJECT_IMAGE: 'registry.example.com/cos-auth-proxy:0.1.0',
  COS_API_URL: 'https://api.cos.example.com',
}

t.test('defaults: 0.0.0.0:8443, native sidecars, no default Secret', async t => {
  const c = loadInjectConfig(BASE)
  t.same(c.listen, { host: '0.0.0.0', port: 8443 })
  t.equal(c.settings.nativeSidecar, true)
  t.equal(c.settings.defaultSecret, undefined)
  t.same(sidecarEnv(c).filter(e => e.name.endsWith('_URL')), [{ name: 'COS_API_URL', value: 'https://api.cos.example.com' }])
  t.equal(c.sidecarFile, undefined, 'no file: the definition comes from the environment')
})

t.test('COS_LOG_FORMAT sets the webhook\'s own lines (JSON by default) and is not handed to the sidecars, whose lines a collector reads', async t => {
  t.equal(loadInjectConfig(BASE).logFormat, 'json')
  const c = loadInjectConfig({ ...BASE, COS_LOG_FORMAT: 'pretty' })
  t.equal(c.logFormat, 'pretty')
  t.notOk(sidecarEnv(c).some(e => e.name === 'COS_LOG_FORMAT'), 'not passed through')
  t.throws(() => loadInjectConfig({ ...BASE, COS_LOG_FORMAT: 'text' }), { name: 'ConfigError', variable: 'COS_LOG_FORMAT' })
})

t.test('the upstream settings are handed to the sidecars; the webhook\'s egress proxy and TLS files are not', async t => {
  const c = loadInjectConfig({
    ...BASE,
    COS_INJECT_NATIVE_SIDECAR: 'false',
    COS_INJECT_DEFAULT_SECRET: 'cos-credentials',
    COS_MANAGEMENT_API_URL: 'https://m.example.com/api',
    COS_MANAGEMENT_PATH_PREFIX: '/mgmt',
    COS_UPSTREAM_TIMEOUT_MS: '20000',
    COS_MANAGEMENT_ALLOWED_METHODS: 'GET',
    HTTPS_PROXY: 'http://proxy.example.com:3128',
    COS_SHUTDOWN_DELAY_MS: '5000',
  })
  t.equal(c.settings.nativeSidecar, false)
  t.equal(c.settings.defaultSecret, 'cos-credentials')
  const names = sidecarEnv(c).map(e => e.name)
  t.same(names.filter(n => /_URL$|_PREFIX$/.test(n)), ['COS_MANAGEMENT_API_URL', 'COS_API_URL', 'COS_MANAGEMENT_PATH_PREFIX'])
  t.same(sidecarEnv(c).slice(-2), [{ name: 'COS_UPSTREAM_TIMEOUT_MS', value: '20000' }, { name: 'COS_MANAGEMENT_ALLOWED_METHODS', value: 'GET' }])
  t.notOk(names.includes('HTTPS_PROXY'))
  t.equal(sidecarEnv(c).find(e => e.name === 'COS_SHUTDOWN_DELAY_MS')?.value, '5000')
})

t.test('a method list for a route the webhook does not configure is a ConfigError naming it, as for serve', async t => {
  t.throws(() => loadInjectConfig({ ...BASE, COS_OPTIMIZE_ALLOWED_METHODS: 'GET' }), new ConfigError('COS_OPTIMIZE_ALLOWED_METHODS', 'is set but COS_OPTIMIZE_API_URL is not: the list would restrict no route'))
})
