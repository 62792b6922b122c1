// Just enough Markdown for the ops tests: sections by heading, table rows
// naming a metric, and the anchors GitHub gives headings.

export interface Section { readonly level: number, readonly title: string, readonly body: string }

export function sections (markdown: string): Section[] {
  const out: Section[] = []
  let current: { level: number, title: string, lines: string[] } = { level: 0, title: '', lines: [] }
  let fenced = false
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced
    const m = fenced ? null : /^(#{1,6}) (.+)$/.exec(line)
    if (m === null) { current.lines.push(line); continue }
    out.push({ level: current.level, title: current.title, body: current.lines.join('\n') })
    current = { level: (m[1] ?? '').length, title: m[2] ?? '', lines: [] }
  }
  out.push({ level: current.level, title: current.title, body: current.lines.join('\n') })
  return out
}

/** The text of a section and its subsections. */
export function sectionText (markdown: string, title: string): string {
  const all = sections(markdown)
  const i = all.findIndex(s => s.title === title)
  if (i < 0) throw new Error(`no section "${title}"`)
  const level = (all[i] as Section).level
  const end = all.findIndex((s, j) => j > i && s.level <= level)
  return all.slice(i, end < 0 ? undefined : end).map(s => s.body).join('\n')
}

/** First-column metric names of the tables in `text`: rows like "| `name` | …". */
export function tableMetricNames (text: string): string[] {
  return [...text.matchAll(/^\| `([a-z_:][a-z0-9_:]*)` \|/gm)].map(m => m[1] ?? '')
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2… */
export function anchors (markdown: string): Set<string> {
  const seen = new Map<string, number>()
  const out = new Set<string>()
  for (const s of sections(markdown)) {
    if (s.level === 0) continue
    const base = s.title.toLowerCase().replace(/`/g, '').replace(/[^\p{L}\p{N} _-]/gu, '').replace(/ /g, '-')
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    out.add(n === 0 ? base : `${base}-${n}`)
  }
  return out
}

export interface MetricRow { readonly name: string, readonly type: string, readonly labels: readonly string[] }

/** Rows "| `name` | type | `a`, `b` or – | meaning |" of the metric tables in `text`. */
export function metricRows (text: string): MetricRow[] {
  return [...text.matchAll(/^\| `([a-z_:][a-z0-9_:]*)` \| (\w+) \| ([^|]*) \|/gm)].map(m => ({
    name: m[1] ?? '',
    type: m[2] ?? '',
    labels: [...(m[3] ?? '').matchAll(/`(\w+)`/g)].map(l => l[1] ?? ''),
  }))
}
