// One version for everything that carries one: package.json (and its lock),
// the image label's default, the chart, the example parent chart's dependency,
// `cos-auth-proxy --version` of the bundle that ships, and a CHANGELOG section.
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import YAML from 'yaml'
import { run } from './support/cli-process.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8')
const VERSION = (JSON.parse(read('package.json')) as { version: string }).version

t.test('package.json has a semantic version and its lock file the same one', async t => {
  t.match(VERSION, /^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/, 'MAJOR.MINOR.PATCH')
  const lock = JSON.parse(read('package-lock.json')) as { version: string, packages: Record<string, { version?: string }> }
  t.equal(lock.version, VERSION, 'package-lock.json')
  t.equal(lock.packages['']?.version, VERSION, 'package-lock.json, the root package')
})

t.test('the image label defaults to package.json\'s version', async t => {
  const dockerfile = read('Dockerfile')
  const runtime = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '))
  t.equal(/^ARG VERSION=(\S+)$/m.exec(runtime)?.[1], VERSION, 'ARG VERSION in the runtime stage')
  t.match(runtime, /org\.opencontainers\.image\.version="\$\{VERSION\}"/, 'the label is that argument')
})

t.test('the chart\'s version and appVersion are package.json\'s, and the example parent chart depends on that chart version', async t => {
  const chart = YAML.parse(read('helm/cos-auth-proxy/Chart.yaml')) as { version: unknown, appVersion: unknown }
  t.equal(chart.appVersion, VERSION, 'appVersion')
  t.equal(chart.version, VERSION, 'version')
  const parent = YAML.parse(read('examples/sidecar-parent-chart/Chart.yaml')) as { dependencies: { name: string, version: unknown }[] }
  t.equal(parent.dependencies.find(d => d.name === 'cos-auth-proxy')?.version, VERSION, 'examples/sidecar-parent-chart depends on it')
})

t.test('cos-auth-proxy --version and -v print the name and package.json\'s version, from the bundle that ships', async t => {
  for (const flag of ['--version', '-v']) {
    const { code, stdout, stderr } = await run([flag], {})
    t.equal(code, 0, `${flag}: exit 0`)
    t.equal(stdout, `cos-auth-proxy ${VERSION}\n`, `${flag}: stdout`)
    t.equal(stderr, '', `${flag}: nothing on stderr`)
  }
})

t.test('CHANGELOG.md has a section for the version and an Unreleased section above it', async t => {
  const changelog = read('CHANGELOG.md')
  const sections = [...changelog.matchAll(/^## \[([^\]]+)\]/gm)].map(m => m[1])
  t.ok(sections.includes(VERSION), `## [${VERSION}] is there (found ${sections.join(', ')})`)
  t.equal(sections[0], 'Unreleased', 'Unreleased comes first')
  const escaped = VERSION.replace(/\./g, '\\.')
  t.match(changelog, new RegExp(`^## \\[${escaped}\\] - \\d{4}-\\d{2}-\\d{2}$`, 'm'), 'the release section is dated (Keep a Changelog)')
})
