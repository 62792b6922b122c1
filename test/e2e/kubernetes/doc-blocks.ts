// The shell blocks of docs/kubernetes.md and helm/cos-auth-proxy/README.md:
// found, classified (installs or creates something, or not; marked as not run
// here, or claimed by a walk-through of doc-walkthroughs.ts: CLAIMS, WALKTHROUGHS,
// inventory) and run as written,
// the placeholders substituted from one table and nothing else edited.
import { accessSync, constants, readFileSync, writeFileSync } from 'node:fs'
import { delimiter, isAbsolute, join, resolve } from 'node:path'
import { ok } from '../harness/checks.js'
import { ROOT, run, type Run } from '../harness/processes.js'

export const DOCS = ['docs/kubernetes.md', 'helm/cos-auth-proxy/README.md'] as const
export type Doc = typeof DOCS[number]

/** What stands in a block for what the reader fills in: the only text the test changes. */
export const PLACEHOLDERS: Readonly<Record<string, string>> = {
  '<management-host>': 'management.cos.example.com',
  '<optimize-host>': 'optimize.cos.example.com',
  '<base-path>': 'api',
}

/** The marker, on the line before a block's fence, of a block that cannot run against test:kubernetes' API server. */
const NOT_RUN = /^<!-- not run by test:kubernetes: (.+) -->$/

export interface Block {
  readonly doc: Doc
  /** 1-based line of the opening fence. */
  readonly line: number
  /** The nearest heading above it. */
  readonly heading: string
  readonly lang: string
  readonly text: string
  /** Why it is not run here, from its marker. */
  readonly notRun: string | undefined
}

export function blocks (doc: Doc): Block[] {
  const lines = readFileSync(join(ROOT, doc), 'utf8').split('\n')
  const out: Block[] = []
  let heading = ''
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] ?? ''
    const fence = /^```(\S*)\s*$/.exec(line)
    if (fence === null) {
      const h = /^#{1,6}\s+(.*)$/.exec(line)
      if (h !== null) heading = h[1] ?? ''
      continue
    }
    const start = i
    const body: string[] = []
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i] ?? ''); i++) body.push(lines[i] ?? '')
    let before = start - 1
    while (before >= 0 && (lines[before] ?? '').trim() === '') before--
    const marker = NOT_RUN.exec((lines[before] ?? '').trim())
    out.push({ doc, line: start + 1, heading, lang: fence[1] ?? '', text: body.join('\n'), notRun: marker?.[1] })
  }
  return out
}

export const isShell = (b: Block): boolean => ['sh', 'bash', 'shell', 'console'].includes(b.lang)

/** A console block's commands ("$ " lines and their continuations) and the output it shows. */
export function consoleParts (text: string): { commands: string, shown: string[] } {
  const commands: string[] = []
  const shown: string[] = []
  let continued = false
  for (const line of text.split('\n')) {
    if (continued || line.startsWith('$ ')) {
      commands.push(continued ? line : line.slice(2))
      continued = line.endsWith('\\')
    } else {
      shown.push(line)
    }
  }
  return { commands: commands.join('\n'), shown }
}

/** The script of a block: a sh block's text, a console block's commands. */
export function script (b: Block): string {
  return b.lang === 'console' ? consoleParts(b.text).commands : b.text
}

const CREATES = /\b(helm\s+(install|upgrade|dependency\s+build)|kubectl\s+(-n\s+\S+\s+)?(create|apply|label|annotate|patch|replace|run|expose|rollout|scale)|kind\s+(create|load)|docker\s+build)\b/

/** Lines of a block that install or create something in a cluster (comments and dry runs aside). */
export function creating (b: Block): string[] {
  return script(b).split('\n').filter(l => !l.trim().startsWith('#') && !l.includes('--dry-run') && CREATES.test(l.replace(/\s+#.*$/, '')))
}

export const where = (b: Block): string => `${b.doc}:${b.line} (${b.heading})`

/** A block of the docs, claimed by a walk-through: its doc, its heading, a line of it. */
export interface Claim { readonly doc: Doc, readonly heading: string, readonly has: string }

export function matches (b: Block, c: Claim): boolean {
  return b.doc === c.doc && b.heading === c.heading && b.text.includes(c.has)
}

/** The text with the table's placeholders filled in; what is left in <angle brackets> outside comments is reported. */
export function substitute (text: string): { text: string, unknown: string[] } {
  let out = text
  for (const [k, v] of Object.entries(PLACEHOLDERS)) out = out.replaceAll(k, v)
  const unknown = out.split('\n').filter(l => !l.trim().startsWith('#')).flatMap(l => [...l.replace(/\s#\s.*$/, '').matchAll(/<[a-z][a-z-]*>/g)].map(m => m[0]))
  return { text: out, unknown }
}

/** An executable on PATH, or undefined. */
export function which (name: string): string | undefined {
  if (name.includes('/')) return isAbsolute(name) ? name : resolve(name)
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    const candidate = join(dir, name)
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch { /* next */ }
  }
  return undefined
}

/** A directory put first on the blocks' PATH: `helm` and `kubectl` are the suite's. */
export function toolDir (dir: string, tools: Readonly<Record<string, string>>): void {
  for (const [name, path] of Object.entries(tools)) {
    writeFileSync(join(dir, name), `#!/bin/sh\nexec '${path.replaceAll('\'', '\'\\\'\'')}' "$@"\n`, { mode: 0o755 })
  }
}

/** Runs a block's script with bash (-e: it stops at the first command that fails, -o pipefail), from the repository's root. */
export function runScript (text: string, env: NodeJS.ProcessEnv, timeoutMs = 180_000): Promise<Run> {
  return run('bash', ['-e', '-o', 'pipefail', '-c', text], { env, timeoutMs, cwd: ROOT })
}

export const K8S = 'docs/kubernetes.md'
export const README = 'helm/cos-auth-proxy/README.md'

/** The blocks the walk-throughs run, each found by its doc, heading and a line of it. */
export const CLAIMS = {
  keyPair: { doc: K8S, heading: 'The image and the key pair', has: 'create secret generic cos-credentials' },
  parentBuild: { doc: K8S, heading: 'As a sidecar in your own workload', has: 'helm dependency build examples/sidecar-parent-chart' },
  parentInstall: { doc: K8S, heading: 'As a sidecar in your own workload', has: 'helm install my-app examples/sidecar-parent-chart' },
  standalone: { doc: K8S, heading: 'Standalone (a Deployment other pods call)', has: 'helm install cos-auth-proxy ./helm/cos-auth-proxy' },
  injector: { doc: K8S, heading: 'Install', has: 'helm install cos helm/cos-auth-proxy' },
  annotate: { doc: K8S, heading: 'Annotate a namespace and a pod', has: 'kubectl label namespace apps cos-auth-proxy.io/injection=enabled' },
  readmeCredentials: { doc: README, heading: 'Credentials', has: 'create secret generic cos-credentials' },
  readmeStandalone: { doc: README, heading: 'Standalone mode', has: 'helm install cos-auth-proxy ./helm/cos-auth-proxy' },
} as const satisfies Record<string, Claim>
export type ClaimName = keyof typeof CLAIMS

export const WALKTHROUGHS: Record<string, readonly ClaimName[]> = {
  'docs/kubernetes.md, as a sidecar': ['keyPair', 'parentBuild', 'parentInstall'],
  'docs/kubernetes.md, standalone': ['keyPair', 'standalone'],
  'docs/kubernetes.md, injection': ['keyPair', 'injector', 'annotate'],
  'chart README, standalone': ['readmeCredentials', 'readmeStandalone'],
}

export function find (all: readonly Block[], claim: Claim): Block[] {
  return all.filter(b => isShell(b) && matches(b, claim))
}

/** Every shell block: run here (by which walk-throughs), marked not run (why), or creating nothing. */
export function inventory (all: readonly Block[]): void {
  for (const [name, claim] of Object.entries(CLAIMS)) {
    const found = find(all, claim)
    ok(found.length === 1, `${name}: one block of ${claim.doc} under "${claim.heading}" with "${claim.has}"`, found.map(where))
  }
  let runHere = 0
  let marked = 0
  let other = 0
  for (const b of all.filter(isShell)) {
    const claimedBy = Object.entries(WALKTHROUGHS).filter(([, names]) => names.some(n => matches(b, CLAIMS[n]))).map(([w]) => w)
    const creates = creating(b)
    if (b.notRun !== undefined) {
      marked++
      ok(claimedBy.length === 0, `not run here (marked): ${where(b)}: ${b.notRun}`, { claimedBy })
    } else if (claimedBy.length > 0) {
      runHere++
      console.log(`    run here: ${where(b)}, in: ${claimedBy.join('; ')}`)
    } else if (creates.length > 0) {
      ok(false, `${where(b)} installs or creates something (${creates[0] ?? ''}), and is neither run by a walk-through here nor marked <!-- not run by test:kubernetes: why -->`)
    } else {
      other++
      console.log(`    creates nothing: ${where(b)}`)
    }
  }
  ok(runHere >= 8, `${runHere} blocks run here, ${marked} marked not run, ${other} that create nothing`)
  console.log(`    placeholders (the only text changed): ${Object.entries(PLACEHOLDERS).map(([k, v]) => `${k} → ${v}`).join(', ')}`)
}
