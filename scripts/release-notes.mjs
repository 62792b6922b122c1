// The release notes of one version: its section of CHANGELOG.md (Keep a
// Changelog), which becomes the body of the GitHub release.
//
// usage: node scripts/release-notes.mjs X.Y.Z [--root DIR]
//   prints the section's body on stdout (its `### Added`, `### Fixed`, ...
//   and their text; not the `## [X.Y.Z] - date` heading, which the release's
//   title says); exit 1 and one line on stderr when there is no such section,
//   when there are two, or when it is empty. --root (default: this
//   repository) is where CHANGELOG.md is read.
//
// A version section is a level-2 heading `## [X.Y.Z]`, alone or followed by
// ` - <date>` (e.g. `## [0.1.0] - 2026-11-23`); it ends at the next level-2
// heading or at the end of the file. `## [Unreleased]` is never a version:
// its entries become a version by being moved under a new heading. Lines
// inside fenced code blocks are not headings; link reference definitions
// (`[0.1.0]: https://…`) at the end of the last section belong to the file,
// not to the notes.
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
export const VERSION = /^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$/

/** The level-2 headings of a Markdown text outside code fences: [line index, heading text]. */
function h2 (lines) {
  const found = []
  let fence
  lines.forEach((line, i) => {
    const f = /^\s{0,3}(`{3,}|~{3,})/.exec(line)
    if (f) {
      if (fence === undefined) fence = f[1][0]
      else if (f[1][0] === fence) fence = undefined
    } else if (fence === undefined && /^## /.test(line)) {
      found.push([i, line])
    }
  })
  return found
}

/** The body of `version`'s section, or throws an Error saying why there is none. */
export function releaseNotes (changelog, version) {
  if (!VERSION.test(version)) throw new Error(`"${version}" is not a version (X.Y.Z)`)
  const lines = changelog.split(/\r?\n/)
  const headings = h2(lines)
  const escaped = version.replace(/[.]/g, '\\.')
  const heading = new RegExp(`^## \\[${escaped}\\](?: - .*)?\\s*$`)
  const hits = headings.filter(([, text]) => heading.test(text))
  if (hits.length === 0) throw new Error(`CHANGELOG.md has no section "## [${version}]" (its sections: ${headings.map(([, t]) => t.slice(3)).join(', ') || 'none'})`)
  if (hits.length > 1) throw new Error(`CHANGELOG.md has ${hits.length} sections "## [${version}]"`)
  const start = hits[0][0] + 1
  const next = headings.find(([i]) => i > hits[0][0])
  const body = lines.slice(start, next === undefined ? lines.length : next[0])
  if (next === undefined) {
    // the file's link reference definitions, after the last section
    while (body.length > 0 && /^(\s*|\[[^\]]+\]:\s*\S+.*)$/.test(body.at(-1))) body.pop()
  }
  const text = body.join('\n').trim()
  if (text === '') throw new Error(`CHANGELOG.md's section "## [${version}]" is empty`)
  return `${text}\n`
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { values, positionals } = parseArgs({ options: { root: { type: 'string' } }, allowPositionals: true })
  if (positionals.length !== 1) {
    console.error('usage: node scripts/release-notes.mjs X.Y.Z [--root DIR]')
    process.exit(2)
  }
  try {
    process.stdout.write(releaseNotes(readFileSync(join(values.root ?? ROOT, 'CHANGELOG.md'), 'utf8'), positionals[0]))
  } catch (err) {
    console.error(`release-notes: ${err instanceof Error ? err.message : String(err)}`)
    process.exit(1)
  }
}
