// An upstream 401 or 403 explained: one warning per interval (not one per
// request) with the access key in force, when it was loaded, the measured
// clock skew and what a fresh read of the credential files found; and, in
// every log line at trace, no secret, token, signature or nonce. Real files,
// a real upstream and the real proxy on 127.0.0.1; the interval is shortened
// to 300 ms so the test stays fast.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { refusalHint, type RefusalFacts } from '../../src/proxy/auth-refusals.js'
import { loadConfig } from '../../src/config/config.js'
import { CredentialWatcher } from '../../src/credentials/credential-watcher.js'
import { accessKeyHint, CredentialStore, readPair } from '../../src/credentials/credentials.js'
import { createLogger } from '../../src/observability/logger.js'
import { buildProxyServer } from '../../src/proxy/proxy-server.js'
import { LogCapture, secretForms, send, startUpstream, tokenForms, until } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'

// Ten requests must fit in one interval: scaled to the machine's load (600 ms quiet, up to 3 s busy).
const INTERVAL_MS = scaled(600)

t.test('upstream 401s and 403s: one warning per interval with the access key, when it was loaded, the skew and the re-read result; no secret, token or signature in any log line', async t => {
  const tmp = mkdtempSync(join(tmpdir(), 'cos-refusals-'))
  t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })
  // Symlinks into a directory nothing watches: only a re-read finds a change.
  const real = join(tmp, 'real')
  const linked = join(tmp, 'linked')
  for (const d of [real, linked]) mkdirSync(d)
  symlinkSync(join(real, 'key'), join(linked, 'key'))
  symlinkSync(join(real, 'secret'), join(linked, 'secret'))
  const pairs = [
    { key: 'AKREFUSED1', secret: 'SeCrEt-ReFuSaL-one-7f3a+/=' },
    { key: 'AKREFUSED2', secret: 'SeCrEt-ReFuSaL-two-9b1c+/=' },
  ] as const
  const write = (p: { key: string, secret: string }): void => {
    writeFileSync(join(real, 'key'), p.key + '\n')
    writeFileSync(join(real, 'secret'), p.secret + '\n')
  }
  write(pairs[0])

  let status = 401
  let aheadMs = 0
  const upstream = await startUpstream((_req, res) => {
    res.statusCode = status
    res.setHeader('date', new Date(Date.now() + aheadMs).toUTCString())
    res.end(JSON.stringify({ error: 'no' }))
  })
  t.teardown(() => upstream.close())

  const config = loadConfig({
    env: { COS_ACCESS_KEY_FILE: join(linked, 'key'), COS_ACCESS_KEY_SECRET_FILE: join(linked, 'secret'), COS_MANAGEMENT_API_URL: upstream.url, COS_LISTEN_PORT: '0' },
    dotenv: false,
  })
  const logs = new LogCapture()
  const logger = createLogger('trace', logs)
  const first = await readPair(config.credentials, config.tokenEncoding)
  if (!first.ok) throw new Error(first.problem)
  const store = new CredentialStore(first.minter)
  const loadedAt = store.loadedAt?.toISOString()
  // Not started: no watch, no period; only the proxy's own re-reads look at the files.
  const watcher = new CredentialWatcher({ credentials: config.credentials, encoding: config.tokenEncoding, store, reloadMs: 60_000, logger })
  t.teardown(() => { watcher.close() })
  const app = await buildProxyServer({
    config,
    credentials: store,
    logger,
    resyncCredentials: () => { watcher.nudge() },
    rereadCredentials: () => watcher.reload(),
    diagnostics: { refusalWarningIntervalMs: INTERVAL_MS, sampleEveryMs: 0 },
  })
  t.teardown(() => app.close())
  await app.listen({ host: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/management`

  const warnings = (): Record<string, unknown>[] => logs.records.filter(r => r.level === 'warn' && String(r.msg).startsWith('auth: '))
  const burst = async (n: number): Promise<void> => {
    for (let i = 0; i < n; i++) t.equal((await send(`${url}/v1/clusters`)).status, status, 'the upstream\'s answer passes through')
  }
  const nextWarning = async (count: number): Promise<Record<string, unknown>> => {
    t.ok(await until(() => warnings().length >= count), `warning ${count} written`)
    return warnings()[count - 1] ?? {}
  }

  await t.test('a 401 storm with the pair on disk unchanged: one warning', async t => {
    const started = Date.now()
    await burst(10)
    const w = await nextWarning(1)
    t.match(w, {
      status: 401,
      route: 'management',
      accessKey: accessKeyHint(pairs[0].key),
      keyLoadedAt: loadedAt,
      clockSkewCorrection: false,
      reread: 'unchanged',
      refusals: 1,
    })
    t.ok(typeof w.upstreamClockSkewSeconds === 'number' && Math.abs(w.upstreamClockSkewSeconds) < 2, `the skew is measured (${String(w.upstreamClockSkewSeconds)})`)
    t.match(w.msg, /^auth: the upstream answered 401 \(token refused\): the pair in force is the one in the credential files and the clocks agree: check that the upstream knows access key A…1 .*COS_TOKEN_ENCODING=url/)
    await sleep(Math.max(0, INTERVAL_MS - (Date.now() - started) - 50))
    t.equal(warnings().length, 1, 'ten 401s within the interval: one warning')
  })

  await t.test('after the interval, a 403: the next warning counts the refusals in between and points at permissions', async t => {
    await sleep(INTERVAL_MS)
    status = 403
    await burst(3)
    const w = await nextWarning(2)
    t.match(w, { status: 403, accessKey: accessKeyHint(pairs[0].key), reread: 'unchanged', refusals: 10 })
    t.match(w.msg, /answered 403 \(forbidden\): .*a 403 usually means access key A…1 lacks the permission for this operation \(RBAC\)/)
  })

  await t.test('the key was rotated on disk and nothing said so: the warning says the re-read found a different pair, now in force', async t => {
    await sleep(INTERVAL_MS)
    status = 401
    write(pairs[1])
    await burst(1)
    const w = await nextWarning(3)
    t.match(w, { status: 401, accessKey: accessKeyHint(pairs[1].key), previousAccessKey: accessKeyHint(pairs[0].key), reread: 'applied', refusals: 3 })
    t.match(w.msg, /a re-read of the credential files found a different key pair and put it in force \(access key A…2\)/)
    t.not(w.keyLoadedAt, loadedAt, 'loaded-at is the new pair\'s')
  })

  await t.test('the upstream\'s clock is 10 min ahead: the warning puts the clock first', async t => {
    await sleep(INTERVAL_MS)
    aheadMs = 600_000
    await burst(1)
    const w = await nextWarning(4)
    t.ok(Math.abs(Number(w.upstreamClockSkewSeconds) - 600) < 2, `skew ${String(w.upstreamClockSkewSeconds)}`)
    // Date has whole-second resolution and the estimate is good to ±0.5 s plus the
    // one-way delay, which a loaded machine stretches: 599 or 601 is still right.
    t.match(w.msg, /the upstream's clock is (599|600|601) s ahead of this node's, so token timestamps fall outside its window: fix the node's clock \(NTP\), or set COS_CLOCK_SKEW_CORRECTION=true/)
  })

  await t.test('no log line holds a secret, a token, a signature or a nonce', async t => {
    await sleep(50)
    const text = logs.text
    t.ok(logs.lines.length >= 10, `${logs.lines.length} lines at trace`)
    for (const p of pairs) for (const form of secretForms(p.secret)) t.notOk(text.includes(form), `the secret of ${p.key} (${form}) is absent`)
    const tokens = upstream.received.map(r => (r.headers.authorization ?? '').slice('Bearer '.length))
    t.ok(tokens.length >= 15, `${tokens.length} tokens reached the upstream`)
    const found = tokens.flatMap(tokenForms).filter(needle => text.includes(needle))
    t.same(found, [], 'no token, signature or nonce of those the upstream received')
  })
})

t.test('the hint names the likeliest cause first', async t => {
  const base: RefusalFacts = { status: 401, accessKey: 'AKIDFIRST0000001', skewSeconds: 0.3, skewed: false, correcting: false, warnAfterS: 60, reread: undefined, fromFiles: true, encoding: 'url' }
  t.match(refusalHint({ ...base, skewSeconds: -600, skewed: true, reread: { result: 'applied', accessKey: 'AKIDSECOND000002' } }), /^the upstream's clock is 600 s behind this node's/, 'a skewed clock before anything else')
  t.match(refusalHint({ ...base, skewSeconds: -600, skewed: true, correcting: true }), /^the pair in force is the one in the credential files and the clock is off but COS_CLOCK_SKEW_CORRECTION shifts timestamps/, 'not once the correction is on')
  t.match(refusalHint({ ...base, skewSeconds: -600, skewed: true, correcting: true, maxCorrectionS: 600 }), /^the pair in force/, 'a skew of the bound itself is followed')
  t.match(refusalHint({ ...base, skewSeconds: 2_306_796_154, skewed: true, correcting: true, maxCorrectionS: 600 }), /^the upstream's clock is 2306796154 s ahead of this node's, beyond the COS_CLOCK_SKEW_MAX_SECONDS \(600 s\) the correction follows, so token timestamps fall outside its window: fix the node's clock \(NTP\), or raise COS_CLOCK_SKEW_MAX_SECONDS if the upstream's clock is the right one$/, 'nor a skew beyond the bound it follows: that is the cause again')
  t.match(refusalHint({ ...base, reread: { result: 'rejected', variable: 'COS_ACCESS_KEY_SECRET_FILE', problem: 'file "/s" is empty' } }), /^the credential files cannot be used \(COS_ACCESS_KEY_SECRET_FILE file "\/s" is empty\), so the pair in force \(access key AK…01\) stays: fix the mounted Secret/)
  t.match(refusalHint({ ...base, fromFiles: false, skewSeconds: undefined }), /^the pair comes from COS_ACCESS_KEY \/ COS_ACCESS_KEY_SECRET and the clock skew is unknown \(no Date header from the upstream yet\): check that the upstream knows access key AK…01/)
  const literal = refusalHint({ ...base, fromFiles: false })
  t.match(literal, /compare COS_ACCESS_KEY and COS_ACCESS_KEY_SECRET with the pair issued for this API/, 'literal values: compare the variables')
  t.notMatch(literal, /Secret|files/, 'and no word of a mounted Secret or files the proxy does not read')
  t.match(refusalHint(base), /compare the mounted Secret with the key issued/, 'files: the mounted Secret')
  t.match(refusalHint({ ...base, encoding: 'none' }), /COS_TOKEN_ENCODING=none is the form it expects$/)
  t.match(refusalHint({ ...base, skewSeconds: -42.4 }), /and the clocks differ by 42 s \(under the 60 s this proxy warns at\): check/, 'a skew under the threshold is still named: the upstream\'s window is not documented')
})
