// The tag joins the one version (issue 44): scripts/check-version.mjs passes
// the tag v<package.json version> and refuses any other, naming what differs;
// scripts/release-notes.mjs prints CHANGELOG.md's section for a version (the
// GitHub release's body) and refuses a version without one. Both run as the
// workflow runs them (a node process); the files' mutual agreement is
// test/version.test.ts's. Offline, no build needed.
import { execFile } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8')
const VERSION = (JSON.parse(read('package.json')) as { version: string }).version
const CHART = 'helm/cos-auth-proxy/Chart.yaml'

interface Outcome { code: number, stdout: string, stderr: string }
/** Runs scripts/<script> with node; never rejects. */
const script = async (name: string, ...args: string[]): Promise<Outcome> => await new Promise(resolve => {
  execFile(process.execPath, [join(ROOT, 'scripts', name), ...args], { cwd: ROOT, timeout: 30_000 }, (err, stdout, stderr) => {
    resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : -1, stdout, stderr })
  })
})

const work = mkdtempSync(join(tmpdir(), 'cos-version-tag-test-'))
t.teardown(() => { rmSync(work, { recursive: true, force: true }) })
/** A copy of the files the scripts read, each edited by `edit` (path -> new text), as a --root. */
function tree (name: string, edit: Record<string, (text: string) => string> = {}): string {
  const root = join(work, name)
  for (const path of ['package.json', CHART, 'Dockerfile', 'CHANGELOG.md']) {
    mkdirSync(dirname(join(root, path)), { recursive: true })
    copyFileSync(join(ROOT, path), join(root, path))
    const change = edit[path]
    if (change) {
      const before = read(path)
      const after = change(before)
      if (after === before) throw new Error(`the edit of ${path} changed nothing`)
      writeFileSync(join(root, path), after)
    }
  }
  return root
}

t.test('check-version: the current tag v<package.json version> passes', async t => {
  const r = await script('check-version.mjs', `v${VERSION}`)
  t.equal(r.code, 0, `exit 0 (${r.stderr.trim()})`)
  t.equal(r.stderr, '', 'nothing on stderr')
  t.match(r.stdout, `v${VERSION} = package.json`, 'says what it compared')
})

t.test('check-version: a tag that is not the version fails naming every file that differs and its value', async t => {
  const other = VERSION.replace(/\d+$/, n => String(Number(n) + 1))
  const r = await script('check-version.mjs', `v${other}`)
  t.equal(r.code, 1, 'exit 1')
  t.equal(r.stdout, '', 'nothing on stdout')
  t.equal(r.stderr.trim().split('\n').length, 1, 'one line')
  for (const what of ['package.json', `${CHART} version`, `${CHART} appVersion`, 'Dockerfile ARG VERSION']) {
    t.match(r.stderr, `${what} is ${VERSION}`, `names ${what}`)
  }
  t.match(r.stderr, `tag v${other} is version ${other}`, 'and the tag')
})

t.test('check-version: one file that lags is named alone', async t => {
  const cases: [string, Record<string, (s: string) => string>, string][] = [
    [`${CHART} appVersion`, { [CHART]: s => s.replace(/^appVersion: .*$/m, 'appVersion: "0.0.9"') }, `${CHART} appVersion is 0.0.9`],
    [`${CHART} version`, { [CHART]: s => s.replace(/^version: .*$/m, 'version: 0.0.9 # old') }, `${CHART} version is 0.0.9`],
    ['Dockerfile', { Dockerfile: s => s.replace(/^ARG VERSION=.*$/m, 'ARG VERSION=0.0.9') }, 'Dockerfile ARG VERSION is 0.0.9'],
    ['Dockerfile without ARG VERSION', { Dockerfile: s => s.replace(/^ARG VERSION=.*$/m, 'ARG VERSION') }, 'Dockerfile ARG VERSION is missing'],
    ['package.json', { 'package.json': s => s.replace(`"version": "${VERSION}"`, '"version": "0.0.9"') }, 'package.json is 0.0.9'],
  ]
  for (const [name, edit, says] of cases) {
    const r = await script('check-version.mjs', `v${VERSION}`, '--root', tree(name.replace(/\W+/g, '-'), edit))
    t.equal(r.code, 1, `${name}: exit 1`)
    t.equal(r.stderr.trim(), `check-version: tag v${VERSION} is version ${VERSION}, but ${says}`, `${name}: named alone, with its value`)
  }
})

t.test('check-version: a tag that is not v and a semantic version is refused', async t => {
  for (const tag of [VERSION, `v${VERSION}.1`, `v${VERSION}+build`, 'latest', `refs/tags/v${VERSION}`, '']) {
    const r = await script('check-version.mjs', tag)
    t.equal(r.code, 1, `${JSON.stringify(tag)}: exit 1`)
    t.match(r.stderr, 'is not vX.Y.Z', `${JSON.stringify(tag)}: says so`)
  }
})

t.test('release-notes: the current version\'s notes are its CHANGELOG section, without its heading', async t => {
  const r = await script('release-notes.mjs', VERSION)
  t.equal(r.code, 0, `exit 0 (${r.stderr.trim()})`)
  t.ok(r.stdout.trim().length > 0, 'not empty')
  t.notMatch(r.stdout, /^## /m, 'no level-2 heading: neither its own nor the next section\'s')
  t.notMatch(r.stdout, /Unreleased/, 'nothing of Unreleased')
  t.match(r.stdout, /^### /m, 'its subsections are kept')
  // the text between the heading and the next level-2 heading (or the end)
  const changelog = read('CHANGELOG.md')
  const at = changelog.search(new RegExp(`^## \\[${VERSION.replace(/\./g, '\\.')}\\]`, 'm'))
  const from = changelog.indexOf('\n', at) + 1
  const to = changelog.indexOf('\n## ', from)
  t.equal(r.stdout, `${changelog.slice(from, to < 0 ? undefined : to).trim()}\n`, 'exactly that section')
})

t.test('release-notes: an unknown version, Unreleased or a non-version exits 1 with one line', async t => {
  for (const version of ['9.9.9', `${VERSION}-rc.1`, 'Unreleased', `v${VERSION}`]) {
    const r = await script('release-notes.mjs', version)
    t.equal(r.code, 1, `${version}: exit 1`)
    t.equal(r.stdout, '', `${version}: nothing on stdout`)
    t.equal(r.stderr.trim().split('\n').length, 1, `${version}: one line (${r.stderr.trim()})`)
  }
})

t.test('release-notes: the last section stops before the link references; an empty or a repeated section is refused', async t => {
  const links = (s: string): string => `${s.trimEnd()}\n\n[Unreleased]: https://example.test/compare/v${VERSION}...HEAD\n[${VERSION}]: https://example.test/releases/tag/v${VERSION}\n`
  const withLinks = await script('release-notes.mjs', VERSION, '--root', tree('links', { 'CHANGELOG.md': links }))
  t.equal(withLinks.code, 0, 'exit 0')
  t.notMatch(withLinks.stdout, 'https://example.test', 'no link reference definition in the notes')
  t.equal(withLinks.stdout, (await script('release-notes.mjs', VERSION)).stdout, 'the same notes as without them')

  const heading = new RegExp(`^(## \\[${VERSION.replace(/\./g, '\\.')}\\].*)$`, 'm')
  const empty = await script('release-notes.mjs', '7.7.7', '--root', tree('empty', { 'CHANGELOG.md': s => s.replace(heading, '## [7.7.7] - 2026-01-01\n\n$1') }))
  t.equal(empty.code, 1, 'an empty section: exit 1')
  t.match(empty.stderr, 'is empty', 'says it is empty')
  const twice = await script('release-notes.mjs', VERSION, '--root', tree('twice', { 'CHANGELOG.md': s => s.replace(heading, '$1\n\n- one\n\n$1') }))
  t.equal(twice.code, 1, 'two sections of one version: exit 1')
  t.match(twice.stderr, '2 sections', 'says so')
  const fenced = await script('release-notes.mjs', '8.8.8', '--root', tree('fenced', { 'CHANGELOG.md': s => s.replace('## [Unreleased]', '## [Unreleased]\n\n```\n## [8.8.8]\n```') }))
  t.equal(fenced.code, 1, 'a heading inside a code fence is not a section')
})
