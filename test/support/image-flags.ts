// The Node flags and environment the image runs the CLI with, read from the
// Dockerfile (bench/image.ts), for tests that must hold under the image's
// heap limits: an attack that only exhausts a 64 MiB old space passes under
// the test runner's own defaults. NODE_OPTIONS becomes flags on the command
// line: children never inherit NODE_OPTIONS (node-child.ts).
import { fileURLToPath } from 'node:url'
import { imageBuild } from '../../bench/image.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

export interface ImageFlags {
  /** Before the script: the ENTRYPOINT's flags, then NODE_OPTIONS's. */
  readonly nodeArgs: readonly string[]
  /** The rest of the image's environment (MALLOC_ARENA_MAX, NODE_ENV, …). */
  readonly env: Readonly<Record<string, string>>
}

export function imageFlags (): ImageFlags {
  const { nodeArgs, env } = imageBuild(ROOT)
  const { NODE_OPTIONS: options = '', ...rest } = env
  return { nodeArgs: [...nodeArgs, ...options.split(/\s+/).filter(o => o !== '')], env: rest }
}
