// The notAfter the expiry gauges export, from PEM texts as operators mount
// them: a leaf with its chain, a CA bundle, files with no certificate.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { earliestNotAfter } from '../../src/mounted/certificate-expiry.js'
import { datedCertificate, type DatedCertificate } from '../support/tls-fixtures.js'

const dir = mkdtempSync(join(tmpdir(), 'cos-expiry-'))
t.teardown(() => rmSync(dir, { recursive: true, force: true }))
const soon = datedCertificate(dir, 'soon', 3)
const later = datedCertificate(dir, 'later', 40)

const within = (t: Test, value: number | undefined, c: DatedCertificate, what: string): void => {
  t.ok(c.isNotAfter(value), `${what}: ${String(value)} in [${c.notAfterWithin.join(', ')}]`)
}

t.test('one certificate: its notAfter, in Unix seconds', async t => {
  within(t, earliestNotAfter(later.cert), later, '40 days')
  t.equal(Number.isInteger(earliestNotAfter(later.cert)), true, 'whole seconds')
})

t.test('a chain or a bundle: the earliest of its certificates, wherever it stands in the file', async t => {
  within(t, earliestNotAfter(later.cert + soon.cert), soon, 'second of two')
  within(t, earliestNotAfter(soon.cert + '\n# a comment between blocks\n' + later.cert), soon, 'first of two')
})

t.test('a file with no certificate that parses has no expiry (no series), and a bad block beside good ones is passed over', async t => {
  t.equal(earliestNotAfter(''), undefined)
  t.equal(earliestNotAfter(soon.key), undefined, 'a key')
  t.equal(earliestNotAfter('-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n'), undefined, 'a block that is not DER')
  within(t, earliestNotAfter('-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n' + later.cert), later, 'the good one')
})
