// A key pair mounted the wrong way round: the secret in the access key's file
// and the key in the secret's. A hex secret is printable and has no `/` or
// `:`, so it passes as an access key, and the proxy used to log it whole as
// `accessKey` (issue 43). Of an access key only what tells keys apart is
// logged now (accessKeyHint): the secret in its place never appears, in the
// start line, the rotation lines or the 401 warning.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { accessKeyHint } from '../../src/credentials/credentials.js'
import { secretForms, startUpstream } from '../support/helpers.js'
import { startSidecar, until, writeKeyPair } from '../support/sidecar.js'

t.test('accessKeyHint: at most a quarter of the key, up to 4 characters at each end', async t => {
  t.equal(accessKeyHint('AKIDEXAMPLE0123456789ABCDEFGWXYZ'), 'AKID…WXYZ', '32 characters or more: 4 at each end')
  t.equal(accessKeyHint('AKREFUSED1'), 'A…1', '10 characters: one at each end')
  t.equal(accessKeyHint('short'), '(5 characters)', 'under 8: only the length')
  const hex = 'f3a9c2e17b5d40a8965e0c4d2b7f1a3e9c8d6b5a4f3e2d1c0b9a8f7e6d5c4b3a'
  t.equal(accessKeyHint(hex), 'f3a9…4b3a', 'a 64-character hex secret: 8 of its characters')
  t.ok(accessKeyHint('AKID000000000001') !== accessKeyHint('AKID000000000002'), 'keys that differ at the end are told apart')
})

t.test('a pair mounted the wrong way round never logs the secret as the access key', async t => {
  const cwd = mkdtempSync(join(tmpdir(), 'cos-swapped-'))
  t.teardown(() => { rmSync(cwd, { recursive: true, force: true }) })
  const accessKey = 'AKIDSWAPPED0000000001'
  const secret = '9d4e1c7a2b8f3e6d0a5c9b1f4e7d2a8c6b3f0e9d5a1c7b4e2f8d6a0c3b9e1f5d'
  // Always 401: the start line, the rotation line and the refusal warning all name the "key".
  const up = await startUpstream((_req, res) => { res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"unauthorized"}') })
  t.teardown(() => up.close())
  const files = writeKeyPair(cwd, accessKey, secret)
  writeFileSync(files.COS_ACCESS_KEY_FILE, `${secret}\n`) // the wrong way round
  writeFileSync(files.COS_ACCESS_KEY_SECRET_FILE, `${accessKey}\n`)
  const s = await startSidecar({ COS_API_URL: up.url, ...files }, { cwd })
  t.teardown(async () => { s.child.kill('SIGKILL'); await s.exited })
  t.equal((await fetch(`${s.proxy}/x`)).status, 401, 'the upstream refuses (the pair is wrong)')
  await until('the 401 warning', () => Promise.resolve(s.lines().some(l => l.level === 40 || l.level === 'warn')), 10_000)
  const text = s.lines().map(l => JSON.stringify(l)).join('\n')
  t.match(text, accessKeyHint(secret), 'the "access key" is named by its hint')
  for (const form of secretForms(secret)) t.notOk(text.includes(form), `the secret is in no log line (${form.slice(0, 6)}…)`)
  t.notOk(text.includes(secret.slice(0, 16)), 'nor 16 characters of it')
})
