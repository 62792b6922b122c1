// The documentation stays true to the code: docs/configuration.md documents
// exactly the settings the configuration accepts, and the relative links of
// README.md and docs/*.md lead to files (and headings) that exist.
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { VARIABLES } from '../src/config/config.js'
import { INJECT_VARIABLES } from '../src/inject/config.js'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const CONFIGURATION = join(ROOT, 'docs', 'configuration.md')
const ACCEPTED = new Set([...Object.keys(VARIABLES), ...Object.keys(INJECT_VARIABLES)])
const MARKDOWN = [join(ROOT, 'README.md'), ...readdirSync(join(ROOT, 'docs')).filter(f => f.endsWith('.md')).map(f => join(ROOT, 'docs', f))]

/** The text outside fenced code blocks, line by line (a link or heading inside a block is an example). */
function prose (text: string): string[] {
  let fenced = false
  return text.split('\n').filter(line => {
    if (/^\s*(```|~~~)/.test(line)) {
      fenced = !fenced
      return false
    }
    return !fenced
  })
}

/** The names in backticks in the first cell of every table row: the variables a table documents. */
function tableVariables (text: string): string[] {
  return prose(text)
    .filter(line => line.startsWith('|') && !/^\|\s*:?-/.test(line))
    .flatMap(line => [...(line.split('|')[1] ?? '').matchAll(/`([A-Za-z_][A-Za-z0-9_]*)`/g)].map(m => m[1] as string))
}

t.test('every variable the configuration accepts is documented in a table of docs/configuration.md', async t => {
  const documented = new Set(tableVariables(readFileSync(CONFIGURATION, 'utf8')))
  for (const name of ACCEPTED) t.ok(documented.has(name), `${name} is documented`)
})

t.test('every variable documented in docs/configuration.md is one the configuration accepts', async t => {
  const text = readFileSync(CONFIGURATION, 'utf8')
  const listed = tableVariables(text)
  t.ok(listed.length >= ACCEPTED.size, `the tables list ${listed.length} names`)
  for (const name of listed) t.ok(ACCEPTED.has(name), `${name} (a table row) is accepted`)
  t.same(listed.filter((name, i) => listed.indexOf(name) !== i), [], 'no variable documented twice')
  // Any COS_ name in the prose too, except patterns such as COS_SHUTDOWN_* or COS_*_ALLOWED_METHODS.
  const mentioned = new Set(prose(text).flatMap(line => [...line.matchAll(/\bCOS_[A-Z0-9]+(?:_[A-Z0-9]+)*\b(?![_*])/g)].map(m => m[0])))
  for (const name of mentioned) t.ok(ACCEPTED.has(name), `${name} (mentioned) is accepted`)
})

t.test('the settings table of README.md names only accepted variables', async t => {
  const listed = tableVariables(readFileSync(join(ROOT, 'README.md'), 'utf8')).filter(name => name.startsWith('COS_'))
  t.ok(listed.length >= 10, `the README lists ${listed.length} settings`)
  for (const name of listed) t.ok(ACCEPTED.has(name), `${name} is accepted`)
})

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2, … */
function anchors (text: string): Set<string> {
  const seen = new Map<string, number>()
  const out = new Set<string>()
  for (const line of prose(text)) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1]
    if (heading === undefined) continue
    const slug = heading.toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').trim().replace(/\s/g, '-')
    const n = seen.get(slug) ?? 0
    seen.set(slug, n + 1)
    out.add(n === 0 ? slug : `${slug}-${n}`)
  }
  return out
}

/** Inline links and images, [text](target) or [text](target "title"), outside code blocks and code spans. */
function links (text: string): string[] {
  return prose(text).flatMap(line => [...line.replace(/`[^`]*`/g, '').matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map(m => m[1] as string))
}

t.test('relative links in README.md and docs/*.md lead to files that exist, and anchors to headings that exist', async t => {
  let checked = 0
  for (const file of MARKDOWN) {
    const name = relative(ROOT, file)
    for (const link of links(readFileSync(file, 'utf8'))) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue // https:, mailto:
      const [path = '', fragment] = link.split('#', 2)
      const target = path === '' ? file : join(dirname(file), decodeURIComponent(path))
      checked++
      t.ok(target.startsWith(ROOT), `${name}: ${link} stays inside the repository`)
      if (!existsSync(target)) {
        t.fail(`${name}: ${link} points at ${relative(ROOT, target)}, which does not exist`)
        continue
      }
      if (fragment !== undefined && target.endsWith('.md')) {
        t.ok(anchors(readFileSync(target, 'utf8')).has(fragment), `${name}: ${link}: ${relative(ROOT, target)} has a heading #${fragment}`)
      }
    }
  }
  t.ok(checked > 20, `${checked} relative links checked`)
})

t.test('the link checker reads GitHub\'s anchors and skips code', async t => {
  t.same([...anchors('# Kubernetes\n## The `inject` webhook\n## Drain\n### Drain\n```\n# not a heading\n```\n')], ['kubernetes', 'the-inject-webhook', 'drain', 'drain-1'])
  t.same(links('see [a](a.md) and [b](../b.md#x "t")\n`[c](c.md)`\n```\n[d](d.md)\n```\n[e](https://x)'), ['a.md', '../b.md#x', 'https://x'])
})
