// One version, one source (issue 44): the release tag vX.Y.Z must be the
// version of package.json, the chart's `version` and `appVersion`, and the
// default of the Dockerfile's `ARG VERSION` (the image label). The release
// workflow runs this on the pushed tag before anything is built, and
// scripts/release.sh runs it on v<--version>. (test/version.test.ts keeps the
// files equal to each other; this adds the tag.)
//
// usage: node scripts/check-version.mjs vX.Y.Z [--root DIR]
//   exit 0 and one line on stdout when all agree; otherwise exit 1 and one
//   line on stderr naming each file (and field) that differs and its value.
//   --root (default: this repository) is where the files are read.
// Reads the files as text (no dependency: it runs before `npm ci`).
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
/** A tag: v and a semantic version (a pre-release suffix allowed, no build metadata). */
export const TAG = /^v(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$/
const CHART = 'helm/cos-auth-proxy/Chart.yaml'

/** A top-level scalar of a YAML file (unindented `key: value`, quotes and a trailing comment removed). */
function topLevel (text, key) {
  const m = new RegExp(`^${key}:[ \\t]*(.*)$`, 'm').exec(text)
  if (!m) return undefined
  return m[1].replace(/[ \t]+#.*$/, '').trim().replace(/^(["'])(.*)\1$/, '$2')
}

/** Where the version is written: [what, value] pairs (undefined when a file does not say). */
export function versionsIn (root) {
  const read = path => readFileSync(join(root, path), 'utf8')
  const chart = read(CHART)
  const dockerArgs = [...read('Dockerfile').matchAll(/^ARG VERSION=(\S+)\s*$/gm)].map(m => m[1])
  return [
    ['package.json', JSON.parse(read('package.json')).version],
    [`${CHART} version`, topLevel(chart, 'version')],
    [`${CHART} appVersion`, topLevel(chart, 'appVersion')],
    // Every `ARG VERSION=` default (today one, in the runtime stage), and at least one.
    ...(dockerArgs.length === 0 ? [['Dockerfile ARG VERSION', undefined]] : dockerArgs.map(v => ['Dockerfile ARG VERSION', v])),
  ]
}

/** undefined when the tag matches everything, else the one line that says what differs. */
export function checkVersion (tag, root = ROOT) {
  const m = TAG.exec(tag ?? '')
  if (!m) return `check-version: the tag ${JSON.stringify(tag ?? '')} is not vX.Y.Z`
  const version = m[1]
  const differ = versionsIn(root).filter(([, v]) => v !== version).map(([what, v]) => `${what} is ${v === undefined ? 'missing' : v}`)
  if (differ.length === 0) return undefined
  return `check-version: tag ${tag} is version ${version}, but ${differ.join(', ')}`
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values, positionals } = parseArgs({ options: { root: { type: 'string' } }, allowPositionals: true })
  if (positionals.length !== 1) {
    console.error('usage: node scripts/check-version.mjs vX.Y.Z [--root DIR]')
    process.exit(2)
  }
  const tag = positionals[0]
  let problem
  try {
    problem = checkVersion(tag, values.root ?? ROOT)
  } catch (err) {
    problem = `check-version: ${err instanceof Error ? err.message : String(err)}`
  }
  if (problem) {
    console.error(problem)
    process.exit(1)
  }
  console.log(`check-version: ${tag} = package.json = ${CHART} version and appVersion = Dockerfile ARG VERSION`)
}
