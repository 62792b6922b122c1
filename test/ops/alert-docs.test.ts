// The runbook of each alert (its section of docs/operations.md) states the
// chart's defaults: the `for` duration and the threshold in values.yaml.
import t from 'tap'
import YAML from 'yaml'
import { read } from './exported.js'
import { sectionText } from './markdown.js'

interface Alert { readonly enabled: boolean, readonly for: string, readonly severity: string, readonly [threshold: string]: unknown }
const values = YAML.parse(read('helm/cos-auth-proxy/values.yaml')) as { prometheusRule: { alerts: Record<string, Alert> } }
const DOC = read('docs/operations.md')

const NAMES: Record<string, string> = {
  notReady: 'CosAuthProxyNotReady',
  upstreamErrors: 'CosAuthProxyUpstreamErrors',
  upstreamThrottled: 'CosAuthProxyUpstreamThrottled',
  credentialReloadFailing: 'CosAuthProxyCredentialReloadFailing',
  tokenMintingFailing: 'CosAuthProxyTokenMintingFailing',
  upstreamLatency: 'CosAuthProxyUpstreamLatencyHigh',
  clockSkew: 'CosAuthProxyClockSkew',
  injectorFailOpen: 'CosAuthProxyInjectorFailOpen',
  certificateExpiry: 'CosAuthProxyCertificateExpiringSoon',
}

/** What the section must say for a threshold's default. */
const THRESHOLD_WORDS: Record<string, (v: number) => string> = {
  ratio: v => `(default ${Math.round(v * 1000) / 10} %)`,
  p99Seconds: v => `(default ${v} s)`,
  seconds: v => `(default ${v})`,
  days: v => `(default ${v} days)`,
}

t.test('each alert\'s section in docs/operations.md gives its default duration and threshold', async t => {
  t.same(Object.keys(values.prometheusRule.alerts).sort(), Object.keys(NAMES).sort(), 'every alert in values.yaml has a name here')
  for (const [key, alert] of Object.entries(values.prometheusRule.alerts)) {
    const name = NAMES[key] ?? key
    const text = sectionText(DOC, name).replace(/\s+/g, ' ')
    t.ok(alert.enabled, `${key} is on by default`)
    const minutes = /^(\d+)m$/.exec(alert.for)?.[1]
    t.ok(minutes !== undefined && text.includes(`for ${minutes} minutes`), `${name}: "for ${minutes ?? alert.for} minutes"`)
    for (const [threshold, words] of Object.entries(THRESHOLD_WORDS)) {
      const v = alert[threshold]
      if (typeof v === 'number') t.ok(text.includes(words(v)), `${name}: "${words(v)}"`)
    }
  }
})
