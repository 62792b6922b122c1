// The ways a mounted file is replaced in the field, held once for every
// consumer of the mounted-file watcher (src/mounted/): the credential files,
// the sidecar definition, the webhook's serving certificate and the upstream
// TLS files. Each consumer is started as the product starts it and asked what
// is in force the way its users find out (consumers.ts); the files are
// replaced the way Kubernetes, cert-manager, an editor or an operator's
// mistake replace them (volume.ts). Events drive every case but the last,
// whose files are reached through symlinks into a directory nobody watches:
// its poll alone must find the change.
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { LogCapture } from '../support/helpers.js'
import { scaled } from '../support/time-scale.js'
import { consumers, SECRET_MARK, type Consumer, type InForce, type Running } from './consumers.js'
import { Volume } from './volume.js'

const root = process.getuid?.() === 0
const NOBODY = 65534
/** The effective user (Linux/macOS only: the permission case needs it as root). */
const seteuid = (uid: number): void => { process.seteuid?.(uid) }

const tmp = mkdtempSync(join(tmpdir(), 'cos-mounted-'))
t.teardown(() => { rmSync(tmp, { recursive: true, force: true }) })
// The permission case runs as another user, who must reach the volumes.
if (root) chmodSync(tmp, 0o755)

/** Far longer than any case: a change seen at all was seen by an event. */
const NO_POLL_MS = 600_000

interface Started {
  readonly volume: Volume
  readonly running: Running
  readonly logs: LogCapture
  /** Log lines that report a refusal or unreadable files so far. */
  readonly reported: () => number
  /** Every value seen in force while waiting. */
  readonly seen: InForce[]
}

let cases = 0
let everyLog: LogCapture[] = []
async function started (t: Test, c: Consumer, opts: { readonly pollMs?: number, readonly volume?: Volume, readonly write?: (v: Volume) => void } = {}): Promise<Started> {
  const volume = opts.volume ?? new Volume(join(tmp, `case-${++cases}`))
  ;(opts.write ?? (v => { v.writeInPlace(c.version(0)) }))(volume)
  const logs = new LogCapture()
  const running = await c.start(t, volume.dir, opts.pollMs ?? NO_POLL_MS, logs)
  const s: Started = { volume, running, logs, reported: () => logs.records.filter(r => c.reportedAs.test(String(r.msg))).length, seen: [] }
  t.equal(await running.inForce(), 0, 'version 0 in force at start')
  everyLog.push(logs)
  return s
}

/** Waits until `n` is in force (recording every value seen), bounded. */
async function inForce (s: Started, n: InForce, ms = 5000): Promise<boolean> {
  const deadline = Date.now() + scaled(ms)
  for (;;) {
    const now = await s.running.inForce()
    s.seen.push(now)
    if (now === n) return true
    if (Date.now() > deadline) return false
    await sleep(20)
  }
}

async function reportedOnce (s: Started, before: number): Promise<boolean> {
  const deadline = Date.now() + scaled(5000)
  while (s.reported() === before && Date.now() < deadline) await sleep(20)
  return s.reported() > before
}

/** Each version seen in force was a whole one: no mixed pair, no half-read file, nothing lost. */
function onlyWhole (t: Test, s: Started, allowed: readonly InForce[]): void {
  t.same([...new Set(s.seen)].filter(v => !allowed.includes(v)), [], `only ${allowed.join(', ')} ever in force`)
}

for (const c of consumers(t)) {
  t.test(c.name, async t => {
    everyLog = []
    t.test('a Kubernetes ..data symlink swap puts each new version in force, by the directory\'s events alone', async t => {
      const s = await started(t, c, { write: v => { v.swapData(c.version(0)) } })
      s.volume.swapData(c.version(1))
      t.ok(await inForce(s, 1), 'the first swap')
      s.volume.swapData(c.version(2))
      t.ok(await inForce(s, 2), 'the second swap (a new ..data, the old one removed)')
      onlyWhole(t, s, [0, 1, 2])
      t.equal(s.reported(), 0, 'an atomic swap is never seen half done')
    })

    t.test('a file renamed over the old one is followed', async t => {
      const s = await started(t, c)
      s.volume.renameOver(c.version(1))
      t.ok(await inForce(s, 1))
      onlyWhole(t, s, [0, 1])
    })

    t.test('a file truncated then written is never taken half read', async t => {
      const s = await started(t, c)
      s.volume.truncate(c.names)
      await sleep(5)
      s.volume.writeInPlace(c.version(1))
      t.ok(await inForce(s, 1))
      onlyWhole(t, s, [0, 1])
      t.equal(s.reported(), 0, 'the empty file was settled past, not refused')
    })

    t.test('a pair written one file at a time is never put in force mixed', async t => {
      const s = await started(t, c)
      const next = c.version(1)
      for (const name of c.names) {
        s.volume.writeInPlace({ [name]: next[name] ?? '' })
        await sleep(30)
      }
      t.ok(await inForce(s, 1))
      onlyWhole(t, s, [0, 1])
    })

    t.test('a file this process may not read keeps the previous version, reported, and is taken once readable', async t => {
      const s = await started(t, c)
      const before = s.reported()
      if (root) {
        // Root reads any file: act as the image's non-root user does, without capabilities.
        s.volume.chown(c.names, NOBODY)
        seteuid(NOBODY)
        t.teardown(() => { seteuid(0) })
      }
      s.volume.writeInPlace(c.version(1))
      s.volume.chmod(c.names, 0o000)
      t.ok(await reportedOnce(s, before), 'reported')
      t.equal(await s.running.inForce(), 0, 'the previous version stays in force')
      s.volume.chmod(c.names, 0o640)
      t.ok(await inForce(s, 1), 'taken once readable')
      if (root) seteuid(0)
      onlyWhole(t, s, [0, 1])
    })

    t.test('files deleted keep the previous version, and are taken when they return', async t => {
      const s = await started(t, c)
      const before = s.reported()
      s.volume.remove(c.names)
      t.ok(await reportedOnce(s, before), 'reported')
      t.equal(await s.running.inForce(), 0, 'the previous version stays in force')
      s.volume.writeInPlace(c.version(2))
      t.ok(await inForce(s, 2))
      onlyWhole(t, s, [0, 2])
    })

    t.test('a content refused by the checks keeps the previous version and is reported once, however often it is read', async t => {
      const s = await started(t, c, { pollMs: 40 })
      s.volume.writeInPlace(c.bad)
      t.ok(await reportedOnce(s, 0), 'reported')
      await sleep(300) // several polls read it again
      t.equal(s.reported(), 1, 'once')
      t.equal(await s.running.inForce(), 0, 'the previous version stays in force')
      s.volume.writeInPlace(c.version(1))
      t.ok(await inForce(s, 1), 'a good content after it is taken')
      onlyWhole(t, s, [0, 1])
    })

    t.test('with no event where the watcher looks, the poll finds the change', async t => {
      const real = new Volume(join(tmp, `case-${++cases}-real`))
      real.writeInPlace(c.version(0))
      const s = await started(t, c, { pollMs: 100, write: v => { v.linkTo(real, c.names) } })
      real.writeInPlace(c.version(1))
      t.ok(await inForce(s, 1), 'found by the poll')
      onlyWhole(t, s, [0, 1])
    })

    t.test('no secret is in any log line, whatever happened to its file', async t => {
      t.ok(everyLog.length >= 8, `${everyLog.length} runs logged`)
      t.ok(everyLog.some(l => l.lines.length > 0), 'something was logged')
      for (const logs of everyLog) t.notOk(logs.text.includes(SECRET_MARK), 'no secret')
    })
  })
}
