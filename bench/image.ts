// How the image runs the proxy, read from a checkout's Dockerfile: the file,
// the Node flags, the environment and the compile-cache warm-up. The
// benchmark runs a build the way its image does from this one reading, and
// test/bundle.test.ts holds `npm start` to the same reading, so the three
// cannot drift apart.
import { existsSync, readFileSync } from 'node:fs'
import { join, posix } from 'node:path'

export interface ImageCommand {
  readonly workdir: string
  /** ENTRYPOINT + CMD. */
  readonly argv: readonly string[]
  readonly healthcheck: readonly string[]
  readonly copies: readonly string[]
  /** Every ENV of the last stage, in order. */
  readonly env: Readonly<Record<string, string>>
  /** The exec-form RUNs of every stage, in order. */
  readonly runs: readonly (readonly string[])[]
}

/** The last stage of a Dockerfile: WORKDIR, ENTRYPOINT + CMD, HEALTHCHECK, COPY, ENV (plus every stage's exec-form RUN). */
export function imageCommand (dockerfile: string): ImageCommand {
  const lines = dockerfile.replace(/\\\n\s*/g, ' ').split('\n').map(l => l.trim())
  const runtime = lines.slice(lines.findLastIndex(l => l.startsWith('FROM ')))
  const one = (instruction: string): string => {
    const found = runtime.findLast(l => l.startsWith(`${instruction} `))
    if (found === undefined) throw new Error(`no ${instruction} in the Dockerfile's last stage`)
    return found.slice(instruction.length + 1).trim()
  }
  const exec = (text: string): string[] => JSON.parse(text) as string[]
  const env: Record<string, string> = {}
  for (const l of runtime.filter(x => x.startsWith('ENV '))) {
    for (const [, name = '', quoted, bare] of l.slice(4).matchAll(/([A-Za-z_][A-Za-z0-9_]*)=(?:"([^"]*)"|(\S*))/g)) env[name] = quoted ?? bare ?? ''
  }
  return {
    workdir: one('WORKDIR'),
    argv: [...exec(one('ENTRYPOINT')), ...exec(one('CMD'))],
    healthcheck: exec(one('HEALTHCHECK').replace(/^.*?\bCMD\s+/, '')),
    copies: runtime.filter(l => l.startsWith('COPY ')),
    env,
    runs: lines.filter(l => /^RUN\s+\[/.test(l)).map(l => exec(l.slice(4).trim())),
  }
}

/** Index of the script in a `node [flags] script args…` argv. */
export function scriptIndex (argv: readonly string[]): number {
  return argv.findIndex((a, i) => i > 0 && !a.startsWith('-'))
}

/** A checkout's proxy as its image runs it, with paths in the checkout. */
export interface Build {
  /** The script node runs: the bundle, or dist/cli.js for a checkout that has none. */
  readonly script: string
  readonly nodeArgs: readonly string[]
  /** The image's environment (COS_* left to the benchmark; NODE_COMPILE_CACHE: see compileCache). */
  readonly env: Readonly<Record<string, string>>
  /**
   * The image's compile-cache warm-up, when it has one: the directory its
   * NODE_COMPILE_CACHE names and the arguments the Dockerfile runs the script
   * with at build time to fill it.
   */
  readonly compileCache?: { readonly imageDir: string, readonly warmArgs: readonly string[] }
  /** One line for the output: what runs, with which flags. */
  readonly description: string
}

/**
 * How `root`'s image runs the proxy, mapped onto the checkout: the file the
 * ENTRYPOINT names under WORKDIR is looked for under `root`. A checkout from
 * before the bundle (or without its build) runs dist/cli.js with no flags.
 */
export function imageBuild (root: string): Build {
  const dockerfile = join(root, 'Dockerfile')
  const image = existsSync(dockerfile) ? imageCommand(readFileSync(dockerfile, 'utf8')) : undefined
  const at = image === undefined ? -1 : scriptIndex(image.argv)
  const relative = image === undefined || at < 0 ? undefined : posix.relative(image.workdir, image.argv[at] ?? '')
  if (image === undefined || relative === undefined || !relative.endsWith('.mjs') || !existsSync(join(root, relative))) {
    const script = join(root, 'dist', 'cli.js')
    return { script, nodeArgs: [], env: {}, description: `${script} (no bundle in this checkout's image: the unbundled build, no image flags)` }
  }
  const nodeArgs = image.argv.slice(1, at)
  const env: Record<string, string> = {}
  for (const [k, v] of Object.entries(image.env)) if (!k.startsWith('COS_') && k !== 'NODE_COMPILE_CACHE') env[k] = v
  const imageScript = image.argv[at] ?? ''
  const warm = image.runs.find(r => r.includes(imageScript))
  const cacheDir = image.env.NODE_COMPILE_CACHE
  const compileCache = cacheDir === undefined || warm === undefined ? undefined : { imageDir: cacheDir, warmArgs: warm.slice(warm.indexOf(imageScript) + 1) }
  const flags = [...nodeArgs, ...Object.entries(env).map(([k, v]) => `${k}=${v}`)].join(' ')
  return {
    script: join(root, relative),
    nodeArgs,
    env,
    ...(compileCache === undefined ? {} : { compileCache }),
    description: `${relative} as the image runs it (${flags === '' ? 'no flags' : flags}${compileCache === undefined ? '' : `, compile cache filled by \`${compileCache.warmArgs.join(' ')}\``})`,
  }
}
