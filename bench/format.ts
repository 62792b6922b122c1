// Plain-text tables for the benchmark's stdout (also valid Markdown, so the
// docs can quote them as they are).

export type Cell = string | number

/** Numbers right-aligned, text left-aligned; `|`-separated so it pastes into Markdown. */
export function table (headers: readonly string[], rows: readonly (readonly Cell[])[]): string {
  const text = rows.map(r => r.map(c => typeof c === 'number' ? fixed(c) : c))
  const widths = headers.map((h, i) => Math.max(h.length, ...text.map(r => (r[i] ?? '').length)))
  // A column is right-aligned when every non-empty cell in it is a figure.
  const numeric = headers.map((_h, i) => rows.length > 0 && rows.every(r => typeof r[i] === 'number' || r[i] === '' || /^[-+]?[\d.,]+/.test(String(r[i]))))
  const line = (cells: readonly string[]): string =>
    '| ' + cells.map((c, i) => numeric[i] === true ? c.padStart(widths[i] ?? 0) : c.padEnd(widths[i] ?? 0)).join(' | ') + ' |'
  const rule = '|' + widths.map((w, i) => numeric[i] === true ? '-'.repeat(w + 1) + ':' : '-'.repeat(w + 2)).join('|') + '|'
  return [line(headers), rule, ...text.map(line)].join('\n')
}

/** Sensible digits for a benchmark figure: 12,345 / 123.4 / 1.23 / 0.123. */
export function fixed (n: number, digits?: number): string {
  if (Number.isNaN(n)) return '–'
  if (digits !== undefined) return n.toFixed(digits)
  const abs = Math.abs(n)
  if (abs >= 1000 || Number.isInteger(n)) return Math.round(n).toLocaleString('en-US')
  if (abs >= 100) return n.toFixed(1)
  if (abs >= 1) return n.toFixed(2)
  return n.toFixed(3)
}

export function ratio (n: number): string {
  return Number.isNaN(n) ? '–' : n.toFixed(2) + '×'
}
