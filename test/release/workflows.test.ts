// The GitHub workflows (issue 44): actionlint (with shellcheck on the run:
// lines when the machine has it) finds nothing; every third-party action is
// pinned by a full commit SHA; the workflow grants nothing and each job asks
// for its own least permissions; no ${{ }} expression is spliced into a
// shell line (untrusted input goes through env:); the release runs on v* tags
// only, checks the tag with scripts/check-version.mjs, builds with
// scripts/release.sh (keyless: no --sign-key) and makes CHANGELOG's section
// (scripts/release-notes.mjs) the GitHub release's body. Offline: actionlint
// is built from its Go module once (scripts/tools/get-go-tool.sh, ~15 s) and
// taken from the cache after; when it cannot be had, the test fails.
import { execFile } from 'node:child_process'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import YAML from 'yaml'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const DIR = join(ROOT, '.github', 'workflows')
const FILES = readdirSync(DIR).filter(f => /\.ya?ml$/.test(f)).sort()

interface Step { uses?: string, run?: string, with?: Record<string, unknown>, env?: Record<string, unknown>, id?: string, name?: string }
interface Job { 'permissions'?: unknown, 'needs'?: string | string[], 'steps'?: Step[], 'uses'?: string, 'env'?: Record<string, unknown>, 'timeout-minutes'?: number }
interface Workflow { on: unknown, permissions?: unknown, env?: Record<string, unknown>, jobs: Record<string, Job> }
const text = (file: string): string => readFileSync(join(DIR, file), 'utf8')
const parse = (file: string): Workflow => YAML.parse(text(file)) as Workflow
const steps = (w: Workflow): Step[] => Object.values(w.jobs).flatMap(j => j.steps ?? [])

interface Outcome { code: number, stdout: string, stderr: string }
const exec = async (file: string, args: string[]): Promise<Outcome> => await new Promise(resolve => {
  execFile(file, args, { cwd: ROOT, timeout: 300_000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
    resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : -1, stdout, stderr: stderr || (err?.message ?? '') })
  })
})

const work = mkdtempSync(join(tmpdir(), 'cos-workflows-test-'))
t.teardown(() => { rmSync(work, { recursive: true, force: true }) })

t.test('there are the two workflows', async t => {
  t.same(FILES, ['ci.yml', 'release.yml'], '.github/workflows/')
})

t.test('actionlint finds nothing in the workflows, and does find an expression spliced into a shell line', async t => {
  const got = await exec('bash', [join(ROOT, 'scripts/tools/get-go-tool.sh'), 'actionlint'])
  const actionlint = got.stdout.trim()
  if (got.code !== 0 || actionlint === '') {
    t.fail(`actionlint could not be obtained (bash scripts/tools/get-go-tool.sh actionlint: exit ${got.code}): ${got.stderr.trim().split('\n').slice(-3).join(' | ')}`)
    return
  }
  const lint = await exec(actionlint, ['-format', '{{json .}}', ...FILES.map(f => join(DIR, f))])
  const findings = lint.stdout.trim() === '' ? [] : JSON.parse(lint.stdout) as { filepath: string, line: number, message: string, kind: string }[]
  t.same(findings.map(f => `${f.filepath}:${f.line}: ${f.message} [${f.kind}]`), [], 'no findings')
  t.equal(lint.code, 0, `actionlint exit 0 (${lint.stderr.trim()})`)

  // The same actionlint on a workflow with the faults this project forbids: it must see them.
  const bad = join(work, '.github', 'workflows')
  mkdirSync(bad, { recursive: true })
  writeFileSync(join(bad, 'bad.yml'), [
    'on: issues',
    'jobs:',
    '  a:',
    '    runs-on: ubuntu-latest',
    '    steps:',
    '      - run: echo "${{ github.event.issue.title }}"',
    '',
  ].join('\n'))
  const caught = await exec(actionlint, ['-format', '{{json .}}', join(bad, 'bad.yml')])
  const kinds = caught.stdout.trim() === '' ? [] : (JSON.parse(caught.stdout) as { kind: string }[]).map(f => f.kind)
  t.equal(caught.code, 1, 'exit 1 on a bad workflow')
  t.ok(kinds.includes('expression'), `an untrusted github.event value in run: is reported (kinds: ${kinds.join(', ')})`)
})

t.test('every third-party action is pinned by a 40-hex commit SHA with its release in a comment, and one action has one pin', async t => {
  const pins = new Map<string, Set<string>>()
  for (const file of FILES) {
    const lines = text(file).split('\n').filter(l => /^\s*(-\s+)?uses:/.test(l))
    const parsed = [...steps(parse(file)).map(s => s.uses), ...Object.values(parse(file).jobs).map(j => j.uses)].filter((u): u is string => u !== undefined)
    t.equal(lines.length, parsed.length, `${file}: every uses: line is a step's or a job's (${parsed.length})`)
    for (const uses of parsed) {
      if (uses.startsWith('./')) continue // this repository's own action, at this commit
      const m = /^([\w.-]+\/[\w.-]+)(\/[\w./-]+)?@([0-9a-f]{40})$/.exec(uses)
      t.ok(m, `${file}: ${uses} is owner/repo[/path]@<40-hex SHA>`)
      if (!m) continue
      const [, repo, , sha] = m as unknown as [string, string, string | undefined, string]
      const line = lines.find(l => l.includes(uses)) ?? ''
      t.match(line, /@[0-9a-f]{40} # v\d+\.\d+\.\d+\s*$/, `${file}: ${uses} says which release the SHA is (# vX.Y.Z)`)
      pins.set(repo, (pins.get(repo) ?? new Set()).add(sha))
    }
  }
  t.ok(pins.size >= 10, `${pins.size} actions pinned`)
  for (const [repo, shas] of pins) t.equal(shas.size, 1, `${repo}: one SHA in every workflow`)
})

t.test('the workflows grant nothing and every job asks for its own permissions, the least it needs', async t => {
  const expected: Record<string, Record<string, Record<string, string>>> = {
    'ci.yml': { ci: { contents: 'read' } },
    'release.yml': {
      'verify': { contents: 'read' },
      'image': { 'contents': 'read', 'packages': 'write', 'id-token': 'write', 'attestations': 'write' },
      'npm': { 'id-token': 'write' },
      'github-release': { contents: 'write' },
    },
  }
  for (const file of FILES) {
    const w = parse(file)
    t.same(w.permissions, {}, `${file}: top-level permissions: {}`)
    t.same(Object.keys(w.jobs).sort(), Object.keys(expected[file] ?? {}).sort(), `${file}: its jobs`)
    for (const [name, job] of Object.entries(w.jobs)) {
      t.ok(job.permissions !== undefined && typeof job.permissions === 'object', `${file} ${name}: declares its permissions`)
      t.same(job.permissions, expected[file]?.[name], `${file} ${name}: exactly what it needs`)
      t.ok(typeof job['timeout-minutes'] === 'number', `${file} ${name}: has a timeout`)
    }
  }
  const ci = parse('ci.yml').jobs.ci
  t.equal(ci?.['timeout-minutes'], 90, 'CI: 90 minutes')
})

t.test('no run: line holds a ${{ }} expression: the tag, github.event, inputs and head_ref reach the shell only through env:', async t => {
  let runs = 0
  for (const file of FILES) {
    for (const step of steps(parse(file))) {
      if (step.run === undefined) continue
      runs++
      t.notMatch(step.run, /\$\{\{/, `${file}: "${step.name ?? step.run.split('\n')[0] ?? ''}" has no \${{ }}`)
    }
    // also no untrusted context anywhere but env: and with: values (a job's if: or name: is evaluated, not run)
    t.notMatch(text(file), /\$\{\{[^}]*(github\.event\.|github\.head_ref|inputs\.)/, `${file}: no github.event.*, head_ref or inputs at all`)
  }
  t.ok(runs >= 10, `${runs} run: steps looked at`)
})

t.test('CI runs .ci/run on push and pull request, as root, with both caches', async t => {
  const w = parse('ci.yml')
  t.same(Object.keys(w.on as object).sort(), ['pull_request', 'push'], 'on push and pull_request')
  const all = steps(w)
  t.ok(all.some(s => s.run?.includes('bash .ci/run') === true && s.run.startsWith('sudo ')), 'runs .ci/run with sudo')
  const cached = all.filter(s => s.uses?.startsWith('actions/cache/') === true).map(s => String(s.with?.path))
  for (const dir of ['~/.cache/cos-auth-proxy-ci', '~/.cache/cos-auth-proxy-kube']) {
    t.equal(cached.filter(p => p.split('\n').includes(dir)).length, 2, `${dir}: restored and saved`)
  }
})

t.test('the release runs on v* tags only: verify (check-version, notes, npm test) → image (release.sh, keyless) → npm → GitHub release', async t => {
  const w = parse('release.yml')
  t.same(w.on, { push: { tags: ['v*'] } }, 'on: push of tags v* and nothing else')
  const jobs = w.jobs
  t.same(jobs.image?.needs, 'verify', 'image needs verify')
  t.same(jobs.npm?.needs, ['verify', 'image'], 'npm needs the image job')
  t.same(jobs['github-release']?.needs, ['verify', 'image', 'npm'], 'the GitHub release comes last')

  const verify = jobs.verify?.steps ?? []
  const check = verify.find(s => s.run?.includes('node scripts/check-version.mjs "$TAG"') === true)
  t.ok(check, 'verify runs scripts/check-version.mjs on "$TAG"')
  t.equal(check?.env?.TAG, '${{ github.ref_name }}', 'TAG is github.ref_name, through env:')
  t.match(check?.run ?? '', 'node scripts/release-notes.mjs "$version"', 'and fails early without a CHANGELOG section')
  const order = ['check-version.mjs', 'npm ci', 'npm test'].map(s => verify.findIndex(step => step.run?.includes(s) === true))
  t.same(order, [...order].sort((a, b) => a - b), `check-version, npm ci, npm test in that order (${order.join(', ')})`)
  t.notOk(order.includes(-1), 'all three there')

  const image = jobs.image?.steps ?? []
  const release = image.find(s => s.run?.includes('scripts/release.sh ') === true)
  t.match(release?.run ?? '', /scripts\/release\.sh --registry "\$REGISTRY" --builder docker --version "\$VERSION"/, 'image runs scripts/release.sh with the docker builder')
  t.notMatch(release?.run ?? '', '--sign-key', 'keyless: no --sign-key')
  t.equal(w.env?.REGISTRY, 'ghcr.io/cos-auth-proxy', 'REGISTRY is ghcr.io/cos-auth-proxy')
  const uses = (s: Step): string => s.uses?.split('@')[0] ?? ''
  for (const action of ['docker/setup-qemu-action', 'docker/setup-buildx-action', 'docker/login-action', 'sigstore/cosign-installer', 'azure/setup-helm']) {
    const at = image.findIndex(s => uses(s) === action)
    t.ok(at >= 0 && at < image.indexOf(release as Step), `${action} before release.sh`)
  }
  const attest = image.find(s => uses(s) === 'actions/attest-build-provenance')
  t.equal(attest?.with?.['subject-digest'], '${{ steps.release.outputs.index }}', 'provenance attested to the index digest release.sh printed')
  t.equal(attest?.with?.['push-to-registry'], true, 'and pushed to the registry')
  t.ok(image.some(s => uses(s) === 'actions/upload-artifact'), 'the release directory handed on as an artifact')

  const publish = (jobs.npm?.steps ?? []).find(s => s.run?.includes('npm publish') === true)
  t.match(publish?.run ?? '', /npm publish "release\/cos-auth-proxy-\$VERSION-npm\.tgz" --provenance --access public/, 'npm publishes the packed tgz with provenance')
  t.equal(publish?.env?.NODE_AUTH_TOKEN, '${{ secrets.NPM_TOKEN }}', 'with the NPM_TOKEN secret')

  const gh = (jobs['github-release']?.steps ?? []).find(s => s.run?.includes('gh release create') === true)?.run ?? ''
  t.match(gh, /node scripts\/release-notes\.mjs "\$VERSION" >"\$RUNNER_TEMP\/notes\.md"/, 'the notes are scripts/release-notes.mjs\'s output')
  t.match(gh, '--notes-file "$RUNNER_TEMP/notes.md"', 'and become the release body')
  for (const asset of ['SHA256SUMS', 'sbom-linux-amd64.cdx.json', 'sbom-linux-arm64.cdx.json', 'cos-auth-proxy-$VERSION.tgz"', 'cos-auth-proxy-$VERSION-npm.tgz"']) {
    t.match(gh, `release/${asset}`, `attaches ${asset.replace('"', '')}`)
  }
  t.match(gh, 'sha256sum --check --strict SHA256SUMS', 'the files are checked against SHA256SUMS first')
})
