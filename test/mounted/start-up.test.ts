// Consumers that read their files at start, before the watcher looks (the
// sidecar definition: exit 78 on a bad one; the upstream TLS files: a config
// error before anything starts), hand the watcher what they read as the value
// in force: its first look finds those bytes unchanged, not parsed and
// applied a second time. And the upstream's look asked for by hand
// (`reloadTls`) is the watcher's own, its dedupe and "report once" included.
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { loadInjectConfig } from '../../src/inject/config.js'
import { InjectMetrics } from '../../src/inject/metrics.js'
import { SidecarSource } from '../../src/inject/sidecar-source.js'
import { createLogger } from '../../src/observability/logger.js'
import { Upstreams } from '../../src/upstream/upstream.js'
import { LogCapture } from '../support/helpers.js'
import { makePki } from '../support/tls-fixtures.js'
import { EXAMPLE_SIDECAR_FILE } from '../inject/pods.js'

const tmp = mkdtempSync(join(tmpdir(), 'cos-mounted-start-'))
t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })

t.test('the sidecar definition read at start is not parsed again: the first look finds it unchanged, and a new version is still taken and announced', async t => {
  const file = join(tmp, 'sidecar.json')
  copyFileSync(EXAMPLE_SIDECAR_FILE, file)
  const config = loadInjectConfig({ COS_INJECT_SIDECAR_FILE: file, COS_INJECT_DEFAULT_SECRET: 'cos-credentials' }, { programVersion: '0.1.0', serving: false })
  t.equal(config.sidecarText, readFileSync(file, 'utf8'), 'start-up kept the text it parsed')
  const logs = new LogCapture()
  // As startWebhook builds it.
  const source = new SidecarSource(config.settings, { file: config.sidecarFile, readAtStart: config.sidecarText, sidecar: config.sidecar, programVersion: '0.1.0', metrics: new InjectMetrics({ defaultMetrics: false }), logger: createLogger('debug', logs), pollMs: 600_000 })
  t.teardown(() => { source.close() })
  t.same(await source.reload(), { result: 'unchanged', recovered: false }, 'the first look: the bytes start-up read are in force')

  const definition = JSON.parse(config.sidecarText) as { container: Record<string, unknown> }
  writeFileSync(file, JSON.stringify({ ...definition, container: { ...definition.container, image: 'registry.example.com/cos-auth-proxy:0.9.0' } }))
  t.match(await source.reload(), { result: 'applied' }, 'a changed file is still taken')
  t.equal(source.current().template.container.image, 'registry.example.com/cos-auth-proxy:0.9.0')
  t.equal(logs.records.filter(r => r.msg === 'sidecar definition reloaded: pods injected from now on get it; running pods keep theirs until restarted').length, 1, 'and announced once')
})

t.test('the upstream TLS files read at start are in force for the watcher, and a TLS reload asked for by hand is reported once however often it is asked', async t => {
  const pki = makePki()
  t.teardown(() => { pki.cleanup() })
  const caFile = join(tmp, 'ca.crt')
  copyFileSync(pki.caFile, caFile)
  const logs = new LogCapture()
  const upstreams = new Upstreams({ connectTimeoutMs: 1000, headersTimeoutMs: 1000, bodyIdleTimeoutMs: 1000, maxConnections: 4, tls: { caFile }, tlsReloadMs: 600_000, logger: createLogger('debug', logs) })
  t.teardown(() => upstreams.destroy())
  t.equal(await upstreams.reloadTls(), false, 'the first look: what start-up read is in force, nothing replaced')
  t.same(logs.lines, [], 'nothing to report')

  writeFileSync(caFile, 'no certificate here\n')
  for (let i = 0; i < 3; i++) t.equal(await upstreams.reloadTls(), false, `a bad bundle is refused (look ${i + 1})`)
  const refusals = logs.records.filter(r => r.msg === 'TLS files changed but cannot be used; keeping the previous ones')
  t.equal(refusals.length, 1, 'and logged once, not once per look')
  t.same(refusals[0] === undefined ? undefined : { variable: refusals[0].variable, problem: refusals[0].problem }, { variable: 'COS_CA_FILE', problem: `COS_CA_FILE ${JSON.stringify(caFile)} holds no PEM block of the expected kind` }, 'the line names the variable, then the file')

  copyFileSync(pki.otherCaFile, caFile)
  t.equal(await upstreams.reloadTls(), true, 'a valid bundle is taken')
  t.equal(await upstreams.reloadTls(), false, 'once')
  t.equal(logs.records.filter(r => r.msg === 'TLS files changed: new upstream connections use them').length, 1)
})
